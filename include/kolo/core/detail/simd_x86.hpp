// kolo/core/detail/simd_x86.hpp — the x86 vector kernels of reduce.hpp and compressor.hpp
// (F16C/AVX2 conversions between float32 and the 16-bit float types), kept out of the public
// headers' path.
//
// They need <immintrin.h>, which costs about a second of compile time on its own, more than all
// the standard headers kolo includes together. Header-only, reduce.hpp includes this file, and
// the functions are inline; with the compiled core (KOLO_COMPILED_CORE, core/compiled_core.hpp)
// only the library compiles it (src/lib/core_impl.cpp) and a user's file sees the declarations
// in reduce.hpp. Each kernel is compiled for its instruction set whatever the build's -m flags and
// called only when the CPU has it (checked once, at run time), so the binary stays portable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kolo/core/compiled_core.hpp"
#include "kolo/core/float16.hpp"
#include "kolo/core/reduce.hpp"

#ifdef KOLO_REDUCE_F16C
#include <cpuid.h>
#include <immintrin.h>

namespace kolo::detail {

namespace simd {

// One operation on 8 fp32 lanes; min and max take `b` first, so a NaN in `a` is kept as the
// scalar path keeps it.
template <SimdOp Op>
[[gnu::target("avx")]] inline __m256 apply_ps(__m256 a, __m256 b) noexcept {
  if constexpr (Op == SimdOp::sum)
    return _mm256_add_ps(a, b);
  else if constexpr (Op == SimdOp::prod)
    return _mm256_mul_ps(a, b);
  else if constexpr (Op == SimdOp::min)
    return _mm256_min_ps(b, a);
  else
    return _mm256_max_ps(b, a);
}

// float16 with F16C: 8 lanes widened to fp32, reduced, rounded back (to nearest even).
template <SimdOp Op>
[[gnu::target("f16c,avx")]] std::size_t reduce_f16(float16* dst, const float16* a, const float16* b,
                                                   std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 fa = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    const __m256 fb = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    const __m256 r = apply_ps<Op>(fa, fb);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT));
  }
  return i;
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
template <SimdOp Op>
[[gnu::target("avx2")]] std::size_t reduce_bf16(bfloat16* dst, const bfloat16* a, const bfloat16* b,
                                                std::size_t n) noexcept {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 fa = bf16x8_to_f32x8(reinterpret_cast<const std::uint16_t*>(a + i));
    const __m256 fb = bf16x8_to_f32x8(reinterpret_cast<const std::uint16_t*>(b + i));
    const __m256 r = apply_ps<Op>(fa, fb);
    f32x8_to_bf16x8(r, reinterpret_cast<std::uint16_t*>(dst + i));
  }
  return i;
}

// The compressor's conversions, times `scale`. `i < whole` rather than `i + 8 <= n`: GCC (-O3,
// inlined with a known bound) otherwise warns that a wrapped `i + 8` would be undefined.
[[gnu::target("f16c,avx")]] inline void f32_to_f16(const float* s, std::uint16_t* d, std::size_t n,
                                                   float scale) noexcept {
  const __m256 k = _mm256_set1_ps(scale);
  const std::size_t whole = n - n % 8;
  std::size_t i = 0;
  for (; i < whole; i += 8) {
    const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(s + i), k);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < n; ++i) d[i] = float_to_half_bits(s[i] * scale);
}
[[gnu::target("f16c,avx")]] inline void f16_to_f32(const std::uint16_t* s, float* d, std::size_t n,
                                                   float scale) noexcept {
  const __m256 k = _mm256_set1_ps(scale);
  const std::size_t whole = n - n % 8;
  std::size_t i = 0;
  for (; i < whole; i += 8) {
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
    _mm256_storeu_ps(d + i, _mm256_mul_ps(v, k));
  }
  for (; i < n; ++i) d[i] = half_bits_to_float(s[i]) * scale;
}
[[gnu::target("avx2")]] inline void f32_to_bf16(const float* s, std::uint16_t* d, std::size_t n,
                                                float scale) noexcept {
  const __m256 k = _mm256_set1_ps(scale);
  const std::size_t whole = n - n % 8;
  std::size_t i = 0;
  for (; i < whole; i += 8) f32x8_to_bf16x8(_mm256_mul_ps(_mm256_loadu_ps(s + i), k), d + i);
  for (; i < n; ++i) d[i] = float_to_bfloat16_bits(s[i] * scale);
}
[[gnu::target("avx2")]] inline void bf16_to_f32(const std::uint16_t* s, float* d, std::size_t n,
                                                float scale) noexcept {
  const __m256 k = _mm256_set1_ps(scale);
  const std::size_t whole = n - n % 8;
  std::size_t i = 0;
  for (; i < whole; i += 8) _mm256_storeu_ps(d + i, _mm256_mul_ps(bf16x8_to_f32x8(s + i), k));
  for (; i < n; ++i) d[i] = bfloat16_bits_to_float(s[i]) * scale;
}

