// The correctness matrix, run by every rank under kolo-run: every collective × every dtype ×
// every reduce op × element counts {0, 1, 7, 1000, 1048579}, in-place and out-of-place.
//
// Inputs are small integers chosen so every summation order is exact in every dtype (sums of at
// most 8 ranks stay below 127 and below float16's 2048), so results are checked exactly; the
// one inexact step, the division of a floating-point average, is allowed one ulp. Random
// float16/bfloat16 data is checked apart, against a float32-accumulated reference within the
// rounding bound of n-1 additions.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "mp_common.hpp"

#if defined(KOLO_TEST_MPI)
#include <time.h>
#include <unistd.h>

#include <algorithm>
#endif

using kolo::DataType;
using kolo::ReduceOp;
using kolo::TensorView;
using namespace kolo_test;

KOLO_TEST_DEFINE_CONNECT

namespace {

const std::size_t kCounts[] = {0, 1, 7, 1000, 1048579};

std::string label(const char* what, DataType t, std::size_t count, const char* mode,
                  ReduceOp op = ReduceOp::sum, bool with_op = false) {
  std::string s = std::string(what) + " " + std::string(kolo::dtype_name(t)) +
                  " count=" + std::to_string(count) + " " + mode;
  if (with_op) s += " op=" + std::string(kolo::reduce_op_name(op));
  return s + " ranks=" + std::to_string(comm().size()) + " rank=" + std::to_string(comm().rank());
}

}  // namespace

TEST_CASE("allreduce: every dtype x op x count - in-place and out-of-place") {
  auto& c = comm();
  const int n = c.size(), r = c.rank();
  for (DataType dt : kolo::all_dtypes) {
    kolo::visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      for (ReduceOp op : kolo::all_reduce_ops) {
        for (std::size_t count : kCounts) {
          std::vector<T> in(count), out(count, from_double<T>(99));
          for (std::size_t i = 0; i < count; ++i) in[i] = from_double<T>(input_value<T>(op, r, i));
          const std::vector<T> original = in;
          // Out-of-place: the input must come back untouched.
          c.allreduce(TensorView(in.data(), count, dt), TensorView(out.data(), count, dt), op);
          std::size_t wrong = 0, touched = 0;
          for (std::size_t i = 0; i < count; ++i) {
            wrong += !close(out[i], expected_value<T>(op, n, i), op);
            touched += std::memcmp(&in[i], &original[i], sizeof(T)) != 0;
          }
          CHECK_MESSAGE(wrong == 0, label("allreduce", dt, count, "out-of-place", op, true));
          CHECK_MESSAGE(touched == 0, label("allreduce input modified", dt, count, "", op, true));
          // In-place.
          c.allreduce(TensorView(in.data(), count, dt), op);
          wrong = 0;
          for (std::size_t i = 0; i < count; ++i)
            wrong += !close(in[i], expected_value<T>(op, n, i), op);
          CHECK_MESSAGE(wrong == 0, label("allreduce", dt, count, "in-place", op, true));
        }
      }
    });
  }
}

TEST_CASE("reduce_scatter: every dtype x op x count - in-place and out-of-place") {
  auto& c = comm();
  const int n = c.size(), r = c.rank();
  const auto un = static_cast<std::size_t>(n);
  for (DataType dt : kolo::all_dtypes) {
    kolo::visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      for (ReduceOp op : kolo::all_reduce_ops) {
        for (std::size_t total : kCounts) {
          // Each rank's block; the largest case keeps the whole input near 1048579 elements.
          const std::size_t block = total == 1048579 ? (total + un - 1) / un : total;
          std::vector<T> in(block * un), out(block, from_double<T>(99));
          for (std::size_t i = 0; i < in.size(); ++i)
            in[i] = from_double<T>(input_value<T>(op, r, i));
          c.reduce_scatter(TensorView(in.data(), in.size(), dt), TensorView(out.data(), block, dt),
                           op);
          std::size_t wrong = 0;
          const std::size_t base = static_cast<std::size_t>(r) * block;
          for (std::size_t i = 0; i < block; ++i)
            wrong += !close(out[i], expected_value<T>(op, n, base + i), op);
          CHECK_MESSAGE(wrong == 0, label("reduce_scatter", dt, block, "out-of-place", op, true));
          // In-place: the output is this rank's own block of the input.
          c.reduce_scatter(TensorView(in.data(), in.size(), dt),
                           TensorView(in.data() + base, block, dt), op);
          wrong = 0;
          for (std::size_t i = 0; i < block; ++i)
            wrong += !close(in[base + i], expected_value<T>(op, n, base + i), op);
          CHECK_MESSAGE(wrong == 0, label("reduce_scatter", dt, block, "in-place", op, true));
        }
      }
    });
  }
}

