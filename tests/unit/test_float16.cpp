#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "kolo/core/float16.hpp"

using kolo::bfloat16;
using kolo::float16;

TEST_CASE("float16 exact values and rounding") {
  CHECK(float16(1.0f).bits == 0x3c00);
  CHECK(float16(-2.0f).bits == 0xc000);
  CHECK(float16(65504.0f).bits == 0x7bff);
  CHECK(float16(65520.0f).bits == 0x7c00);  // rounds up to Inf
  CHECK(float16(1e6f).bits == 0x7c00);
  CHECK(float16(std::numeric_limits<float>::infinity()).bits == 0x7c00);
  CHECK(std::isnan(static_cast<float>(float16(std::nanf("")))));
  // Ties to even: 1 + 2^-11 is halfway between 1 and 1 + 2^-10 -> 1.
  CHECK(float16(1.0f + std::ldexp(1.0f, -11)).bits == 0x3c00);
  CHECK(float16(1.0f + 3 * std::ldexp(1.0f, -11)).bits == 0x3c02);
  // Smallest subnormal 2^-24 and half of it (tie to even -> 0).
  CHECK(float16(std::ldexp(1.0f, -24)).bits == 0x0001);
  CHECK(float16(std::ldexp(1.0f, -25)).bits == 0x0000);
  CHECK(float16(std::ldexp(1.5f, -25)).bits == 0x0001);
  for (int i = -2048; i <= 2048; ++i) {
    CHECK(static_cast<float>(float16(static_cast<float>(i))) == static_cast<float>(i));
  }
}

TEST_CASE("float16 round trip over all bit patterns") {
  for (unsigned b = 0; b < 0x10000; ++b) {
    const float16 h = float16::from_bits(static_cast<std::uint16_t>(b));
    const float f = static_cast<float>(h);
    if (std::isnan(f)) {
      CHECK(std::isnan(static_cast<float>(float16(f))));
    } else {
      CHECK(float16(f).bits == h.bits);
    }
  }
}

TEST_CASE("bfloat16 rounding, Inf and NaN") {
  CHECK(bfloat16(1.0f).bits == 0x3f80);
  CHECK(bfloat16(std::numeric_limits<float>::infinity()).bits == 0x7f80);
  CHECK(std::isnan(static_cast<float>(bfloat16(std::nanf("")))));
  // A NaN whose payload is only in the low bits must stay NaN, not become Inf.
  CHECK(std::isnan(static_cast<float>(bfloat16(std::bit_cast<float>(0x7f800001u)))));
  CHECK(bfloat16(1.0f + std::ldexp(1.0f, -8)).bits == 0x3f80);      // tie -> even
  CHECK(bfloat16(1.0f + 3 * std::ldexp(1.0f, -8)).bits == 0x3f82);  // tie -> even (up)
  for (unsigned b = 0; b < 0x10000; ++b) {
    const bfloat16 h = bfloat16::from_bits(static_cast<std::uint16_t>(b));
    const float f = static_cast<float>(h);
    if (!std::isnan(f)) CHECK(bfloat16(f).bits == h.bits);
  }
}
