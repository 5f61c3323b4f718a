// Host reduce kernels (kolo/core/reduce.hpp) against a scalar reference, bit for bit.
//
// The kernels run a 16-byte vector body, four vectors per iteration, then a scalar tail, so the
// lengths straddle every boundary of that loop for 1-, 2-, 4- and 8-byte elements, and the
// pointers are offset by one element because callers reduce slices of fused buffers. The
// reference is written independently of the library: wrapped integer arithmetic through
// uint64_t, exact IEEE arithmetic for float/double, and for float16/bfloat16 the exact result in
// double rounded to nearest-even by searching a table of every finite 16-bit value (so a wrong
// rounding in kolo's own conversion cannot hide in the reference).
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "kolo/core/dtype.hpp"
#include "kolo/core/error.hpp"
#include "kolo/core/float16.hpp"
#include "kolo/core/reduce.hpp"

namespace {

using kolo::bfloat16;
using kolo::DataType;
using kolo::float16;
using kolo::ReduceOp;

constexpr std::size_t kLengths[] = {0, 1, 3, 15, 16, 17, 63, 64, 65, 1000, 4099};

template <class T>
constexpr bool is_half_v = std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;

// ---- 16-bit float reference rounding -------------------------------------------------------

// Every finite non-negative value of H, indexed by its bit pattern (0 .. largest finite).
// Consecutive patterns are consecutive values, so "nearest, ties to the even pattern" is a
// binary search plus one comparison.
template <class H>
const std::vector<double>& finite_table() {
  static const std::vector<double> table = [] {
    const unsigned inf_bits = std::is_same_v<H, float16> ? 0x7c00u : 0x7f80u;
    std::vector<double> t;
    for (unsigned b = 0; b < inf_bits; ++b) {
      t.push_back(
          static_cast<double>(static_cast<float>(H::from_bits(static_cast<std::uint16_t>(b)))));
    }
    return t;
  }();
  return table;
}

// Round-to-nearest-even of a finite double to H, without using kolo's float -> H conversion.
template <class H>
std::uint16_t round_to_bits(double x) {
  const auto& t = finite_table<H>();
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double ax = std::fabs(x);
  const std::uint16_t inf_bits = static_cast<std::uint16_t>(t.size());
  const double top = t.back();
  const double overflow = top + (top - t[t.size() - 2]) / 2;  // halfway to the next binade
  // At exactly the halfway point the even neighbour is Inf (the largest finite is odd).
  if (ax >= overflow) return static_cast<std::uint16_t>(sign | inf_bits);
  auto hi = std::lower_bound(t.begin(), t.end(), ax);  // first value >= ax
  if (hi == t.end()) return static_cast<std::uint16_t>(sign | (inf_bits - 1));
  std::size_t up = static_cast<std::size_t>(hi - t.begin());
  if (t[up] == ax || up == 0) return static_cast<std::uint16_t>(sign | up);
  const std::size_t down = up - 1;
  const double d_down = ax - t[down];
  const double d_up = t[up] - ax;
  std::size_t pick = d_down < d_up ? down : d_up < d_down ? up : (down % 2 == 0 ? down : up);
  return static_cast<std::uint16_t>(sign | pick);
}

// ---- scalar reference --------------------------------------------------------------------

template <class T>
double as_double(T v) {
  if constexpr (is_half_v<T>) {
    return static_cast<double>(static_cast<float>(v));
  } else {
    return static_cast<double>(v);
  }
}

template <class T>
T ref_reduce(T a, T b, ReduceOp op) {
  if constexpr (std::is_integral_v<T>) {
    // Conversions from uint64_t to a narrower or signed type are modular in C++20: wraparound.
    const auto ua = static_cast<std::uint64_t>(a);
    const auto ub = static_cast<std::uint64_t>(b);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::average:
        return static_cast<T>(ua + ub);
      case ReduceOp::product:
        return static_cast<T>(ua * ub);
      case ReduceOp::min:
        return std::min(a, b);
      case ReduceOp::max:
        return std::max(a, b);
    }
  } else if constexpr (is_half_v<T>) {
    // The exact sum/product of two 16-bit floats is a double (the data generators keep bfloat16
    // products away from float underflow, where fp32 arithmetic itself rounds first).
    const double x = as_double(a), y = as_double(b);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::average:
        return T::from_bits(round_to_bits<T>(x + y));
      case ReduceOp::product:
        return T::from_bits(round_to_bits<T>(x * y));
      case ReduceOp::min:
        return y < x ? b : a;  // an input, unrounded; ties keep `a` (as for +0 vs -0)
      case ReduceOp::max:
        return x < y ? b : a;
    }
  } else {
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::average:
        return a + b;
      case ReduceOp::product:
        return a * b;
      case ReduceOp::min:
        return b < a ? b : a;
      case ReduceOp::max:
        return a < b ? b : a;
    }
  }
  return a;
}