template <class T>
double gather_value(int rank, std::size_t i) {
  const auto k = static_cast<long long>((static_cast<std::size_t>(rank) * 131 + i) % 100);
  return is_signed_elem<T>() ? static_cast<double>(k - 50) : static_cast<double>(k);
}

TEST_CASE("allgather and allgatherv: every dtype x count - in-place and out-of-place") {
  auto& c = comm();
  const int n = c.size(), r = c.rank();
  const auto un = static_cast<std::size_t>(n);
  for (DataType dt : kolo::all_dtypes) {
    kolo::visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      for (std::size_t listed : kCounts) {
        // Each rank's input, scaled by 1/n in the largest case as reduce_scatter's block is: the
        // output stays near 1048579 elements whatever the rank count, and each rank's block
        // (131073+ elements, 512 KiB+ in 4-byte types at 8 ranks) still spans several 256 KiB
        // ring segments.
        const std::size_t count = listed == 1048579 ? (listed + un - 1) / un : listed;
        std::vector<T> in(count), out(count * un, from_double<T>(99));
        for (std::size_t i = 0; i < count; ++i) in[i] = from_double<T>(gather_value<T>(r, i));
        c.allgather(TensorView(in.data(), count, dt), TensorView(out.data(), out.size(), dt));
        std::size_t wrong = 0;
        for (int q = 0; q < n; ++q) {
          for (std::size_t i = 0; i < count; ++i) {
            wrong +=
                to_double(out[static_cast<std::size_t>(q) * count + i]) != gather_value<T>(q, i);
          }
        }
        CHECK_MESSAGE(wrong == 0, label("allgather", dt, count, "out-of-place"));
        // In-place: the input already sits in this rank's slot of the output.
        std::vector<T> io(count * un, from_double<T>(99));
        // std::copy_n, not memcpy: with count 0 the pointers may be null (undefined for memcpy).
        std::copy_n(in.data(), count, io.data() + static_cast<std::size_t>(r) * count);
        c.allgather(TensorView(io.data() + static_cast<std::size_t>(r) * count, count, dt),
                    TensorView(io.data(), io.size(), dt));
        CHECK_MESSAGE(
            (io.empty() || std::memcmp(io.data(), out.data(), io.size() * sizeof(T)) == 0),
            label("allgather", dt, count, "in-place"));

        // allgatherv: uneven counts, some zero, derived from `count`.
        std::vector<std::size_t> counts(un);
        for (std::size_t q = 0; q < un; ++q)
          counts[q] = count == 0 ? 0 : (count * (q + 1) + q) % (count + 3);
        const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
        std::vector<T> vin(counts[static_cast<std::size_t>(r)]), vout(total, from_double<T>(99));
        for (std::size_t i = 0; i < vin.size(); ++i) vin[i] = from_double<T>(gather_value<T>(r, i));
        c.allgatherv(TensorView(vin.data(), vin.size(), dt), TensorView(vout.data(), total, dt),
                     counts);
        wrong = 0;
        std::size_t off = 0;
        for (int q = 0; q < n; ++q) {
          for (std::size_t i = 0; i < counts[static_cast<std::size_t>(q)]; ++i) {
            wrong += to_double(vout[off + i]) != gather_value<T>(q, i);
          }
          off += counts[static_cast<std::size_t>(q)];
        }
        CHECK_MESSAGE(wrong == 0, label("allgatherv", dt, count, "out-of-place"));
      }
    });
  }
}

TEST_CASE("broadcast: every dtype x count x root") {
  auto& c = comm();
  const int n = c.size(), r = c.rank();
  const int roots[] = {0, n - 1, n / 2};
  for (DataType dt : kolo::all_dtypes) {
    kolo::visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      for (std::size_t count : kCounts) {
        for (int root : roots) {
          std::vector<T> buf(count, from_double<T>(99));
          if (r == root) {
            for (std::size_t i = 0; i < count; ++i)
              buf[i] = from_double<T>(gather_value<T>(root, i));
          }
          c.broadcast(TensorView(buf.data(), count, dt), root);
          std::size_t wrong = 0;
          for (std::size_t i = 0; i < count; ++i)
            wrong += to_double(buf[i]) != gather_value<T>(root, i);
          CHECK_MESSAGE(wrong == 0,
                        label("broadcast", dt, count, ("root=" + std::to_string(root)).c_str()));
        }
      }
    });
  }
}