// The compressed ring's fold (reduce.hpp: fold_f16_f16c), one kernel per combination of its
// flags, so the loop has no branch: each lane does what the separate passes did, in the same
// order (widen, add, divide, round to nearest even and widen back), so the bits are the same;
// with Wire, the rounded lanes' wire values are stored to `wire` too. The two kernels differ
// only in their conversions, which need different instruction sets (F16C, AVX2): a shared
// template would have to require both. The tail is fold_scalar.
template <bool Local, bool Divide, bool Round, bool Wire>
[[gnu::target("f16c,avx")]] void fold_f16(const std::uint16_t* w, const float* local, float* dst,
                                          std::size_t n, int divisor,
                                          std::uint16_t* wire) noexcept {
  const float df = static_cast<float>(divisor);
  const __m256 d = _mm256_set1_ps(df);
  const std::size_t whole = n - n % 8;
  std::size_t i = 0;
  for (; i < whole; i += 8) {
    __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i)));
    if constexpr (Local) v = _mm256_add_ps(_mm256_loadu_ps(local + i), v);
    if constexpr (Divide) v = _mm256_div_ps(v, d);
    if constexpr (Round) {
      const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
      if constexpr (Wire) _mm_storeu_si128(reinterpret_cast<__m128i*>(wire + i), h);
      v = _mm256_cvtph_ps(h);
    }
    _mm256_storeu_ps(dst + i, v);
  }
  fold_scalar<half_bits_to_float, float_to_half_bits>(w + i, Local ? local + i : nullptr, dst + i,
                                                      n - i, divisor, Round,
                                                      Round && Wire ? wire + i : nullptr);
}
template <bool Local, bool Divide, bool Round, bool Wire>
[[gnu::target("avx2")]] void fold_bf16(const std::uint16_t* w, const float* local, float* dst,
                                       std::size_t n, int divisor, std::uint16_t* wire) noexcept {
  const float df = static_cast<float>(divisor);
  const __m256 d = _mm256_set1_ps(df);
  const std::size_t whole = n - n % 8;
  std::size_t i = 0;
  for (; i < whole; i += 8) {
    __m256 v = bf16x8_to_f32x8(w + i);
    if constexpr (Local) v = _mm256_add_ps(_mm256_loadu_ps(local + i), v);
    if constexpr (Divide) v = _mm256_div_ps(v, d);
    if constexpr (Round) {
      alignas(16) std::uint16_t tmp[8];
      std::uint16_t* r = Wire ? wire + i : tmp;
      f32x8_to_bf16x8(v, r);
      v = bf16x8_to_f32x8(r);
    }
    _mm256_storeu_ps(dst + i, v);
  }
  fold_scalar<bfloat16_bits_to_float, float_to_bfloat16_bits>(w + i, Local ? local + i : nullptr,
                                                              dst + i, n - i, divisor, Round,
                                                              Round && Wire ? wire + i : nullptr);
}
// Calls f.template operator()<B...>() with each of the flags as a template argument (the fold
// kernels: one per combination).
template <bool... Fixed, class F>
void with_bools(F&& f) noexcept {
  f.template operator()<Fixed...>();
}
template <bool... Fixed, class F, class... Rest>
void with_bools(F&& f, bool b, Rest... rest) noexcept {
  if (b) return with_bools<Fixed..., true>(f, rest...);
  return with_bools<Fixed..., false>(f, rest...);
}

