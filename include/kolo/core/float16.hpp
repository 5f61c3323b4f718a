// kolo/core/float16.hpp — portable IEEE binary16 (float16) and bfloat16 storage types.
//
// Both are 2-byte storage types converted through float. Conversion from float rounds to
// nearest, ties to even, keeps Inf, keeps NaN a NaN (quiet, sign kept), and for float16 produces
// subnormals and saturates to Inf on overflow, as IEEE 754 requires. Arithmetic happens in float.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kolo {

namespace detail {

inline std::uint16_t float_to_half_bits(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // Inf or NaN
    if (abs == 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
    // NaN: keep the top payload bits and force the quiet bit so it never becomes Inf.
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  }
  if (abs >= 0x477ff000u) {  // >= 65520 rounds to Inf (65504 is the largest finite half)
    return static_cast<std::uint16_t>(sign | 0x7c00u);
  }
  if (abs < 0x38800000u) {  // below 2^-14: half subnormal or zero
    if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);  // < 2^-25 rounds to 0
    // Value = mant * 2^(e-150) with the implicit bit; half subnormal unit is 2^-24.
    const std::uint32_t e = abs >> 23;
    const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - e;  // bits to drop: (150 - e) - 24
    std::uint32_t result = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (result & 1u))) ++result;
    return static_cast<std::uint16_t>(sign | result);
  }
  // Normal: rebias exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  std::uint32_t result = ((abs - 0x38000000u) >> 13);
  const std::uint32_t rem = abs & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (result & 1u))) ++result;  // may carry into Inf: right
  return static_cast<std::uint16_t>(sign | result);
}

inline float half_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  std::uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {                  // subnormal: normalise
      std::uint32_t e = 113;  // 127 - 15 + 1
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --e;
      }
      bits = sign | (e << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // Inf or NaN (payload kept)
  } else {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

inline std::uint16_t float_to_bfloat16_bits(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {  // NaN: truncate and force the quiet bit
    return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  }
  // Round to nearest even on the 16 dropped bits; overflow carries into Inf, as it should.
  const std::uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>((x + rounding) >> 16);
}

inline float bfloat16_bits_to_float(std::uint16_t b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

// The compressed ring's fold (Fp16Compressor::fold) element by element, for a 16-bit wire type
// given by its two conversions: the scalar path and the vector kernels' tails.
template <float (*Widen)(std::uint16_t) noexcept, std::uint16_t (*Narrow)(float) noexcept>
inline void fold_scalar(const std::uint16_t* w, const float* local, float* dst, std::size_t n,
                        int divisor, bool round, std::uint16_t* wire = nullptr) noexcept {
  const float df = static_cast<float>(divisor);
  for (std::size_t i = 0; i < n; ++i) {
    float v = Widen(w[i]);
    if (local) v = local[i] + v;
    if (divisor > 1) v = v / df;
    if (round) {
      const std::uint16_t h = Narrow(v);
      if (wire) wire[i] = h;
      v = Widen(h);
    }
    dst[i] = v;
  }
}

}  // namespace detail

struct float16 {
  std::uint16_t bits = 0;
  float16() = default;
  explicit float16(float f) noexcept : bits(detail::float_to_half_bits(f)) {}
  explicit operator float() const noexcept { return detail::half_bits_to_float(bits); }
  static float16 from_bits(std::uint16_t b) noexcept {
    float16 h;
    h.bits = b;
    return h;
  }
  friend bool operator==(float16 a, float16 b) noexcept { return float(a) == float(b); }
};

struct bfloat16 {
  std::uint16_t bits = 0;
  bfloat16() = default;
  explicit bfloat16(float f) noexcept : bits(detail::float_to_bfloat16_bits(f)) {}
  explicit operator float() const noexcept { return detail::bfloat16_bits_to_float(bits); }
  static bfloat16 from_bits(std::uint16_t b) noexcept {
    bfloat16 h;
    h.bits = b;
    return h;
  }
  friend bool operator==(bfloat16 a, bfloat16 b) noexcept { return float(a) == float(b); }
};

static_assert(sizeof(float16) == 2 && sizeof(bfloat16) == 2);

}  // namespace kolo