TEST_CASE("alltoall: every dtype x count") {
  auto& c = comm();
  const int n = c.size(), r = c.rank();
  const auto un = static_cast<std::size_t>(n);
  auto code = [](int from, int to, std::size_t k) {
    return static_cast<double>(
        (static_cast<std::size_t>(from) * 17 + static_cast<std::size_t>(to) * 5 + k) % 100);
  };
  for (DataType dt : kolo::all_dtypes) {
    kolo::visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      for (std::size_t total : kCounts) {
        const std::size_t block = total == 1048579 ? (total + un - 1) / un : total;
        std::vector<T> in(block * un), out(block * un, from_double<T>(99));
        for (int to = 0; to < n; ++to) {
          for (std::size_t k = 0; k < block; ++k)
            in[static_cast<std::size_t>(to) * block + k] = from_double<T>(code(r, to, k));
        }
        c.alltoall(TensorView(in.data(), in.size(), dt), TensorView(out.data(), out.size(), dt));
        std::size_t wrong = 0;
        for (int from = 0; from < n; ++from) {
          for (std::size_t k = 0; k < block; ++k) {
            wrong += to_double(out[static_cast<std::size_t>(from) * block + k]) != code(from, r, k);
          }
        }
        CHECK_MESSAGE(wrong == 0, label("alltoall", dt, block, "out-of-place"));
      }
    });
  }
}

TEST_CASE("barrier: nobody leaves before everyone arrived") {
  auto& c = comm();
#if !defined(KOLO_TEST_MPI)
  // Each rank adds to a store counter before the barrier; after it, all increments are visible.
  for (int round = 0; round < 3; ++round) {
    if (c.size() > 1) c.bootstrap()->store()->add("test/barrier/" + std::to_string(round), 1);
    c.barrier();
    if (c.size() > 1) {
      const std::string v = c.bootstrap()->store()->get("test/barrier/" + std::to_string(round));
      CHECK(std::stoll(v) == c.size());
    }
  }
#else
  // No store under MPI: one rank arrives late each round, and every rank's arrival and departure
  // times (CLOCK_MONOTONIC, shared by the processes of one host) show that nobody left before the
  // last arrival.
  for (int round = 0; round < 3; ++round) {
    if (c.rank() == round % c.size()) ::usleep(50000);
    const auto now = [] {
      timespec ts{};
      ::clock_gettime(CLOCK_MONOTONIC, &ts);
      return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
    };
    std::vector<std::int64_t> mine = {now(), 0};
    c.barrier();
    mine[1] = now();
    std::vector<std::int64_t> all(2 * static_cast<std::size_t>(c.size()));
    c.allgather(TensorView(mine.data(), 2, DataType::int64),
                TensorView(all.data(), all.size(), DataType::int64));
    std::int64_t last_arrival = 0, first_departure = INT64_MAX;
    for (std::size_t q = 0; q < all.size(); q += 2) {
      last_arrival = std::max(last_arrival, all[q]);
      first_departure = std::min(first_departure, all[q + 1]);
    }
    CHECK(first_departure >= last_arrival);
  }
#endif
}

TEST_CASE("typed span overloads and topology") {
  auto& c = comm();
  std::vector<std::int64_t> v(5, c.rank());
  c.allreduce(std::span<std::int64_t>(v), ReduceOp::max);
  for (auto x : v) CHECK(x == c.size() - 1);
  CHECK(c.local_size() >= 1);
  CHECK(c.local_rank() < c.local_size());
  CHECK(c.cross_rank() < c.cross_size());
}

