// kolo/cuda/kernels.cuh — the device fusion kernels (pack, unpack, reduce); needs nvcc.
//
// Include this header in one .cu file of a program: an inline variable registers the kernels in
// kolo::cuda::registered_kernels() at start-up, so plain C++ code (the NCCL and host-staged
// transports) finds them through the FusionKernels table of kolo/cuda/device_ops.hpp. The
// launchers are also callable directly as kolo::cuda::pack / unpack / reduce with a cudaStream_t.
//
// Semantics are the host's, bit for bit: pack/unpack scale exactly like detail::scaled_copy
// (fusion_buffer.hpp) and the Fp16/Bf16 compressors (compressor.hpp); reduce is kolo::reduce
// (16-bit floats widen to fp32, one operation, one round to nearest even; integers wrap). The only
// difference is the payload of a NaN that went through arithmetic or a conversion: it stays a
// NaN, but the device writes the canonical NaN where the host keeps the payload. Plain copies
// (scale 1, divisor 1, same type) are bitwise, NaNs included. Build without --use_fast_math
// (flushing subnormals to zero would change results).
//
// Work distribution of a batch (pack, unpack): one launch for all tensors. The host lists the
// tensors that have work as descriptors {src, dst, count, begin}, where `begin` places each
// tensor in a "work space": its elements, rounded up to a whole vector, plus a fixed overhead
// (the cost of a tensor's descriptor, head and tail, as elements), so that tiny tensors weigh
// something. The work space is cut into equal contiguous ranges, one per warp, of at least
// 4 vectors per lane: a 64 MiB tensor becomes thousands of blocks (many more than are resident,
// so the hardware block scheduler balances the load), a thousand tiny tensors a few hundred
// warps of a few tensors each. A warp finds the first tensor of its range with a 32-way search
// over `begin` (two rounds of loads for 1000 tensors) and converts its piece of each tensor with
// 16-byte vector accesses on the wider side (8 or 16 on the narrower) when source and
// destination can be aligned at the same element (a scalar head first), with scalar accesses
// otherwise; the choice is per piece and uniform across the warp.
//
// Descriptors: up to 120 travel in the kernel's parameters (nothing to upload; a captured graph
// gets a single kernel node). Larger batches are uploaded with one cudaMemcpyAsync from
// pageable memory (the driver stages it before the call returns, so the caller's item array and
// our copy may be reused at once) into memory from a stream-ordered pool owned by this file (one
// per device, created once under a mutex), freed after the kernel in stream order, so nothing
// is shared between streams or threads. Under stream capture the graph gets alloc, memcpy, kernel
// and free nodes; the host copy of the descriptors is kept for the life of the process, because
// every replay copies it again. On a device without memory pools a growable scratch buffer per
// device serves instead, guarded by a mutex and an event (the next upload, on any stream, waits for
// the last kernel that read it).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "kolo/core/dtype.hpp"
#include "kolo/core/error.hpp"
#include "kolo/core/float16.hpp"
#include "kolo/cuda/device_ops.hpp"

