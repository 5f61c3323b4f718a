// The engine's compressed float32 allreduce stays within the documented bound of the exact sum.
//
// The bound (docs/optimizer.md, "Compression bounds"). With unit roundoff u of the wire format
// (fp16: 2^-11, bf16: 2^-8), γ_m = m·u / (1 - m·u), and η = half the wire format's smallest
// subnormal spacing (fp16: 2^-25, bf16: 2^-134), an allreduce-sum of x_1..x_n over n ranks:
//   * compresses each x_r once:            x̂_r = x_r (1 + δ_r),  |δ_r| <= u   (or ± η)
//   * adds along some tree (ring or recursive doubling, n - 1 additions, each rounded to the
//     wire format): |ŝ - Σ x̂_r| <= γ_{n-1} Σ |x̂_r|                         (Higham, Thm 4.4)
//   so |ŝ - Σ x_r| <= γ_n Σ_r |x_r| + (2n - 1)·η        [(1 + u)(1 + γ_{n-1}) <= 1 + γ_n]
//   and decompression multiplies by postscale/size in fp32 (two more fp32 roundings, 2^-23
//   relative). The bound is per element and holds for any element count and summation order.
// Overflow is the exception: a partial sum beyond the format's range (fp16: 65504) is ±Inf —
// which is what gradient_predivide_factor (prescale 1/f before the sum) is for.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <kolo/engine/engine.hpp>
#include <kolo/kolo.hpp>

#include "tiny_mlp.hpp"

using kolo::CompressionPolicy;
using kolo::ReduceOp;
using kolo::TensorView;

namespace {

// Rank r's input for tensor t: mixed signs, magnitudes from 2^-20 to 2^4 (subnormal in fp16 at
// the low end), the same numbers whichever rank computes them.
std::vector<float> input(int r, std::size_t t, std::size_t count) {
  tiny::Rng rng{1000003ull * static_cast<std::uint64_t>(r + 1) + t};
  std::vector<float> v(count);
  for (auto& x : v) {
    x = std::exp2(rng.uniform(-20.0f, 4.0f));
    if (rng.next() & 1u) x = -x;
  }
  return v;
}

struct Wire {
  const char* name;
  double u, eta;
};

}  // namespace

TEST_CASE("compressed allreduce: within γ_n·Σ|x| + (2n-1)·η of the exact fp32 sum") {
  const Wire wires[] = {{"fp16", 0x1p-11, 0x1p-25}, {"bf16", 0x1p-8, 0x1p-134}};
  const std::size_t counts[] = {0, 1, 7, 1000, 100003};
  for (const Wire& w : wires) {
    const std::string wire_name = w.name;
    CAPTURE(wire_name);
    auto eo = kolo::EngineOptions::from_env();
    eo.compression = CompressionPolicy::parse(w.name);
    kolo::Engine<> engine(kolo::Communicator<>::from_env(), eo);
    const int n = engine.size(), me = engine.rank();
    const double gamma = n * w.u / (1 - n * w.u);
    auto round = [&](ReduceOp op) {
      CAPTURE(static_cast<int>(op));
      // All tensors in flight together: the engine fuses them into one compressed buffer.
      std::vector<std::vector<float>> mine, out;
      std::vector<kolo::Handle> hs;
      for (std::size_t t = 0; t < std::size(counts); ++t) {
        mine.push_back(input(me, t, counts[t]));
        out.emplace_back(counts[t], -1.0f);
      }
      for (std::size_t t = 0; t < std::size(counts); ++t) {
        hs.push_back(engine.allreduce_async(std::string(w.name) + "/" + std::to_string(t),
                                            TensorView(std::span<float>(mine[t])), op, 1.0, 1.0,
                                            TensorView(std::span<float>(out[t]))));
      }
      double worst = 0;  // largest error / bound seen
      std::size_t bad = 0;
      for (std::size_t t = 0; t < std::size(counts); ++t) {
        hs[t].wait();
        std::vector<double> exact(counts[t], 0.0), abs_sum(counts[t], 0.0);
        for (int r = 0; r < n; ++r) {
          const auto x = input(r, t, counts[t]);
          for (std::size_t i = 0; i < counts[t]; ++i) {
            exact[i] += x[i];
            abs_sum[i] += std::fabs(x[i]);
          }
        }
        const double post = op == ReduceOp::average ? 1.0 / n : 1.0;
        for (std::size_t i = 0; i < counts[t]; ++i) {
          const double got = out[t][i], want = exact[i] * post;
          const double bound =
              (gamma * abs_sum[i] + (2 * n - 1) * w.eta) * post + 0x1p-23 * std::fabs(got);
          const double err = std::fabs(got - want);
          worst = std::max(worst, err / bound);
          if (!(err <= bound) && bad++ < 5) {
            FAIL_CHECK("tensor " << t << "[" << i << "]: got " << got << ", exact " << want
                                 << ", error " << err << " > bound " << bound);
          }
        }
        CHECK(mine[t] == input(me, t, counts[t]));  // out of place: the input is untouched
      }
      CHECK(bad == 0);
      MESSAGE(std::string(w.name) << std::string(op == ReduceOp::sum ? " sum" : " average")
                                  << ", n = " << n << ": worst error / bound = " << worst);
    };
    round(ReduceOp::sum);
    round(ReduceOp::average);
    // On a loaded host the engine thread may take each submission in a cycle of its own (it wakes
    // at the first); a few more rounds, values checked as before, until one is fused. Every rank
    // runs the same number of rounds: the count of fused collectives is the same on all.
    for (int more = 0; more < 20 && engine.stats().fused_collectives == 0; ++more) {
      round(ReduceOp::sum);
    }
    CHECK(engine.stats().fused_collectives > 0);
  }
}

