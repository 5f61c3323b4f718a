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

#include "kolo/core/dtype.hpp"
#include "kolo/core/float16.hpp"

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#endif

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

// Native element types: vector body + scalar tail. Unaligned loads/stores via memcpy.
template <class T, class Op>
void reduce_native(T* dst, const T* a, const T* b, std::size_t n) noexcept {
  using V = vec16<T>;
  constexpr std::size_t lanes = sizeof(V) / sizeof(T);
  constexpr std::size_t unroll = 4;
  std::size_t i = 0;
  for (; i + unroll * lanes <= n; i += unroll * lanes) {
    V va[unroll], vb[unroll];
    std::memcpy(va, a + i, sizeof(va));
    std::memcpy(vb, b + i, sizeof(vb));
    for (std::size_t k = 0; k < unroll; ++k) va[k] = Op::apply_vec(va[k], vb[k]);
    std::memcpy(dst + i, va, sizeof(va));
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
// float16 with F16C: 8 lanes widened to fp32, reduced, rounded back (to nearest even). Compiled
// for F16C+AVX whatever the build's -m flags and called only when the CPU has them (checked
// once, at run time): portable builds then get the vector path too — the fp16-compressed
// allreduce reduces float16 on every ring step, and the scalar conversion is ~5x slower.
template <class Op>
[[gnu::target("f16c,avx")]] std::size_t reduce_f16_f16c(float16* dst, const float16* a,
                                                        const float16* b, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 fa = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    const __m256 fb = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    __m256 r;
    if constexpr (std::is_same_v<Op, OpSum>)
      r = _mm256_add_ps(fa, fb);
    else if constexpr (std::is_same_v<Op, OpProd>)
      r = _mm256_mul_ps(fa, fb);
    else if constexpr (std::is_same_v<Op, OpMin>)
      r = _mm256_min_ps(fb, fa);
    else
      r = _mm256_max_ps(fb, fa);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
  }
  return i;
}
inline bool reduce_cpu_has_f16c() noexcept {
#if defined(__F16C__) && defined(__AVX__)
  return true;  // the build already requires it
#else
  // cpuid rather than __builtin_cpu_supports("f16c"), which clang before 16 rejects.
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0 &&
           __builtin_cpu_supports("avx");
  }();
  return has;
#endif
}

// bfloat16 with AVX2: widening is a 16-bit shift, narrowing rounds to nearest even on the
// dropped 16 bits and keeps NaNs quiet — bit for bit detail::float_to_bfloat16_bits.
[[gnu::target("avx2")]] inline __m256 bf16x8_to_f32x8(const std::uint16_t* p) noexcept {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
[[gnu::target("avx2")]] inline void f32x8_to_bf16x8(__m256 v, std::uint16_t* p) noexcept {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(x, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
  const __m256i absx = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
  const __m256i nan = _mm256_cmpgt_epi32(absx, _mm256_set1_epi32(0x7f800000));
  const __m256i quiet = _mm256_or_si256(x, _mm256_set1_epi32(0x00400000));
  const __m256i r = _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet, nan), 16);
  const __m128i packed =
      _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}
template <class Op>
[[gnu::target("avx2")]] std::size_t reduce_bf16_avx2(bfloat16* dst, const bfloat16* a,
                                                     const bfloat16* b, std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 fa = bf16x8_to_f32x8(reinterpret_cast<const std::uint16_t*>(a + i));
    const __m256 fb = bf16x8_to_f32x8(reinterpret_cast<const std::uint16_t*>(b + i));
    __m256 r;
    if constexpr (std::is_same_v<Op, OpSum>)
      r = _mm256_add_ps(fa, fb);
    else if constexpr (std::is_same_v<Op, OpProd>)
      r = _mm256_mul_ps(fa, fb);
    else if constexpr (std::is_same_v<Op, OpMin>)
      r = _mm256_min_ps(fb, fa);
    else
      r = _mm256_max_ps(fb, fa);
    f32x8_to_bf16x8(r, reinterpret_cast<std::uint16_t*>(dst + i));
  }
  return i;
}
inline bool cpu_has_avx2() noexcept {
#if defined(__AVX2__)
  return true;
#else
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
#endif
}
#endif

// 16-bit floats: widen to float, reduce, round back (round-to-nearest-even).
template <class H, class Op>
void reduce_half(H* dst, const H* a, const H* b, std::size_t n) noexcept {
  std::size_t i = 0;
#ifdef KOLO_REDUCE_F16C
  if constexpr (std::is_same_v<H, float16>) {
    if (reduce_cpu_has_f16c()) i = reduce_f16_f16c<Op>(dst, a, b, n);
  } else if constexpr (std::is_same_v<H, bfloat16>) {
    if (cpu_has_avx2()) i = reduce_bf16_avx2<Op>(dst, a, b, n);
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