namespace kolo::cuda {

namespace kernel_detail {

// ---- errors ----

inline void check(cudaError_t e, const char* who, const char* what) {
  if (e == cudaSuccess) return;
  throw Error(std::string(who) + ": " + what + " failed: " + cudaGetErrorName(e) + " (" +
              cudaGetErrorString(e) + ")");
}

// ---- geometry, shared by the host (descriptor layout) and the device (tasks) ----

constexpr unsigned kBlockThreads = 256;
constexpr unsigned kWarpsPerBlock = kBlockThreads / 32;
constexpr std::size_t kUnroll = 4;  // vector loads in flight per lane (fewer for narrow types)
constexpr int kMaxWaves = 32;       // batch kernel: at most this many waves of resident blocks

struct CopyOp;

template <class In, class Out>
struct Geometry {
  static constexpr std::size_t max_size = sizeof(In) < sizeof(Out) ? sizeof(Out) : sizeof(In);
  // Elements per vector step: 16 bytes of the wider type (the narrower side moves 8 or 16), so
  // that every vector load and store of a warp covers one contiguous span.
  static constexpr std::size_t lanes = 16 / max_size;
  // The weight a tensor adds to the work space on top of its elements (its descriptor, head and
  // tail cost about as much as streaming two vectors per lane), and the least work of a warp.
  static constexpr std::size_t overhead = 32 * lanes * 2;
  static constexpr std::size_t min_task = 32 * lanes * 4;
  // Vectors in flight per lane: narrow elements are unpacked into one register each, so fewer of
  // them keep the kernel near 64 registers (copies move whole vectors: 4).
  template <class Cvt>
  static constexpr std::size_t unroll = std::is_same_v<Cvt, CopyOp> || lanes <= 4
                                            ? kUnroll
                                            : (lanes == 8 ? 2 : 1);
};

// One tensor of a batch, as the kernel sees it (pointers already offset into the buffer).
struct BatchDesc {
  const void* src;  // nullptr: the source is zeros
  void* dst;
  std::size_t count;  // elements (> 0)
  std::size_t begin;  // position in the work space, strictly increasing
};

template <class T, std::size_t N>
struct alignas(sizeof(T) * N) VecN {
  T e[N];
};

// Batches of at most this many tensors travel in the kernel's parameters: no upload. 120
// descriptors (3840 bytes) keep all parameters within the 4 KiB every driver accepts; measured
// on H100, a launch with them costs the host ~1 us more than one with 32, while an upload delays
// the kernel by ~3-10 us.
constexpr std::size_t kInlineDescs = 120;
struct InlineDescs {
  BatchDesc d[kInlineDescs];
};

// ---- element conversions ----

__device__ __forceinline__ float to_float(kolo::float16 h) {
  return __half2float(__ushort_as_half(h.bits));
}
__device__ __forceinline__ float to_float(kolo::bfloat16 h) {
  return __bfloat162float(__ushort_as_bfloat16(h.bits));
}

template <class H>
__device__ __forceinline__ H from_float(float f) {
  H h;
  if constexpr (std::is_same_v<H, kolo::float16>) {
    h.bits = __half_as_ushort(__float2half_rn(f));
  } else {
    static_assert(std::is_same_v<H, kolo::bfloat16>);
    h.bits = __bfloat16_as_ushort(__float2bfloat16_rn(f));
  }
  return h;
}

template <class T>
inline constexpr bool is_half_v =
    std::is_same_v<T, kolo::float16> || std::is_same_v<T, kolo::bfloat16>;

// ---- pack/unpack element operations (functors passed by value to the kernel) ----

struct CopyOp {  // same type, scale 1, divisor 1: bitwise (the host's memmove)
  template <class T>
  __device__ T operator()(T x) const {
    return x;
  }
};
// Same-type scaling: x * f, or with Divide x / f (an average's division alone, scale 1: a
// true division, one rounding per element, as the host's detail::scaled_copy; a multiplication
// by 1/divisor differs from it in the last bit).
template <class H, bool Divide>
struct HalfScaleOp {  // T(float(x) * f) or T(float(x) / f)
  float f;
  __device__ H operator()(H x) const {
    const float v = to_float(x);
    return from_float<H>(Divide ? __fdiv_rn(v, f) : __fmul_rn(v, f));
  }
};
template <bool Divide>
struct FloatScaleOp {
  float f;
  __device__ float operator()(float x) const { return Divide ? __fdiv_rn(x, f) : __fmul_rn(x, f); }
};
template <bool Divide>
struct DoubleScaleOp {
  double f;
  __device__ double operator()(double x) const {
    return Divide ? __ddiv_rn(x, f) : __dmul_rn(x, f);
  }
};
template <class T>
struct IntDivOp {  // truncation toward zero in 64 bits
  long long d;
  __device__ T operator()(T x) const { return static_cast<T>(static_cast<long long>(x) / d); }
};
template <class H>
struct CompressOp {  // wire(src * scale)
  float f;
  __device__ H operator()(float x) const { return from_float<H>(__fmul_rn(x, f)); }
};
template <class H>
struct DecompressOp {  // float(wire) * scale
  float f;
  __device__ float operator()(H x) const { return __fmul_rn(to_float(x), f); }
};

// ---- reduce operations: dst = a (op) b with a = dst, b = src, exactly kolo::reduce ----

struct SumOp {
  template <class T>
  __device__ T operator()(T a, T b) const {
    if constexpr (is_half_v<T>) {
      return from_float<T>(__fadd_rn(to_float(a), to_float(b)));
    } else if constexpr (std::is_same_v<T, float>) {
      return __fadd_rn(a, b);
    } else if constexpr (std::is_same_v<T, double>) {
      return __dadd_rn(a, b);
    } else {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    }
  }
};
struct ProdOp {
  template <class T>
  __device__ T operator()(T a, T b) const {
    if constexpr (is_half_v<T>) {
      return from_float<T>(__fmul_rn(to_float(a), to_float(b)));
    } else if constexpr (std::is_same_v<T, float>) {
      return __fmul_rn(a, b);
    } else if constexpr (std::is_same_v<T, double>) {
      return __dmul_rn(a, b);
    } else {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
    }
  }
};
// min/max pick one operand, so 16-bit floats need no rounding: converting the pick back is
// exact (for a NaN the host would set the quiet bit; the NaN stays a NaN either way).
struct MinOp {
  template <class T>
  __device__ T operator()(T a, T b) const {
    if constexpr (is_half_v<T>) {
      return to_float(b) < to_float(a) ? b : a;
    } else {
      return b < a ? b : a;
    }
  }
};
struct MaxOp {
  template <class T>
  __device__ T operator()(T a, T b) const {
    if constexpr (is_half_v<T>) {
      return to_float(a) < to_float(b) ? b : a;
    } else {
      return a < b ? b : a;
    }
  }
};

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

// ---- host side: launch geometry ----

inline int current_device(const char* who) {
  int dev = 0;
  check(cudaGetDevice(&dev), who, "cudaGetDevice");
  return dev;
}

inline int sm_count(int dev, const char* who) {
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), who,
        "cudaDeviceGetAttribute(multiProcessorCount)");
  return sms > 0 ? sms : 1;
}