#if !defined(KOLO_TEST_MPI)  // MPI chooses its own routes (btl); no store, no host keys
TEST_CASE("routes follow hosts: shared memory within a host and TCP across hosts") {
  auto& c = comm();
  auto& t = c.transport();
  const auto& keys = c.bootstrap()->host_keys();
  for (int p = 0; p < c.size(); ++p) {
    if (p == c.rank()) continue;
    const bool same_host =
        keys[static_cast<std::size_t>(p)] == keys[static_cast<std::size_t>(c.rank())];
    kolo::Route want = kolo::Route::tcp;
    if (t.mode() == kolo::RouteMode::shm_only) want = kolo::Route::shm;
    if (t.mode() == kolo::RouteMode::routed && same_host) want = kolo::Route::shm;
    CHECK_MESSAGE(t.route(p) == want,
                  "route to rank " << p << " is " << kolo::route_name(t.route(p)));
  }
  // The namespace tests say how many hosts and ranks per host they started.
  if (const char* h = std::getenv("KOLO_TEST_EXPECT_HOSTS")) {
    CHECK(c.cross_size() == std::atoi(h));
    CHECK(c.size() % c.cross_size() == 0);
    CHECK(c.local_size() == c.size() / c.cross_size());
    // Ranks on one host share memory: this host's shared-memory peer count is local_size - 1.
    int shm_peers = 0;
    for (int p = 0; p < c.size(); ++p) shm_peers += p != c.rank() && t.route(p) == kolo::Route::shm;
    CHECK(shm_peers == c.local_size() - 1);
    if (c.cross_size() > 1) CHECK(shm_peers < c.size() - 1);  // and some peers are remote
  }
}
#endif

// ---- algorithm selection (issue 4): appended; the CTest entries force each algorithm ----

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <random>
#include <utility>

namespace {

// KOLO_TEST_EXPECT_<WHAT>="NAME" or "NAME@BYTES": the named algorithm must run (a forced one
// must not silently fall back; a topology must make the model pick it at BYTES).
std::optional<std::pair<std::string, std::size_t>> expected_algorithm(const char* var,
                                                                      std::size_t dflt) {
  const char* v = std::getenv(var);
  if (!v || !*v) return std::nullopt;
  const std::string s(v);
  const auto at = s.find('@');
  if (at == std::string::npos) return std::make_pair(s, dflt);
  return std::make_pair(s.substr(0, at), static_cast<std::size_t>(std::stoull(s.substr(at + 1))));
}

}  // namespace

TEST_CASE("allreduce: results are bit-identical on every rank (random floats)") {
  // Sums of random floats depend on the order of the additions; data-parallel training needs
  // every rank to end with the same bits, so each algorithm must compute each element once (or
  // in one order everywhere). Compare every rank's result with rank 0's through an allgather.
  auto& c = comm();
  const int n = c.size(), r = c.rank();
  const auto un = static_cast<std::size_t>(n);
  std::mt19937_64 rng(0x6b6f6c6fu + static_cast<unsigned>(r));
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  for (DataType dt :
       {DataType::float32, DataType::float64, DataType::float16, DataType::bfloat16}) {
    kolo::visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::average}) {
        for (std::size_t count :
             {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{262147}}) {
          std::vector<T> v(count);
          // Magnitudes spread over six decades, so a different summation order shows.
          for (auto& x : v) x = from_double<T>(dist(rng) * std::pow(10.0, 3 * dist(rng)));
          c.allreduce(TensorView(v.data(), count, dt), op);
          std::vector<T> all(count * un);
          c.allgather(TensorView(v.data(), count, dt), TensorView(all.data(), all.size(), dt));
          std::size_t differ = 0;
          for (std::size_t q = 1; q < un; ++q) {
            differ += std::memcmp(all.data(), all.data() + q * count, count * sizeof(T)) != 0;
          }
          CHECK_MESSAGE(differ == 0, label("allreduce bit-identical", dt, count, "", op, true)
                                         << " algorithm "
                                         << kolo::algorithm_name(c.last_allreduce_algorithm()));
        }
      }
    });
  }
}

namespace {

// Rank q's pseudo-random half-precision input in [-1, 1), a hash of (q, i) (splitmix64's
// finalizer): every rank builds every rank's input to compute the reference on its own, and a
// hash keeps that cheap where 8 ranks share two cores.
template <class T>
std::vector<T> half_input(int q, std::size_t count) {
  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) {
    std::uint64_t z = (static_cast<std::uint64_t>(q) << 40) + i + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    v[i] = T(static_cast<float>(z >> 40) * 0x1p-23f - 1.0f);
  }
  return v;
}