TEST_CASE("compressed allreduce: fp16 overflows to Inf; a predivide factor keeps it finite") {
  auto eo = kolo::EngineOptions::from_env();
  eo.compression = CompressionPolicy::parse("fp16");
  kolo::Engine<> engine(kolo::Communicator<>::from_env(), eo);
  const int n = engine.size();
  if (n == 1) return;  // one rank never adds: nothing can overflow
  // Every rank: 40000 (fits fp16); the sum n·40000 does not (> 65504).
  std::vector<float> a(100, 40000.0f), b(100, 40000.0f);
  engine.allreduce_async("overflow", TensorView(std::span<float>(a)), ReduceOp::average).wait();
  for (float x : a) CHECK(std::isinf(x));
  // Horovod's gradient_predivide_factor = n: prescale 1/n, postscale n (the average divides by
  // n again): every partial sum stays below 40000.
  const double f = n;
  engine
      .allreduce_async("predivided", TensorView(std::span<float>(b)), ReduceOp::average, 1.0 / f, f)
      .wait();
  for (float x : b) CHECK(x == doctest::Approx(40000.0).epsilon(n * 0x1p-11));
}

// Communicator::allreduce_compressed, each of its paths: the ring converting on the wire
// (forced, so every size takes it), the compress / allreduce / decompress passes (the Selector
// forced to another algorithm) and, where the ranks are on several hosts of equal rank counts
// (tests/netns: keyed/compressed/*), the hierarchical allreduce converting on the wire in each
// of its three rings. Small segments cut the blocks into many messages.
TEST_CASE("allreduce_compressed: exact where the wire is exact, bounded otherwise, same bits") {
  auto co = kolo::CommunicatorOptions::from_env();
  co.segment_bytes = 512;  // 256 16-bit elements per message: blocks of many segments
  // The hierarchical path pipelined from 512 elements on (1000 in 3 chunks, 70001 in 256).
  co.hierarchical_chunk_bytes = 1024;
  kolo::Communicator<> comm(kolo::Topology::from_env(), co);
  const int n = comm.size(), me = comm.rank();
  const std::size_t counts[] = {0, 1, 2, 3, 5, 255, 256, 257, 1000, 4099, 70001};
  const bool hosts = comm.host_groups().hosts > 1 && comm.host_groups().uniform;
  if (const char* want = std::getenv("KOLO_TEST_EXPECT_HOSTS")) {
    REQUIRE(comm.host_groups().hosts == std::atoi(want));
    REQUIRE(hosts);
  }
  std::vector<kolo::AllreduceAlgorithm> algos = {kolo::AllreduceAlgorithm::ring,
                                                 kolo::AllreduceAlgorithm::recursive_doubling};
  if (hosts) algos.push_back(kolo::AllreduceAlgorithm::hierarchical);
  const Wire wires[] = {{"fp16", 0x1p-11, 0x1p-25}, {"bf16", 0x1p-8, 0x1p-134}};
  for (const Wire& w : wires) {
    const CompressionPolicy c = CompressionPolicy::parse(w.name);
    // Wire roundings of partial sums, plus float32 additions (2^-24 each), n of each at most.
    const double u = w.u + 0x1p-24;
    const double gamma = n * u / (1 - n * u);
    for (const auto algo : algos) {
      comm.selector().force_allreduce(algo);
      double worst = 0;  // largest error / bound seen on this path
      const bool on_wire = n == 1 || algo == kolo::AllreduceAlgorithm::ring ||
                           algo == kolo::AllreduceAlgorithm::hierarchical;
      CHECK(comm.compresses_on_wire(1000, c) == on_wire);
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::average}) {
        for (bool in_place : {false, true}) {
          for (std::size_t count : counts) {
            const std::string wire_name = w.name;
            CAPTURE(wire_name);
            CAPTURE(static_cast<int>(algo));
            CAPTURE(static_cast<int>(op));
            CAPTURE(in_place);
            CAPTURE(count);
            // Exact: small integers, every partial sum (at most 3n² <= 256 up to n = 9, the
            // integers bfloat16 holds exactly) and the average representable.
            auto small = [&](int r, std::size_t i) { return n * static_cast<int>((r + i) % 4); };
            std::vector<float> a(count), out(count, -7.0f);
            for (std::size_t i = 0; i < count; ++i) a[i] = static_cast<float>(small(me, i));
            float* dst = in_place ? a.data() : out.data();
            comm.allreduce_compressed(TensorView(std::span<float>(a)),
                                      TensorView(dst, count, kolo::DataType::float32), op, c);
            if (n > 1 && on_wire) CHECK(comm.last_allreduce_algorithm() == algo);
            std::size_t wrong = 0;
            for (std::size_t i = 0; i < count; ++i) {
              double s = 0;
              for (int r = 0; r < n; ++r) s += small(r, i);
              const double want = op == ReduceOp::average ? s / n : s;
              if (dst[i] != want && wrong++ < 3)
                FAIL_CHECK("[" << i << "] " << dst[i] << " != " << want);
            }
            CHECK(wrong == 0);
            // Rounded: mixed magnitudes, within the bound, and the same bits on every rank.
            auto x = input(me, count, count);
            std::vector<float> got(count, -7.0f);
            float* d = in_place ? x.data() : got.data();
            comm.allreduce_compressed(TensorView(std::span<float>(x)),
                                      TensorView(d, count, kolo::DataType::float32), op, c);
            const double post = op == ReduceOp::average ? 1.0 / n : 1.0;
            std::vector<double> exact(count, 0.0), abs_sum(count, 0.0);
            for (int r = 0; r < n; ++r) {
              const auto xr = input(r, count, count);
              for (std::size_t i = 0; i < count; ++i) {
                exact[i] += xr[i];
                abs_sum[i] += std::fabs(xr[i]);
              }
            }
            for (std::size_t i = 0; i < count; ++i) {
              const double bound =
                  (gamma * abs_sum[i] + (2 * n - 1) * w.eta) * post + 0x1p-23 * std::fabs(d[i]);
              worst = std::max(worst, std::fabs(d[i] - exact[i] * post) / bound);
              if (!(std::fabs(d[i] - exact[i] * post) <= bound) && wrong++ < 3) {
                FAIL_CHECK("[" << i << "] " << d[i] << " vs exact " << exact[i] * post);
              }
            }
            CHECK(wrong == 0);
            if (!in_place) CHECK(x == input(me, count, count));
            std::vector<float> all(count * static_cast<std::size_t>(n));
            comm.allgather(TensorView(d, count, kolo::DataType::float32),
                           TensorView(std::span<float>(all)));
            for (int r = 0; r < n && count > 0; ++r) {  // (no memcmp of null pointers)
              CHECK(std::memcmp(all.data() + r * count, d, count * sizeof(float)) == 0);
            }
          }
        }
      }
      const std::string path = algo == kolo::AllreduceAlgorithm::ring           ? "on the wire"
                               : algo == kolo::AllreduceAlgorithm::hierarchical ? "hierarchical"
                                                                                : "in passes";
      MESSAGE(std::string(w.name) << " " << path << ", n = " << n
                                  << ": worst error / bound = " << worst);
    }
  }
  comm.selector().clear_overrides();
  // A float32 tensor only, sum or average only, a 16-bit wire only: errors that name it. The
  // error ends the communicator on every rank; a rank still in the barrier gets it there.
  std::vector<double> dbl(4, 1.0);
  auto bad_call = [&] {
    comm.barrier();
    comm.allreduce_compressed(TensorView(std::span<double>(dbl)),
                              TensorView(std::span<double>(dbl)), ReduceOp::sum,
                              CompressionPolicy::parse("fp16"));
  };
  CHECK_THROWS_WITH_AS(bad_call(), doctest::Contains("compression takes float32"), kolo::Error);
}