// Resident blocks per SM of a kernel (asked once per kernel; a failure just means "a few").
template <class Kernel>
int blocks_per_sm(Kernel kernel) {
  int b = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, kBlockThreads, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    b = 0;
  }
  return b > 0 ? b : 4;
}

inline unsigned grid_size(std::size_t wanted, int sms, int per_sm) {
  const std::size_t cap = static_cast<std::size_t>(sms) * static_cast<std::size_t>(per_sm);
  return static_cast<unsigned>(std::max<std::size_t>(1, std::min(wanted, cap)));
}

// ---- host side: descriptor upload ----

struct DeviceState {
  bool probed = false;
  cudaMemPool_t pool = nullptr;  // nullptr: no memory pools on this device
  // Fallback scratch (devices without memory pools).
  void* scratch = nullptr;
  std::size_t capacity = 0;
  cudaEvent_t last_use = nullptr;
  bool recorded = false;
};

inline std::mutex& state_mutex() {
  static std::mutex m;
  return m;
}

// Per device; the caller holds state_mutex(). Never destroyed: pools and buffers live as long as
// the process (tearing them down at static destruction could race the driver's own shutdown).
inline DeviceState& device_state(int dev) {
  static auto* states = new std::map<int, DeviceState>();
  return (*states)[dev];
}

// Tests set this to exercise the scratch-buffer path on a device that has memory pools.
inline std::atomic<bool>& force_scratch_fallback() {
  static std::atomic<bool> force{false};
  return force;
}