// ---- data ----------------------------------------------------------------------------------

template <class T>
T random_value(std::mt19937_64& rng) {
  if constexpr (std::is_same_v<T, float16>) {
    // Any finite pattern: sums and products then cover subnormals, rounding and overflow to Inf.
    for (;;) {
      const auto b = static_cast<std::uint16_t>(rng());
      if ((b & 0x7c00u) != 0x7c00u) return float16::from_bits(b);
    }
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    // Exponents within 2^±20: products stay normal in fp32, where fp32-then-round is exact
    // rounding (24 >= 2*8+2 bits); below that fp32 underflow would round first.
    const auto b = static_cast<std::uint16_t>(rng());
    const unsigned exp = 127 - 20 + static_cast<unsigned>(rng() % 41);
    return bfloat16::from_bits(static_cast<std::uint16_t>((b & 0x807fu) | (exp << 7)));
  } else if constexpr (std::is_floating_point_v<T>) {
    // Mantissas wider than T and exponents far apart: sums need rounding, products too.
    const double m = static_cast<double>(static_cast<std::int64_t>(rng() >> 8) - (1ll << 55));
    const int e = static_cast<int>(rng() % 61) - 30 - 55;
    return static_cast<T>(std::ldexp(m, e));
  } else {
    // Full range: sums and products wrap.
    return static_cast<T>(rng());
  }
}

template <class T>
std::uint64_t bits_of(T v) {
  std::uint64_t out = 0;
  std::memcpy(&out, &v, sizeof(T));
  return out;
}

template <class T>
std::string show(T v) {
  std::ostringstream s;
  if constexpr (is_half_v<T>) {
    s << static_cast<float>(v) << " (0x" << std::hex << v.bits << ")";
  } else if constexpr (std::is_integral_v<T>) {
    s << static_cast<long long>(v);
  } else {
    s.precision(std::numeric_limits<T>::max_digits10);
    s << v;
  }
  return s.str();
}

// First index where `got` and `want` differ bitwise, as a readable line; empty if none.
template <class T>
std::string first_mismatch(const T* got, const T* want, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (bits_of(got[i]) != bits_of(want[i])) {
      return "element " + std::to_string(i) + ": got " + show(got[i]) + ", want " + show(want[i]);
    }
  }
  return {};
}

// A buffer with one spare element in front (to misalign by one element) and guard elements
// behind, so writes past `n` are caught as well as wrong values.
template <class T>
struct Buffer {
  static constexpr std::size_t kGuard = 8;
  std::vector<T> storage;
  std::size_t offset;
  std::size_t n;
  Buffer(std::size_t count, std::size_t off)
      : storage(count + 1 + kGuard, sentinel()), offset(off), n(count) {}
  static T sentinel() {  // a recognisable pattern, for every element type alike
    unsigned char bytes[sizeof(T)];
    std::memset(bytes, 0xA5, sizeof(T));
    T v;
    std::memcpy(&v, bytes, sizeof(T));
    return v;
  }
  T* data() { return storage.data() + offset; }
  bool guards_intact() const {
    const std::uint64_t s = bits_of(sentinel());
    for (std::size_t i = offset + n; i < storage.size(); ++i) {
      if (bits_of(storage[i]) != s) return false;
    }
    return offset == 0 || bits_of(storage[0]) == s;
  }
};

enum class Alias { none, dst_is_a, dst_is_b };

const char* alias_name(Alias a) {
  switch (a) {
    case Alias::none:
      return "out-of-place";
    case Alias::dst_is_a:
      return "dst aliases a";
    case Alias::dst_is_b:
      return "dst aliases b";
  }
  return "?";
}

