// Compression policies (kolo/compression/compressor.hpp): the fp16/bf16 round trip stays within
// the wire format's rounding bound for normal, subnormal, huge and NaN inputs, on the F16C path
// and the scalar path alike (they must agree bit for bit), and KOLO_COMPRESSION picks a policy.
// Without F16C/AVX2 the path comparisons end early: a skip outside CI, a failure in CI
// (tests/common/skip.hpp), where the machine must have them.
//
// The bounds (round to nearest even, p significant bits, unit roundoff u = 2^-p):
//   float16  (p = 11, u = 2^-11): normal |x| in [2^-14, 65504]: |q(x) - x| <= u·|x|;
//            subnormal |x| < 2^-14: |q(x) - x| <= 2^-25 (half the spacing 2^-24);
//            65504 <= |x| < 65520: ±65504; |x| >= 65520 (and Inf): ±Inf.
//   bfloat16 (p = 8, u = 2^-8): float32 normals: |q(x) - x| <= u·|x|; float32 subnormals:
//            |q(x) - x| <= 2^-134 (half the spacing 2^-133); |x| >= (2 - 2^-8)·2^127: ±Inf.
//   Both: NaN stays NaN with its sign; decompression is exact (every 16-bit value is a float).
#include <doctest/doctest.h>
#include <algorithm>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "../common/skip.hpp"
#include "kolo/compression/compressor.hpp"

using kolo::Bf16Compressor;
using kolo::CompressionPolicy;
using kolo::Fp16Compressor;

namespace {

constexpr double kU16 = 0x1p-11;  // float16 unit roundoff
constexpr double kUb16 = 0x1p-8;  // bfloat16 unit roundoff

std::vector<float> scalar_f16_round_trip(const std::vector<float>& x, float scale = 1.0f) {
  std::vector<float> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    out[i] = kolo::detail::half_bits_to_float(kolo::detail::float_to_half_bits(x[i] * scale));
  }
  return out;
}

std::vector<float> scalar_bf16_round_trip(const std::vector<float>& x, float scale = 1.0f) {
  std::vector<float> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    out[i] =
        kolo::detail::bfloat16_bits_to_float(kolo::detail::float_to_bfloat16_bits(x[i] * scale));
  }
  return out;
}

template <class C>
std::vector<float> policy_round_trip(const std::vector<float>& x, float scale = 1.0f) {
  std::vector<std::uint16_t> wire(x.size());
  std::vector<float> out(x.size());
  C::compress(x.data(), wire.data(), x.size(), scale);
  C::decompress(wire.data(), out.data(), x.size(), 1.0f);
  return out;
}

// Values log-uniform in [lo, hi), random sign.
std::vector<float> log_uniform(std::mt19937& rng, std::size_t n, double lo, double hi) {
  std::uniform_real_distribution<double> e(std::log2(lo), std::log2(hi));
  std::vector<float> v(n);
  for (auto& x : v) {
    x = static_cast<float>(std::exp2(e(rng)));
    if (rng() & 1u) x = -x;
  }
  return v;
}

// Every kind of float32: random bit patterns (NaNs, Infs, subnormals, zeros included).
std::vector<float> any_bits(std::mt19937& rng, std::size_t n) {
  std::vector<float> v(n);
  for (auto& x : v) x = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
  v[0] = std::numeric_limits<float>::infinity();
  v[1] = -std::numeric_limits<float>::infinity();
  v[2] = std::numeric_limits<float>::quiet_NaN();
  v[3] = std::bit_cast<float>(0xff800001u);  // a signalling NaN, negative, low payload only
  v[4] = -0.0f;
  v[5] = std::numeric_limits<float>::denorm_min();
  return v;
}

bool same_value(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}

void check_f16_bound(const std::vector<float>& x, const std::vector<float>& q) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double xi = x[i], qi = q[i], ax = std::fabs(xi);
    bool ok;
    if (std::isnan(xi)) {
      ok = std::isnan(qi) && std::signbit(qi) == std::signbit(xi);
    } else if (ax >= 65520.0) {
      ok = std::isinf(qi) && std::signbit(qi) == std::signbit(xi);
    } else if (ax >= 65504.0) {
      ok = qi == std::copysign(65504.0, xi);
    } else if (ax >= 0x1p-14) {
      ok = std::fabs(qi - xi) <= kU16 * ax;
    } else {
      ok = std::fabs(qi - xi) <= 0x1p-25 && (qi == 0 || std::signbit(qi) == std::signbit(xi));
    }
    if (!ok && bad++ < 5) FAIL_CHECK("float16: " << xi << " -> " << qi);
  }
  CHECK(bad == 0);
}

