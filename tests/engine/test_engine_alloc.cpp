// The engine's steady state allocates nothing: this binary replaces the global operator new and
// counts every allocation, in the whole process and on the calling thread, while a training-like
// loop submits the same named tensors every step (names longer than std::string's inline buffer,
// so a copied name would show).
//
// * One rank (kolo-run -np 1): every thread's allocations while steps run, after warm-up, are
//   0 — submissions, negotiation (the response cache), fusion, completion, the handles; with and
//   without average/scaling, and through DistributedOptimizer's synchronize().
// * Several ranks: the submitting thread's allocations while it submits a whole step are 0.
//   (Collectives with peers allocate inside the algorithms and the transport, which are not the
//   engine's; so the whole step is counted at one rank only.)
// In 10 steps, at most 4 may allocate at all: under load the handle pool can reach a new high of
// live handles after the warm-up, once or twice (see the engine case); a cost per step shows in
// all 10.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include <kolo/engine/engine.hpp>
#include <kolo/kolo.hpp>
#include <kolo/optim/optim.hpp>

// The replacement operator delete below frees with std::free what the replacement operator new
// took with std::malloc. Where GCC inlines both around a new-expression (the engine's handle
// states, under -O1 with TSan), -Wmismatched-new-delete sees "free of a new'd pointer": a
// false positive for replaced global operators.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif

namespace {

std::atomic<std::uint64_t> g_allocs{0};
thread_local std::uint64_t t_allocs = 0;

void* counted(std::size_t n, std::size_t align) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  ++t_allocs;
  if (n == 0) n = 1;
  void* p = align > __STDCPP_DEFAULT_NEW_ALIGNMENT__
                ? std::aligned_alloc(align, (n + align - 1) / align * align)
                : std::malloc(n);
  if (!p) throw std::bad_alloc();
  return p;
}

}  // namespace

