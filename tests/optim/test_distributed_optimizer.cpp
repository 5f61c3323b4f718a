// DistributedOptimizer under kolo-run (N = 1, 2, 4, ...): every rank runs these cases in order.
//
// The central property of synchronous data parallelism: N ranks that each compute the mean
// gradient of an equal shard and average them take exactly the step that one process takes on
// the whole batch. Every rank computes that single-process reference itself (the data set is
// generated identically everywhere) and compares.
//
// Tolerance of the comparison (fp32, no compression): the two computations differ only in the
// order of the floating-point additions inside a gradient (per shard, then across ranks, versus
// one pass over the batch): a relative difference of at most about (batch size)·2^-24 per
// gradient element, in practice a few 2^-24. Over 30 steps at learning rates where training is
// stable (no chaotic amplification), the parameters (all O(1)) agree to kParamTol = 1e-5
// absolute; measured: at most 3.6e-7 for N = 2, 3, 4 (printed by each case).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <kolo/kolo.hpp>
#include <kolo/optim/optim.hpp>

#include "tiny_mlp.hpp"

using kolo::CompressionPolicy;
using kolo::DistributedOptimizer;
using kolo::DistributedOptions;
using kolo::TensorView;

namespace {

constexpr double kParamTol = 1e-5;

// No compression, whatever KOLO_COMPRESSION says: the equality tests are about fp32.
DistributedOptions exact(DistributedOptions o = {}) {
  o.compression = CompressionPolicy{};
  return o;
}

// The three ways the optimizer hands gradients to the engine: one bucket for the small models
// here (the default sizes), small buckets (16 and 64 bytes: a parameter or two each), and no
// buckets (one submission per gradient).
struct BucketMode {
  const char* what;
  std::size_t bytes, first;
};
constexpr BucketMode kBucketModes[] = {
    {"default buckets", DistributedOptions{}.bucket_bytes, DistributedOptions{}.first_bucket_bytes},
    {"small buckets", 64, 16},
    {"no buckets", 0, 0}};

DistributedOptions with_buckets(DistributedOptions o, const BucketMode& m) {
  o.bucket_bytes = m.bytes;
  o.first_bucket_bytes = m.first;
  return o;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
  }
  return m;
}

// True when every rank holds exactly these bytes (an allgather, compared block by block).
template <class E>
bool identical_on_every_rank(kolo::Engine<>& engine, const std::string& name,
                             const std::vector<E>& v) {
  std::vector<std::uint8_t> bytes(v.size() * sizeof(E));
  std::memcpy(bytes.data(), v.data(), bytes.size());
  auto h =
      engine.allgather_async(name, TensorView(bytes.data(), bytes.size(), kolo::DataType::uint8));
  const auto out = h.output();
  const auto* all = static_cast<const std::uint8_t*>(out.data);
  bool same = true;
  for (int r = 0; r < engine.size(); ++r) {
    same = same && std::memcmp(all + static_cast<std::size_t>(r) * bytes.size(), bytes.data(),
                               bytes.size()) == 0;
  }
  return same;
}

// One process, the full batch of every step: the reference every rank computes locally.
template <class Opt>
std::vector<float> reference_training(Opt opt, const tiny::Data& d, std::size_t batch, int steps,
                                      std::uint64_t init_seed) {
  tiny::Model m(init_seed);
  auto params = m.parameters();
  for (int s = 0; s < steps; ++s) {
    m.backward(d, static_cast<std::size_t>(s) * batch, batch, [](std::size_t) {});
    opt.step(std::span<kolo::Parameter>(params));
  }
  return m.flat();
}

// Data-parallel: rank r takes the r-th of `size` equal shards of every global batch.
template <class Opt>
std::vector<float> distributed_training(Opt opt, const tiny::Data& d, std::size_t batch, int steps,
                                        std::uint64_t init_seed, DistributedOptions o,
                                        double* first_loss = nullptr, double* last_loss = nullptr) {
  tiny::Model m(init_seed);
  DistributedOptimizer<Opt> dopt(kolo::Communicator<>::from_env(), std::move(opt), m.parameters(),
                                 o);
  const auto n = static_cast<std::size_t>(dopt.size());
  const auto r = static_cast<std::size_t>(dopt.rank());
  REQUIRE(batch % n == 0);
  const std::size_t shard = batch / n;
  dopt.broadcast_parameters(0);
  for (int s = 0; s < steps; ++s) {
    const std::size_t first = static_cast<std::size_t>(s) * batch + r * shard;
    if (s == 0 && first_loss) *first_loss = m.loss(d, 0, batch);
    m.backward(d, first, shard, [&](std::size_t i) { dopt.gradient_ready(i); });
    dopt.step();
  }
  if (last_loss) *last_loss = m.loss(d, static_cast<std::size_t>(steps - 1) * batch, batch);
  const auto flat = m.flat();
  CHECK(identical_on_every_rank(dopt.engine(), "check/final", flat));
  return flat;
}

}  // namespace

