// kolo/cuda/kernels/device_kernels.cuh — the __global__ kernels and their device helpers: the
// batch kernel (a warp's range of the work space, found by a 32-way search, converted with
// vector or scalar accesses) and the grid-stride reduce kernel.
//
// Included by kolo/cuda/kernels.cuh (not a public header: include that one); self-contained.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kolo/cuda/kernels/element_ops.cuh"
#include "kolo/cuda/kernels/layout.cuh"

namespace kolo::cuda::kernel_detail {

// ---- the batch kernel ----

// Elements to skip until both s and d are aligned for vector steps (16 bytes on the wider side,
// 8 or 16 on the narrower), or -1 when they never are together. `s` may be null (zeros).
template <class In, class Out>
__device__ __forceinline__ long long vector_head(const In* s, const Out* d) {
  constexpr std::size_t L = Geometry<In, Out>::lanes;
  constexpr std::size_t ai = L * sizeof(In), ao = L * sizeof(Out);
  const auto da = reinterpret_cast<std::uintptr_t>(d);
  if (da % sizeof(Out) != 0) return -1;
  const std::size_t hd = (ao - da % ao) % ao / sizeof(Out);
  if (s == nullptr) return static_cast<long long>(hd);
  const auto sa = reinterpret_cast<std::uintptr_t>(s);
  if (sa % sizeof(In) != 0) return -1;
  const std::size_t hs = (ai - sa % ai) % ai / sizeof(In);
  return hs == hd ? static_cast<long long>(hs) : -1;
}

// A warp converts d[i] = cvt(s[i]) for i < n (s == nullptr: d[i] = cvt(In{}), "zeros").
template <class In, class Out, class Cvt>
__device__ void convert_piece(const In* s, Out* d, std::size_t n, const Cvt& cvt, unsigned lane) {
  constexpr std::size_t L = Geometry<In, Out>::lanes;
  constexpr std::size_t U = Geometry<In, Out>::template unroll<Cvt>;
  constexpr bool copy = std::is_same_v<Cvt, CopyOp>;  // In == Out: move 16 bytes as they are
  using VI = std::conditional_t<copy, uint4, VecN<In, L>>;
  using VO = std::conditional_t<copy, uint4, VecN<Out, L>>;
  const Out zero = cvt(In{});
  const long long head = vector_head(s, d);
  if (head < 0) {  // scalar, kUnroll loads in flight per lane
    if (s == nullptr) {
      for (std::size_t i = lane; i < n; i += 32) d[i] = zero;
      return;
    }
    for (std::size_t i0 = lane; i0 < n; i0 += 32 * kUnroll) {
      In x[kUnroll];
#pragma unroll
      for (std::size_t u = 0; u < kUnroll; ++u) {
        const std::size_t i = i0 + u * 32;
        if (i < n) x[u] = s[i];
      }
#pragma unroll
      for (std::size_t u = 0; u < kUnroll; ++u) {
        const std::size_t i = i0 + u * 32;
        if (i < n) d[i] = cvt(x[u]);
      }
    }
    return;
  }
  const std::size_t h = static_cast<std::size_t>(head) < n ? static_cast<std::size_t>(head) : n;
  if (lane < h) d[lane] = s ? cvt(s[lane]) : zero;  // h < L <= 16
  const std::size_t nv = (n - h) / L;
  VO* vd = reinterpret_cast<VO*>(d + h);
  if (s != nullptr) {
    const VI* vs = reinterpret_cast<const VI*>(s + h);
    for (std::size_t v0 = lane; v0 < nv; v0 += 32 * U) {
      VI x[U];
#pragma unroll
      for (std::size_t u = 0; u < U; ++u) {
        const std::size_t v = v0 + u * 32;
        if (v < nv) x[u] = vs[v];
      }
#pragma unroll
      for (std::size_t u = 0; u < U; ++u) {
        const std::size_t v = v0 + u * 32;
        if (v < nv) {
          if constexpr (copy) {
            vd[v] = x[u];
          } else {
            VO y;
#pragma unroll
            for (std::size_t j = 0; j < L; ++j) y.e[j] = cvt(x[u].e[j]);
            vd[v] = y;
          }
        }
      }
    }
  } else {
    VO z;
    if constexpr (copy) {
      z = make_uint4(0, 0, 0, 0);  // a copy's zero is all-zero bits
    } else {
#pragma unroll
      for (std::size_t j = 0; j < L; ++j) z.e[j] = zero;
    }
    for (std::size_t v = lane; v < nv; v += 32) vd[v] = z;
  }
  const std::size_t t = h + nv * L + lane;  // tail: fewer than L elements
  if (t < n) d[t] = s ? cvt(s[t]) : zero;
}

// The last descriptor with begin <= w (descs[0].begin == 0 <= w): a 32-way search, each lane
// probing one position per round, so 1000 tensors take two rounds of loads.
__device__ __forceinline__ std::size_t find_tensor(const BatchDesc* descs, std::size_t n,
                                                   std::size_t w, unsigned lane) {
  std::size_t lo = 0, hi = n;  // descs[lo].begin <= w, and w < descs[hi].begin (or hi == n)
  while (hi - lo > 1) {
    const std::size_t span = hi - lo;
    const std::size_t p = lo + span * lane / 32;
    const unsigned le = __ballot_sync(0xffffffffu, descs[p].begin <= w);  // a prefix of lanes
    const unsigned j = 31u - static_cast<unsigned>(__clz(le));
    if (j != 31) hi = lo + span * (j + 1) / 32;
    lo += span * j / 32;
  }
  return lo;
}

// Warp w converts the work space [w * task, (w + 1) * task): the pieces of the tensors there.
template <class In, class Out, class Cvt>
__global__ void __launch_bounds__(kBlockThreads)
    batch_kernel(const BatchDesc* global_descs, std::size_t n, std::size_t task, std::size_t end,
                 Cvt cvt, const __grid_constant__ InlineDescs inline_descs) {
  const BatchDesc* descs = global_descs != nullptr ? global_descs : inline_descs.d;
  const unsigned lane = threadIdx.x % 32;
  const std::size_t warp = static_cast<std::size_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  const std::size_t w0 = warp * task;
  if (w0 >= end) return;  // the whole warp
  const std::size_t w1 = end - w0 < task ? end : w0 + task;
  for (std::size_t k = find_tensor(descs, n, w0, lane); k < n; ++k) {
    const BatchDesc dk = descs[k];
    if (dk.begin >= w1) break;
    const std::size_t a = w0 > dk.begin ? w0 - dk.begin : 0;
    const std::size_t b = w1 - dk.begin < dk.count ? w1 - dk.begin : dk.count;
    if (a >= b) continue;  // the range starts in this tensor's overhead
    const In* s = dk.src ? static_cast<const In*>(dk.src) + a : nullptr;
    convert_piece<In, Out>(s, static_cast<Out*>(dk.dst) + a, b - a, cvt, lane);
  }
}

// ---- the reduce kernel: one array, grid-stride ----

template <class T, class Op>
__global__ void __launch_bounds__(kBlockThreads)
    reduce_kernel(T* dst, const T* src, std::size_t n, std::size_t head, bool vec, Op op) {
  constexpr std::size_t L = 16 / sizeof(T);
  constexpr std::size_t U = sizeof(T) >= 4 ? kUnroll : sizeof(T);  // see Geometry::unroll
  using V = VecN<T, L>;
  const std::size_t tid = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t threads = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  if (!vec) {
    for (std::size_t i0 = tid; i0 < n; i0 += threads * kUnroll) {
      T a[kUnroll], b[kUnroll];
#pragma unroll
      for (std::size_t u = 0; u < kUnroll; ++u) {
        const std::size_t i = i0 + u * threads;
        if (i < n) {
          a[u] = dst[i];
          b[u] = src[i];
        }
      }
#pragma unroll
      for (std::size_t u = 0; u < kUnroll; ++u) {
        const std::size_t i = i0 + u * threads;
        if (i < n) dst[i] = op(a[u], b[u]);
      }
    }
    return;
  }
  if (tid < head) dst[tid] = op(dst[tid], src[tid]);  // head < L
  const std::size_t nv = (n - head) / L;
  V* vd = reinterpret_cast<V*>(dst + head);
  const V* vs = reinterpret_cast<const V*>(src + head);
  for (std::size_t v0 = tid; v0 < nv; v0 += threads * U) {
    V a[U], b[U];
#pragma unroll
    for (std::size_t u = 0; u < U; ++u) {
      const std::size_t v = v0 + u * threads;
      if (v < nv) {
        a[u] = vd[v];
        b[u] = vs[v];
      }
    }
#pragma unroll
    for (std::size_t u = 0; u < U; ++u) {
      const std::size_t v = v0 + u * threads;
      if (v < nv) {
#pragma unroll
        for (std::size_t j = 0; j < L; ++j) a[u].e[j] = op(a[u].e[j], b[u].e[j]);
        vd[v] = a[u];
      }
    }
  }
  const std::size_t t = head + nv * L + tid;  // tail: fewer than L elements
  if (t < n) dst[t] = op(dst[t], src[t]);
}

}  // namespace kolo::cuda::kernel_detail