// The engine sends a lone unscaled float32 tensor through allreduce_compressed (no fusion
// buffer: fused_collectives stays 0); a scaled one, or a batch, takes the passes.
TEST_CASE("compressed allreduce: the engine converts a lone tensor on the wire") {
  kolo::Communicator<> comm(kolo::Topology::from_env());
  comm.selector().force_allreduce(kolo::AllreduceAlgorithm::ring);
  auto eo = kolo::EngineOptions::from_env();
  eo.compression = CompressionPolicy::parse("fp16");
  kolo::Engine<> engine(std::move(comm), eo);
  const int n = engine.size(), me = engine.rank();
  const std::size_t count = 50001;
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::average}) {
    CAPTURE(static_cast<int>(op));
    std::vector<float> a(count), out(count, -1.0f);
    for (std::size_t i = 0; i < count; ++i) a[i] = static_cast<float>((me + 1) * (i % 29) * n);
    engine
        .allreduce_async("lone", TensorView(std::span<float>(a)), op, 1.0, 1.0,
                         TensorView(std::span<float>(out)))
        .wait();
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i) {
      const double s = static_cast<double>(n) * (n * (n + 1) / 2) * (i % 29);
      wrong += out[i] != (op == ReduceOp::average ? s / n : s);
    }
    CHECK(wrong == 0);
  }
  CHECK(engine.stats().fused_collectives == 0);
  // Scaled: the passes (the fusion buffer carries the prescale).
  std::vector<float> b(count, 1.0f);
  engine.allreduce_async("scaled", TensorView(std::span<float>(b)), ReduceOp::sum, 0.5, 1.0).wait();
  for (float x : {b.front(), b[count / 2], b.back()}) CHECK(x == 0.5f * n);
  CHECK(engine.stats().fused_collectives == 1);
}