TEST_CASE("optim: data-parallel SGD and Adam equal one process on the full batch") {
  constexpr std::size_t kBatch = 96;  // divisible by 1, 2, 3, 4, 6, 8
  constexpr int kSteps = 30;
  const tiny::Data d = tiny::make_data(kBatch * kSteps, 42);
  const kolo::SGD sgd({.lr = 0.2, .momentum = 0.9, .weight_decay = 1e-4});
  const kolo::Adam adam({.lr = 0.02});

  for (double f : {1.0, 2.5}) {  // the predivide factor changes rounding only
    CAPTURE(f);
    DistributedOptions o = exact();
    o.gradient_predivide_factor = f;
    double l0 = 0, l1 = 0;
    const auto ref = reference_training(sgd, d, kBatch, kSteps, 1);
    const auto got = distributed_training(sgd, d, kBatch, kSteps, 1, o, &l0, &l1);
    const double diff = max_abs_diff(ref, got);
    MESSAGE("SGD momentum, f = " << f << ": max |param - reference| = " << diff << ", loss " << l0
                                 << " -> " << l1);
    CHECK(diff <= kParamTol);
    CHECK(l1 < 0.8 * l0);                        // and it learned something
    for (const BucketMode& bm : kBucketModes) {  // the same step whichever way gradients travel
      const std::string mode = bm.what;
      CAPTURE(mode);
      const auto got_b = distributed_training(sgd, d, kBatch, kSteps, 1, with_buckets(o, bm));
      CHECK(max_abs_diff(ref, got_b) <= kParamTol);
    }

    const auto ref_a = reference_training(adam, d, kBatch, kSteps, 1);
    const auto got_a = distributed_training(adam, d, kBatch, kSteps, 1, o);
    const double diff_a = max_abs_diff(ref_a, got_a);
    MESSAGE("Adam, f = " << f << ": max |param - reference| = " << diff_a);
    CHECK(diff_a <= kParamTol);
  }
}

TEST_CASE("optim: backward_passes_per_step = k equals one step on a k-times larger batch") {
  constexpr std::size_t kMicro = 8;  // per rank, per pass
  constexpr int kPasses = 3, kSteps = 6;
  auto comm = kolo::Communicator<>::from_env();
  const auto n = static_cast<std::size_t>(comm.size());
  const auto r = static_cast<std::size_t>(comm.rank());
  const std::size_t big = kMicro * kPasses * n;  // the reference's batch
  const tiny::Data d = tiny::make_data(big * kSteps, 7);
  const kolo::SGD sgd({.lr = 0.3, .momentum = 0.5});
  const auto ref = reference_training(sgd, d, big, kSteps, 3);

  // This case shares an engine it builds itself (fp32: compression off whatever the
  // environment says); the optimizer adds accumulation on top.
  auto eo = kolo::EngineOptions::from_env();
  eo.compression = {};
  kolo::Engine<> engine(std::move(comm), eo);
  for (const BucketMode& bm : kBucketModes) {
    const std::string mode = bm.what;
    CAPTURE(mode);
    tiny::Model m(3);
    DistributedOptions o = with_buckets({}, bm);
    o.backward_passes_per_step = kPasses;
    DistributedOptimizer<kolo::SGD> dopt(engine, sgd, m.parameters(), o);
    for (int s = 0; s < kSteps; ++s) {
      for (int j = 0; j < kPasses; ++j) {
        // Pass j on rank r: the (j·n + r)-th micro-batch of this step's big batch.
        const std::size_t first =
            static_cast<std::size_t>(s) * big + (static_cast<std::size_t>(j) * n + r) * kMicro;
        m.backward(d, first, kMicro, [&](std::size_t i) { dopt.gradient_ready(i); });
      }
      if (s == 0) {
        // A (k+1)-th report before step() is the caller's mistake, said locally.
        CHECK_THROWS_WITH(dopt.gradient_ready("w2"),
                          doctest::Contains("more than backward_passes_per_step = 3"));
      }
      dopt.step();
    }
    const double diff = max_abs_diff(ref, m.flat());
    MESSAGE("k = " << kPasses << ", " << mode << ": max |param - reference| = " << diff);
    CHECK(diff <= kParamTol);
    CHECK(identical_on_every_rank(engine, "check/accumulated", m.flat()));
  }
}

