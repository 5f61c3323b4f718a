// kolo/cuda/kernels/element_ops.cuh — the device's element arithmetic: float16/bfloat16
// conversions and the per-element functors of pack/unpack (copy, scale, divide, compress,
// decompress) and of reduce (sum, product, min, max), each rounding exactly as the host does.
//
// Included by kolo/cuda/kernels.cuh (not a public header: include that one); self-contained.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "kolo/core/float16.hpp"

namespace kolo::cuda::kernel_detail {

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

}  // namespace kolo::cuda::kernel_detail
