// kolo/engine/detail/inbox.hpp — the engine's inbox: the submissions on their way from the
// submitting threads to the cycle, the lock they take, and the spare lists of coalesced
// submissions. No transport, no negotiation: a queue and its wake-up threshold.
#pragma once

#include <atomic>
#include <cstddef>
#include <exception>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "kolo/core/error.hpp"
#include "kolo/engine/detail/records.hpp"

namespace kolo::detail {

// The lock of an engine's inbox: every submission takes it, for a few stores. Its release is a
// plain store where std::mutex's is an atomic exchange: one read-modify-write less per
// submitted tensor, on a path that costs about 100 ns in all. A thread that finds it held
// yields the CPU while it waits (the holder may be descheduled on a busy host).
class InboxLock {
 public:
  void lock() noexcept {
    while (held_.exchange(true, std::memory_order_acquire)) {
      while (held_.load(std::memory_order_relaxed)) std::this_thread::yield();
    }
  }
  void unlock() noexcept { held_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> held_{false};
};

namespace engine {

// A submission on its way to the engine thread; the name is in the inbox's name buffer.
struct Incoming {
  // Not value-initialised: emplace_back() would zero the whole entry (about 200 bytes) before
  // the inbox sets every field of it, a cost per submitted tensor.
  Incoming() noexcept {}
  std::size_t name_at = 0, name_len = 0;
  Local local;
};

// The inbox and what a submission reads, guarded by `lock` (taken after the engine's mutex
// where both are held; a submission takes `lock` alone). wake_at, shutdown_requested and dead
// are written holding both locks and read holding either.
struct Inbox {
  InboxLock lock;
  std::vector<Incoming> entries;  // submissions, names in `names`
  std::string names;
  clock::time_point since;  // when the oldest submission in the inbox arrived
  std::size_t wake_at = 1;  // the inbox size at which a submission wakes the engine thread
  bool shutdown_requested = false;
  std::exception_ptr dead;
  // Coalesced submissions' lists, kept for reuse (recycle(), allreduce_coalesced_async).
  std::vector<std::vector<TensorView>> spare_views;
  std::vector<std::vector<std::uint64_t>> spare_counts;

  // Files a checked submission; true when it should wake the engine thread. `now`: the
  // submission's time when each submission is stamped (the timeline), else unset.
  bool add(std::string_view name, StateRef&& state, const TensorView& in, const TensorView& out,
           RequestParams&& p, std::vector<TensorView>&& parts, clock::time_point now,
           bool stamp_each) {
    std::lock_guard guard(lock);
    if (dead) std::rethrow_exception(dead);
    if (shutdown_requested) throw Error("engine: shut down; no new operations");
    // The inbox and its name buffer keep their capacity from cycle to cycle (the engine
    // thread swaps them with its own pair): no allocation once a step's size has been seen.
    // The engine thread sleeps until the inbox holds wake_at submissions (1, the rest of a
    // step, or never: see EngineCore::wake_threshold): one wake-up per step at most.
    if (entries.empty()) since = stamp_each ? now : clock::now();
    const bool wake = entries.size() + 1 == wake_at;
    const std::size_t at = names.size();
    names.append(name);  // first: if it throws, no entry points past the buffer
    Incoming& e = entries.emplace_back();
    e.name_at = at;
    e.name_len = name.size();
    e.local.handle = std::move(state);
    e.local.in = in;
    e.local.out = out;
    e.local.p = std::move(p);
    e.local.parts = std::move(parts);
    e.local.enqueued = now;
    return wake;
  }

  // Keeps a finished coalesced submission's lists (their capacity) for the next one: a step
  // that submits the same lists every time allocates none. At most kSpares of each are kept.
  static constexpr std::size_t kSpares = 64;
  void recycle(Local& old) {
    if (old.parts.capacity() == 0 && old.p.parts.capacity() == 0) return;
    std::lock_guard guard(lock);
    if (spare_views.size() < kSpares && old.parts.capacity() > 0) {
      spare_views.push_back(std::move(old.parts));
    }
    if (spare_counts.size() < kSpares && old.p.parts.capacity() > 0) {
      spare_counts.push_back(std::move(old.p.parts));
    }
  }

  // A spare pair of lists for a coalesced submission (empty vectors where none is spare).
  void take_spares(std::vector<TensorView>& views, std::vector<std::uint64_t>& counts) {
    std::lock_guard guard(lock);
    if (!spare_views.empty()) {
      views = std::move(spare_views.back());
      spare_views.pop_back();
    }
    if (!spare_counts.empty()) {
      counts = std::move(spare_counts.back());
      spare_counts.pop_back();
    }
  }
};

}  // namespace engine
}  // namespace kolo::detail