TEST_CASE("optim: a parameter without a gradient on some ranks contributes zeros") {
  auto eo = kolo::EngineOptions::from_env();
  eo.compression = {};
  kolo::Engine<> engine(kolo::Communicator<>::from_env(), eo);
  const int n = engine.size(), r = engine.rank();
  const auto fn = static_cast<float>(n);
  for (const BucketMode& bm : kBucketModes)
    for (int k : {1, 2}) {
      const std::string mode = bm.what;
      CAPTURE(mode);
      CAPTURE(k);
      std::vector<float> used(5, 0.0f), g_used(5), some(3, 0.0f), g_some(3), never(2, 0.0f),
          g_never(2, 99.0f);
      DistributedOptions o = with_buckets({}, bm);
      o.backward_passes_per_step = k;
      DistributedOptimizer<kolo::SGD> dopt(
          engine, kolo::SGD({.lr = 1.0}),
          {{"used", used, g_used}, {"sometimes", some, g_some}, {"never", never, g_never}}, o);
      for (int pass = 0; pass < k; ++pass) {
        // "used": every rank, every pass, (rank + 1)·(2·pass + 1); the k passes average to
        // (rank + 1)·k, the ranks to k·(n + 1)/2.
        std::fill(g_used.begin(), g_used.end(), static_cast<float>((r + 1) * (2 * pass + 1)));
        dopt.gradient_ready("used");
        // "sometimes": rank 0 on pass 0 only (6); elsewhere the buffer holds garbage, unreported.
        std::fill(g_some.begin(), g_some.end(), r == 0 && pass == 0 ? 6.0f : 99.0f);
        if (r == 0 && pass == 0) dopt.gradient_ready(1);
        // "never": nobody reports it.
      }
      dopt.step();
      const float want_used = static_cast<float>(k) * (fn + 1.0f) / 2.0f;
      const float want_some = 6.0f / static_cast<float>(k) / fn;
      for (float g : g_used) CHECK(g == want_used);
      for (float g : g_some) CHECK(g == doctest::Approx(want_some));
      for (float g : g_never) CHECK(g == 0.0f);
      for (float v : used) CHECK(v == -want_used);
      for (float v : some) CHECK(v == doctest::Approx(-want_some));
      for (float v : never) CHECK(v == 0.0f);
      // And the next step starts clean: no report at all is a step of zeros everywhere.
      dopt.step();
      for (float g : g_used) CHECK(g == 0.0f);
      for (float v : some) CHECK(v == doctest::Approx(-want_some));
    }
}