void check_bf16_bound(const std::vector<float>& x, const std::vector<float>& q) {
  const double overflow = (2.0 - 0x1p-8) * 0x1p127;  // the tie above the largest bfloat16
  std::size_t bad = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double xi = x[i], qi = q[i], ax = std::fabs(xi);
    bool ok;
    if (std::isnan(xi)) {
      ok = std::isnan(qi) && std::signbit(qi) == std::signbit(xi);
    } else if (ax >= overflow) {
      ok = std::isinf(qi) && std::signbit(qi) == std::signbit(xi);
    } else if (ax >= 0x1p-126) {
      ok = std::fabs(qi - xi) <= kUb16 * ax && std::isfinite(qi);
    } else {
      ok = std::fabs(qi - xi) <= 0x1p-134;
    }
    if (!ok && bad++ < 5) FAIL_CHECK("bfloat16: " << xi << " -> " << qi);
  }
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("compression: fp16 round trip within 2^-11 relative (normal), 2^-25 (subnormal)") {
  std::mt19937 rng(7);
  for (auto [lo, hi] : {std::pair{0x1p-14, 65504.0}, std::pair{0x1p-30, 0x1p-14},
                        std::pair{1e-3, 1e3}, std::pair{65000.0, 1e6}}) {
    const auto x = log_uniform(rng, 100003, lo, hi);  // odd count: the vector loop's tail too
    CAPTURE(lo);
    check_f16_bound(x, scalar_f16_round_trip(x));
    check_f16_bound(x, policy_round_trip<Fp16Compressor>(x));
  }
  // Exact edges of the format.
  const std::vector<float> edges = {65504.0f,  65519.99f, 65520.0f,   -65520.0f, 0x1p-14f,
                                    0x1p-24f,  0x1p-25f,  0x1.8p-25f, 0x1p-26f,  -0x1p-24f,
                                    0x1p-149f, 0.0f,      -0.0f,      1.0f,      2049.0f};
  const auto q = policy_round_trip<Fp16Compressor>(edges);
  check_f16_bound(edges, q);
  CHECK(q[1] == 65504.0f);
  CHECK(std::isinf(q[2]));
  CHECK(q[6] == 0.0f);      // 2^-25 is a tie between 0 and 2^-24: to even (0)
  CHECK(q[7] == 0x1p-24f);  // 1.5 · 2^-25 rounds up to the smallest subnormal
  CHECK(q[14] == 2048.0f);  // 2049 is a tie between 2048 and 2050: to even
}

TEST_CASE("compression: fp16 huge values saturate to Inf, NaN stays NaN with its sign") {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {1e6f,
                                -1e30f,
                                inf,
                                -inf,
                                std::numeric_limits<float>::max(),
                                std::numeric_limits<float>::quiet_NaN(),
                                -std::numeric_limits<float>::quiet_NaN(),
                                std::bit_cast<float>(0x7f800001u),  // signalling, low payload
                                std::bit_cast<float>(0xffa00000u),
                                1.0f,
                                1.0f,
                                1.0f};  // 12 elements: 8 through F16C, 4 through the tail
  for (const auto& q : {scalar_f16_round_trip(x), policy_round_trip<Fp16Compressor>(x)}) {
    check_f16_bound(x, q);
    CHECK(q[0] == inf);
    CHECK(q[1] == -inf);
    CHECK(q[2] == inf);
    CHECK(q[3] == -inf);
    CHECK(q[4] == inf);
    for (int i : {5, 6, 7, 8}) {
      CHECK(std::isnan(q[static_cast<std::size_t>(i)]));
      CHECK(std::signbit(q[static_cast<std::size_t>(i)]) ==
            std::signbit(x[static_cast<std::size_t>(i)]));
    }
  }
}

