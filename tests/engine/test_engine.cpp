// The engine under kolo-run: every rank runs these cases in the same order, each with a fresh
// communicator and engine. Tensors are submitted in a different random order on every rank.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <kolo/engine/engine.hpp>
#include <kolo/kolo.hpp>

using kolo::DataType;
using kolo::ReduceOp;
using kolo::TensorView;

namespace {

kolo::Engine<> make_engine(kolo::EngineOptions opts = kolo::EngineOptions::from_env()) {
  return kolo::Engine<>(kolo::Communicator<>::from_env(), opts);
}

// A tensor of any dtype, filled with small integers so every result is exact.
struct Tensor {
  DataType dtype;
  std::vector<std::byte> data;
  std::size_t count;
  Tensor(DataType t, std::size_t n) : dtype(t), data(n * kolo::dtype_size(t)), count(n) {}
  TensorView view() { return TensorView(data.data(), count, dtype); }
  void fill(const std::function<double(std::size_t)>& f) {
    kolo::visit_dtype(dtype, [&](auto tag) {
      using T = decltype(tag);
      auto* p = reinterpret_cast<T*>(data.data());
      for (std::size_t i = 0; i < count; ++i) {
        if constexpr (std::is_same_v<T, kolo::float16> || std::is_same_v<T, kolo::bfloat16>) {
          p[i] = T(static_cast<float>(f(i)));
        } else {
          p[i] = static_cast<T>(f(i));
        }
      }
    });
  }
  double at(std::size_t i) const {
    return kolo::visit_dtype(dtype, [&](auto tag) -> double {
      using T = decltype(tag);
      const auto* p = reinterpret_cast<const T*>(data.data());
      if constexpr (std::is_same_v<T, kolo::float16> || std::is_same_v<T, kolo::bfloat16>) {
        return static_cast<double>(static_cast<float>(p[i]));
      } else {
        return static_cast<double>(p[i]);
      }
    });
  }
};

const DataType kTypes[] = {DataType::float32, DataType::float64,  DataType::int32,
                           DataType::float16, DataType::bfloat16, DataType::int64,
                           DataType::int8,    DataType::uint8};
const ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::average, ReduceOp::min, ReduceOp::max,
                         ReduceOp::product};

double value(ReduceOp op, int rank, std::size_t tensor, std::size_t i) {
  if (op == ReduceOp::product) return ((rank + tensor + i) % 3 == 0) ? 2 : 1;
  return static_cast<double>((rank * 3 + tensor * 5 + i * 7) % 9);
}

double expect(ReduceOp op, int n, std::size_t tensor, std::size_t i, DataType t,
              const std::vector<int>& active) {
  double acc = op == ReduceOp::product
                   ? 1
                   : (op == ReduceOp::min ? 1e300 : (op == ReduceOp::max ? -1e300 : 0));
  for (int r : active) {
    const double v = value(op, r, tensor, i);
    if (op == ReduceOp::sum || op == ReduceOp::average) acc += v;
    if (op == ReduceOp::product) acc *= v;
    if (op == ReduceOp::min) acc = std::min(acc, v);
    if (op == ReduceOp::max) acc = std::max(acc, v);
  }
  if (op == ReduceOp::average) {
    if (kolo::dtype_is_floating(t)) return acc / n;
    return static_cast<double>(static_cast<long long>(acc) / n);
  }
  return acc;
}

bool near(double got, double want, DataType t, ReduceOp op) {
  if (op != ReduceOp::average || !kolo::dtype_is_floating(t)) return got == want;
  const double tol = t == DataType::float16 ? 1e-3 : t == DataType::bfloat16 ? 8e-3 : 1e-6;
  return std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want));
}

std::vector<int> all_ranks(int n) {
  std::vector<int> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
  return v;
}

}  // namespace

