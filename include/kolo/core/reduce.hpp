// kolo/core/reduce.hpp — host reduce kernels: dst = a (op) b, elementwise.
//
// Templated on the element type and the operation because this is the inner loop where the type
// matters to speed (Gloo's lesson: template the hot loop, erase everything else). The body works
// on 16-byte GCC/Clang vector types so it vectorises at -O2 without -march flags; float16/bfloat16
// go through float, which is how the reduction is defined (arithmetic in fp32, storage in 16 bits).
//
// Average is reduced as a sum; the caller divides by the rank count once at the end
// (`finish_average`), so a ring of n ranks performs n-1 additions and one division per element.
// Integer averages truncate toward zero, like C++ integer division.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kolo/core/compiled_core.hpp"
#include "kolo/core/dtype.hpp"
#include "kolo/core/float16.hpp"

namespace kolo {

namespace detail {

// 16 bytes: the SSE2/NEON width every x86-64/aarch64 build has, so passing it never changes
// the ABI (-Wpsabi); four per iteration keep enough loads in flight to saturate memory.
template <class T>
using vec16 [[gnu::vector_size(16)]] = T;

// Signed overflow in vector lanes is undefined just as in scalars (UBSan reports it), so signed
// integer lanes are added and multiplied as unsigned: the two's-complement wraparound we promise.
template <class V, class F>
V wrapping_lanes(V a, V b, F f) noexcept {
  using E = std::remove_cvref_t<decltype(a[0])>;
  if constexpr (std::is_integral_v<E> && std::is_signed_v<E>) {
    using UV = vec16<std::make_unsigned_t<E>>;
    return std::bit_cast<V>(f(std::bit_cast<UV>(a), std::bit_cast<UV>(b)));
  } else {
    return f(a, b);
  }
}

struct OpSum {
  template <class T>
  static T apply(T a, T b) noexcept {
    if constexpr (std::is_integral_v<T>) {  // wrap like the hardware, never UB
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return a + b;
    }
  }
  template <class V>
  static V apply_vec(V a, V b) noexcept {
    return wrapping_lanes(a, b, [](auto x, auto y) { return x + y; });
  }
};
struct OpProd {
  template <class T>
  static T apply(T a, T b) noexcept {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
    } else {
      return a * b;
    }
  }
  template <class V>
  static V apply_vec(V a, V b) noexcept {
    return wrapping_lanes(a, b, [](auto x, auto y) { return x * y; });
  }
};
struct OpMin {
  template <class T>
  static T apply(T a, T b) noexcept {
    return b < a ? b : a;
  }
  template <class V>
  static V apply_vec(V a, V b) noexcept {
    return b < a ? b : a;
  }
};
struct OpMax {
  template <class T>
  static T apply(T a, T b) noexcept {
    return a < b ? b : a;
  }
  template <class V>
  static V apply_vec(V a, V b) noexcept {
    return a < b ? b : a;
  }
};

// One 16-byte vector from `p` (unaligned: memcpy).
template <class V, class T>
V load_vec(const T* p) noexcept {
  V v;
  std::memcpy(&v, p, sizeof(V));
  return v;
}
template <class V, class T>
void store_vec(T* p, V v) noexcept {
  std::memcpy(p, &v, sizeof(V));
}

// Native element types: vector body + scalar tail. Unaligned loads/stores via memcpy.
// Four vectors per iteration, written out: as arrays with a loop over them, g++ -O2 (which does
// not unroll that loop; -O3 does) kept them on the stack and the 4 MiB allreduce took 1.65x as
// long as at -O3. Written out, every -O level gets the same loop.
template <class T, class Op>
void reduce_native(T* dst, const T* a, const T* b, std::size_t n) noexcept {
  using V = vec16<T>;
  constexpr std::size_t lanes = sizeof(V) / sizeof(T);
  std::size_t i = 0;
  for (; i + 4 * lanes <= n; i += 4 * lanes) {
    const V r0 = Op::apply_vec(load_vec<V>(a + i), load_vec<V>(b + i));
    const V r1 = Op::apply_vec(load_vec<V>(a + i + lanes), load_vec<V>(b + i + lanes));
    const V r2 = Op::apply_vec(load_vec<V>(a + i + 2 * lanes), load_vec<V>(b + i + 2 * lanes));
    const V r3 = Op::apply_vec(load_vec<V>(a + i + 3 * lanes), load_vec<V>(b + i + 3 * lanes));
    store_vec(dst + i, r0);
    store_vec(dst + i + lanes, r1);
    store_vec(dst + i + 2 * lanes, r2);
    store_vec(dst + i + 3 * lanes, r3);
  }
  // The tail too goes through memcpy: operands may be misaligned (a TCP staging buffer holds a
  // float64 payload at whatever offset the frames before it left), and a typed load would be UB.
  for (; i < n; ++i) {
    T x, y;
    std::memcpy(&x, a + i, sizeof(T));
    std::memcpy(&y, b + i, sizeof(T));
    x = Op::apply(x, y);
    std::memcpy(dst + i, &x, sizeof(T));
  }
}

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define KOLO_REDUCE_F16C 1
// The x86 vector kernels for the 16-bit floats, defined in detail/simd_x86.hpp (which needs
// <immintrin.h>, kept out of the public path: see that file). float16 with F16C and bfloat16
// with AVX2: 8 lanes widened to fp32, reduced, rounded back to nearest even. Compiled for their
// instruction set whatever the build's -m flags and called only when the CPU has it: portable
// builds then get the vector path too — the fp16-compressed allreduce reduces float16 on every
// ring step, and the scalar conversion is ~5x slower. Each returns how many leading elements it
// reduced (a multiple of 8); the caller does the rest.
enum class SimdOp { sum, prod, min, max };
KOLO_IMPL_INLINE bool cpu_has_f16c() noexcept;  // F16C and AVX
KOLO_IMPL_INLINE bool cpu_has_avx2() noexcept;
KOLO_IMPL_INLINE std::size_t reduce_f16_simd(SimdOp op, float16* dst, const float16* a,
                                             const float16* b, std::size_t n) noexcept;
KOLO_IMPL_INLINE std::size_t reduce_bf16_simd(SimdOp op, bfloat16* dst, const bfloat16* a,
                                              const bfloat16* b, std::size_t n) noexcept;
// The compressor's conversions (compression/compressor.hpp), all n elements times `scale`; call
// them only when cpu_has_f16c() / cpu_has_avx2() says so.
KOLO_IMPL_INLINE void f32_to_f16_f16c(const float* s, std::uint16_t* d, std::size_t n,
                                      float scale) noexcept;
KOLO_IMPL_INLINE void f16_to_f32_f16c(const std::uint16_t* s, float* d, std::size_t n,
                                      float scale) noexcept;
KOLO_IMPL_INLINE void f32_to_bf16_avx2(const float* s, std::uint16_t* d, std::size_t n,
                                       float scale) noexcept;
KOLO_IMPL_INLINE void bf16_to_f32_avx2(const std::uint16_t* s, float* d, std::size_t n,
                                       float scale) noexcept;
// The compressed ring's fold of a received 16-bit segment, in one pass (see
// Fp16Compressor::fold): v = float(w[i]), plus local[i] when local is set, divided by divisor when
// it is > 1, rounded to the wire type and back when round is set (and the wire value stored to
// wire[i] when wire is not null); dst[i] = v.
KOLO_IMPL_INLINE void fold_f16_f16c(const std::uint16_t* w, const float* local, float* dst,
                                    std::size_t n, int divisor, bool round,
                                    std::uint16_t* wire) noexcept;
KOLO_IMPL_INLINE void fold_bf16_avx2(const std::uint16_t* w, const float* local, float* dst,
                                     std::size_t n, int divisor, bool round,
                                     std::uint16_t* wire) noexcept;

template <class Op>
constexpr SimdOp simd_op() noexcept {
  if constexpr (std::is_same_v<Op, OpSum>)
    return SimdOp::sum;
  else if constexpr (std::is_same_v<Op, OpProd>)
    return SimdOp::prod;
  else if constexpr (std::is_same_v<Op, OpMin>)
    return SimdOp::min;
  else
    return SimdOp::max;
}
#endif

// 16-bit floats: widen to float, reduce, round back (round-to-nearest-even).
template <class H, class Op>
void reduce_half(H* dst, const H* a, const H* b, std::size_t n) noexcept {
  std::size_t i = 0;
#ifdef KOLO_REDUCE_F16C
  if constexpr (std::is_same_v<H, float16>) {
    if (cpu_has_f16c()) i = reduce_f16_simd(simd_op<Op>(), dst, a, b, n);
  } else if constexpr (std::is_same_v<H, bfloat16>) {
    if (cpu_has_avx2()) i = reduce_bf16_simd(simd_op<Op>(), dst, a, b, n);
  }
#endif
  for (; i < n; ++i) {  // memcpy: operands may be misaligned (see reduce_native)
    H x, y;
    std::memcpy(&x, a + i, sizeof(H));
    std::memcpy(&y, b + i, sizeof(H));
    const H r = H(Op::apply(static_cast<float>(x), static_cast<float>(y)));
    std::memcpy(dst + i, &r, sizeof(H));
  }
}

template <class T, class Op>
void reduce_typed(void* dst, const void* a, const void* b, std::size_t n) noexcept {
  if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
    reduce_half<T, Op>(static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), n);
  } else {
    reduce_native<T, Op>(static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b),
                         n);
  }
}

}  // namespace detail