TEST_CASE("compression: the F16C path and the scalar path agree bit for bit") {
#ifdef KOLO_HAVE_F16C_DISPATCH
  if (!kolo::detail::cpu_has_f16c()) {
    KOLO_TEST_SKIP_CASE("cpu-feature", "this CPU has no F16C: only the scalar path runs");
  }
  std::mt19937 rng(11);
  auto x = any_bits(rng, 1 << 20);
  const auto more = log_uniform(rng, 1 << 18, 0x1p-27, 1e5);
  x.insert(x.end(), more.begin(), more.end());
  for (float scale : {1.0f, 0.125f, 3.0f}) {
    CAPTURE(scale);
    std::vector<std::uint16_t> hw(x.size()), sw(x.size());
    kolo::detail::f32_to_f16_f16c(x.data(), hw.data(), x.size(), scale);
    for (std::size_t i = 0; i < x.size(); ++i) {
      sw[i] = kolo::detail::float_to_half_bits(x[i] * scale);
    }
    std::size_t differ = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      // NaN payloads may legitimately differ; NaN-ness and sign may not.
      const bool nan_hw = (hw[i] & 0x7fffu) > 0x7c00u, nan_sw = (sw[i] & 0x7fffu) > 0x7c00u;
      const bool same =
          nan_hw || nan_sw ? nan_hw == nan_sw && (hw[i] >> 15) == (sw[i] >> 15) : hw[i] == sw[i];
      if (!same && differ++ < 5) {
        FAIL_CHECK("x = " << x[i] << ": F16C " << hw[i] << ", scalar " << sw[i]);
      }
    }
    CHECK(differ == 0);
  }
  // Decompression of every float16 bit pattern, F16C against scalar.
  std::vector<std::uint16_t> all(65536 + 5);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i);
  std::vector<float> hw(all.size()), sw(all.size());
  kolo::detail::f16_to_f32_f16c(all.data(), hw.data(), all.size(), 1.0f);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    sw[i] = kolo::detail::half_bits_to_float(all[i]);
    differ += !same_value(hw[i], sw[i]);
  }
  CHECK(differ == 0);
#else
  KOLO_TEST_SKIP_CASE("cpu-feature", "not an x86 build: only the scalar path exists");
#endif
}

TEST_CASE("compression: the AVX2 bfloat16 path and the scalar path agree bit for bit") {
#ifdef KOLO_HAVE_F16C_DISPATCH
  if (!kolo::detail::cpu_has_avx2()) {
    KOLO_TEST_SKIP_CASE("cpu-feature", "this CPU has no AVX2: only the scalar path runs");
  }
  std::mt19937 rng(12);
  auto x = any_bits(rng, 1 << 20);  // NaNs, infinities, subnormals, every exponent
  const auto more = log_uniform(rng, 1 << 18, 0x1p-130, 1e30);
  x.insert(x.end(), more.begin(), more.end());
  x.push_back(std::bit_cast<float>(0x3f808000u));  // ties: round to even, both ways
  x.push_back(std::bit_cast<float>(0x3f818000u));
  x.push_back(std::bit_cast<float>(0x7f7fffffu));  // rounds up to Inf
  for (float scale : {1.0f, 0.125f, 3.0f}) {
    CAPTURE(scale);
    std::vector<std::uint16_t> hw(x.size());
    kolo::detail::f32_to_bf16_avx2(x.data(), hw.data(), x.size(), scale);
    std::size_t differ = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const std::uint16_t sw = kolo::detail::float_to_bfloat16_bits(x[i] * scale);
      if (hw[i] != sw && differ++ < 5) {
        FAIL_CHECK("x = " << x[i] << ": AVX2 " << hw[i] << ", scalar " << sw);
      }
    }
    CHECK(differ == 0);
  }
  std::vector<std::uint16_t> all(65536 + 5);
  for (std::size_t i = 0; i < all.size(); ++i) all[i] = static_cast<std::uint16_t>(i);
  std::vector<float> hw(all.size());
  kolo::detail::bf16_to_f32_avx2(all.data(), hw.data(), all.size(), 1.0f);
  std::size_t differ = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    differ += !same_value(hw[i], kolo::detail::bfloat16_bits_to_float(all[i]));
  }
  CHECK(differ == 0);
#else
  KOLO_TEST_SKIP_CASE("cpu-feature",
                      "no AVX2 dispatch on this platform: only the scalar path runs");
#endif
}

// What the compressed ring did before fold existed, in separate passes: decompress, an fp32
// add (reduce_function), finish_average, and a compress/decompress round trip.
std::vector<float> composed_fold(const CompressionPolicy& c, const std::vector<std::uint16_t>& w,
                                 const float* local, int divisor, bool round) {
  const std::size_t n = w.size();
  std::vector<float> tmp(n), dst(n);
  c.decompress(w.data(), tmp.data(), n, 1.0f);
  if (local != nullptr) {
    kolo::reduce_function(kolo::DataType::float32, kolo::ReduceOp::sum)(dst.data(), local,
                                                                        tmp.data(), n);
  } else {
    dst = tmp;
  }
  kolo::finish_average(dst.data(), n, kolo::DataType::float32, divisor);
  if (round) {
    std::vector<std::uint16_t> r(n);
    c.compress(dst.data(), r.data(), n, 1.0f);
    c.decompress(r.data(), dst.data(), n, 1.0f);
  }
  return dst;
}