// Host copies of descriptors uploaded under stream capture: a graph replays the memcpy from
// this memory each time it is launched, so it is never freed.
inline const BatchDesc* retain_for_graph(const std::vector<BatchDesc>& descs) {
  static std::mutex m;
  static auto* kept = new std::vector<std::unique_ptr<BatchDesc[]>>();
  auto copy = std::make_unique<BatchDesc[]>(descs.size());
  std::copy(descs.begin(), descs.end(), copy.get());
  std::lock_guard<std::mutex> lock(m);
  kept->push_back(std::move(copy));
  return kept->back().get();
}

inline cudaMemPool_t descriptor_pool(DeviceState& st, int dev, const char* who) {
  if (!st.probed) {
    int supported = 0;
    check(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, dev), who,
          "cudaDeviceGetAttribute(memoryPoolsSupported)");
    if (supported) {
      cudaMemPoolProps props{};
      props.allocType = cudaMemAllocationTypePinned;
      props.handleTypes = cudaMemHandleTypeNone;
      props.location.type = cudaMemLocationTypeDevice;
      props.location.id = dev;
      check(cudaMemPoolCreate(&st.pool, &props), who, "cudaMemPoolCreate (descriptor pool)");
      // Keep what the pool holds (a few KiB): no unmapping and remapping at every sync.
      std::uint64_t keep = std::numeric_limits<std::uint64_t>::max();
      check(cudaMemPoolSetAttribute(st.pool, cudaMemPoolAttrReleaseThreshold, &keep), who,
            "cudaMemPoolSetAttribute(releaseThreshold)");
    }
    st.probed = true;
  }
  return st.pool;
}

// Copies `descs` to the device, calls launch(device_descs) and releases the copy, all in stream
// order on `stream`. descs is not empty.
template <class Launch>
void with_device_descriptors(const std::vector<BatchDesc>& descs, cudaStream_t stream,
                             const char* who, Launch&& launch) {
  const std::size_t bytes = descs.size() * sizeof(BatchDesc);
  const int dev = current_device(who);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &capture), who, "cudaStreamIsCapturing");
  if (capture == cudaStreamCaptureStatusInvalidated) {
    throw Error(std::string(who) + ": the stream's capture has been invalidated");
  }

  // Memory from a stream-ordered allocation, freed after the kernel on the same stream.
  // From pageable memory (measured on H100: for small uploads the driver's path from pageable
  // memory delays the kernel that follows less than a copy-engine DMA from pinned memory does).
  const auto run_stream_ordered = [&](void* d, const BatchDesc* host) {
    struct Release {  // frees on error paths too (best effort: the first error is reported)
      void* p;
      cudaStream_t s;
      ~Release() {
        if (p != nullptr) (void)cudaFreeAsync(p, s);
      }
    } release{d, stream};
    check(cudaMemcpyAsync(d, host, bytes, cudaMemcpyHostToDevice, stream), who,
          "cudaMemcpyAsync (descriptor upload)");
    launch(static_cast<const BatchDesc*>(d));
    release.p = nullptr;
    check(cudaFreeAsync(d, stream), who, "cudaFreeAsync (descriptors)");
  };

  if (capture == cudaStreamCaptureStatusActive) {
    // Graph-owned memory (an alloc and a free node); the host copy outlives every replay.
    const BatchDesc* host = retain_for_graph(descs);
    void* d = nullptr;
    check(cudaMallocAsync(&d, bytes, stream), who, "cudaMallocAsync (descriptors, captured)");
    run_stream_ordered(d, host);
    return;
  }

  std::unique_lock<std::mutex> lock(state_mutex());
  DeviceState& st = device_state(dev);
  cudaMemPool_t pool = descriptor_pool(st, dev, who);
  if (pool != nullptr && !force_scratch_fallback().load()) {
    lock.unlock();
    void* d = nullptr;
    check(cudaMallocFromPoolAsync(&d, bytes, pool, stream), who,
          "cudaMallocFromPoolAsync (descriptors)");
    run_stream_ordered(d, descs.data());
    return;
  }

  // Fallback: one growable buffer per device. The lock is held until the kernel is queued and
  // the event recorded; the next upload (any stream) waits for that event on the device.
  if (st.last_use == nullptr) {
    check(cudaEventCreateWithFlags(&st.last_use, cudaEventDisableTiming), who,
          "cudaEventCreate (descriptor scratch)");
  }
  if (st.capacity < bytes) {
    if (st.recorded) {
      check(cudaEventSynchronize(st.last_use), who, "cudaEventSynchronize (descriptor scratch)");
    }
    if (st.scratch != nullptr) {
      check(cudaFree(st.scratch), who, "cudaFree (descriptor scratch)");
      st.scratch = nullptr;
      st.capacity = 0;
    }
    const std::size_t want = std::max<std::size_t>({bytes, 2 * st.capacity, 4096});
    check(cudaMalloc(&st.scratch, want), who, "cudaMalloc (descriptor scratch)");
    st.capacity = want;
  }
  if (st.recorded) {
    check(cudaStreamWaitEvent(stream, st.last_use, 0), who,
          "cudaStreamWaitEvent (descriptor scratch)");
  }
  struct Record {  // records even when the launch fails, after the copy may have been queued
    DeviceState& st;
    cudaStream_t s;
    bool armed = false;
    ~Record() {
      if (armed && cudaEventRecord(st.last_use, s) == cudaSuccess) st.recorded = true;
    }
  } record{st, stream};
  record.armed = true;
  check(cudaMemcpyAsync(st.scratch, descs.data(), bytes, cudaMemcpyHostToDevice, stream), who,
        "cudaMemcpyAsync (descriptor upload)");
  launch(static_cast<const BatchDesc*>(st.scratch));
  record.armed = false;
  check(cudaEventRecord(st.last_use, stream), who, "cudaEventRecord (descriptor scratch)");
  st.recorded = true;
}

