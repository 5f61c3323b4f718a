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
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::average}) {
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