TEST_CASE("engine: 1 to 500 tensors of mixed dtypes, ops and sizes in random per-rank order") {
  auto engine = make_engine();
  const int n = engine.size(), r = engine.rank();
  std::mt19937 rng(1234u + static_cast<unsigned>(r));
  for (std::size_t k : {1u, 7u, 64u, 500u}) {
    for (int step = 0; step < 3; ++step) {  // step 0 negotiates, later steps hit the cache
      std::vector<Tensor> ts;
      std::vector<ReduceOp> ops;
      for (std::size_t i = 0; i < k; ++i) {
        const DataType t = kTypes[i % 8];
        const std::size_t count = (i * 131) % 2000 + (i % 5 == 0 ? 0 : 1);
        const ReduceOp op = kOps[(i / 8) % 5];
        ts.emplace_back(t, count);
        ts.back().fill([&](std::size_t e) { return value(op, r, i, e); });
        ops.push_back(op);
      }
      std::vector<std::size_t> order(k);
      for (std::size_t i = 0; i < k; ++i) order[i] = i;
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<kolo::Handle> hs(k);
      for (std::size_t i : order) {
        hs[i] = engine.allreduce_async("k" + std::to_string(k) + "/t" + std::to_string(i),
                                       ts[i].view(), ops[i]);
      }
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < k; ++i) {
        hs[i].wait();
        for (std::size_t e = 0; e < ts[i].count; ++e) {
          wrong += !near(ts[i].at(e), expect(ops[i], n, i, e, ts[i].dtype, all_ranks(n)),
                         ts[i].dtype, ops[i]);
        }
      }
      CHECK_MESSAGE(wrong == 0, "k=" << k << " step=" << step);
    }
  }
  // On a loaded host the engine thread may take each submission in a cycle of its own (it wakes
  // at the first); a few more rounds of two tensors, values checked, until one batch is fused.
  // Every rank runs the same number of rounds: the count of fused collectives is the same on
  // all (negotiation is replicated).
  for (int more = 0; more < 20 && engine.stats().fused_collectives == 0; ++more) {
    std::vector<float> a(64, static_cast<float>(r + 1)), b(64, 1.0f);
    auto ha = engine.allreduce_async("fuse/a", TensorView(std::span<float>(a)), ReduceOp::sum);
    auto hb = engine.allreduce_async("fuse/b", TensorView(std::span<float>(b)), ReduceOp::sum);
    ha.wait();
    hb.wait();
    for (float v : a) CHECK(v == static_cast<float>(n * (n + 1) / 2));
    for (float v : b) CHECK(v == static_cast<float>(n));
  }
  const auto s = engine.stats();
  CHECK(s.cached_responses > 0);   // later steps used the response cache
  CHECK(s.fused_collectives > 0);  // and fusion
}