// Runs every op x length x alignment x aliasing for element type T.
template <class T>
void check_every_op() {
  constexpr DataType dt = kolo::dtype_of<T>();
  std::mt19937_64 rng(0x6b6f6c6f + static_cast<unsigned>(dt));
  for (ReduceOp op : kolo::all_reduce_ops) {
    const kolo::ReduceFn fn = kolo::reduce_function(dt, op);
    REQUIRE(static_cast<bool>(fn));
    for (std::size_t n : kLengths) {
      for (Alias alias : {Alias::none, Alias::dst_is_a, Alias::dst_is_b}) {
        for (unsigned offsets = 0; offsets < 8; ++offsets) {
          const std::size_t off_a = offsets & 1, off_b = (offsets >> 1) & 1,
                            off_d = (offsets >> 2) & 1;
          if (alias != Alias::none && off_d != 0) continue;  // dst shares the aliased offsets
          Buffer<T> a(n, off_a), b(n, off_b), d(n, off_d);
          std::vector<T> want(n);
          for (std::size_t i = 0; i < n; ++i) {
            a.data()[i] = random_value<T>(rng);
            b.data()[i] = random_value<T>(rng);
            want[i] = ref_reduce(a.data()[i], b.data()[i], op);
          }
          T* dst = alias == Alias::dst_is_a   ? a.data()
                   : alias == Alias::dst_is_b ? b.data()
                                              : d.data();
          // Alternate the two entry points: the function pointer and the convenience call.
          if (offsets % 2 == 0) {
            fn(dst, a.data(), b.data(), n);
          } else {
            kolo::reduce(dst, a.data(), b.data(), n, dt, op);
          }
          INFO(kolo::dtype_name(dt), " ", kolo::reduce_op_name(op), " n=", n, " ",
               alias_name(alias), " offsets(a,b,dst)=", off_a, ",", off_b, ",", off_d);
          const std::string bad = first_mismatch(dst, want.data(), n);
          CHECK_MESSAGE(bad.empty(), bad);
          CHECK(a.guards_intact());
          CHECK(b.guards_intact());
          CHECK(d.guards_intact());
        }
      }
    }
  }
}

// ---- finish_average ------------------------------------------------------------------------

template <class T>
T ref_divide(T v, int divisor) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<std::int64_t>(v) / divisor);  // truncates toward zero
  } else if constexpr (is_half_v<T>) {
    return T::from_bits(round_to_bits<T>(as_double(v) / divisor));
  } else {
    return static_cast<T>(v / static_cast<T>(divisor));
  }
}

template <class T>
void check_finish_average() {
  constexpr DataType dt = kolo::dtype_of<T>();
  std::mt19937_64 rng(0x61766700 + static_cast<unsigned>(dt));
  // Divisors are rank counts: beyond int8/uint8 range on purpose (256 ranks are common). All
  // are exact in bfloat16's 8-bit significand, so fp32 division then rounding is exact rounding.
  for (int divisor : {1, 2, 3, 7, 8, 200, 256, 300, 1000}) {
    for (std::size_t n : kLengths) {
      for (std::size_t off : {0u, 1u}) {
        Buffer<T> buf(n, off);
        std::vector<T> want(n);
        for (std::size_t i = 0; i < n; ++i) {
          buf.data()[i] = random_value<T>(rng);
          want[i] = divisor <= 1 ? buf.data()[i] : ref_divide(buf.data()[i], divisor);
        }
        kolo::finish_average(buf.data(), n, dt, divisor);
        INFO(kolo::dtype_name(dt), " divisor=", divisor, " n=", n, " offset=", off);
        const std::string bad = first_mismatch(buf.data(), want.data(), n);
        CHECK_MESSAGE(bad.empty(), bad);
        CHECK(buf.guards_intact());
      }
    }
  }
}

}  // namespace

TEST_CASE("reduce float16: every op, length, alignment and aliasing matches the reference") {
  check_every_op<float16>();
}
TEST_CASE("reduce bfloat16: every op, length, alignment and aliasing matches the reference") {
  check_every_op<bfloat16>();
}
TEST_CASE("reduce float32: every op, length, alignment and aliasing matches the reference") {
  check_every_op<float>();
}
TEST_CASE("reduce float64: every op, length, alignment and aliasing matches the reference") {
  check_every_op<double>();
}
TEST_CASE("reduce int8: every op, length, alignment and aliasing matches the reference") {
  check_every_op<std::int8_t>();
}
TEST_CASE("reduce uint8: every op, length, alignment and aliasing matches the reference") {
  check_every_op<std::uint8_t>();
}
TEST_CASE("reduce int32: every op, length, alignment and aliasing matches the reference") {
  check_every_op<std::int32_t>();
}
TEST_CASE("reduce int64: every op, length, alignment and aliasing matches the reference") {
  check_every_op<std::int64_t>();
}