// ---- host side: one batch ----

// This thread's descriptor vector, reused from call to call: allocating and first touching
// 32 KB for 1000 tensors cost the host ~10 us per call (measured on H100 hosts).
inline std::vector<BatchDesc>& descriptor_scratch() {
  thread_local std::vector<BatchDesc> descs;
  return descs;
}

// The batch as descriptors: pack reads items' src and writes buf; unpack reads buf and writes
// items' dst (items without one are skipped). Items without elements are dropped.
template <class In, class Out>
void make_descriptors(const FusionItem* items, std::size_t n, bool packing, const void* buf,
                      std::size_t* end, const char* who, std::vector<BatchDesc>& descs) {
  using G = Geometry<In, Out>;
  descs.clear();
  if (descs.capacity() > (std::size_t{1} << 16) && n < (std::size_t{1} << 16)) {
    std::vector<BatchDesc>().swap(descs);  // do not keep megabytes after one huge batch
  }
  descs.reserve(n);
  std::size_t begin = 0;
  *end = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const FusionItem& it = items[i];
    if (it.count == 0 || (!packing && it.dst == nullptr)) continue;
    if (buf == nullptr) throw ConfigError(std::string(who) + ": the fusion buffer is null");
    BatchDesc d{};
    if (packing) {
      d.src = it.src;
      d.dst = static_cast<Out*>(const_cast<void*>(buf)) + it.offset;
    } else {
      d.src = static_cast<const In*>(buf) + it.offset;
      d.dst = it.dst;
    }
    d.count = it.count;
    d.begin = begin;
    *end = begin + it.count;
    descs.push_back(d);
    begin += (it.count + G::lanes - 1) / G::lanes * G::lanes + G::overhead;
  }
}