// The type-erased kernel: one function pointer per (dtype, op), chosen once per collective.
using ReduceFn = void (*)(void* dst, const void* a, const void* b, std::size_t n) noexcept;

inline ReduceFn reduce_function(DataType t, ReduceOp op) {
  return visit_dtype(t, [op](auto tag) -> ReduceFn {
    using T = decltype(tag);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::average:
        return &detail::reduce_typed<T, detail::OpSum>;
      case ReduceOp::product:
        return &detail::reduce_typed<T, detail::OpProd>;
      case ReduceOp::min:
        return &detail::reduce_typed<T, detail::OpMin>;
      case ReduceOp::max:
        return &detail::reduce_typed<T, detail::OpMax>;
    }
    throw ConfigError("invalid ReduceOp value " + std::to_string(static_cast<int>(op)));
  });
}

// dst[i] = a[i] op b[i] for i < count; dst may alias a or b.
inline void reduce(void* dst, const void* a, const void* b, std::size_t count, DataType t,
                   ReduceOp op) {
  reduce_function(t, op)(dst, a, b, count);
}

// Divides by `divisor` in place: the last step of ReduceOp::average.
inline void finish_average(void* data, std::size_t count, DataType t, int divisor) {
  if (divisor <= 1) return;
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(data);
    if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
      const float d = static_cast<float>(divisor);
      for (std::size_t i = 0; i < count; ++i) p[i] = T(static_cast<float>(p[i]) / d);
    } else if constexpr (std::is_integral_v<T>) {
      // Divide in 64 bits: narrowing the rank count to T would make 200 ranks -56 for int8 and
      // 256 ranks a division by zero for uint8. The quotient always fits back into T.
      const std::int64_t d = divisor;
      for (std::size_t i = 0; i < count; ++i) {
        p[i] = static_cast<T>(static_cast<std::int64_t>(p[i]) / d);
      }
    } else {
      const T d = static_cast<T>(divisor);
      for (std::size_t i = 0; i < count; ++i) p[i] = p[i] / d;
    }
  });
}

}  // namespace kolo

// Header-only: the vector kernels' definitions, inline. With the compiled core they are in the
// library (src/lib/core_impl.cpp).
#if defined(KOLO_REDUCE_F16C) && !KOLO_USE_COMPILED_CORE
#include "kolo/core/detail/simd_x86.hpp"
#endif