TEST_CASE("reduce integer sum and product wrap around like two's complement hardware") {
  // 37 elements: two full vector iterations for int8 would need 64, so this covers the vector
  // body for the wider types and the scalar tail for all of them.
  constexpr std::size_t n = 37;
  auto run = [&](auto max_v, auto one, auto want_sum, ReduceOp op) {
    using T = decltype(max_v);
    std::vector<T> a(n, max_v), b(n, one), d(n);
    kolo::reduce(d.data(), a.data(), b.data(), n, kolo::dtype_of<T>(), op);
    for (std::size_t i = 0; i < n; ++i) CHECK(d[i] == want_sum);
  };
  run(std::int8_t{127}, std::int8_t{1}, std::int8_t{-128}, ReduceOp::sum);
  run(std::uint8_t{255}, std::uint8_t{1}, std::uint8_t{0}, ReduceOp::sum);
  run(std::int32_t{std::numeric_limits<std::int32_t>::max()}, std::int32_t{1},
      std::int32_t{std::numeric_limits<std::int32_t>::min()}, ReduceOp::sum);
  run(std::int64_t{std::numeric_limits<std::int64_t>::max()}, std::int64_t{1},
      std::int64_t{std::numeric_limits<std::int64_t>::min()}, ReduceOp::sum);
  // Average is reduced as a sum, so it wraps the same way before the final division.
  run(std::int8_t{-128}, std::int8_t{-1}, std::int8_t{127}, ReduceOp::average);
  run(std::int8_t{64}, std::int8_t{2}, std::int8_t{-128}, ReduceOp::product);
  run(std::uint8_t{16}, std::uint8_t{16}, std::uint8_t{0}, ReduceOp::product);
  run(std::int32_t{65536}, std::int32_t{65536}, std::int32_t{0}, ReduceOp::product);
}

TEST_CASE("reduce float16/bfloat16 round to nearest even, overflow to Inf") {
  auto sum16 = [](float x, float y) {
    float16 a(x), b(y), d;
    kolo::reduce(&d, &a, &b, 1, DataType::float16, ReduceOp::sum);
    return d.bits;
  };
  CHECK(sum16(1.0f, 2.0f) == float16(3.0f).bits);
  CHECK(sum16(2048.0f, 1.0f) == float16(2048.0f).bits);  // tie: 2049 -> even 2048
  CHECK(sum16(2048.0f, 3.0f) == float16(2052.0f).bits);  // tie: 2051 -> even 2052
  CHECK(sum16(65504.0f, 8.0f) == 0x7bff);                // below half an ulp (16): stays
  CHECK(sum16(65504.0f, 16.0f) == 0x7c00);               // tie with odd 0x7bff: Inf
  CHECK(sum16(65504.0f, 65504.0f) == 0x7c00);
  CHECK(sum16(-65504.0f, -65504.0f) == 0xfc00);
  // Two subnormals add exactly; the smallest subnormals are 2^-24 apart.
  CHECK(sum16(std::ldexp(1.0f, -24), std::ldexp(1.0f, -24)) == 0x0002);

  auto sumbf = [](float x, float y) {
    bfloat16 a(x), b(y), d;
    kolo::reduce(&d, &a, &b, 1, DataType::bfloat16, ReduceOp::sum);
    return d.bits;
  };
  CHECK(sumbf(1.0f, std::ldexp(1.0f, -8)) == 0x3f80);   // 1 + half an ulp: tie -> even (1)
  CHECK(sumbf(1.0f, std::ldexp(3.0f, -8)) == 0x3f82);   // 1 + 1.5 ulp: tie -> even (up)
  CHECK(sumbf(256.0f, 1.0f) == bfloat16(256.0f).bits);  // 257 is a tie -> 256
  CHECK(sumbf(3.0e38f, 3.0e38f) == 0x7f80);             // overflow -> Inf
}