void* operator new(std::size_t n) {
  return counted(n, 0);
}
void* operator new[](std::size_t n) {
  return counted(n, 0);
}
void* operator new(std::size_t n, std::align_val_t a) {
  return counted(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return counted(n, static_cast<std::size_t>(a));
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted(n, 0);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return counted(n, 0);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
  std::free(p);
}

using kolo::ReduceOp;
using kolo::TensorView;

namespace {

struct Model {
  std::vector<std::vector<float>> grads;
  std::vector<std::string> names;
  std::vector<kolo::Handle> handles;
  Model(std::size_t tensors, std::size_t count) : grads(tensors), handles(tensors) {
    for (std::size_t k = 0; k < tensors; ++k) {
      grads[k].assign(count + k % 3, 0.0f);  // uneven sizes, like a real model
      names.push_back("model.encoder.layer" + std::to_string(k) + ".attention.weight");
    }
  }
  void fill(int rank) {
    for (std::size_t k = 0; k < grads.size(); ++k) {
      for (std::size_t i = 0; i < grads[k].size(); ++i) {
        grads[k][i] = static_cast<float>((rank + 2 * k + i) % 5);
      }
    }
  }
  // Exact: the ranks' values are small integers; `expect` maps their sum to the result, in
  // float as the engine computes it.
  template <class Expect>
  std::size_t wrong(int n, Expect&& expect) const {
    std::size_t bad = 0;
    for (std::size_t k = 0; k < grads.size(); ++k) {
      for (std::size_t i = 0; i < grads[k].size(); ++i) {
        float sum = 0;
        for (int r = 0; r < n; ++r) sum += static_cast<float>((r + 2 * k + i) % 5);
        bad += grads[k][i] != expect(sum);
      }
    }
    return bad;
  }
};

void submit(kolo::Engine<>& engine, Model& m, ReduceOp op, double pre, double post) {
  for (std::size_t k = 0; k < m.grads.size(); ++k) {
    m.handles[k] =
        engine.allreduce_async(m.names[k], TensorView(std::span<float>(m.grads[k])), op, pre, post);
  }
}

void wait_all(Model& m) {
  for (auto& h : m.handles) h.wait();
}

}  // namespace

// Under ASan the engine allocates each handle's state and frees it (no reuse, so that a use
// after release is reported): one allocation per submission is then expected, and nothing more.
constexpr std::uint64_t kStateAllocs = kolo::detail::kAsan ? 1 : 0;

TEST_CASE("engine steady state: no allocation per step (1 rank: all threads; N ranks: submit)") {
  kolo::EngineOptions opts = kolo::EngineOptions::from_env();
  opts.timeline.clear();
  kolo::Engine<> engine(kolo::Communicator<>::from_env(), opts);
  const int n = engine.size(), r = engine.rank();
  Model m(300, 97);
  struct Variant {
    ReduceOp op;
    double pre, post;
  };
  // sum; average (the collective divides); scaled (prescale while packing, postscale while
  // unpacking). Each variant's names are negotiated in its warm-up steps.
  const Variant variants[] = {
      {ReduceOp::sum, 1.0, 1.0}, {ReduceOp::average, 1.0, 1.0}, {ReduceOp::sum, 2.0, 0.25}};
  const float nf = static_cast<float>(n);
  for (const Variant& v : variants) {
    for (int warm = 0; warm < 3; ++warm) {
      m.fill(r);
      submit(engine, m, v.op, v.pre, v.post);
      wait_all(m);
    }
    // A step that allocates: on a loaded machine the engine's thread may lag further behind
    // the submitter than in any step before, so more handles are alive at once and the handle
    // pool takes a few more blocks, in a step or two. An allocation per step (what this test guards
    // against) shows in every step.
    int submitting = 0, whole = 0;  // steps that allocated
    std::uint64_t submitting_n = 0, whole_n = 0;
    std::size_t wrong = 0;
    for (int step = 0; step < 10; ++step) {
      m.fill(r);
      const std::uint64_t g0 = g_allocs.load(), t0 = t_allocs;
      submit(engine, m, v.op, v.pre, v.post);
      submitting += t_allocs - t0 > kStateAllocs * m.grads.size();
      submitting_n += t_allocs - t0;
      wait_all(m);
      whole += g_allocs.load() - g0 > kStateAllocs * m.grads.size();
      whole_n += g_allocs.load() - g0;
      wrong += m.wrong(n, [&](float sum) {
        if (v.op == ReduceOp::average) return sum / nf;
        return v.pre == 1.0 ? sum : sum * 0.5f;
      });
    }
    CHECK(wrong == 0);
    CHECK_MESSAGE(submitting <= 4, "op " << kolo::reduce_op_name(v.op) << " pre " << v.pre << ": "
                                         << submitting_n << " allocations in " << submitting
                                         << " of 10 steps");
    if (n == 1) {
      CHECK_MESSAGE(whole <= 4, "op " << kolo::reduce_op_name(v.op) << " pre " << v.pre << ": "
                                      << whole_n << " allocations in " << whole << " of 10 steps");
    }
  }
  const kolo::EngineStats s = engine.stats();
  CHECK(s.cached_responses >= 3 * 10 * 300);  // the steps above went through the cache
}

TEST_CASE("DistributedOptimizer steady state: synchronize() allocates nothing (1 rank)") {
  std::vector<std::vector<float>> values(64), grads(64);
  std::vector<kolo::Parameter> params;
  for (std::size_t k = 0; k < values.size(); ++k) {
    values[k].assign(50 + k, 1.0f);
    grads[k].assign(50 + k, 0.0f);
    params.push_back({"decoder.block" + std::to_string(k) + ".mlp.weight", values[k], grads[k]});
  }
  kolo::EngineOptions eo = kolo::EngineOptions::from_env();
  eo.timeline.clear();
  kolo::DistributedOptimizer dist(kolo::Communicator<>::from_env(), kolo::SGD(), std::move(params),
                                  kolo::DistributedOptions{}, eo);
  const int n = dist.size();
  auto pass = [&] {
    for (std::size_t k = 0; k < grads.size(); ++k) {
      for (std::size_t i = 0; i < grads[k].size(); ++i) {
        grads[k][i] = static_cast<float>((dist.rank() + k + i) % 4);
      }
      dist.gradient_ready(k);
    }
    dist.synchronize();
  };
  for (int warm = 0; warm < 3; ++warm) pass();
  std::uint64_t whole = 0, whole_n = 0;  // steps that allocated, allocations
  std::size_t wrong = 0;
  for (int step = 0; step < 10; ++step) {
    const std::uint64_t g0 = g_allocs.load();
    pass();
    const std::uint64_t d = g_allocs.load() - g0;
    whole += d > kStateAllocs * grads.size() ? 1 : 0;
    whole_n += d;
    for (std::size_t k = 0; k < grads.size(); ++k) {
      for (std::size_t i = 0; i < grads[k].size(); ++i) {
        float sum = 0;
        for (int q = 0; q < n; ++q) sum += static_cast<float>((q + k + i) % 4);
        wrong += grads[k][i] != sum / static_cast<float>(n);
      }
    }
  }
  CHECK(wrong == 0);
  // As in the engine case: a new high of live handles under load may allocate once or twice
  // (a fresh CI run at load ~6 saw 1 allocation in 10 steps); a per-step cost shows in all 10.
  if (n == 1) {
    CHECK_MESSAGE(whole <= 4, whole_n << " allocations in " << whole << " of 10 steps");
  }
}