TEST_CASE("compression: fold (the ring's one-pass step) equals the separate passes, bit for bit") {
  // Wire values of every bit pattern (NaN, Inf, subnormals), local values of any bits and of
  // ordinary magnitudes; a count that is not a multiple of 8, so the scalar tail runs too.
  std::mt19937 rng(21);
  const std::size_t n = 65536 + 7;
  std::vector<std::uint16_t> w(n);
  for (std::size_t i = 0; i < n; ++i) w[i] = static_cast<std::uint16_t>(i * 40503u);
  auto local = any_bits(rng, n / 2);
  const auto ordinary = log_uniform(rng, n - n / 2, 0x1p-20, 7e4);
  local.insert(local.end(), ordinary.begin(), ordinary.end());
  std::vector<float> in_place(n);
  for (const CompressionPolicy& c :
       {CompressionPolicy::of<Fp16Compressor>(), CompressionPolicy::of<Bf16Compressor>()}) {
    CAPTURE(c.name);
    REQUIRE((c.fold != nullptr));
    for (bool with_local : {false, true}) {
      for (int divisor : {1, 3, 8}) {
        for (bool round : {false, true}) {
          CAPTURE(with_local);
          CAPTURE(divisor);
          CAPTURE(round);
          const float* l = with_local ? local.data() : nullptr;
          const auto want = composed_fold(c, w, l, divisor, round);
          std::vector<float> got(n);
          c.fold(w.data(), l, got.data(), n, divisor, round, nullptr);
          // In place (dst = local), as the ring runs when the output is the input; with the
          // wire values written out too where it rounds (the ring's finishing stage).
          in_place = local;
          std::vector<std::uint16_t> wire(n, 0x5a5a);
          c.fold(w.data(), with_local ? in_place.data() : nullptr, in_place.data(), n, divisor,
                 round, round ? wire.data() : nullptr);
          if (round) {  // what the ring's next send compressed from dst before: the same bits
            std::vector<std::uint16_t> sent(n);
            c.compress(in_place.data(), sent.data(), n, 1.0f);
            CHECK(wire == sent);
          } else {
            CHECK(
                std::all_of(wire.begin(), wire.end(), [](std::uint16_t x) { return x == 0x5a5a; }));
          }
          std::size_t differ = 0;
          for (std::size_t i = 0; i < n; ++i) {
            const bool same = same_value(got[i], want[i]) && same_value(in_place[i], want[i]);
            if (!same && differ++ < 5) {
              FAIL_CHECK("element " << i << ": fold " << got[i] << " / " << in_place[i]
                                    << ", passes " << want[i]);
            }
          }
          CHECK(differ == 0);
        }
      }
    }
  }
}

TEST_CASE("compression: bf16 round trip within 2^-8 relative, subnormals, Inf and NaN") {
  std::mt19937 rng(13);
  for (auto [lo, hi] : {std::pair{0x1p-126, 0x1p127}, std::pair{0x1p-149, 0x1p-126},
                        std::pair{1e-3, 1e3}, std::pair{3e38, 3.4e38}}) {
    const auto x = log_uniform(rng, 100003, lo, hi);
    CAPTURE(lo);
    check_bf16_bound(x, scalar_bf16_round_trip(x));
    check_bf16_bound(x, policy_round_trip<Bf16Compressor>(x));
  }
  const auto x = any_bits(rng, 1 << 18);
  const auto q = policy_round_trip<Bf16Compressor>(x);
  check_bf16_bound(x, q);
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> edges = {std::numeric_limits<float>::max(), -inf,
                                    std::bit_cast<float>(0x7f7f7fffu),  // just below the tie
                                    std::bit_cast<float>(0x7f800001u), 1.0f + 0x1p-8f};
  const auto qe = policy_round_trip<Bf16Compressor>(edges);
  CHECK(qe[0] == inf);  // FLT_MAX is above the largest bfloat16's rounding interval
  CHECK(qe[1] == -inf);
  CHECK(qe[2] == std::bit_cast<float>(0x7f7f0000u));
  CHECK(std::isnan(qe[3]));  // payload only in the dropped bits: must not become Inf
  CHECK(qe[4] == 1.0f);      // tie to even
}