TEST_CASE("reduce NaN and infinity stay NaN and infinity") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> a(20, 1.0f), b(20, 2.0f), d(20);
  a[3] = nan;
  a[18] = nan;  // one in the vector body, one in the tail
  b[5] = inf;
  kolo::reduce(d.data(), a.data(), b.data(), d.size(), DataType::float32, ReduceOp::sum);
  CHECK(std::isnan(d[3]));
  CHECK(std::isnan(d[18]));
  CHECK(std::isinf(d[5]));
  CHECK(d[0] == 3.0f);

  std::vector<float16> ha(20, float16(1.0f)), hb(20, float16(2.0f)), hd(20);
  ha[3] = float16(nan);
  hb[5] = float16(inf);
  kolo::reduce(hd.data(), ha.data(), hb.data(), hd.size(), DataType::float16, ReduceOp::sum);
  CHECK(std::isnan(static_cast<float>(hd[3])));
  CHECK(std::isinf(static_cast<float>(hd[5])));
}

TEST_CASE("reduce_function: average shares the sum kernel, bad tags are ConfigErrors") {
  for (DataType dt : kolo::all_dtypes) {
    CAPTURE(kolo::dtype_name(dt));
    // Compared as bool: doctest cannot print function pointers.
    const bool same =
        kolo::reduce_function(dt, ReduceOp::average) == kolo::reduce_function(dt, ReduceOp::sum);
    const bool differ =
        kolo::reduce_function(dt, ReduceOp::min) != kolo::reduce_function(dt, ReduceOp::max);
    CHECK(same);
    CHECK(differ);
  }
  CHECK_THROWS_AS(kolo::reduce_function(DataType::float32, static_cast<ReduceOp>(99)),
                  kolo::ConfigError);
  CHECK_THROWS_AS(kolo::reduce_function(static_cast<DataType>(42), ReduceOp::sum),
                  kolo::ConfigError);
  // Zero elements with null pointers is a valid (empty) reduction.
  kolo::reduce(nullptr, nullptr, nullptr, 0, DataType::float64, ReduceOp::product);
}

TEST_CASE("finish_average float16: exact rounding of the division") {
  check_finish_average<float16>();
}
TEST_CASE("finish_average bfloat16: exact rounding of the division") {
  check_finish_average<bfloat16>();
}
TEST_CASE("finish_average float32 and float64 divide exactly as IEEE does") {
  check_finish_average<float>();
  check_finish_average<double>();
}
TEST_CASE("finish_average integers truncate toward zero, for any rank count") {
  check_finish_average<std::int8_t>();
  check_finish_average<std::uint8_t>();
  check_finish_average<std::int32_t>();
  check_finish_average<std::int64_t>();

  std::int32_t v[] = {7, -7, 1, -1, 0, 9, -9};
  kolo::finish_average(v, 7, DataType::int32, 2);
  const std::int32_t want[] = {3, -3, 0, 0, 0, 4, -4};
  for (int i = 0; i < 7; ++i) CHECK(v[i] == want[i]);

  // More ranks than int8/uint8 can count: the divisor must not be narrowed to the element type.
  std::int8_t s8[] = {-128, 127, -100, 100};
  kolo::finish_average(s8, 4, DataType::int8, 300);
  for (auto x : s8) CHECK(x == 0);
  std::uint8_t u8[] = {255, 200};
  kolo::finish_average(u8, 2, DataType::uint8, 256);
  CHECK(u8[0] == 0);
  CHECK(u8[1] == 0);
  std::int8_t s8b[] = {-128, 127};
  kolo::finish_average(s8b, 2, DataType::int8, 100);
  CHECK(s8b[0] == -1);
  CHECK(s8b[1] == 1);
}

TEST_CASE("average of four ranks' buffers: reduce as a sum, then finish_average") {
  constexpr int ranks = 4;
  constexpr std::size_t n = 65;
  std::vector<std::vector<float>> in(ranks, std::vector<float>(n));
  for (int r = 0; r < ranks; ++r) {
    for (std::size_t i = 0; i < n; ++i)
      in[r][i] = static_cast<float>(r * 100 + static_cast<int>(i));
  }
  std::vector<float> acc = in[0];
  for (int r = 1; r < ranks; ++r) {
    kolo::reduce(acc.data(), acc.data(), in[r].data(), n, DataType::float32, ReduceOp::average);
  }
  kolo::finish_average(acc.data(), n, DataType::float32, ranks);
  for (std::size_t i = 0; i < n; ++i) CHECK(acc[i] == 150.0f + static_cast<float>(i));
}