// Calls f.template operator()<op>() with `op` as a template argument: one kernel per operation.
template <class F>
std::size_t with_simd_op(SimdOp op, F&& f) noexcept {
  switch (op) {
    case SimdOp::sum:
      return f.template operator()<SimdOp::sum>();
    case SimdOp::prod:
      return f.template operator()<SimdOp::prod>();
    case SimdOp::min:
      return f.template operator()<SimdOp::min>();
    case SimdOp::max:
      return f.template operator()<SimdOp::max>();
  }
  return 0;
}

}  // namespace simd

KOLO_IMPL_INLINE bool cpu_has_f16c() noexcept {
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

KOLO_IMPL_INLINE bool cpu_has_avx2() noexcept {
#if defined(__AVX2__)
  return true;
#else
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
#endif
}

KOLO_IMPL_INLINE std::size_t reduce_f16_simd(SimdOp op, float16* dst, const float16* a,
                                             const float16* b, std::size_t n) noexcept {
  return simd::with_simd_op(op, [&]<SimdOp O>() { return simd::reduce_f16<O>(dst, a, b, n); });
}

KOLO_IMPL_INLINE std::size_t reduce_bf16_simd(SimdOp op, bfloat16* dst, const bfloat16* a,
                                              const bfloat16* b, std::size_t n) noexcept {
  return simd::with_simd_op(op, [&]<SimdOp O>() { return simd::reduce_bf16<O>(dst, a, b, n); });
}

KOLO_IMPL_INLINE void f32_to_f16_f16c(const float* s, std::uint16_t* d, std::size_t n,
                                      float scale) noexcept {
  simd::f32_to_f16(s, d, n, scale);
}
KOLO_IMPL_INLINE void f16_to_f32_f16c(const std::uint16_t* s, float* d, std::size_t n,
                                      float scale) noexcept {
  simd::f16_to_f32(s, d, n, scale);
}
KOLO_IMPL_INLINE void f32_to_bf16_avx2(const float* s, std::uint16_t* d, std::size_t n,
                                       float scale) noexcept {
  simd::f32_to_bf16(s, d, n, scale);
}
KOLO_IMPL_INLINE void bf16_to_f32_avx2(const std::uint16_t* s, float* d, std::size_t n,
                                       float scale) noexcept {
  simd::bf16_to_f32(s, d, n, scale);
}
KOLO_IMPL_INLINE void fold_f16_f16c(const std::uint16_t* w, const float* local, float* dst,
                                    std::size_t n, int divisor, bool round,
                                    std::uint16_t* wire) noexcept {
  simd::with_bools(
      [&]<bool L, bool D, bool R, bool W>() {
        simd::fold_f16<L, D, R, W>(w, local, dst, n, divisor, wire);
      },
      local != nullptr, divisor > 1, round, round && wire != nullptr);
}
KOLO_IMPL_INLINE void fold_bf16_avx2(const std::uint16_t* w, const float* local, float* dst,
                                     std::size_t n, int divisor, bool round,
                                     std::uint16_t* wire) noexcept {
  simd::with_bools(
      [&]<bool L, bool D, bool R, bool W>() {
        simd::fold_bf16<L, D, R, W>(w, local, dst, n, divisor, wire);
      },
      local != nullptr, divisor > 1, round, round && wire != nullptr);
}

}  // namespace kolo::detail

#endif  // KOLO_REDUCE_F16C