template <class In, class Out, class Cvt>
void run_batch(const FusionItem* items, std::size_t n, bool packing, const void* buf, Cvt cvt,
               cudaStream_t stream, const char* who) {
  using G = Geometry<In, Out>;
  std::size_t end = 0;
  std::vector<BatchDesc>& descs = descriptor_scratch();
  make_descriptors<In, Out>(items, n, packing, buf, &end, who, descs);
  if (descs.empty()) return;
  // One contiguous range of the work space per warp, all of the same size: min_task each, so
  // that there are many more blocks than the GPU holds at once and its block scheduler balances
  // the load (measured on H100, 64 MiB: one resident wave of persistent warps reached 89% of a
  // D2D copy's bandwidth, this 98%); ranges grow only past kMaxWaves waves (huge batches).
  const int dev = current_device(who);
  static const int per_sm = blocks_per_sm(batch_kernel<In, Out, Cvt>);
  const std::size_t warps_wanted = (end + G::min_task - 1) / G::min_task;
  const unsigned grid = grid_size((warps_wanted + kWarpsPerBlock - 1) / kWarpsPerBlock,
                                  sm_count(dev, who), per_sm * kMaxWaves);
  const std::size_t warps = static_cast<std::size_t>(grid) * kWarpsPerBlock;
  const std::size_t task = ((end + warps - 1) / warps + G::lanes - 1) / G::lanes * G::lanes;
  const auto launch = [&](const BatchDesc* d, const InlineDescs& inl) {
    batch_kernel<In, Out, Cvt>
        <<<grid, kBlockThreads, 0, stream>>>(d, descs.size(), task, end, cvt, inl);
    check(cudaGetLastError(), who, "launching the batch kernel");
  };
  if (descs.size() <= kInlineDescs) {
    InlineDescs inl{};
    std::copy(descs.begin(), descs.end(), inl.d);
    launch(nullptr, inl);
    return;
  }
  with_device_descriptors(descs, stream, who,
                          [&](const BatchDesc* d) { launch(d, InlineDescs{}); });
}

// Same-type copies by element size: one kernel per size, whatever the dtype.
inline void run_copy(const FusionItem* items, std::size_t n, bool packing, const void* buf,
                     DataType t, cudaStream_t stream, const char* who) {
  switch (dtype_size(t)) {
    case 1:
      return run_batch<std::uint8_t, std::uint8_t>(items, n, packing, buf, CopyOp{}, stream, who);
    case 2:
      return run_batch<std::uint16_t, std::uint16_t>(items, n, packing, buf, CopyOp{}, stream, who);
    case 4:
      return run_batch<std::uint32_t, std::uint32_t>(items, n, packing, buf, CopyOp{}, stream, who);
    case 8:
      return run_batch<std::uint64_t, std::uint64_t>(items, n, packing, buf, CopyOp{}, stream, who);
    default:
      throw ConfigError(std::string(who) + ": invalid DataType value " +
                        std::to_string(static_cast<int>(t)));
  }
}

// Same-type scaling (floating types; the factor is computed like detail::scaled_copy's): by
// `factor`, or with Divide divided by it (an average's divisor, scale 1).
template <bool Divide = false>
inline void run_scale(const FusionItem* items, std::size_t n, bool packing, const void* buf,
                      DataType t, double factor, cudaStream_t stream, const char* who) {
  const auto f = static_cast<float>(factor);
  switch (t) {
    case DataType::float16:
      return run_batch<kolo::float16, kolo::float16>(
          items, n, packing, buf, HalfScaleOp<kolo::float16, Divide>{f}, stream, who);
    case DataType::bfloat16:
      return run_batch<kolo::bfloat16, kolo::bfloat16>(
          items, n, packing, buf, HalfScaleOp<kolo::bfloat16, Divide>{f}, stream, who);
    case DataType::float32:
      return run_batch<float, float>(items, n, packing, buf, FloatScaleOp<Divide>{f}, stream, who);
    case DataType::float64:
      return run_batch<double, double>(items, n, packing, buf, DoubleScaleOp<Divide>{factor},
                                       stream, who);
    default:
      throw ConfigError(std::string(who) + ": cannot scale " + std::string(dtype_name(t)));
  }
}

inline bool is_half_dtype(DataType t) {
  return t == DataType::float16 || t == DataType::bfloat16;
}

inline std::string dtype_str(DataType t) {
  const std::string_view n = dtype_name(t);
  if (n == "invalid") return "invalid DataType " + std::to_string(static_cast<int>(t));
  return std::string(n);
}

}  // namespace kernel_detail