TEST_CASE("optim: gradients_ready() submits every gradient as one coalesced list") {
  auto eo = kolo::EngineOptions::from_env();
  eo.compression = {};
  kolo::Engine<> engine(kolo::Communicator<>::from_env(), eo);
  const int n = engine.size(), r = engine.rank();
  for (const BucketMode& bm : kBucketModes) {
    const std::string mode = bm.what;
    CAPTURE(mode);
    // Three parameters (one of them empty) of small integers: every sum below is exact, and with
    // gradient_predivide_factor = 4 the scalings are powers of two until the division by n.
    std::vector<float> a(5, 0.0f), ga(5), e, ge, b(300, 0.0f), gb(300);
    DistributedOptions o = with_buckets({}, bm);
    o.gradient_predivide_factor = 4.0;
    DistributedOptimizer<kolo::SGD> dopt(engine, kolo::SGD({.lr = 1.0}),
                                         {{"a", a, ga}, {"empty", e, ge}, {"b", b, gb}}, o);
    for (int step = 1; step <= 3; ++step) {
      CAPTURE(step);
      for (std::size_t i = 0; i < ga.size(); ++i) ga[i] = static_cast<float>((r + 1) * step + i);
      for (std::size_t i = 0; i < gb.size(); ++i) gb[i] = static_cast<float>((r + i) % 5);
      const kolo::EngineStats before = engine.stats();
      dopt.gradients_ready();
      // The list is in flight: a single report or a broadcast before step() is a misuse.
      CHECK_THROWS_WITH(dopt.gradient_ready("a"), doctest::Contains("reported more than"));
      CHECK_THROWS_WITH(dopt.broadcast_parameters(0), doctest::Contains("call step() first"));
      dopt.step();
      const kolo::EngineStats after = engine.stats();
      // One submission for the three parameters (without buckets), or one per bucket: as many
      // responses per step (cached after the first).
      const std::size_t lists = bm.bytes == 0 ? 1 : dopt.buckets().size();
      CHECK(lists == (bm.bytes == 64 ? 2 : 1));  // small: {b}, {a, empty}
      CHECK(after.cached_responses + after.uncached_responses -
                (before.cached_responses + before.uncached_responses) ==
            lists);
      double sum_a0 = 0;
      for (int q = 0; q < n; ++q) sum_a0 += (q + 1) * step;
      for (std::size_t i = 0; i < ga.size(); ++i) {
        const double want = (sum_a0 + static_cast<double>(i) * n) / n;
        CHECK(ga[i] == doctest::Approx(want).epsilon(1e-6));
      }
      for (std::size_t i = 0; i < gb.size(); ++i) {
        double sum = 0;
        for (int q = 0; q < n; ++q)
          sum += static_cast<double>((static_cast<std::size_t>(q) + i) % 5);
        CHECK(gb[i] == doctest::Approx(sum / n).epsilon(1e-6));
      }
    }
    // The per-gradient path still works on the same optimizer: the list is not stuck in flight.
    std::fill(ga.begin(), ga.end(), 1.0f);
    std::fill(gb.begin(), gb.end(), 2.0f);
    dopt.gradient_ready("a");
    dopt.gradient_ready("b");
    dopt.gradient_ready("empty");
    dopt.step();
    for (float g : ga) CHECK(g == 1.0f);
    for (float g : gb) CHECK(g == 2.0f);
  }
}

TEST_CASE("optim: buckets are cut from the last parameter, and ranks may report in any order") {
  auto eo = kolo::EngineOptions::from_env();
  eo.compression = {};
  kolo::Engine<> engine(kolo::Communicator<>::from_env(), eo);
  const int n = engine.size(), r = engine.rank();
  // Gradients of 100, 200, 300 and 400 floats (400 to 1600 bytes). first_bucket_bytes 1000:
  // the last parameter alone (larger than the cap, a bucket of its own); then bucket_bytes 2000:
  // parameters 2 and 1 (2000 bytes), then parameter 0.
  std::vector<std::vector<float>> values, grads;
  for (std::size_t c : {100, 200, 300, 400}) {
    values.emplace_back(c, 0.0f);
    grads.emplace_back(c, 0.0f);
  }
  auto params = [&] {
    std::vector<kolo::Parameter> ps;
    for (std::size_t i = 0; i < values.size(); ++i) {
      ps.push_back({"p" + std::to_string(i), values[i], grads[i]});
    }
    return ps;
  };
  DistributedOptions o;
  o.op = kolo::ReduceOp::sum;
  o.bucket_bytes = 2000;
  o.first_bucket_bytes = 1000;
  DistributedOptimizer<kolo::SGD> dopt(engine, kolo::SGD({.lr = 0.0}), params(), o);
  const std::vector<std::vector<std::size_t>> want = {{3}, {1, 2}, {0}};
  CHECK(dopt.buckets() == want);
  // first_bucket_bytes = 0 means bucket_bytes; bucket_bytes = 0 means no buckets.
  o.first_bucket_bytes = 0;
  CHECK(DistributedOptimizer<kolo::SGD>(engine, {}, params(), o).buckets() ==
        std::vector<std::vector<std::size_t>>{{3}, {1, 2}, {0}});
  o.bucket_bytes = 0;
  CHECK(DistributedOptimizer<kolo::SGD>(engine, {}, params(), o).buckets().empty());

  // Each rank reports in its own order (rank r starts at parameter r mod 4 and walks down),
  // so the buckets complete in a different order on every rank; each is exactly the sum.
  for (int step = 1; step <= 3; ++step) {
    CAPTURE(step);
    for (std::size_t i = 0; i < grads.size(); ++i) {
      for (std::size_t e = 0; e < grads[i].size(); ++e) {
        grads[i][e] = static_cast<float>((r + 1) * step + static_cast<int>(i + e % 7));
      }
    }
    for (std::size_t j = 0; j < grads.size(); ++j) {
      dopt.gradient_ready((static_cast<std::size_t>(r) + grads.size() - j) % grads.size());
    }
    CHECK_THROWS_WITH(dopt.gradient_ready(2), doctest::Contains("reported more than"));
    dopt.step();
    for (std::size_t i = 0; i < grads.size(); ++i) {
      for (std::size_t e = 0; e < grads[i].size(); ++e) {
        double sum = 0;
        for (int q = 0; q < n; ++q) sum += (q + 1) * step + static_cast<int>(i + e % 7);
        CHECK(grads[i][e] == static_cast<float>(sum));
      }
    }
  }
}