// How far a half-precision sum of n ranks' values may be from the float32-accumulated
// reference. However an algorithm orders the additions (a ring's chain, a tree's or
// halving-doubling's pairs, a direct reduction), each element is the result of at most n-1
// additions, and each rounds its partial sum to the element type at most once, so the error is
// at most gamma(n-1) * sum|x_i| with gamma(k) = k*u / (1 - k*u) and u the unit roundoff (2^-11
// for float16, 2^-8 for bfloat16); plus half float16's smallest subnormal (2^-25) per addition,
// for sums that cancel into the subnormal range, and the reference's own float32 error
// (n * 2^-24 * sum|x_i|). A lost, doubled or misplaced contribution is off by about |x_i|
// (~0.5), far outside this bound (at most 0.028 * sum|x_i| for bfloat16 on 8 ranks).
template <class T>
double half_sum_tolerance(int n, double sum_abs) {
  const double u = std::is_same_v<T, kolo::float16> ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
  const double k = n - 1;
  return k * u / (1 - k * u) * sum_abs + k * std::ldexp(1.0, -25) +
         n * std::ldexp(1.0, -24) * sum_abs;
}

}  // namespace

TEST_CASE("allreduce and reduce_scatter: float16/bfloat16 random data, float32 reference") {
  // The matrix's integer inputs are exact in every order; these are not: random values in
  // [-1, 1], so each element's result is checked against the sum accumulated in float32 within
  // the bound above, and the allreduce's result must have the same bits on every rank.
  auto& c = comm();
  const int n = c.size(), r = c.rank();
  const auto un = static_cast<std::size_t>(n);
  for (DataType dt : {DataType::float16, DataType::bfloat16}) {
    kolo::visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (is_half_v<T>) {
        // 300007 elements: 586 KiB, several 256 KiB ring segments (the reduce_scatter's input
        // is cut into n blocks of it).
        for (std::size_t count : {std::size_t{1}, std::size_t{1000}, std::size_t{300007}}) {
          const std::size_t block = (count + un - 1) / un;
          const std::size_t total = block * un;  // reduce_scatter's input: n blocks
          std::vector<float> ref(total, 0.0f);
          std::vector<double> sum_abs(total, 0.0);
          for (int q = 0; q < n; ++q) {
            const std::vector<T> x = half_input<T>(q, total);
            for (std::size_t i = 0; i < total; ++i) {
              ref[i] += static_cast<float>(x[i]);
              sum_abs[i] += std::fabs(static_cast<double>(static_cast<float>(x[i])));
            }
          }
          auto off_by = [&](const T* got, std::size_t first, std::size_t k) {
            std::size_t wrong = 0;
            for (std::size_t i = 0; i < k; ++i) {
              const double err = std::fabs(static_cast<double>(static_cast<float>(got[i])) -
                                           static_cast<double>(ref[first + i]));
              wrong += !(err <= half_sum_tolerance<T>(n, sum_abs[first + i]));
            }
            return wrong;
          };

          std::vector<T> v = half_input<T>(r, count);
          c.allreduce(TensorView(v.data(), count, dt), ReduceOp::sum);
          CHECK_MESSAGE(off_by(v.data(), 0, count) == 0,
                        label("allreduce vs float32 reference", dt, count, "in-place")
                            << " algorithm " << kolo::algorithm_name(c.last_allreduce_algorithm()));
          std::vector<T> all(count * un);
          c.allgather(TensorView(v.data(), count, dt), TensorView(all.data(), all.size(), dt));
          std::size_t differ = 0;
          for (std::size_t q = 1; q < un; ++q)
            differ += std::memcmp(all.data(), all.data() + q * count, count * sizeof(T)) != 0;
          CHECK_MESSAGE(differ == 0, label("allreduce bit-identical", dt, count, ""));

          std::vector<T> in = half_input<T>(r, total);
          std::vector<T> out(block);
          c.reduce_scatter(TensorView(in.data(), total, dt), TensorView(out.data(), block, dt),
                           ReduceOp::sum);
          CHECK_MESSAGE(off_by(out.data(), static_cast<std::size_t>(r) * block, block) == 0,
                        label("reduce_scatter vs float32 reference", dt, block, "out-of-place"));
        }
      }
    });
  }
}

TEST_CASE("allreduce: the expected algorithm runs (KOLO_TEST_EXPECT_ALLREDUCE)") {
  auto& c = comm();
  const auto want = expected_algorithm("KOLO_TEST_EXPECT_ALLREDUCE", 4096);
  if (!want) return;
  const std::size_t count = std::max<std::size_t>(1, want->second / sizeof(std::int32_t));
  std::vector<std::int32_t> v(count, c.rank() + 1);
  c.allreduce(std::span<std::int32_t>(v));
  CHECK(std::string(kolo::algorithm_name(c.last_allreduce_algorithm())) == want->first);
  const std::int32_t sum = c.size() * (c.size() + 1) / 2;
  CHECK(std::count(v.begin(), v.end(), sum) == static_cast<std::ptrdiff_t>(count));
  MESSAGE("selector: " << c.selector().describe());
}