// buf[offset + i] = wire(src[i] * scale) for every item, in one launch (see FusionKernels::pack).
inline void pack(const FusionItem* items, std::size_t n, DataType in, DataType wire, void* buf,
                 double scale, cudaStream_t stream) {
  namespace kd = kernel_detail;
  constexpr const char* who = "kolo::cuda::pack";
  const bool same = in == wire && dtype_name(in) != "invalid";
  const bool compress = in == DataType::float32 && kd::is_half_dtype(wire);
  if (!same && !compress) {
    throw ConfigError(std::string(who) + ": cannot pack " + kd::dtype_str(in) + " tensors into a " +
                      kd::dtype_str(wire) +
                      " buffer (supported: the tensors' own type, or float32 into float16 or "
                      "bfloat16)");
  }
  if (!dtype_is_floating(in) && scale != 1.0) {
    throw ConfigError(std::string(who) + ": " + kd::dtype_str(in) +
                      " tensors cannot be scaled (by " + std::to_string(scale) +
                      "): scale factors need a floating type");
  }
  if (n == 0) return;
  if (items == nullptr) throw ConfigError(std::string(who) + ": items is null");
  if (compress) {
    const float f = static_cast<float>(scale);
    if (wire == DataType::float16) {
      kd::run_batch<float, kolo::float16>(items, n, true, buf, kd::CompressOp<kolo::float16>{f},
                                          stream, who);
    } else {
      kd::run_batch<float, kolo::bfloat16>(items, n, true, buf, kd::CompressOp<kolo::bfloat16>{f},
                                           stream, who);
    }
  } else if (scale == 1.0 || !dtype_is_floating(in)) {
    kd::run_copy(items, n, true, buf, in, stream, who);
  } else {
    kd::run_scale(items, n, true, buf, in, scale, stream, who);
  }
}

// dst[i] = out(buf[offset + i]) * (scale / divisor) for every item with a dst, in one launch
// (see FusionKernels::unpack); with scale 1, buf / divisor (a true division, as the host's).
// Integers: buf / divisor, truncated toward zero (scale must be 1).
inline void unpack(const FusionItem* items, std::size_t n, DataType wire, DataType out,
                   const void* buf, double scale, int divisor, cudaStream_t stream) {
  namespace kd = kernel_detail;
  constexpr const char* who = "kolo::cuda::unpack";
  const bool same = wire == out && dtype_name(out) != "invalid";
  const bool decompress = out == DataType::float32 && kd::is_half_dtype(wire);
  if (!same && !decompress) {
    throw ConfigError(std::string(who) + ": cannot unpack a " + kd::dtype_str(wire) +
                      " buffer into " + kd::dtype_str(out) +
                      " tensors (supported: the buffer's own type, or float16 or bfloat16 into "
                      "float32)");
  }
  if (!dtype_is_floating(out)) {
    if (scale != 1.0) {
      throw ConfigError(std::string(who) + ": " + kd::dtype_str(out) +
                        " tensors cannot be scaled (by " + std::to_string(scale) +
                        "): scale factors need a floating type");
    }
    if (divisor == 0) throw ConfigError(std::string(who) + ": integer division by a divisor of 0");
  }
  if (n == 0) return;
  if (items == nullptr) throw ConfigError(std::string(who) + ": items is null");
  if (decompress) {
    const float f = static_cast<float>(scale / divisor);
    if (wire == DataType::float16) {
      kd::run_batch<kolo::float16, float>(items, n, false, buf, kd::DecompressOp<kolo::float16>{f},
                                          stream, who);
    } else {
      kd::run_batch<kolo::bfloat16, float>(items, n, false, buf,
                                           kd::DecompressOp<kolo::bfloat16>{f}, stream, who);
    }
  } else if (scale == 1.0 && divisor == 1) {
    kd::run_copy(items, n, false, buf, out, stream, who);
  } else if (dtype_is_floating(out) && scale == 1.0) {
    kd::run_scale<true>(items, n, false, buf, out, divisor, stream, who);  // x / divisor
  } else if (dtype_is_floating(out)) {
    kd::run_scale(items, n, false, buf, out, scale / divisor, stream, who);
  } else {
    visit_dtype(out, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_integral_v<T>) {
        kd::run_batch<T, T>(items, n, false, buf, kd::IntDivOp<T>{divisor}, stream, who);
      }
    });
  }
}