TEST_CASE("compression: scale is applied in fp32 before rounding and after widening") {
  std::mt19937 rng(17);
  const auto x = log_uniform(rng, 1001, 1e-2, 1e2);
  const auto a = policy_round_trip<Fp16Compressor>(x, 0.25f);
  const auto b = scalar_f16_round_trip(x, 0.25f);
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(a[i] == b[i]);
  // Decompression scale: wire value times the scale, in fp32.
  std::vector<std::uint16_t> wire(x.size());
  std::vector<float> out(x.size());
  Fp16Compressor::compress(x.data(), wire.data(), x.size(), 1.0f);
  Fp16Compressor::decompress(wire.data(), out.data(), x.size(), 0.5f);
  for (std::size_t i = 0; i < x.size(); ++i) {
    CHECK(out[i] == kolo::detail::half_bits_to_float(wire[i]) * 0.5f);
  }
  const auto c = policy_round_trip<Bf16Compressor>(x, 3.0f);
  const auto d = scalar_bf16_round_trip(x, 3.0f);
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(c[i] == d[i]);
  // Zero elements touch nothing.
  Fp16Compressor::compress(nullptr, nullptr, 0, 1.0f);
  Bf16Compressor::decompress(nullptr, nullptr, 0, 1.0f);
}

namespace {
// A user's own compressor: float32 truncated to bfloat16 (round toward zero).
struct TruncatingBf16 {
  static constexpr kolo::DataType wire_dtype = kolo::DataType::bfloat16;
  static constexpr std::string_view name = "bf16-truncate";
  static void compress(const float* s, void* d, std::size_t n, float scale) {
    auto* o = static_cast<std::uint16_t*>(d);
    for (std::size_t i = 0; i < n; ++i) {
      o[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(s[i] * scale) >> 16);
    }
  }
  static void decompress(const void* s, float* d, std::size_t n, float scale) {
    const auto* in = static_cast<const std::uint16_t*>(s);
    for (std::size_t i = 0; i < n; ++i) {
      d[i] = std::bit_cast<float>(static_cast<std::uint32_t>(in[i]) << 16) * scale;
    }
  }
};
}  // namespace

TEST_CASE("compression: KOLO_COMPRESSION selects a policy, a user compressor plugs in") {
  auto env = [](std::optional<std::string> v) {
    return kolo::EnvLookup([v](const std::string& name) -> std::optional<std::string> {
      return name == "KOLO_COMPRESSION" ? v : std::nullopt;
    });
  };
  CHECK(!CompressionPolicy::from_env(env(std::nullopt)).enabled());
  CHECK(!CompressionPolicy::from_env(env("none")).enabled());
  const auto f = CompressionPolicy::from_env(env("fp16"));
  CHECK(f.enabled());
  CHECK(f.wire == kolo::DataType::float16);
  CHECK(f.name == "fp16");
  CHECK(CompressionPolicy::parse("float16").wire == kolo::DataType::float16);
  CHECK(CompressionPolicy::parse("bf16").wire == kolo::DataType::bfloat16);
  CHECK(CompressionPolicy::parse("bfloat16").name == "bf16");
  CHECK_THROWS_AS(CompressionPolicy::from_env(env("int8")), kolo::ConfigError);
  CHECK_THROWS_WITH(CompressionPolicy::parse("FP16"),
                    doctest::Contains("KOLO_COMPRESSION=FP16 is not one of none, fp16, bf16"));

  static_assert(kolo::Compressor<TruncatingBf16>);
  const auto mine = CompressionPolicy::of<TruncatingBf16>();
  CHECK(mine.enabled());
  CHECK(mine.name == "bf16-truncate");
  const std::vector<float> x = {1.0f + 0x1p-7f + 0x1p-9f, -3.0f};
  std::vector<std::uint16_t> w(2);
  std::vector<float> y(2);
  mine.compress(x.data(), w.data(), 2, 1.0f);
  mine.decompress(w.data(), y.data(), 2, 2.0f);
  CHECK(y[0] == 2.0f * (1.0f + 0x1p-7f));  // truncated, then scaled
  CHECK(y[1] == -6.0f);
  // Without a static fold, the policy's fold is null: the compressed ring takes the separate
  // passes (decompress, add, round trip) with the user's functions.
  CHECK((mine.fold == nullptr));
  CHECK((CompressionPolicy::of<Fp16Compressor>().fold != nullptr));
}