// Handles share their operation's state (reused from step to step): copies waited on by other
// threads, copies dropped before the operation finishes, handles that outlive their engine, and
// states that a second engine reuses after the first has gone. Values exact throughout.
TEST_CASE("engine: handles copied across threads, dropped early, outliving the engine") {
  const int64_t kTensors = 48;
  std::vector<kolo::Handle> kept;  // handles of the first engine, used after it has gone
  std::vector<std::vector<float>> data(kTensors);
  int n = 0, r = 0;
  {
    auto engine = make_engine();
    n = engine.size();
    r = engine.rank();
    for (int step = 0; step < 4; ++step) {
      std::vector<kolo::Handle> hs;
      for (int64_t k = 0; k < kTensors; ++k) {
        auto& d = data[static_cast<std::size_t>(k)];
        d.assign(static_cast<std::size_t>(33 + k), static_cast<float>(r + k));
        hs.push_back(engine.allreduce_async("h" + std::to_string(k), TensorView(std::span(d))));
      }
      // Two threads wait on copies of every handle; this thread drops every other one of its
      // own at once (before it has finished, most of the time) and waits on the rest.
      std::vector<kolo::Handle> a(hs.begin(), hs.end()), b(hs.rbegin(), hs.rend());
      for (std::size_t k = 0; k < hs.size(); k += 2) hs[k] = kolo::Handle();
      std::thread ta([&] {
        for (auto& h : a) h.wait();
      });
      std::thread tb([&] {
        for (auto& h : b) h.wait();
      });
      for (auto& h : hs) {
        if (h.valid()) h.wait();
      }
      ta.join();
      tb.join();
      std::size_t wrong = 0;
      for (int64_t k = 0; k < kTensors; ++k) {
        const float want = static_cast<float>(n * (n - 1) / 2 + n * k);
        for (float v : data[static_cast<std::size_t>(k)]) wrong += v != want;
      }
      CHECK_MESSAGE(wrong == 0, "step " << step);
      if (step == 3) kept = std::move(a);
    }
  }
  // The engine has gone: its handles still say done and hand out their outputs.
  for (std::size_t k = 0; k < kept.size(); ++k) {
    CHECK(kept[k].ready());
    kept[k].wait();
    const TensorView out = kept[k].output();
    CHECK(out.count == 33 + k);
    CHECK(static_cast<const float*>(out.data)[0] == static_cast<float>(n * (n - 1) / 2 + n * k));
  }
  kept.clear();  // their states return for reuse, with the first engine's driver in them
  auto engine = make_engine();
  for (int step = 0; step < 2; ++step) {
    std::vector<kolo::Handle> hs;
    for (int64_t k = 0; k < kTensors; ++k) {
      auto& d = data[static_cast<std::size_t>(k)];
      d.assign(8, 1.0f);
      hs.push_back(engine.allreduce_async("again" + std::to_string(k), TensorView(std::span(d))));
    }
    for (auto& h : hs) h.wait();  // waiting runs the second engine's cycles, not the first's
    std::size_t wrong = 0;
    for (const auto& d : data) {
      for (float v : d) wrong += v != static_cast<float>(n);
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("engine: prescale, postscale, out-of-place output, grouped allreduce") {
  auto engine = make_engine();
  const int n = engine.size(), r = engine.rank();
  std::vector<float> in(1000, static_cast<float>(r + 1)), out(1000, -1);
  auto h = engine.allreduce_async("scaled", TensorView(std::span<float>(in)), ReduceOp::sum, 2.0,
                                  0.5, TensorView(std::span<float>(out)));
  h.wait();
  for (float v : out) CHECK(v == static_cast<float>(n * (n + 1) / 2));
  for (float v : in) CHECK(v == static_cast<float>(r + 1));  // input untouched

  std::vector<std::vector<double>> g(5);
  std::vector<std::pair<std::string, TensorView>> members;
  for (int i = 0; i < 5; ++i) {
    g[static_cast<std::size_t>(i)].assign(static_cast<std::size_t>(10 * (i + 1)), r * 10.0 + i);
    members.emplace_back("g" + std::to_string(i),
                         TensorView(std::span<double>(g[static_cast<std::size_t>(i)])));
  }
  auto hs = engine.grouped_allreduce_async("grads", members, ReduceOp::average);
  for (auto& x : hs) x.wait();
  for (int i = 0; i < 5; ++i) {
    for (double v : g[static_cast<std::size_t>(i)])
      CHECK(v == doctest::Approx(10.0 * (n - 1) / 2.0 + i));
  }
}

// allreduce_coalesced_async: one handle for many tensors, under every path a fused batch takes
// (pieces, the fusion buffer, compression, a batch larger than the fusion threshold, one rank),
// beside single submissions in the same cycles, negotiated and then cached. Values exact (the
// fp16 wire: exact for these small integers).
TEST_CASE("engine: coalesced submissions under every fusion path, values exact") {
  struct Config {
    const char* what;
    std::function<void(kolo::EngineOptions&)> set;
  };
  const Config configs[] = {
      {"default", [](kolo::EngineOptions&) {}},
      {"fusion buffer", [](kolo::EngineOptions& o) { o.fusion_pieces = false; }},
      {"threshold 4 KiB", [](kolo::EngineOptions& o) { o.fusion_threshold = 4096; }},
      {"fp16 wire",
       [](kolo::EngineOptions& o) { o.compression = kolo::CompressionPolicy::parse("fp16"); }},
  };
  for (const Config& cfg : configs) {
    auto opts = kolo::EngineOptions::from_env();
    cfg.set(opts);
    auto engine = make_engine(opts);
    const int n = engine.size(), r = engine.rank();
    std::mt19937 rng(99u + static_cast<unsigned>(r));
    for (int step = 0; step < 3; ++step) {  // step 0 negotiates, later steps hit the cache
      // Three coalesced submissions (float32 sum with zero-length members, int32 max, float64
      // average with a scale) and two single tensors, submitted in a per-rank random order.
      struct Sub {
        DataType dtype;
        ReduceOp op;
        double pre, post;
        std::vector<Tensor> ts;
      };
      std::vector<Sub> subs(3);
      subs[0] = {DataType::float32, ReduceOp::sum, 1.0, 1.0, {}};
      subs[1] = {DataType::int32, ReduceOp::max, 1.0, 1.0, {}};
      subs[2] = {DataType::float64, ReduceOp::average, 2.0, 0.5, {}};
      for (std::size_t s = 0; s < subs.size(); ++s) {
        const std::size_t members = s == 0 ? 40 : (s == 1 ? 3 : 1);
        for (std::size_t i = 0; i < members; ++i) {
          const std::size_t count = i % 7 == 3 ? 0 : (i * 37 + s * 11) % 700 + 1;
          subs[s].ts.emplace_back(subs[s].dtype, count);
          subs[s].ts.back().fill([&](std::size_t e) { return value(subs[s].op, r, i, e); });
        }
      }
      std::vector<float> single_a(300), single_b(5000);
      for (std::size_t e = 0; e < single_a.size(); ++e) single_a[e] = static_cast<float>(r + e % 4);
      for (std::size_t e = 0; e < single_b.size(); ++e) single_b[e] = static_cast<float>(r * 2);
      std::vector<kolo::Handle> hs(subs.size() + 2);
      std::vector<std::size_t> order{0, 1, 2, 3, 4};
      std::shuffle(order.begin(), order.end(), rng);
      for (std::size_t k : order) {
        if (k < subs.size()) {
          std::vector<TensorView> views;
          for (auto& t : subs[k].ts) views.push_back(t.view());
          hs[k] = engine.allreduce_coalesced_async("bucket" + std::to_string(k), views, subs[k].op,
                                                   subs[k].pre, subs[k].post);
        } else if (k == subs.size()) {
          hs[k] = engine.allreduce_async("single/a", TensorView(std::span<float>(single_a)));
        } else {
          hs[k] = engine.allreduce_async("single/b", TensorView(std::span<float>(single_b)));
        }
      }
      for (auto& h : hs) h.wait();
      std::size_t wrong = 0;
      for (const Sub& s : subs) {
        for (std::size_t i = 0; i < s.ts.size(); ++i) {
          for (std::size_t e = 0; e < s.ts[i].count; ++e) {
            // prescale 2 and postscale 0.5 cancel: the plain result.
            wrong +=
                !near(s.ts[i].at(e), expect(s.op, n, i, e, s.dtype, all_ranks(n)), s.dtype, s.op);
          }
        }
      }
      for (std::size_t e = 0; e < single_a.size(); ++e) {
        wrong += single_a[e] != static_cast<float>(n * (n - 1) / 2 + n * static_cast<int>(e % 4));
      }
      for (float v : single_b) wrong += v != static_cast<float>(n * (n - 1));
      CHECK_MESSAGE(wrong == 0, cfg.what << ", step " << step);
    }
    CHECK_MESSAGE(engine.stats().cached_responses > 0, cfg.what);
  }
}

// A coalesced submission while ranks join (a joined rank contributes zeros for every member),
// and the errors: counts that differ between ranks (a MismatchError on every rank, naming the
// member), and bad input on the submitting rank (a ConfigError at submission).
TEST_CASE("engine: coalesced submissions with joined ranks, mismatches and bad input") {
  auto engine = make_engine();
  const int n = engine.size(), r = engine.rank();
  const int my_steps = 2 + r;  // rank r runs 2 + r steps, then joins
  for (int step = 0; step < my_steps; ++step) {
    std::vector<float> a(100, static_cast<float>(r + 1)), b(3, 1.0f), c(1000, 2.0f);
    std::vector<TensorView> views{TensorView(std::span<float>(a)), TensorView(std::span<float>(b)),
                                  TensorView(std::span<float>(c))};
    engine.allreduce_coalesced_async("joined/bucket", views).wait();
    float want = 0, ones = 0;
    for (int q = 0; q < n; ++q) {
      if (2 + q > step) {
        want += static_cast<float>(q + 1);
        ones += 1;
      }
    }
    CHECK(a[0] == want);
    CHECK(a[99] == want);
    CHECK(b[2] == ones);
    CHECK(c[999] == 2 * ones);
  }
  engine.join();

  std::vector<float> x(10, 1.0f), y(static_cast<std::size_t>(r == 0 ? 20 : 21), 1.0f);
  std::vector<TensorView> views{TensorView(std::span<float>(x)), TensorView(std::span<float>(y))};
  auto h = engine.allreduce_coalesced_async("counts differ", views);
  if (n > 1) {
    std::string m;
    long index = -2;
    try {
      h.wait();
    } catch (const kolo::MismatchError& e) {
      m = e.what();
      index = e.tensor_index();
    }
    CHECK_MESSAGE(m.find("'counts differ'") != std::string::npos, m);
    CHECK(index == 1);  // the list's first tensor whose count differs
    CHECK_MESSAGE(m.find("tensor 1 has 20 elements but rank") != std::string::npos, m);
  } else {
    h.wait();
    CHECK(y[0] == 1.0f);
  }

  auto config_error = [&](std::vector<TensorView> v) -> std::string {
    try {
      engine.allreduce_coalesced_async("bad", v);
    } catch (const kolo::ConfigError& e) {
      return e.what();
    }
    return "no error";
  };
  std::vector<float> f(8, 1.0f);
  std::vector<double> d(8, 1.0);
  CHECK(config_error({}).find("needs at least one tensor") != std::string::npos);
  CHECK(config_error({TensorView(std::span<float>(f)), TensorView(std::span<double>(d))})
            .find("tensor 1 is float64 but tensor 0 is float32") != std::string::npos);
  CHECK(config_error(
            {TensorView(std::span<float>(f).subspan(4)), TensorView(std::span<float>(f).first(5))})
            .find("overlap") != std::string::npos);
  CHECK(config_error({TensorView(nullptr, 3, DataType::float32)}).find("null data pointer") !=
        std::string::npos);
  // Out of address order (the overlap check sorts), submitted twice (the second time the same
  // list passes without the sort), then the same addresses with one size grown into the other.
  std::vector<float> g(16);
  for (int step = 0; step < 2; ++step) {
    std::fill(g.begin(), g.end(), static_cast<float>(r + step));
    const std::vector<TensorView> desc{TensorView(std::span<float>(g).subspan(8)),
                                       TensorView(std::span<float>(g).first(8))};
    engine.allreduce_coalesced_async("descending", desc).wait();
    CHECK(g[0] == static_cast<float>(n * (n - 1) / 2 + n * step));
    CHECK(g[15] == static_cast<float>(n * (n - 1) / 2 + n * step));
  }
  CHECK(config_error(
            {TensorView(std::span<float>(g).subspan(8)), TensorView(std::span<float>(g).first(9))})
            .find("overlap") != std::string::npos);
  // The engine still works.
  engine.allreduce_coalesced_async("after", std::span<const TensorView>(views).first(1)).wait();
  CHECK(x[0] == static_cast<float>(n));
}

TEST_CASE("engine: allgather with different counts and broadcast from every root") {
  auto engine = make_engine();
  const int n = engine.size(), r = engine.rank();
  for (int step = 0; step < 2; ++step) {
    std::vector<std::int32_t> mine(static_cast<std::size_t>(r + step), 100 * r);
    auto h = engine.allgather_async("gather", TensorView(std::span<std::int32_t>(mine)));
    auto outv = h.output();
    std::size_t pos = 0;
    for (int q = 0; q < n; ++q) {
      CHECK(h.counts()[static_cast<std::size_t>(q)] == static_cast<std::size_t>(q + step));
      for (int e = 0; e < q + step; ++e) {
        CHECK(static_cast<std::int32_t*>(outv.data)[pos++] == 100 * q);
      }
    }
    CHECK(pos == outv.count);
  }
  for (int root = 0; root < n; ++root) {
    std::vector<float> b(77, r == root ? 3.5f + root : 0.0f);
    engine.broadcast_async("bcast" + std::to_string(root), TensorView(std::span<float>(b)), root)
        .wait();
    for (float v : b) CHECK(v == 3.5f + root);
  }
}

TEST_CASE("engine: mismatched dtype or count is an error on every rank, naming both") {
  auto engine = make_engine();
  const int r = engine.rank();
  std::vector<float> f(100, 1);
  std::vector<std::int32_t> i32(100, 1);
  auto h = r == 1 ? engine.allreduce_async("mixed", TensorView(std::span<std::int32_t>(i32)))
                  : engine.allreduce_async("mixed", TensorView(std::span<float>(f)));
  if (engine.size() > 1) {
    CHECK_THROWS_AS(h.wait(), kolo::MismatchError);
    try {
      h.wait();
    } catch (const kolo::MismatchError& e) {
      const std::string m = e.what();
      CHECK(m.find("mixed") != std::string::npos);
      CHECK(m.find("int32") != std::string::npos);
      CHECK(m.find("float32") != std::string::npos);
      CHECK(e.tensor_index() == -1);  // not about one tensor of a list
    }
  }
  std::vector<float> c(static_cast<std::size_t>(r == 0 ? 10 : 11), 1);
  auto h2 = engine.allreduce_async("counts", TensorView(std::span<float>(c)));
  if (engine.size() > 1) CHECK_THROWS_AS(h2.wait(), kolo::MismatchError);
  // The engine keeps working after a mismatch: it is a per-tensor error.
  std::vector<float> ok(5, 1);
  engine.allreduce_async("after", TensorView(std::span<float>(ok))).wait();
  CHECK(ok[0] == static_cast<float>(engine.size()));
}

TEST_CASE("engine: a duplicate name in flight is an error for that handle") {
  auto engine = make_engine();
  const int n = engine.size(), r = engine.rank();
  std::vector<float> a(10, 1), b(10, 1), go(1, 1);
  if (r == 0) {
    // Rank 0 submits "dup" twice while its first cannot complete: the other ranks submit theirs
    // only after "go", which rank 0 submits after the refusal. (Submitting on every rank back to
    // back is racy: a cycle may finish the first before the second is taken in, making the
    // second a legal new round that nobody else joins.)
    auto h1 = engine.allreduce_async("dup", TensorView(std::span<float>(a)));
    auto h2 = engine.allreduce_async("dup", TensorView(std::span<float>(b)));
    bool second_failed = false;
    try {
      h2.wait();
    } catch (const kolo::Error& e) {
      second_failed = std::string(e.what()).find("already in flight") != std::string::npos;
    }
    if (n > 1) CHECK(second_failed);  // one rank: the first may be done before the second
    engine.allreduce_async("go", TensorView(std::span<float>(go))).wait();
    h1.wait();
  } else {
    engine.allreduce_async("go", TensorView(std::span<float>(go))).wait();
    engine.allreduce_async("dup", TensorView(std::span<float>(a))).wait();
  }
  CHECK(a[0] == static_cast<float>(n));
}

TEST_CASE("engine: join with ranks that stop after different numbers of steps") {
  auto engine = make_engine();
  const int n = engine.size(), r = engine.rank();
  const int my_steps = 2 + r;  // rank r runs 2 + r steps, then joins
  for (int step = 0; step < my_steps; ++step) {
    std::vector<float> v(257, static_cast<float>(r + 1));
    engine.allreduce_async("grad", TensorView(std::span<float>(v)), ReduceOp::sum).wait();
    // Ranks with more than `step` steps contribute; joined ones add zeros.
    float want = 0;
    for (int q = 0; q < n; ++q) {
      if (2 + q > step) want += static_cast<float>(q + 1);
    }
    CHECK(v[0] == want);
    CHECK(v[256] == want);
  }
  engine.join();
  // After everyone joined, the engine works normally again.
  std::vector<float> v(3, 1);
  engine.allreduce_async("after-join", TensorView(std::span<float>(v))).wait();
  CHECK(v[0] == static_cast<float>(n));
}

TEST_CASE("engine: timeline is valid Chrome-trace JSON with the expected events") {
  const std::string path = "/tmp/kolo-timeline-" + std::to_string(::getppid()) + ".json";
  kolo::EngineOptions opts = kolo::EngineOptions::from_env();
  opts.timeline = path;
  {
    auto engine = make_engine(opts);
    std::vector<std::vector<float>> ts(6, std::vector<float>(100, 1));
    std::vector<kolo::Handle> hs;
    for (int i = 0; i < 6; ++i) {
      hs.push_back(
          engine.allreduce_async("layer" + std::to_string(i),
                                 TensorView(std::span<float>(ts[static_cast<std::size_t>(i)]))));
    }
    for (auto& h : hs) h.wait();
    std::vector<float> b(10, 2);
    engine.broadcast_async("weights", TensorView(std::span<float>(b)), 0).wait();
    engine.communicator().rank();
  }  // shutdown closes the file
  if (kolo::Topology::from_env().rank == 0) {
    const std::string cmd =
        "python3 -c \"import json,sys; ev=json.load(open('" + path +
        "')); names={e['name'] for e in ev}; "
        "need={'NEGOTIATE','ALLREDUCE','BROADCAST'}; "
        "assert need<=names, names; "
        "assert any(e.get('args',{}).get('tensor')=='layer3' for e in ev); "
        "assert all('dtype' in e['args'] and 'bytes' in e['args'] for e in ev if e['ph']=='X')\"";
    CHECK(std::system(cmd.c_str()) == 0);
    std::remove(path.c_str());
  }
}

TEST_CASE("engine: a name some ranks never submit is reported by the stall inspector") {
  kolo::EngineOptions opts = kolo::EngineOptions::from_env();
  opts.stall_warning_seconds = 0.3;
  opts.stall_shutdown_seconds = 1.5;
  const int n = kolo::Topology::from_env().size;
  if (n < 2) return;
  // Rank 0 captures its stderr to read the inspector's warning.
  const std::string log = "/tmp/kolo-stall-" + std::to_string(::getppid()) + ".log";
  const bool rank0 = kolo::Topology::from_env().rank == 0;
  int saved = -1;
  if (rank0) {
    std::fflush(stderr);
    saved = ::dup(2);
    const int fd = ::open(log.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0600);
    ::dup2(fd, 2);
    ::close(fd);
  }
  std::string error_text;
  {
    auto engine = make_engine(opts);
    std::vector<float> v(10, 1);
    kolo::Handle h;
    if (engine.rank() != n - 1)
      h = engine.allreduce_async("lonely", TensorView(std::span<float>(v)));
    if (h.valid()) {
      try {
        h.wait();
      } catch (const kolo::Error& e) {
        error_text = e.what();
      }
    } else {
      // The last rank has nothing pending; its engine is shut down with the reason too.
      for (int i = 0; i < 100 && error_text.empty(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        try {
          engine.allreduce_async("probe" + std::to_string(i), TensorView(std::span<float>(v)));
        } catch (const kolo::Error& e) {
          error_text = e.what();
        }
      }
    }
  }
  if (rank0) {
    std::fflush(stderr);
    ::dup2(saved, 2);
    ::close(saved);
    std::ifstream f(log);
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string text = ss.str();
    CHECK(text.find("stall inspector") != std::string::npos);
    CHECK(text.find("lonely") != std::string::npos);
    CHECK(text.find("not by rank(s) " + std::to_string(n - 1)) != std::string::npos);
    CHECK(text.find("Engine::join()") != std::string::npos);  // the likely cause, uneven data
    std::remove(log.c_str());
  }
  CHECK_MESSAGE(error_text.find("lonely") != std::string::npos, error_text);
  CHECK_MESSAGE(error_text.find(std::to_string(n - 1)) != std::string::npos, error_text);
  // Every rank says why (each computes it from the same flags and table) and what to do.
  CHECK_MESSAGE(error_text.find("shut down by the stall inspector") != std::string::npos,
                error_text);
  CHECK_MESSAGE(error_text.find("Engine::join()") != std::string::npos, error_text);
}

TEST_CASE(
    "engine: tensors back to back in memory are reduced in place, with any layout elsewhere") {
  // Views into one flat buffer (as DDP's bucket views or a flat gradient buffer give) are the
  // packed layout already: such a batch runs on the tensors' own memory. Rank 1 keeps separate
  // tensors, so the same collective meets a direct batch on some ranks and a packed one on
  // others. In place, out of place, average, postscale. Once with fused batches in pieces (the
  // default: the ring reads and writes every tensor in place, flat or not) and once through the
  // fusion buffer (KOLO_FUSION_PIECES=off), where only the flat ranks skip the copies.
  for (const bool in_pieces : {true, false}) {
    kolo::EngineOptions opts = kolo::EngineOptions::from_env();
    opts.fusion_pieces = in_pieces;
    auto engine = make_engine(opts);
    const int n = engine.size(), r = engine.rank();
    const bool flat = r != 1;
    constexpr std::size_t kTensors = 40;
    auto count_of = [](std::size_t k) { return 17 + (k * 5) % 23; };
    std::size_t total = 0;
    for (std::size_t k = 0; k < kTensors; ++k) total += count_of(k);
    auto val = [](int rank, std::size_t k, std::size_t i) {
      return static_cast<float>((rank + 3 * k + i) % 7);
    };
    auto sum = [&](std::size_t k, std::size_t i) {
      float s = 0;
      for (int q = 0; q < n; ++q) s += val(q, k, i);
      return s;
    };
    struct Layout {
      std::vector<float> in_flat, out_flat;
      std::vector<std::vector<float>> in_sep, out_sep;
    };
    for (int variant = 0; variant < 4; ++variant) {
      // 0: in place, sum; 1: out of place, sum; 2: in place, average; 3: in place, postscale 0.5
      const bool out_of_place = variant == 1;
      const ReduceOp op = variant == 2 ? ReduceOp::average : ReduceOp::sum;
      const double post = variant == 3 ? 0.5 : 1.0;
      Layout L;
      L.in_flat.assign(total, 0.0f);
      L.out_flat.assign(total, -1.0f);
      for (std::size_t k = 0; k < kTensors; ++k) {
        L.in_sep.emplace_back(count_of(k));
        L.out_sep.emplace_back(count_of(k), -1.0f);
      }
      std::vector<TensorView> in(kTensors), out(kTensors);
      std::size_t off = 0;
      for (std::size_t k = 0; k < kTensors; ++k) {
        float* pi = flat ? L.in_flat.data() + off : L.in_sep[k].data();
        float* po = flat ? L.out_flat.data() + off : L.out_sep[k].data();
        for (std::size_t i = 0; i < count_of(k); ++i) pi[i] = val(r, k, i);
        in[k] = TensorView(pi, count_of(k), DataType::float32);
        out[k] = out_of_place ? TensorView(po, count_of(k), DataType::float32) : in[k];
        off += count_of(k);
      }
      const auto before = engine.stats();
      for (int step = 0; step < 3; ++step) {  // negotiated once, then cached
        if (step > 0) {
          for (std::size_t k = 0; k < kTensors; ++k) {
            auto* pi = static_cast<float*>(in[k].data);
            for (std::size_t i = 0; i < count_of(k); ++i) pi[i] = val(r, k, i);
          }
        }
        std::vector<kolo::Handle> hs;
        for (std::size_t k = 0; k < kTensors; ++k) {
          hs.push_back(
              engine.allreduce_async("flat" + std::to_string(variant) + "/" + std::to_string(k),
                                     in[k], op, 1.0, post, out_of_place ? out[k] : TensorView{}));
        }
        for (auto& h : hs) h.wait();
        std::size_t wrong = 0;
        for (std::size_t k = 0; k < kTensors; ++k) {
          const auto* po = static_cast<const float*>(out[k].data);
          for (std::size_t i = 0; i < count_of(k); ++i) {
            float want = sum(k, i);
            if (op == ReduceOp::average) want /= static_cast<float>(n);
            if (post != 1.0) want *= 0.5f;
            wrong += po[i] != want;
          }
          if (out_of_place) {  // inputs untouched
            const auto* pi = static_cast<const float*>(in[k].data);
            for (std::size_t i = 0; i < count_of(k); ++i) wrong += pi[i] != val(r, k, i);
          }
        }
        CHECK_MESSAGE(wrong == 0, "variant " << variant << " step " << step);
      }
      const auto after = engine.stats();
      // A postscale keeps a batch out of pieces (the collective would not apply it).
      const bool pieces = in_pieces && n > 1 && post == 1.0;
      if (pieces) {
        CHECK(after.piece_collectives > before.piece_collectives);
        CHECK(after.direct_collectives == before.direct_collectives);
      } else {
        CHECK(after.piece_collectives == before.piece_collectives);
        if (flat && n > 1) CHECK(after.direct_collectives > before.direct_collectives);
        if (!flat) CHECK(after.direct_collectives == before.direct_collectives);
      }
    }
  }
}