// dst[i] = dst[i] (op) src[i], exactly kolo::reduce (see FusionKernels::reduce).
inline void reduce(void* dst, const void* src, std::size_t n, DataType t, ReduceOp op,
                   cudaStream_t stream) {
  namespace kd = kernel_detail;
  constexpr const char* who = "kolo::cuda::reduce";
  if (reduce_op_name(op) == "invalid") {
    throw ConfigError(std::string(who) + ": invalid ReduceOp value " +
                      std::to_string(static_cast<int>(op)));
  }
  if (dtype_name(t) == "invalid") throw ConfigError(std::string(who) + ": " + kd::dtype_str(t));
  if (n == 0) return;
  if (dst == nullptr || src == nullptr) {
    throw ConfigError(std::string(who) + ": null pointer for " + std::to_string(n) + " elements");
  }
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    const auto launch = [&](auto opf) {
      using Op = decltype(opf);
      constexpr std::size_t L = 16 / sizeof(T);
      const auto da = reinterpret_cast<std::uintptr_t>(dst);
      const auto sa = reinterpret_cast<std::uintptr_t>(src);
      const bool vec = da % sizeof(T) == 0 && sa % sizeof(T) == 0 && da % 16 == sa % 16;
      const std::size_t head =
          vec ? std::min<std::size_t>(((16 - da % 16) % 16) / sizeof(T), n) : 0;
      const std::size_t units = vec ? (n - head) / L : n;
      const int dev = kd::current_device(who);
      static const int per_sm = kd::blocks_per_sm(kd::reduce_kernel<T, Op>);
      const std::size_t per_block = kd::kBlockThreads * kd::kUnroll;
      const unsigned grid =
          kd::grid_size((units + per_block - 1) / per_block, kd::sm_count(dev, who), per_sm);
      kd::reduce_kernel<T, Op><<<grid, kd::kBlockThreads, 0, stream>>>(
          static_cast<T*>(dst), static_cast<const T*>(src), n, head, vec, opf);
      kd::check(cudaGetLastError(), who, "launching the reduce kernel");
    };
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::average:  // the division is finish_average's
        return launch(kd::SumOp{});
      case ReduceOp::product:
        return launch(kd::ProdOp{});
      case ReduceOp::min:
        return launch(kd::MinOp{});
      case ReduceOp::max:
        return launch(kd::MaxOp{});
    }
  });
}

namespace kernel_detail {

inline void pack_erased(const FusionItem* items, std::size_t n, DataType in, DataType wire,
                        void* buf, double scale, void* stream) {
  cuda::pack(items, n, in, wire, buf, scale, static_cast<cudaStream_t>(stream));
}
inline void unpack_erased(const FusionItem* items, std::size_t n, DataType wire, DataType out,
                          const void* buf, double scale, int divisor, void* stream) {
  cuda::unpack(items, n, wire, out, buf, scale, divisor, static_cast<cudaStream_t>(stream));
}
inline void reduce_erased(void* dst, const void* src, std::size_t n, DataType t, ReduceOp op,
                          void* stream) {
  cuda::reduce(dst, src, n, t, op, static_cast<cudaStream_t>(stream));
}

inline constexpr FusionKernels kernel_table{&pack_erased, &unpack_erased, &reduce_erased};

}  // namespace kernel_detail

// Registers the table at start-up in every program that includes this header (one definition
// across translation units: an inline variable).
inline const bool kernels_registered = [] {
  registered_kernels() = &kernel_detail::kernel_table;
  return true;
}();

}  // namespace kolo::cuda