TEST_CASE("broadcast: the expected algorithm runs (KOLO_TEST_EXPECT_BROADCAST)") {
  auto& c = comm();
  const auto want = expected_algorithm("KOLO_TEST_EXPECT_BROADCAST", 4096);
  if (!want) return;
  std::vector<std::uint8_t> v(want->second, c.rank() == 0 ? 7 : 0);
  c.broadcast(std::span<std::uint8_t>(v), 0);
  CHECK(std::string(kolo::algorithm_name(c.last_broadcast_algorithm())) == want->first);
  CHECK(std::count(v.begin(), v.end(), 7) == static_cast<std::ptrdiff_t>(v.size()));
}

namespace {

// The tensors of one allreduce_coalesced case: their counts, and whether they lie back to back
// in memory (merged into one run) or apart (a gap of 3 elements between neighbours).
struct CoalescedLayout {
  std::vector<std::size_t> counts;
  bool apart = true;
};

std::vector<CoalescedLayout> coalesced_layouts(bool large) {
  std::vector<CoalescedLayout> v;
  v.push_back({{}, true});
  v.push_back({{0}, true});
  v.push_back({{1, 0, 7, 1000, 3}, true});
  v.push_back({{1, 0, 7, 1000, 3}, false});
  if (large) {
    std::vector<std::size_t> many;  // 300 small tensors, some empty, across several segments
    for (std::size_t i = 0; i < 300; ++i) many.push_back((i * 37) % 97);
    many.push_back(70001);  // one that spans several ring segments by itself
    many.push_back(2);
    v.push_back({many, true});
    v.push_back({many, false});
  }
  return v;
}

}  // namespace

TEST_CASE("coalesced allreduce: every dtype x op, tensor lists apart and back to back") {
  auto& c = comm();
  const int n = c.size(), r = c.rank();
  for (DataType dt : kolo::all_dtypes) {
    kolo::visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      for (ReduceOp op : kolo::all_reduce_ops) {
        const bool large = dt == DataType::float32 || dt == DataType::int64;
        for (const CoalescedLayout& lay : coalesced_layouts(large)) {
          const std::size_t gap = lay.apart ? 3 : 0;
          std::size_t total = 0;
          for (std::size_t k : lay.counts) total += k + gap;
          for (bool in_place : {false, true}) {
            std::vector<T> in(total + 1, from_double<T>(55)), out(total + 1, from_double<T>(99));
            std::vector<TensorView> ins, outs;
            std::size_t at = 0, logical = 0;
            for (std::size_t k : lay.counts) {
              for (std::size_t i = 0; i < k; ++i) {
                in[at + i] = from_double<T>(input_value<T>(op, r, logical + i));
              }
              ins.emplace_back(in.data() + at, k, dt);
              outs.emplace_back((in_place ? in : out).data() + at, k, dt);
              at += k + gap;
              logical += k;
            }
            const std::vector<T> original = in;
            c.allreduce_coalesced(ins, outs, op);
            const std::vector<T>& res = in_place ? in : out;
            std::size_t wrong = 0, touched = 0, gaps = 0;
            at = 0;
            logical = 0;
            for (std::size_t k : lay.counts) {
              for (std::size_t i = 0; i < k; ++i) {
                wrong += !close(res[at + i], expected_value<T>(op, n, logical + i), op);
                if (!in_place) touched += std::memcmp(&in[at + i], &original[at + i], sizeof(T));
              }
              for (std::size_t i = k; i < k + gap; ++i) {  // between tensors: never written
                gaps += !close(res[at + i], in_place ? 55 : 99, ReduceOp::sum);
              }
              at += k + gap;
              logical += k;
            }
            gaps += !close(res[total], in_place ? 55 : 99, ReduceOp::sum);
            const std::string what = label("allreduce_coalesced", dt, logical,
                                           in_place ? "in-place" : "out-of-place", op, true) +
                                     " tensors=" + std::to_string(lay.counts.size()) +
                                     (lay.apart ? " apart" : " packed");
            CHECK_MESSAGE(wrong == 0, what);
            CHECK_MESSAGE(touched == 0, what << ": input modified");
            CHECK_MESSAGE(gaps == 0, what << ": memory between tensors written");
          }
        }
      }
    });
  }
}