TEST_CASE("optim: ranks whose parameters differ fail construction, naming the difference") {
  kolo::Engine<> engine(kolo::Communicator<>::from_env());
  const int n = engine.size(), r = engine.rank();
  std::vector<float> a(4, 0.0f), ga(4, 1.0f), b(5, 0.0f), gb(5, 1.0f), c(3, 0.0f), gc(3, 1.0f);
  std::vector<float> b6(6, 0.0f), gb6(6, 1.0f);
  auto build = [&](std::vector<kolo::Parameter> ps, const std::string& prefix) {
    DistributedOptions o;
    o.name_prefix = prefix;
    DistributedOptimizer<kolo::SGD> dopt(engine, kolo::SGD({.lr = 1.0}), std::move(ps), o);
    return dopt.parameters().size();
  };
  // The same parameters everywhere: the check passes, and the optimizer works.
  CHECK(build({{"a", a, ga}, {"b", b, gb}}, "same/") == 2);
  auto error_of = [&](std::vector<kolo::Parameter> ps, const std::string& prefix) {
    try {
      build(std::move(ps), prefix);
    } catch (const kolo::MismatchError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  if (n == 1) return;  // the rest needs two ranks that disagree
  // Rank 1's "b" is larger: every rank gets the same message, naming parameter 1 on both ranks.
  std::string m = error_of(r == 1 ? std::vector<kolo::Parameter>{{"a", a, ga}, {"b", b6, gb6}}
                                  : std::vector<kolo::Parameter>{{"a", a, ga}, {"b", b, gb}},
                           "size/");
  CHECK_MESSAGE(m.find("parameter 1 is 'b' (6 elements) on rank 1 but 'b' (5 elements) on rank "
                       "0") != std::string::npos,
                m);
  // A different name at the same place.
  m = error_of(r == n - 1 ? std::vector<kolo::Parameter>{{"a", a, ga}, {"c", b, gb}}
                          : std::vector<kolo::Parameter>{{"a", a, ga}, {"b", b, gb}},
               "name/");
  CHECK_MESSAGE(m.find("parameter 1 is 'c' (5 elements) on rank " + std::to_string(n - 1) +
                       " but 'b' (5 elements) on rank 0") != std::string::npos,
                m);
  // Rank 1 has an extra parameter at the end (the case that would otherwise leave a bucket
  // that only rank 1 submits), and then rank 0 has one.
  m = error_of(r == 1 ? std::vector<kolo::Parameter>{{"a", a, ga}, {"b", b, gb}, {"c", c, gc}}
                      : std::vector<kolo::Parameter>{{"a", a, ga}, {"b", b, gb}},
               "extra/");
  CHECK_MESSAGE(m.find("rank 1 has 3 parameters but rank 0 has 2 (the first extra one is 'c' (3 "
                       "elements) on rank 1") != std::string::npos,
                m);
  m = error_of(r == 0 ? std::vector<kolo::Parameter>{{"a", a, ga}, {"b", b, gb}, {"c", c, gc}}
                      : std::vector<kolo::Parameter>{{"a", a, ga}, {"b", b, gb}},
               "fewer/");
  CHECK_MESSAGE(m.find("rank 1 has 2 parameters but rank 0 has 3 (the first extra one is 'c' (3 "
                       "elements) on rank 0") != std::string::npos,
                m);
  // The engine is still usable after the failed constructions.
  CHECK(build({{"a", a, ga}, {"b", b, gb}}, "again/") == 2);
}

TEST_CASE("optim: ranks whose parameters differ in size get an error naming the parameter") {
  kolo::Engine<> engine(kolo::Communicator<>::from_env());
  const int n = engine.size(), r = engine.rank();
  if (n == 1) return;  // needs two ranks that disagree
  // Rank 1's "b" has one element more: one bucket of ("a", "b") on every rank, whose counts
  // differ at tensor 1. The construction check is off, so the step itself meets the difference.
  std::vector<float> a(4, 0.0f), ga(4, 1.0f), b(r == 1 ? 6 : 5, 0.0f), gb(b.size(), 1.0f);
  DistributedOptions unchecked;
  unchecked.verify_parameters = false;
  DistributedOptimizer<kolo::SGD> dopt(engine, kolo::SGD({.lr = 1.0}), {{"a", a, ga}, {"b", b, gb}},
                                       unchecked);
  REQUIRE(dopt.buckets().size() == 1);
  dopt.gradient_ready(0);
  dopt.gradient_ready(1);
  try {
    dopt.step();
    FAIL("step() returned on rank " << r);
  } catch (const kolo::MismatchError& e) {
    const std::string what = e.what();
    CAPTURE(what);
    CHECK(what.find("kolo.optim/bucket/0") != std::string::npos);
    CHECK(what.find("tensor 1 has 5 elements") != std::string::npos);
    CHECK(what.find("tensor 1 is parameter 'b'") != std::string::npos);
    CHECK(e.tensor_index() == 1);
  }
  // The optimizer is still usable afterwards: a bucket of zeros everywhere fails the same way,
  // and nothing hangs.
  CHECK_THROWS_AS(dopt.step(), kolo::MismatchError);
}

TEST_CASE("optim: broadcast makes every rank's parameters and optimizer state bit-identical") {
  auto comm = kolo::Communicator<>::from_env();
  const int n = comm.size(), r = comm.rank();
  const int root = n - 1;
  tiny::Model m(100 + static_cast<std::uint64_t>(r));  // different weights on every rank
  DistributedOptimizer<kolo::Adam> dopt(std::move(comm), kolo::Adam({.lr = 0.01}), m.parameters(),
                                        exact());
  // Different optimizer state on every rank too, written through the state views.
  auto state = dopt.optimizer().state(dopt.parameters());
  CHECK(state.size() == 1 + 2 * 4);
  for (auto& s : state) {
    if (s.tensor.dtype == kolo::DataType::int64) {
      *static_cast<std::int64_t*>(s.tensor.data) = 5 + r;
    } else {
      auto* p = static_cast<float*>(s.tensor.data);
      for (std::size_t i = 0; i < s.tensor.count; ++i) p[i] = 0.01f * static_cast<float>(r + i);
    }
  }
  if (n > 1) CHECK_FALSE(identical_on_every_rank(dopt.engine(), "check/before", m.flat()));

  dopt.broadcast_parameters(root);
  dopt.broadcast_optimizer_state(root);
  CHECK(identical_on_every_rank(dopt.engine(), "check/params", m.flat()));
  const tiny::Model root_model(100 + static_cast<std::uint64_t>(root));
  CHECK(std::memcmp(m.flat().data(), root_model.flat().data(), m.flat().size() * 4) == 0);
  CHECK(dopt.optimizer().steps() == 5 + root);
  for (auto& s : dopt.optimizer().state(dopt.parameters())) {
    if (s.tensor.dtype != kolo::DataType::float32) continue;
    const auto* p = static_cast<const float*>(s.tensor.data);
    std::vector<float> v(p, p + s.tensor.count);
    for (std::size_t i = 0; i < v.size(); ++i) {
      CHECK(v[i] == 0.01f * static_cast<float>(root + static_cast<int>(i)));
    }
    CHECK(identical_on_every_rank(dopt.engine(), "check/" + s.name, v));
  }

  // Training from there on rank-specific data keeps every rank bit-identical.
  const tiny::Data d = tiny::make_data(64 * static_cast<std::size_t>(n), 5);
  for (int s = 0; s < 3; ++s) {
    m.backward(d, static_cast<std::size_t>(r) * 64, 64,
               [&](std::size_t i) { dopt.gradient_ready(i); });
    dopt.step();
  }
  CHECK(dopt.optimizer().steps() == 8 + root);
  CHECK(identical_on_every_rank(dopt.engine(), "check/trained", m.flat()));
}

TEST_CASE("optim: the loss falls with fp16 and bf16 compression, ranks stay identical") {
  constexpr std::size_t kBatch = 96;
  constexpr int kSteps = 30;
  const tiny::Data d = tiny::make_data(kBatch * kSteps, 42);
  const kolo::SGD sgd({.lr = 0.2, .momentum = 0.9});
  const auto ref = reference_training(sgd, d, kBatch, kSteps, 1);
  for (const char* wire : {"fp16", "bf16"}) {
    const std::string wire_name = wire;
    CAPTURE(wire_name);
    DistributedOptions o;
    o.compression = CompressionPolicy::parse(wire);
    o.gradient_predivide_factor = 2.0;
    double l0 = 0, l1 = 0;
    const auto got = distributed_training(sgd, d, kBatch, kSteps, 1, o, &l0, &l1);
    MESSAGE(std::string(wire) << ": loss " << l0 << " -> " << l1
                              << ", max |param - fp32 reference| = " << max_abs_diff(ref, got));
    CHECK(l1 < 0.8 * l0);
  }
}

TEST_CASE("optim: KOLO_COMPRESSION reaches an optimizer that builds its own engine") {
  const char* env = std::getenv("KOLO_COMPRESSION");
  const std::string wire = env ? env : "none";
  std::vector<float> v(10, 0.0f), g(10, 1.0f + 0x1p-20f);  // not representable in fp16/bf16
  DistributedOptimizer<kolo::SGD> dopt(kolo::Communicator<>::from_env(), kolo::SGD({.lr = 1.0}),
                                       {{"v", v, g}});
  dopt.gradients_ready();
  dopt.synchronize();
  MESSAGE("KOLO_COMPRESSION=" << wire << ": averaged gradient 1 + " << (g[0] - 1.0f));
  for (float x : g) CHECK(x == (wire == "none" ? 1.0f + 0x1p-20f : 1.0f));
}

TEST_CASE("optim: wrong options and misuse are errors that say what to do") {
  kolo::Engine<> engine(kolo::Communicator<>::from_env());
  std::vector<float> a(4, 0.0f), ga(4, 1.0f), b(3, 0.0f), gb(2);
  using SgdOpt = DistributedOptimizer<kolo::SGD>;
  auto with = [](auto f) {
    DistributedOptions o;
    f(o);
    return o;
  };
  CHECK_THROWS_WITH(
      SgdOpt(engine, {}, {{"a", a, ga}}, with([](auto& o) { o.op = kolo::ReduceOp::max; })),
      doctest::Contains("op must be average or sum"));
  CHECK_THROWS_WITH(SgdOpt(engine, {}, {{"a", a, ga}}, with([](auto& o) {
                             o.op = kolo::ReduceOp::sum;
                             o.gradient_predivide_factor = 2;
                           })),
                    doctest::Contains("gradient_predivide_factor needs op = average"));
  CHECK_THROWS_AS(
      SgdOpt(engine, {}, {{"a", a, ga}}, with([](auto& o) { o.backward_passes_per_step = 0; })),
      kolo::ConfigError);
  CHECK_THROWS_WITH(SgdOpt(engine, {}, {{"a", a, ga}, {"a", a, ga}}),
                    doctest::Contains("two parameters are named 'a'"));
  CHECK_THROWS_WITH(SgdOpt(engine, {}, {{"b", b, gb}}),
                    doctest::Contains("'b' has 3 values but 2 gradients"));
  CHECK_THROWS_WITH(SgdOpt(engine, {}, {{"a", a, ga}},
                           with([](auto& o) { o.compression = CompressionPolicy::parse("fp16"); })),
                    doctest::Contains("EngineOptions::compression"));

  // op = sum: the gradients add up instead of averaging.
  SgdOpt dopt(engine, kolo::SGD({.lr = 1.0}), {{"a", a, ga}},
              with([](auto& o) { o.op = kolo::ReduceOp::sum; }));
  CHECK_THROWS_WITH(dopt.gradient_ready("nope"), doctest::Contains("no parameter named 'nope'"));
  dopt.gradient_ready(0);
  CHECK_THROWS_WITH(dopt.broadcast_parameters(0), doctest::Contains("call step() first"));
  dopt.step();
  for (float g : ga) CHECK(g == static_cast<float>(engine.size()));
  for (float x : a) CHECK(x == -static_cast<float>(engine.size()));
}
