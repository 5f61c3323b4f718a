// The engine's diagnostics and join semantics under kolo-run (every rank runs these cases in the
// same order, each with a fresh communicator and engine):
//  * join's average, both choices (EngineOptions::join_average), exact;
//  * an error in a fused collective names the user's tensors, a count and the op they asked for;
//  * a rank that stops (destroys its engine) while others still submit is named, with join();
//  * the engine entry points accept contiguous ranges.
#include <doctest/doctest.h>

#include <array>
#include <span>
#include <string>
#include <vector>

#include <kolo/engine/engine.hpp>
#include <kolo/kolo.hpp>

using kolo::DataType;
using kolo::ReduceOp;
using kolo::TensorView;

namespace {

kolo::Engine<> engine_with(kolo::EngineOptions opts) {
  return kolo::Engine<>(kolo::Communicator<>::from_env(), opts);
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Rank q's element i: small integers, so sums are exact in every type used here.
double contribution(int q, std::size_t tensor, std::size_t i) {
  return static_cast<double>((q + 1) * 3 + static_cast<int>((i * 5 + tensor) % 11));
}

// Runs the uneven-steps loop (rank r: 2 + r steps, then join) with `mode` and checks every
// element of every step exactly: the sum over the ranks still stepping, divided by the number
// of ranks (world_size) or by the number of ranks still stepping (active_ranks), with one
// division per element in the tensor's own type (integers truncate toward zero).
void check_join_average(kolo::JoinAverage mode) {
  auto opts = kolo::EngineOptions::from_env();
  opts.join_average = mode;
  auto engine = engine_with(opts);
  const int n = engine.size(), r = engine.rank();
  const int my_steps = 2 + r;
  std::size_t wrong = 0, checked = 0;
  for (int step = 0; step < my_steps; ++step) {
    int active = 0;
    for (int q = 0; q < n; ++q) active += (2 + q > step) ? 1 : 0;
    const int divisor = mode == kolo::JoinAverage::active_ranks ? active : n;
    // Tensor 0 alone (the unfused path: reduced in its own buffer), tensors 1-3 in one fused
    // batch of float32, tensor 4 float64, tensor 5 int32, tensor 6 float32 with a postscale.
    std::vector<std::vector<float>> f(4, std::vector<float>(301));
    std::vector<double> d(77);
    std::vector<std::int32_t> i32(55);
    std::vector<float> scaled(40);
    auto fill = [&](auto& v, std::size_t t) {
      for (std::size_t i = 0; i < v.size(); ++i)
        v[i] = static_cast<std::remove_reference_t<decltype(v[0])>>(contribution(r, t, i));
    };
    for (std::size_t t = 0; t < 4; ++t) fill(f[t], t);
    fill(d, 4);
    fill(i32, 5);
    fill(scaled, 6);
    engine.allreduce_async("join.alone", f[0], ReduceOp::average).wait();
    std::vector<kolo::Handle> hs;
    for (std::size_t t = 1; t < 4; ++t) {
      hs.push_back(
          engine.allreduce_async("join.fused" + std::to_string(t), f[t], ReduceOp::average));
    }
    hs.push_back(engine.allreduce_async("join.f64", d, ReduceOp::average));
    hs.push_back(engine.allreduce_async("join.i32", i32, ReduceOp::average));
    hs.push_back(engine.allreduce_async("join.scaled", scaled, ReduceOp::average, 1.0, 4.0));
    for (auto& h : hs) h.wait();
    auto sum = [&](std::size_t t, std::size_t i) {
      double s = 0;
      for (int q = 0; q < n; ++q) {
        if (2 + q > step) s += contribution(q, t, i);
      }
      return s;
    };
    for (std::size_t t = 0; t < 4; ++t) {
      for (std::size_t i = 0; i < f[t].size(); ++i, ++checked) {
        const bool bad = f[t][i] != static_cast<float>(sum(t, i)) / static_cast<float>(divisor);
        if (bad && wrong < 5)
          MESSAGE("step " << step << " t " << t << " i " << i << " got " << f[t][i] << " want "
                          << static_cast<float>(sum(t, i)) / static_cast<float>(divisor));
        wrong += bad;
      }
    }
    for (std::size_t i = 0; i < d.size(); ++i, ++checked) {
      wrong += d[i] != sum(4, i) / static_cast<double>(divisor);
    }
    for (std::size_t i = 0; i < i32.size(); ++i, ++checked) {
      wrong += i32[i] != static_cast<std::int32_t>(static_cast<long long>(sum(5, i)) / divisor);
    }
    // postscale 4 with an average: one multiplication by float32(4 / divisor), as documented.
    for (std::size_t i = 0; i < scaled.size(); ++i, ++checked) {
      const float want = static_cast<float>(sum(6, i)) * static_cast<float>(4.0 / divisor);
      wrong += scaled[i] != want;
    }
  }
  CHECK_MESSAGE(wrong == 0, wrong << " of " << checked << " elements differ (mode "
                                  << std::string(kolo::join_average_name(mode)) << ")");
  engine.join();
  std::vector<float> after(3, 2.0f);
  engine.allreduce_async("join.after", after, ReduceOp::average).wait();
  CHECK(after[0] == 2.0f);  // everyone is back: the average of equal values
}

}  // namespace

TEST_CASE("engine join: average divides by the number of ranks (world_size, the default)") {
  CHECK(kolo::EngineOptions{}.join_average == kolo::JoinAverage::world_size);
  check_join_average(kolo::JoinAverage::world_size);
}

TEST_CASE("engine join: average divides by the ranks that contributed (active_ranks)") {
  check_join_average(kolo::JoinAverage::active_ranks);
}

TEST_CASE("engine join: ranks that disagree about join_average get a MismatchError") {
  const auto topo = kolo::Topology::from_env();
  if (topo.size < 2) return;
  auto opts = kolo::EngineOptions::from_env();
  opts.join_average =
      topo.rank == 1 ? kolo::JoinAverage::active_ranks : kolo::JoinAverage::world_size;
  auto engine = engine_with(opts);
  std::vector<float> v(10, 1.0f);
  std::string m;
  // A named handle outlives the catch: the engine thread then never drops the last reference to
  // the exception while this thread reads it (a false positive under TSan, whose view of
  // libstdc++'s uninstrumented exception reference counts is blind).
  kolo::Handle h = engine.allreduce_async("disagree", v, ReduceOp::average);
  try {
    h.wait();
  } catch (const kolo::MismatchError& e) {
    m = e.what();
  }
  CHECK_MESSAGE(has(m, "'disagree'"), m);
  CHECK_MESSAGE(has(m, "divided by the active ranks"), m);
  // The option concerns averages only: a sum still agrees.
  engine.allreduce_async("agree", v, ReduceOp::sum).wait();
  CHECK(v[0] == static_cast<float>(topo.size));
}

TEST_CASE("engine errors: a fused collective that fails names the user's tensors and op") {
  // Rank 1 compresses to fp16 and the others do not: the engine's fused collective then carries
  // float16 on rank 1 and float32 elsewhere, and the Communicator reports a mismatch about its
  // own buffer. The engine must say which of the user's tensors that was, and the likely cause.
  const auto topo = kolo::Topology::from_env();
  if (topo.size < 2) return;
  const int me = topo.rank;
  auto opts = kolo::EngineOptions::from_env();
  opts.compression = me == 1 ? kolo::CompressionPolicy::parse("fp16") : kolo::CompressionPolicy{};
  auto engine = engine_with(opts);
  // One group: its 50 members always travel in one fused collective.
  std::vector<std::vector<float>> ts(50, std::vector<float>(1000, 1.0f));
  std::vector<std::pair<std::string, TensorView>> members;
  for (std::size_t i = 0; i < ts.size(); ++i) {
    members.emplace_back("layer" + std::to_string(i) + ".weight", kolo::buffer_view(ts[i]));
  }
  auto hs = engine.grouped_allreduce_async("model", members, ReduceOp::average);
  int mismatches = 0, named = 0;
  std::string sample;
  for (auto& h : hs) {
    try {
      h.wait();
    } catch (const kolo::MismatchError& e) {
      ++mismatches;
      const std::string m = e.what();
      if (sample.empty()) sample = m;
      // In the user's words: the op asked for, the first names, the count of the others; then
      // the Communicator's own message; then the likely cause. The failing collective is the
      // fused one; a rank still finishing the cycle's negotiation when the abort arrives says
      // so, naming what was pending there.
      const bool batch = has(m,
                             "engine: allreduce(average) of 50 tensors 'layer0.weight', "
                             "'layer1.weight', 'layer2.weight' and 47 more (50000 x float32 "
                             "in one fused collective) failed: ");
      const bool negotiating =
          has(m,
              "engine: negotiation failed with 50 tensors pending on this rank "
              "('layer0.weight', 'layer1.weight', 'layer2.weight' and 47 more; "
              "allreduce(average)): ");
      named += (batch || negotiating) && has(m, "KOLO_COMPRESSION");
    } catch (const kolo::Error& e) {
      // As strings: doctest prints a const char* as its address.
      FAIL_CHECK("rank " << me << ": unexpected " << std::string(kolo::error_kind_name(e.kind()))
                         << ": " << std::string(e.what()));
    }
  }
  CHECK_MESSAGE(mismatches == 50, sample);
  CHECK_MESSAGE(named == 50, sample);
  MESSAGE("rank " << me << ": " << sample);
}

TEST_CASE("engine errors: a rank that stops without join() is named, and join() suggested") {
  // The last rank runs 2 steps and destroys its engine; the others try a third.
  auto engine = engine_with(kolo::EngineOptions::from_env());
  const int n = engine.size(), r = engine.rank();
  if (n < 2) return;
  const int steps = r == n - 1 ? 2 : 3;
  std::string error_text;
  std::vector<kolo::Handle> handles;  // outlive the catch (see above)
  std::vector<std::vector<float>> gs(3, std::vector<float>(100, 1.0f));
  for (int step = 0; step < steps; ++step) {
    std::vector<float>& g = gs[static_cast<std::size_t>(step)];
    try {
      handles.push_back(engine.allreduce_async("grad", g, ReduceOp::average));
      handles.back().wait();
      CHECK(step < 2);
    } catch (const kolo::Error& e) {
      error_text = e.what();
      break;
    }
  }
  if (r == n - 1) {
    engine.shutdown();  // leaves the training loop: as the destructor would
    return;
  }
  CHECK_MESSAGE(has(error_text, "engine shut down by rank " + std::to_string(n - 1) + ","),
                error_text);
  CHECK_MESSAGE(has(error_text, "Engine::join()"), error_text);
  MESSAGE("rank " << r << ": " << error_text);
  // A rank whose tensor was already pending also hears which one.
  if (has(error_text, "still waiting for")) {
    CHECK(has(error_text, "still waiting for 1 tensor ('grad'; allreduce(average))"));
  }
}

TEST_CASE("engine API: contiguous ranges are accepted by every entry point") {
  auto engine = engine_with(kolo::EngineOptions::from_env());
  const int n = engine.size(), r = engine.rank();
  std::vector<double> v(10, 1.0);
  std::array<std::int32_t, 4> a{r, r, r, r};
  std::span<double> s(v);
  engine.allreduce_async("range.vector", v).wait();
  CHECK(v[9] == n);
  engine.allreduce_async("range.span", s, ReduceOp::average).wait();
  CHECK(v[0] == n);
  engine.broadcast_async("range.array", a, 0).wait();
  CHECK(a[3] == 0);
  const std::vector<std::int64_t> mine(static_cast<std::size_t>(r + 1), r);
  auto h = engine.allgather_async("range.const", mine);
  CHECK(h.output().count == static_cast<std::size_t>(n * (n + 1) / 2));
  // Input and output: the same buffer (in place) or disjoint; a partial overlap is refused
  // before anything is sent, naming both address ranges.
  std::vector<float> big(20, 1.0f);
  CHECK_THROWS_WITH_AS(engine.allreduce_async(
                           "overlap", TensorView(big.data(), 10, DataType::float32), ReduceOp::sum,
                           1.0, 1.0, TensorView(big.data() + 5, 10, DataType::float32)),
                       doctest::Contains("engine: tensor 'overlap': input [0x"), kolo::ConfigError);
  engine
      .allreduce_async("disjoint", TensorView(big.data(), 10, DataType::float32), ReduceOp::sum,
                       1.0, 1.0, TensorView(big.data() + 10, 10, DataType::float32))
      .wait();
  CHECK(big[19] == static_cast<float>(n));
  CHECK(big[0] == 1.0f);
  static_assert(kolo::AsyncInOutBuffer<std::vector<float>&>);
  static_assert(kolo::AsyncInOutBuffer<std::span<float>>);
  static_assert(!kolo::AsyncInOutBuffer<std::vector<float>>);         // a temporary would dangle
  static_assert(!kolo::AsyncInOutBuffer<const std::vector<float>&>);  // written in place
  static_assert(kolo::AsyncBuffer<const std::vector<float>&>);        // allgather reads only
  static_assert(!kolo::AsyncBuffer<std::vector<bool>&>);
}
