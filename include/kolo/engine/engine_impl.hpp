// kolo/engine/engine_impl.hpp — the engine's machinery behind Engine<T> (engine.hpp): the
// progress thread, negotiation, the response cache, tensor fusion, and Engine<T>'s members.
//
// Header-only, engine.hpp includes this file. With the compiled core (KOLO_COMPILED_CORE) the
// library holds the Engine of the standard transports (MeshTransport = DefaultTransport,
// RoutedTransport, ShmTransport, TcpTransport) and a user's file does not parse this one; a
// file that builds an Engine of another transport (InprocTransport, MpiTransport,
// NcclTransport, CudaStagedTransport, its own) includes it.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>
#include "kolo/communicator.hpp"
#include "kolo/compression/compressor.hpp"
#include "kolo/core/checked_size.hpp"
#include "kolo/core/compiled_core.hpp"
#include "kolo/core/config.hpp"
#include "kolo/core/env.hpp"
#include "kolo/core/error.hpp"
#include "kolo/core/reduce.hpp"
#include "kolo/core/tensor.hpp"
#include "kolo/cuda/device_ops.hpp"
#include "kolo/engine/engine.hpp"
#include "kolo/engine/fusion_buffer.hpp"
#include "kolo/engine/handle.hpp"
#include "kolo/engine/request.hpp"
#include "kolo/engine/timeline.hpp"

namespace kolo {
namespace detail {
template <class T>
struct engine_defined<T, std::void_t<T>> : std::true_type {};

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
}  // namespace detail

// What Engine<T> holds by pointer; its public members are Engine<T>'s, one to one.
template <class T>
class EngineCore {
  static_assert(check_transport<T>());  // names the member T lacks (transport/transport.hpp)
  using clock = std::chrono::steady_clock;

 public:
  // Engine<T>'s members (engine.hpp documents them), without the default arguments and the range
  // overloads, which Engine<T> resolves before it hands over.
  EngineCore(Communicator<T> comm, EngineOptions opts);
  EngineCore(const EngineCore&) = delete;
  EngineCore& operator=(const EngineCore&) = delete;
  ~EngineCore();

  Handle allreduce_async(std::string_view name, const TensorView& tensor, ReduceOp op,
                         double prescale, double postscale, const TensorView& output);
  std::vector<Handle> grouped_allreduce_async(
      const std::string& group, const std::vector<std::pair<std::string, TensorView>>& tensors,
      ReduceOp op, double prescale, double postscale);
  Handle allreduce_coalesced_async(std::string_view name, std::span<const TensorView> tensors,
                                   ReduceOp op, double prescale, double postscale);
  Handle allgather_async(std::string_view name, const TensorView& tensor);
  Handle broadcast_async(std::string_view name, const TensorView& tensor, int root);
  void join();
  void shutdown();
  EngineStats stats() const;
  Communicator<T>& communicator() { return comm_; }
  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }

 private:
  // Names are looked up by std::string_view (no std::string is built to find one).
  struct NameHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept {
      return std::hash<std::string_view>{}(s);
    }
  };
  template <class V>
  using NameMap = std::unordered_map<std::string, V, NameHash, std::equal_to<>>;

  // One operation this rank submitted, from enqueue until its handle completes.
  struct Local {
    detail::StateRef handle;
    TensorView in, out;
    RequestParams p;
    clock::time_point enqueued, ready;
    std::uint64_t seq = 0;  // submission order on this rank (oldest first in messages)
    int cache_slot = -1;    // >= 0: it waits in that cache slot; -1: in pending_, by name;
                            // kPart: one tensor of a coalesced submission, while it executes
    std::vector<TensorView> parts;  // a coalesced submission: its tensors (in, out: unused)
  };
  static constexpr int kPart = -2;
  // A name every rank has negotiated before, with the parameters they agreed on. A steady-state
  // submission finds its slot with one hash lookup at intake and is a slot number from then on:
  // it waits in the slot, the cycle's flags carry the slot, the response is the slot.
  struct CacheSlot {
    bool used = false;
    std::string name;
    RequestParams p;
    int track = -1;     // the name's timeline track, once the timeline has seen it
    bool busy = false;  // `local` holds this rank's operation of this name, in flight
    Local local;
  };
  struct TableEntry {
    std::string name;
    std::vector<std::optional<RequestParams>> by_rank;
    clock::time_point first_seen;
    bool warned = false;
    bool done = false;
  };
  // A response the request table decided (rather than a cache slot), or one held for its group.
  struct Decided {
    std::string name;
    RequestParams p;
    std::vector<std::size_t> counts;  // allgather
    std::string error;                // non-empty: a mismatch, delivered to the handle
    long error_tensor = -1;           // a list's first tensor whose count differs (else -1)
  };
  // What a cycle runs: a name every rank agreed on. It points into its cache slot or Decided.
  struct Response {
    const std::string* name = nullptr;
    const RequestParams* p = nullptr;
    const Decided* decided = nullptr;  // table responses: counts, error
    int slot = -1;                     // cached responses: the slot
    bool cached = false;
    Local* local = nullptr;  // this rank's request (nullptr: joined, contributes zeros)

    const std::string& error() const {
      static const std::string none;
      return decided ? decided->error : none;
    }
    long error_tensor() const { return decided ? decided->error_tensor : -1; }
  };
  // A submission on its way to the engine thread; the name is in the inbox's name buffer.
  struct Incoming {
    // Not value-initialised: emplace_back() would zero the whole entry (about 200 bytes) before
    // enqueue sets every field of it, a cost per submitted tensor.
    Incoming() noexcept {}
    std::size_t name_at = 0, name_len = 0;
    Local local;
  };
  struct Held {  // a group member that waits for the rest of its group
    std::unique_ptr<Decided> data;
    Response r;
  };

  // The tensors by reference: copies of them on the stack, read back piecewise, stalled the
  // loads here (a submission is about 100 ns in all).
  Handle enqueue(std::string_view name, const TensorView& in, const TensorView& out,
                 RequestParams&& p) {
    auto state = detail::make_handle_state();
    state->output = out;
    const bool on_device = in.device.kind == Device::Kind::cuda;
    if (on_device != (out.device.kind == Device::Kind::cuda)) {
      throw ConfigError("engine: tensor '" + std::string(name) +
                        "': input and output must both be on a CUDA device or both in host memory");
    }
    if (on_device) {
      if constexpr (!DeviceFusionTransport<T>) {
        throw ConfigError("engine: tensor '" + std::string(name) +
                          "' is on a CUDA device, but this engine's transport takes host memory "
                          "only (use Engine<NcclTransport> or Engine<CudaStagedTransport>)");
      }
      if (p.kind == OpKind::allgather) {
        throw ConfigError("engine: tensor '" + std::string(name) +
                          "': allgather of device tensors is not supported by the engine; use "
                          "Communicator::allgather on device buffers");
      }
      p.device = 1;
    }
    if (in.count > 0 && (!in.data || !out.data)) {
      throw ConfigError("engine: tensor '" + std::string(name) + "' has a null data pointer");
    }
    // The message is built only on failure: this runs for every submission, which must not
    // allocate in steady state (engine/alloc).
    if (dtype_size(in.dtype) != 0 && in.count > detail::kMaxObjectBytes / dtype_size(in.dtype)) {
      (void)detail::checked_bytes(in.count, dtype_size(in.dtype),
                                  "engine: tensor '" + std::string(name) + "'");
    }
    if (out.count != in.count || out.dtype != in.dtype) {
      throw ConfigError("engine: tensor '" + std::string(name) +
                        "': output must match the input's count and dtype");
    }
    if (in.data != out.data && in.count > 0) {
      // In place (the same pointer) or disjoint: a partial overlap would be read after parts
      // of it were written.
      const auto a0 = reinterpret_cast<std::uintptr_t>(in.data);
      const auto b0 = reinterpret_cast<std::uintptr_t>(out.data);
      const std::uintptr_t a1 = a0 + in.bytes(), b1 = b0 + out.bytes();
      if (a0 < b1 && b0 < a1) {
        auto hex = [](std::uintptr_t v) {
          char buf[32];
          std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
          return std::string(buf);
        };
        throw ConfigError("engine: tensor '" + std::string(name) + "': input [" + hex(a0) + ", " +
                          hex(a1) + ") and output [" + hex(b0) + ", " + hex(b1) +
                          ") overlap; pass the same buffer (in place) or disjoint buffers");
      }
    }
    if (!dtype_is_floating(p.dtype) && (p.prescale != 1.0 || p.postscale != 1.0)) {
      throw ConfigError("engine: tensor '" + std::string(name) +
                        "': prescale/postscale need a floating dtype");
    }
    if (p.kind == OpKind::broadcast && (p.root < 0 || p.root >= size())) {
      throw ConfigError("engine: tensor '" + std::string(name) + "': broadcast root " +
                        std::to_string(p.root) + " is not a rank");
    }
    return push(name, std::move(state), in, out, std::move(p), {});
  }

  // Files a checked submission in the inbox and returns its handle.
  Handle push(std::string_view name, detail::StateRef state, const TensorView& in,
              const TensorView& out, RequestParams&& p, std::vector<TensorView>&& parts) {
    // A waiting thread may run the cycles of a host engine. Not of a device engine: its
    // transport selects the CUDA device on the calling thread, which would change the
    // waiter's current device behind its back.
    if constexpr (!DeviceFusionTransport<T>) {
      if (state->driver != driver_) state->driver = driver_;  // a reused state may have it
    } else if (state->driver) {
      state->driver.reset();
    }
    Handle h(state.share_unpublished());
    // The submission time serves the timeline (NEGOTIATE starts here); otherwise the engine
    // stamps a whole inbox with the time it takes it, which is precise enough for the stall
    // inspector and saves a clock read per tensor.
    const auto now = stamp_each_ ? clock::now() : clock::time_point{};
    bool wake = false;
    {
      std::lock_guard lock(inbox_lock_);
      if (dead_) std::rethrow_exception(dead_);
      if (shutdown_requested_) throw Error("engine: shut down; no new operations");
      // The inbox and its name buffer keep their capacity from cycle to cycle (the engine
      // thread swaps them with its own pair): no allocation once a step's size has been seen.
      // The engine thread sleeps until the inbox holds wake_at_ submissions (1, the rest of a
      // step, or never: see wake_threshold): one wake-up per step at most, not one per tensor.
      if (inbox_.empty()) inbox_since_ = stamp_each_ ? now : clock::now();
      wake = inbox_.size() + 1 == wake_at_;
      const std::size_t at = inbox_names_.size();
      inbox_names_.append(name);  // first: if it throws, no entry points past the buffer
      Incoming& e = inbox_.emplace_back();
      e.name_at = at;
      e.name_len = name.size();
      e.local.handle = std::move(state);
      e.local.in = in;
      e.local.out = out;
      e.local.p = std::move(p);
      e.local.parts = std::move(parts);
      e.local.enqueued = now;
    }
    if (wake) {
      // The engine thread checks the inbox holding mu_ and then waits on cv_, which releases
      // mu_: taking mu_ here puts this notification after its wait, or this submission before
      // its check.
      { std::lock_guard lock(mu_); }
      cv_.notify_all();
    }
    return h;
  }

  // ---------------- the progress thread ----------------

  enum class CycleResult { idle, progress, stop };

  // The engine thread: runs a cycle whenever there is a reason to and no waiting thread is
  // running them (Driver, handle.hpp).
  void loop() {
    bool busy = true;
    while (await_work(busy)) {
      std::unique_lock progress(driver_->mu, std::try_to_lock);
      if (!progress.owns_lock()) {  // a waiting thread took over meanwhile
        busy = false;
        continue;
      }
      const CycleResult r = run_cycle();
      if (r == CycleResult::stop) break;
      busy = r == CycleResult::progress && (in_flight() > 0 || !to_send_.empty());
      set_wake_at();
    }
  }

  // Sleeps until the engine thread should run a cycle: at once after a cycle that left work in
  // flight (`busy`); when a shutdown or a join is asked for; when the inbox holds a whole step
  // (wake_at_ submissions) or its oldest submission has waited cycle_time_ms; else on the cycle
  // clock (an idle cycle: every rank's engine cycles, so that a rank with work, waiting inside
  // the first collective, finds the others there). Never while a waiting thread runs the cycles.
  // False once the engine has stopped.
  bool await_work(bool busy) {
    const auto cycle = std::chrono::duration_cast<clock::duration>(
        std::chrono::duration<double, std::milli>(opts_.cycle_time_ms));
    std::unique_lock lock(mu_);
    auto tick = clock::now() + cycle;
    for (;;) {
      if (stopped_) return false;
      const auto now = clock::now();
      bool empty;
      std::size_t waiting;
      clock::time_point since;
      {
        std::lock_guard inbox(inbox_lock_);
        empty = inbox_.empty();
        waiting = inbox_.size();
        since = inbox_since_;
      }
      if (driving_ == 0) {
        if (busy || shutdown_requested_ || (!join_waiters_.empty() && !joined_mirror_)) return true;
        if (empty ? now >= tick : waiting >= wake_at_ || now >= since + cycle) {
          return true;
        }
      } else {
        // A waiting thread runs the cycles: sleep without the clock, whose wake-ups would only
        // take the CPU from it. It wakes this thread when it stops (if anything is left), and
        // a long timeout bounds the pause of the idle cycles if it left nothing.
        cv_.wait_for(lock, 50 * cycle);
        tick = clock::now() + cycle;
        continue;
      }
      cv_.wait_until(lock, !empty ? since + cycle : tick);
    }
  }

  // One cycle, then its completions announced and its timeline events handed on. An error
  // fails every pending operation and stops the engine.
  CycleResult run_cycle() {
    CycleResult r;
    try {
      r = cycle();
    } catch (...) {  // current_exception keeps the dynamic type (PeerLostError, ...)
      fail_everything(std::current_exception());
      r = CycleResult::stop;
    }
    notify_completed();  // nothing marked done stays unannounced past a cycle
    if (timeline_.enabled()) timeline_.publish();  // this cycle's events to the writer
    if (r == CycleResult::stop) {
      {
        std::lock_guard lock(mu_);
        stopped_ = true;
      }
      cv_.notify_all();
    }
    return r;
  }

  // A thread waiting for `h` runs the cycles itself (the progress lock is held) while they make
  // progress and `h` is not done; then the engine thread takes over what remains, if anything.
  void drive(detail::HandleState& h) {
    {
      std::lock_guard lock(mu_);
      if (stopped_) return;
      ++driving_;
    }
    driven_ = true;
    for (;;) {
      bump([](EngineStats& s) { ++s.driven_cycles; });
      const CycleResult r = run_cycle();
      if (r != CycleResult::progress || h.is_done()) break;
    }
    driven_ = false;
    const bool more = in_flight() > 0 || !to_send_.empty();
    const std::size_t wake = wake_threshold();
    bool notify;
    {
      std::lock_guard lock(mu_);
      std::lock_guard inbox(inbox_lock_);
      --driving_;
      wake_at_ = wake;
      notify = more || stopped_ || !inbox_.empty() || shutdown_requested_ ||
               (!join_waiters_.empty() && !joined_mirror_);
    }
    if (notify) cv_.notify_all();
  }

  // The inbox size at which a submission wakes the engine thread: 1; the rest of the step while
  // one is being submitted (all cached names, and this rank submitted more than that over the
  // previous stretch between idle moments); never while the steps are run by the threads that
  // wait for them (then the cycle clock takes anything nobody waits for, within cycle_time_ms).
  std::size_t wake_threshold() const {
    if (!to_send_.empty() || joined_ || step_size_ == 0) return 1;
    if (step_driven_) return std::numeric_limits<std::size_t>::max();
    return step_size_ > since_idle_ ? step_size_ - since_idle_ : 1;
  }
  void set_wake_at() {
    const std::size_t w = wake_threshold();
    std::lock_guard lock(mu_);
    std::lock_guard inbox(inbox_lock_);
    wake_at_ = w;
  }

  // Operations of this rank in flight: waiting in a cache slot or in pending_.
  std::size_t in_flight() const { return pending_.size() + busy_slots_; }

  void set_joined(bool j) {
    joined_ = j;
    std::lock_guard lock(mu_);
    joined_mirror_ = j;
  }

  // Files the inbox's submissions; says whether a shutdown or a join is asked for.
  void take_inbox(bool& want_shutdown, bool& want_join) {
    {
      std::lock_guard lock(mu_);
      std::lock_guard inbox(inbox_lock_);
      incoming_.swap(inbox_);
      incoming_names_.swap(inbox_names_);
      want_shutdown = shutdown_requested_;
      want_join = !join_waiters_.empty();
    }
    const std::string_view names = incoming_names_;
    const auto now = incoming_.empty() || stamp_each_ ? clock::time_point{} : clock::now();
    for (auto& in : incoming_) {
      if (!stamp_each_) in.local.enqueued = now;
      intake(names.substr(in.name_at, in.name_len), std::move(in.local));
    }
    incoming_.clear();
    incoming_names_.clear();
  }

  CycleResult cycle() {
    const int n = size();
    const int me = rank();
    const auto t0 = clock::now();
    // 1. Take new work.
    bool want_shutdown, want_join;
    take_inbox(want_shutdown, want_join);
    // A join takes effect once this rank's own submissions have completed: a joined rank then
    // contributes only zeros, so "ranks that contributed" is exactly "ranks not joined".
    if (want_join && in_flight() == 0) set_joined(true);
    const bool stall_stop = stall_shutdown_;
    // Cached names stuck in negotiation past half the warning time leave the cache, so the
    // table can say who is missing them.
    const std::size_t slots = cache_.size();
    if (opts_.stall_warning_seconds > 0 && busy_slots_ > 0) {
      const auto limit = t0 - std::chrono::duration_cast<clock::duration>(
                                  std::chrono::duration<double>(opts_.stall_warning_seconds / 2));
      for (std::size_t k = 0; k < slots; ++k) {
        if (slot_pending_[k] && cache_[k].local.enqueued < limit) invalid_[k] = 1;
      }
    }

    // Pack now what will most likely be this cycle's fused batch, while the other ranks may
    // still be on their way to the negotiation (see prepack).
    prepack();

    // 2. The one collective of a steady-state cycle: min over [shutdown?, new names?, stall
    //    shutdown?, joined by rank..., shutting down by rank..., (pending, valid) per cache
    //    slot]. Min over 0/1 bytes is AND; the per-rank bytes let every rank name the others.
    const std::size_t joined_at = 3, stop_at = 3 + static_cast<std::size_t>(n);
    const std::size_t base = 3 + 2 * static_cast<std::size_t>(n);
    flags_.assign(base + 2 * slots, 1);
    flags_[0] = (want_shutdown || stall_stop) ? 0 : 1;
    flags_[1] = to_send_.empty() ? 1 : 0;
    flags_[2] = stall_stop ? 0 : 1;
    for (int r = 0; r < n; ++r)
      flags_[joined_at + static_cast<std::size_t>(r)] = r == me ? (joined_ ? 1 : 0) : 1;
    flags_[stop_at + static_cast<std::size_t>(me)] = want_shutdown ? 0 : 1;
    const bool joined_here = joined_;
    for (std::size_t k = 0; k < slots; ++k) {
      flags_[base + 2 * k] = (joined_here || slot_pending_[k]) ? 1 : 0;
      flags_[base + 2 * k + 1] = invalid_[k] ? 0 : 1;
    }
    guarded(
        [&] {
          comm_.allreduce(TensorView(flags_.data(), flags_.size(), DataType::uint8), ReduceOp::min);
        },
        [&] { return negotiation_text(); });
    bump([](EngineStats& s) { ++s.cycles; });

    joined_ranks_.assign(static_cast<std::size_t>(n), false);
    bool all_joined = true;
    int active = 0;  // ranks that have not joined: they contribute this cycle's tensors
    for (int r = 0; r < n; ++r) {
      const bool j = flags_[joined_at + static_cast<std::size_t>(r)] != 0;
      joined_ranks_[static_cast<std::size_t>(r)] = j;
      all_joined = all_joined && j;
      active += j ? 0 : 1;
    }
    const std::vector<bool>& joined = joined_ranks_;
    if (flags_[0] == 0) {
      std::vector<int> stopped;
      for (int r = 0; r < n; ++r) {
        if (flags_[stop_at + static_cast<std::size_t>(r)] == 0) stopped.push_back(r);
      }
      fail_pending(
          std::make_exception_ptr(Error(shutdown_reason(flags_[2] == 0, stopped, joined))));
      return CycleResult::stop;
    }

    // Once, in the first cycle every rank reaches (allocate is collective): on one host the
    // fusion buffer moves into memory the local peers map, and fused allreduces read each
    // other's packed tensors in place. Pages are committed when touched, so the threshold's
    // size costs only what the largest batch uses.
    if (!fusion_attach_tried_) {
      fusion_attach_tried_ = true;
      if (comm_.zero_copy_routes() && opts_.fusion_threshold > 0) {
        guarded([&] { fusion_.attach(comm_.allocate_region(opts_.fusion_threshold)); },
                [] { return std::string("allocating the shared fusion buffer"); });
        prepacked_.clear();  // packed into the old storage
      }
    }

    // Last cycle's responses are done with (their handles completed or failed).
    responses_.clear();
    if (!decided_.empty()) decided_.clear();
    released_.clear();
    // 3. Evictions first (identical on every rank), then cached names ready everywhere.
    for (std::size_t k = 0; k < slots; ++k) {
      if (flags_[base + 2 * k + 1] == 0 && cache_[k].used) evict(k);
    }
    if (!all_joined) {
      for (std::size_t k = 0; k < slots; ++k) {
        if (cache_[k].used && flags_[base + 2 * k] == 1) {
          Response r;
          r.name = &cache_[k].name;
          r.p = &cache_[k].p;
          r.slot = static_cast<int>(k);
          r.cached = true;
          responses_.push_back(r);
          slot_pending_[k] = 0;
        }
      }
    }

    // 4. New names: gather every rank's requests, file them, decide.
    bool exchanged = false;
    if (flags_[1] == 0) {
      exchanged = true;
      guarded([&] { exchange_requests(joined); }, [&] { return negotiation_text(); });
    }
    const auto t1 = clock::now();
    bump([&](EngineStats& s) {
      s.negotiation_seconds += std::chrono::duration<double>(t1 - t0).count();
      if (exchanged) ++s.uncached_cycles;
    });
    if (me == 0) inspect_stalls(joined);

    // 5. Groups execute only when complete.
    hold_incomplete_groups();

    // 6. Run them.
    const bool did = !responses_.empty();
    execute(active);

    // 7. Join completes when every rank has joined.
    if (all_joined && joined_) {
      set_joined(false);
      std::vector<detail::StateRef> waiters;
      {
        std::lock_guard lock(mu_);
        waiters.swap(join_waiters_);
      }
      for (auto& w : waiters) w->finish();
    }
    return did || exchanged ? CycleResult::progress : CycleResult::idle;
  }

  void intake(std::string_view name, Local&& local) {
    if (joined_) {
      local.handle->finish(std::make_exception_ptr(
          Error("engine: tensor '" + std::string(name) + "' was submitted on rank " +
                std::to_string(rank()) +
                " while it is inside join(); submit again after join() has returned")));
      return;
    }
    // A training step submits its names in the same order every step: the slot that followed
    // the last one filed, last time, is checked first (one comparison of the name), and the hash
    // lookup runs only when that guess is wrong.
    int found = -1;
    const int guess = last_slot_ >= 0 ? next_slot_[static_cast<std::size_t>(last_slot_)] : -1;
    if (guess >= 0 && cache_[static_cast<std::size_t>(guess)].used &&
        std::string_view(cache_[static_cast<std::size_t>(guess)].name) == name) {
      found = guess;
    } else {
      auto it = cache_index_.find(name);
      if (it != cache_index_.end()) {
        found = it->second;
        if (last_slot_ >= 0) next_slot_[static_cast<std::size_t>(last_slot_)] = found;
      }
    }
    CacheSlot* slot = found >= 0 ? &cache_[static_cast<std::size_t>(found)] : nullptr;
    if ((slot && slot->busy) || (!pending_.empty() && pending_.find(name) != pending_.end()) ||
        (!held_names_.empty() && held_names_.find(name) != held_names_.end())) {
      local.handle->finish(std::make_exception_ptr(
          Error("engine: tensor '" + std::string(name) + "' is already in flight on rank " +
                std::to_string(rank()) + "; wait for it before submitting the name again")));
      return;
    }
    ++since_idle_;
    local.seq = ++submitted_;
    if (slot) {
      const auto k = static_cast<std::size_t>(found);
      last_slot_ = found;
      if (slot->p == local.p) {  // the steady state: no string is built, nothing allocated
        local.cache_slot = found;
        // A coalesced submission's two lists: the previous submission's go back to the spares
        // that the next allreduce_coalesced_async takes, instead of being freed.
        if (!local.parts.empty()) recycle(slot->local);
        slot->local = std::move(local);
        slot->busy = true;
        ++busy_slots_;
        slot_pending_[k] = 1;
        return;
      }
      invalid_[k] = 1;  // parameters changed: everyone drops the slot, the table decides
    }
    std::string key(name);
    to_send_.push_back(key);
    local.cache_slot = -1;
    pending_.emplace(std::move(key), std::move(local));
  }

  // Keeps a finished coalesced submission's lists (their capacity) for the next one: a step that
  // submits the same lists every time allocates none. At most kSpares of each are kept.
  static constexpr std::size_t kSpares = 64;
  void recycle(Local& old) {
    if (old.parts.capacity() == 0 && old.p.parts.capacity() == 0) return;
    std::lock_guard inbox(inbox_lock_);
    if (spare_views_.size() < kSpares && old.parts.capacity() > 0) {
      spare_views_.push_back(std::move(old.parts));
    }
    if (spare_counts_.size() < kSpares && old.p.parts.capacity() > 0) {
      spare_counts_.push_back(std::move(old.p.parts));
    }
  }

  void evict(std::size_t k) {
    CacheSlot& c = cache_[k];
    auto it = cache_index_.find(std::string_view(c.name));
    if (it != cache_index_.end()) cache_index_.erase(it);
    if (c.busy) {
      // Still in flight here: it goes back through the request table (unless it is a group
      // member already agreed on, which only waits for the rest of its group).
      c.busy = false;
      --busy_slots_;
      c.local.cache_slot = -1;
      if (held_names_.find(std::string_view(c.name)) == held_names_.end()) {
        to_send_.push_back(c.name);
      }
      pending_.emplace(c.name, std::move(c.local));
    }
    c = CacheSlot{};
    free_hint_ = std::min(free_hint_, k);
    slot_pending_[k] = 0;
    invalid_[k] = 0;
    // A stale "changed parameters" request already queued stays in to_send_.
  }

  void exchange_requests(const std::vector<bool>& joined) {
    const int n = size();
    std::string mine;
    for (const std::string& name : to_send_) {
      auto it = pending_.find(std::string_view(name));
      if (it == pending_.end()) continue;
      serialize(mine, WireRequest{name, it->second.p});
    }
    to_send_.clear();
    std::vector<std::int64_t> sizes(static_cast<std::size_t>(n));
    std::int64_t my_size = static_cast<std::int64_t>(mine.size());
    comm_.allgather(TensorView(&my_size, 1, DataType::int64),
                    TensorView(sizes.data(), sizes.size(), DataType::int64));
    std::vector<std::size_t> counts(sizes.begin(), sizes.end());
    std::size_t total = 0;
    for (auto c : counts) total += c;
    std::string all(total, '\0');
    comm_.allgatherv(TensorView(mine.data(), mine.size(), DataType::uint8),
                     TensorView(all.data(), all.size(), DataType::uint8), counts);
    std::size_t off = 0;
    const auto now = clock::now();
    for (int r = 0; r < n; ++r) {
      const auto reqs = deserialize_requests(all.substr(off, counts[static_cast<std::size_t>(r)]));
      off += counts[static_cast<std::size_t>(r)];
      for (const auto& req : reqs) {
        auto it = table_index_.find(req.name);
        if (it == table_index_.end()) {
          it = table_index_.emplace(req.name, table_.size()).first;
          table_.push_back(TableEntry{
              req.name, std::vector<std::optional<RequestParams>>(static_cast<std::size_t>(n)), now,
              false, false});
        }
        table_[it->second].by_rank[static_cast<std::size_t>(r)] = req.p;
      }
    }
    // Decide, in table order (the same on every rank).
    for (auto& e : table_) {
      bool ready = true, any = false;
      for (int r = 0; r < n; ++r) {
        const auto& got = e.by_rank[static_cast<std::size_t>(r)];
        any = any || got.has_value();
        ready = ready && (got.has_value() || joined[static_cast<std::size_t>(r)]);
      }
      if (!ready || !any) continue;
      e.done = true;
      const Decided& d = decided_.emplace_back(decide(e, joined));  // deque: d stays put
      Response resp;
      resp.name = &d.name;
      resp.p = &d.p;
      resp.decided = &d;
      responses_.push_back(resp);
    }
    std::erase_if(table_, [](const TableEntry& e) { return e.done; });
    table_index_.clear();
    for (std::size_t i = 0; i < table_.size(); ++i) table_index_[table_[i].name] = i;
  }

  Decided decide(const TableEntry& e, const std::vector<bool>& joined) {
    const int n = size();
    Decided resp;
    resp.name = e.name;
    int first = -1;
    for (int r = 0; r < n; ++r) {
      if (e.by_rank[static_cast<std::size_t>(r)]) {
        first = r;
        break;
      }
    }
    resp.p = *e.by_rank[static_cast<std::size_t>(first)];
    for (int r = first + 1; r < n; ++r) {
      const auto& q = e.by_rank[static_cast<std::size_t>(r)];
      if (!q) continue;
      RequestParams a = resp.p, b = *q;
      if (a.kind == OpKind::allgather) a.count = b.count = 0;  // allgather counts may differ
      if (!(a == b) && a.parts.size() == b.parts.size() && !a.parts.empty()) {
        std::size_t i = 0;
        while (i < a.parts.size() && a.parts[i] == b.parts[i]) ++i;
        if (i < a.parts.size()) {
          resp.error = "tensor '" + e.name + "' mismatch: rank " + std::to_string(first) +
                       "'s tensor " + std::to_string(i) + " has " + std::to_string(a.parts[i]) +
                       " elements but rank " + std::to_string(r) + "'s has " +
                       std::to_string(b.parts[i]) + " (coalesced submissions: every rank passes " +
                       "the same tensor counts, in the same order)";
          resp.error_tensor = static_cast<long>(i);
          return resp;
        }
      }
      if (!(a == b)) {
        resp.error = "tensor '" + e.name + "' mismatch: rank " + std::to_string(first) +
                     " submitted " + resp.p.describe() + " but rank " + std::to_string(r) +
                     " submitted " + q->describe();
        return resp;
      }
    }
    if (resp.p.kind == OpKind::broadcast && joined[static_cast<std::size_t>(resp.p.root)]) {
      resp.error = "tensor '" + e.name + "': broadcast root " + std::to_string(resp.p.root) +
                   " has joined and has no data to send";
      return resp;
    }
    if (resp.p.kind == OpKind::allgather) {
      for (int r = 0; r < n; ++r) {
        const auto& q = e.by_rank[static_cast<std::size_t>(r)];
        resp.counts.push_back(q ? static_cast<std::size_t>(q->count) : 0);
      }
    } else {
      cache_insert(e.name, resp.p);
    }
    return resp;
  }

  void cache_insert(const std::string& name, const RequestParams& p) {
    if (opts_.cache_capacity == 0 || cache_index_.count(name)) return;
    std::size_t k = free_hint_;  // every slot below it is in use
    while (k < cache_.size() && cache_[k].used) ++k;
    free_hint_ = k;
    if (k == cache_.size()) {
      if (cache_.size() >= opts_.cache_capacity) {
        // Full: this name goes through the request exchange every time (about 0.3-0.6 us per
        // name and step more). Said once, on rank 0, with the remedy.
        if (!cache_full_said_ && rank() == 0) {
          cache_full_said_ = true;
          std::fprintf(stderr,
                       "[kolo] engine: the response cache is full (%zu names); tensor '%s' and "
                       "any further names are negotiated in full every step. Raise "
                       "KOLO_CACHE_CAPACITY (EngineOptions::cache_capacity) above the number of "
                       "names a step submits.\n",
                       opts_.cache_capacity, name.c_str());
        }
        return;
      }
      cache_.emplace_back();  // a deque: the slots responses point at stay where they are
      slot_pending_.push_back(0);
      invalid_.push_back(0);
      next_slot_.push_back(-1);
    }
    CacheSlot& c = cache_[k];
    c.used = true;
    c.name = name;
    c.p = p;
    c.track = -1;
    cache_index_[name] = static_cast<int>(k);
    free_hint_ = k + 1;
    // The request that just completed through the table is executed now, not via its slot.
  }

  // Group members wait (as copies: their slot may be evicted meanwhile) until the whole group
  // is ready; a completed group joins the responses where its last member arrived.
  void hold_incomplete_groups() {
    bool any = false;
    for (const Response& r : responses_) any = any || (!r.p->group.empty() && r.error().empty());
    if (!any) return;
    held_scratch_.clear();
    for (const Response& r : responses_) {
      if (r.p->group.empty() || !r.error().empty()) {
        held_scratch_.push_back(r);
        continue;
      }
      auto data = std::make_unique<Decided>();
      data->name = *r.name;
      data->p = *r.p;
      if (r.decided) data->counts = r.decided->counts;
      Response h = r;
      h.name = &data->name;
      h.p = &data->p;
      h.decided = data.get();
      h.slot = -1;  // found by name when it runs
      const std::string group = data->p.group;
      held_names_.insert(data->name);
      auto& members = groups_[group];
      members.push_back(Held{std::move(data), h});
      if (members.size() == members.front().r.p->group_size) {
        for (auto& m : members) {
          held_names_.erase(*m.r.name);
          held_scratch_.push_back(m.r);
          released_.push_back(std::move(m.data));
        }
        groups_.erase(group);
      }
    }
    responses_.swap(held_scratch_);
  }

  // This rank's operation for a response: in the response's slot, or found by name.
  Local* find_local(const Response& r) {
    if (r.slot >= 0) {
      CacheSlot& c = cache_[static_cast<std::size_t>(r.slot)];
      return c.busy ? &c.local : nullptr;
    }
    auto it = cache_index_.find(std::string_view(*r.name));
    if (it != cache_index_.end()) {
      CacheSlot& c = cache_[static_cast<std::size_t>(it->second)];
      if (c.busy) return &c.local;
    }
    auto pt = pending_.find(std::string_view(*r.name));
    return pt != pending_.end() ? &pt->second : nullptr;
  }

  // The timeline track of a response's tensor (cached: remembered in the slot).
  int track_of(const Response& r) {
    if (r.slot >= 0) {
      CacheSlot& c = cache_[static_cast<std::size_t>(r.slot)];
      if (c.track < 0) c.track = timeline_.track(c.name);
      return c.track;
    }
    return timeline_.track(*r.name);
  }

  // ---------------- execution ----------------

  // Whether a fused batch converts float32 to the 16-bit wire (KOLO_COMPRESSION).
  bool compresses(const RequestParams& p) const {
    return opts_.compression.enabled() && p.dtype == DataType::float32 &&
           (p.op == ReduceOp::sum || p.op == ReduceOp::average);
  }

  // The steady state packs before it negotiates. Every cached operation pending here (in slot
  // order, the order the cycle's responses will have) goes into the fusion buffer now, if they
  // would all travel in one fused batch. When every rank turns out to have the same ones
  // pending — a training step, every step — the negotiated batch is exactly this one and the
  // collective starts as soon as the negotiation ends: the ranks arrive at it together instead
  // of each after its own pack, and on a busy host a rank that arrives late costs the others a
  // sleep and a wake-up. Otherwise the batch is packed again (the work here is lost).
  void prepack() {
    prepacked_.clear();
    if (joined_ || busy_slots_ < 2) return;
    const RequestParams* first = nullptr;
    std::size_t elems = 0, bytes = 0, es = 0;
    for (std::size_t k = 0; k < slot_pending_.size(); ++k) {
      if (!slot_pending_[k]) continue;
      const RequestParams& q = cache_[k].p;
      if (!first) {
        first = &q;
        if (q.kind != OpKind::allreduce || q.device != 0 || !q.group.empty() || !q.parts.empty()) {
          return;
        }
        es = dtype_size(compresses(q) ? opts_.compression.wire : q.dtype);
      } else if (q.kind != OpKind::allreduce || q.dtype != first->dtype || q.op != first->op ||
                 q.prescale != first->prescale || q.postscale != first->postscale ||
                 q.device != 0 || !q.group.empty() || !q.parts.empty()) {
        prepacked_.clear();
        return;
      }
      bytes += q.count * dtype_size(q.dtype);  // the threshold counts the tensors' own bytes
      if (prepacked_.size() > 0 && bytes > opts_.fusion_threshold) {
        prepacked_.clear();
        return;
      }
      prepacked_.push_back(k);
      elems += q.count;
    }
    if (prepacked_.size() < 2 || in_pieces(*first, size(), size())) {
      prepacked_.clear();  // nothing to pack: the batch travels in pieces
      return;
    }
    if (size() == 1 && !compresses(*first)) {
      prepacked_.clear();  // nothing to pack: one rank copies its tensors (run_alone)
      return;
    }
    if (first->prescale == 1.0 && !compresses(*first)) {
      locals_.clear();
      for (std::size_t k : prepacked_) locals_.push_back(&cache_[k].local);
      TensorView in, out;
      if (direct_ranges(locals_, first->dtype, in, out)) {  // nothing to pack
        prepacked_.clear();
        return;
      }
    }
    fusion_.reserve(elems * es);
    prepack_offsets_.clear();
    prepack_begin_ = clock::now();
    // This rank's own block is read from the tensors by the collective (own_inputs).
    prepack_skipped_own_ = skips_own_block(*first);
    std::size_t own_lo = 0, own_hi = 0;
    if (prepack_skipped_own_) own_block_bytes(elems * es, es, own_lo, own_hi);
    std::size_t off = 0;
    for (std::size_t k : prepacked_) {
      const Local& l = cache_[k].local;
      prepack_offsets_.push_back(off);
      const std::size_t b = l.p.count * es;
      if (!(off >= own_lo && off + b <= own_hi)) pack_one(off, l.in, *first);
      off += b;
    }
    prepack_end_ = clock::now();
  }

  // A fused batch whose collective `run` works on the tensors' own memory (no fusion buffer):
  // timed, counted as fused and in `kind`, and completed.
  template <class Run>
  void run_unpacked(std::vector<Response>& responses, const std::vector<std::size_t>& batch,
                    clock::time_point tq, std::uint64_t EngineStats::*kind, Run&& run) {
    const auto ta = clock::now();
    run();
    const auto tb = clock::now();
    bump([kind](EngineStats& s) {
      ++s.fused_collectives;
      ++(s.*kind);
    });
    complete_unpacked(responses, batch, tq, ta, tb);
  }

  // Whether a fused batch of these parameters travels in pieces (allreduce_coalesced), with no
  // fusion buffer: a host allreduce on a transport with vectored messages, unscaled (an average
  // divided by all ranks, as the collective divides), uncompressed, with every rank's tensors
  // (none joined). Every input of this choice is the same on every rank, so all ranks take it.
  //
  // Also where the shared fusion buffer would take the zero-copy path (one host, no more ranks
  // than cores): packing half the batch, reading the peers' halves in place and unpacking
  // measured slower than the pieces once the reduction kernel ran at full speed (N = 2, 1024 x
  // 4 KiB: 342-415 us against 282-288; 16 x 4 MiB: 13.0-14.0 ms against 6.3-6.6;
  // docs/performance.md). A tensor in a Buffer is still read in place by a collective of its
  // own, and scaled or compressed batches still go through the shared fusion buffer.
  bool in_pieces(const RequestParams& p, int divisor, int active) const {
    if constexpr (!VectoredP2P<T>) return false;
    return opts_.fusion_pieces && size() > 1 && active == size() && p.device == 0 &&
           p.prescale == 1.0 && p.postscale == 1.0 && !compresses(p) &&
           (p.op != ReduceOp::average || divisor == size());
  }

  // Whether a fused batch of these parameters leaves its tensors that lie wholly in this rank's
  // own block unpacked: the collective reads them from the tensors (Communicator::allreduce_to
  // with a BlockSource). On the zero-copy path no peer reads this rank's block, so packing it is
  // a pass for nothing; elsewhere the Communicator copies it in, which is the same pass. Not with
  // a prescale (the tensors hold unscaled values) or compression (another path).
  bool skips_own_block(const RequestParams& p) const {
    return size() > 1 && p.prescale == 1.0 && !compresses(p) && p.device == 0;
  }
  // Bytes [lo, hi) of a fused batch of `total` bytes that form this rank's block.
  void own_block_bytes(std::size_t total, std::size_t es, std::size_t& lo, std::size_t& hi) const {
    std::size_t first = 0, count = 0;
    zero_copy_block(total / es, rank(), size(), first, count);
    lo = first * es;
    hi = (first + count) * es;
  }

  // Whether these operations' tensors lie back to back in memory, in this order, inputs and
  // outputs alike (as views into one flat gradient buffer do); then `in` and `out` span them.
  // Such a batch needs no fusion buffer: this rank's memory already is the packed layout, and
  // the collective runs on it in place (or from the inputs into the outputs). Other ranks may
  // pack theirs: the collective is the same (count, dtype, op), so the choice is local.
  static bool direct_ranges(const std::vector<const Local*>& ls, DataType dtype, TensorView& in,
                            TensorView& out) {
    if (ls.empty() || !ls.front()) return false;
    const auto* in0 = static_cast<const std::byte*>(ls.front()->in.data);
    auto* out0 = static_cast<std::byte*>(ls.front()->out.data);
    const std::byte* in_end = in0;
    std::byte* out_end = out0;
    std::size_t count = 0;
    for (const Local* l : ls) {
      if (!l) return false;  // joined here: zeros
      if (l->in.count == 0) continue;
      if (l->in.data != in_end || l->out.data != out_end) return false;
      in_end += l->in.bytes();
      out_end += l->out.bytes();
      count += l->in.count;
    }
    if (count == 0) return false;
    // One range, or two disjoint ones (each tensor's own are, but not necessarily the spans).
    if (in0 != out0 && in0 < out_end && out0 < in_end) return false;
    in = TensorView(const_cast<std::byte*>(in0), count, dtype);
    out = TensorView(out0, count, dtype);
    return true;
  }

  // One tensor into the fusion buffer at byte `off`: times the prescale, compressed if the
  // batch travels compressed.
  void pack_one(std::size_t off, const TensorView& in, const RequestParams& p) {
    if (compresses(p)) {
      opts_.compression.compress(static_cast<const float*>(in.data), fusion_.data() + off, in.count,
                                 static_cast<float>(p.prescale));
    } else {
      fusion_.pack(off, in, p.prescale);
    }
  }

  // True when `batch` is exactly what prepack() packed (the same slots, in order): its offsets
  // are then in offsets_ and the pack is done. Used once: the buffer is the batch's afterwards.
  bool take_prepacked(const std::vector<Response>& responses,
                      const std::vector<std::size_t>& batch) {
    const bool same = [&] {
      if (batch.size() != prepacked_.size()) return false;
      for (std::size_t i = 0; i < batch.size(); ++i) {
        const Response& r = responses[batch[i]];
        if (r.slot < 0 || static_cast<std::size_t>(r.slot) != prepacked_[i] || !r.local) {
          return false;
        }
      }
      return true;
    }();
    prepacked_.clear();
    if (same) offsets_.swap(prepack_offsets_);
    return same;
  }

  void execute(int active) {
    std::vector<Response>& responses = responses_;
    const auto now = clock::now();
    std::uint64_t cached = 0;
    for (auto& r : responses) {
      r.local = find_local(r);
      if (r.local) {
        r.local->ready = now;
        if (timeline_.enabled()) {
          timeline_.record(track_of(r), "NEGOTIATE", r.local->enqueued, now, r.p->dtype,
                           r.p->count * dtype_size(r.p->dtype));
        }
      }
      cached += r.cached ? 1 : 0;
    }
    bump([&](EngineStats& s) {
      s.cached_responses += cached;
      s.uncached_responses += responses.size() - cached;
    });
    // Errors first: they need no collective.
    for (auto& r : responses) {
      if (r.error().empty()) continue;
      complete(r, std::make_exception_ptr(MismatchError(r.error(), r.error_tensor())));
    }
    done_.assign(responses.size(), 0);
    for (std::size_t i = 0; i < responses.size(); ++i) {
      if (done_[i] || !responses[i].error().empty()) continue;
      const Response& r = responses[i];
      if (r.p->kind == OpKind::allgather) {
        guarded([&] { run_allgather(r); }, [&] { return failed_text(responses, {i}); });
        done_[i] = 1;
      } else if (r.p->kind == OpKind::broadcast) {
        guarded([&] { run_broadcast(r); }, [&] { return failed_text(responses, {i}); });
        done_[i] = 1;
      } else {
        // Fuse: look ahead for allreduces with the same dtype/op/scaling, up to the threshold;
        // a group always travels whole.
        batch_.clear();
        std::size_t bytes = 0;
        const RequestParams& rp = *r.p;
        for (std::size_t j = i; j < responses.size(); ++j) {
          if (done_[j]) continue;
          const Response& q = responses[j];
          const RequestParams& qp = *q.p;
          if (qp.kind != OpKind::allreduce || !q.error().empty()) continue;
          if (qp.dtype != rp.dtype || qp.op != rp.op || qp.prescale != rp.prescale ||
              qp.postscale != rp.postscale || qp.device != rp.device) {
            continue;
          }
          const std::size_t b = qp.count * dtype_size(qp.dtype);
          const bool same_group = !rp.group.empty() && qp.group == rp.group;
          if (j != i && !same_group && bytes + b > opts_.fusion_threshold) continue;
          batch_.push_back(j);
          bytes += b;
          done_[j] = 1;
        }
        guarded([&] { run_allreduce(responses, batch_, bytes, active); },
                [&] { return failed_text(responses, batch_); });
        notify_completed();
      }
    }
    prepacked_.clear();  // a prepack no batch matched is stale after this cycle
    notify_completed();
  }

  // One rank: every op's allreduce of a tensor is the tensor (an average divides by 1), so a
  // batch needs no fusion buffer and no collective: each output gets its own input, scaled as
  // the collective would have scaled it (prescale, then postscale). Not for a joined rank's
  // zeros or an invalid dtype or op (the collective names those); false then, nothing done.
  bool run_alone(std::vector<Response>& responses, const std::vector<std::size_t>& batch,
                 clock::time_point tq) {
    const RequestParams& p = *responses[batch.front()].p;
    if (dtype_name(p.dtype) == "invalid" || reduce_op_name(p.op) == "invalid") return false;
    for (std::size_t j : batch) {
      if (!responses[j].local) return false;
    }
    const auto ta = clock::now();
    for (std::size_t j : batch) {
      const Local& l = *responses[j].local;
      if (p.prescale != 1.0 || l.out.data != l.in.data) {
        detail::scaled_copy(l.out.data, l.in.data, l.in.count, p.dtype, p.prescale);
      }
      if (p.postscale != 1.0) {
        detail::scaled_copy(l.out.data, l.out.data, l.out.count, p.dtype, p.postscale);
      }
    }
    const auto tb = clock::now();
    if (batch.size() > 1) bump([](EngineStats& s) { ++s.fused_collectives; });
    complete_unpacked(responses, batch, tq, ta, tb);
    return true;
  }

  // Completes a batch that ran without a fusion buffer (QUEUE until `ta`, ALLREDUCE until `tb`
  // on each tensor's timeline track).
  void complete_unpacked(const std::vector<Response>& responses,
                         const std::vector<std::size_t>& batch, clock::time_point tq,
                         clock::time_point ta, clock::time_point tb) {
    for (std::size_t j : batch) {
      const Response& r = responses[j];
      if (timeline_.enabled()) {
        const int tr = track_of(r);
        const std::size_t b = r.p->count * dtype_size(r.p->dtype);
        timeline_.record(tr, "QUEUE", tq, ta, r.p->dtype, b);
        timeline_.record(tr, "ALLREDUCE", ta, tb, r.p->dtype, b);
      }
      complete(r, nullptr);
    }
  }

  // The local tensor for a response, or a zero tensor when this rank has joined.
  TensorView local_input(const Response& r) {
    if (r.local) return r.local->in;
    const std::size_t b = r.p->count * dtype_size(r.p->dtype);
    zeros_.assign(b, std::byte{0});
    return TensorView(zeros_.data(), r.p->count, r.p->dtype);
  }

  // The unpack of a fused batch by ranges of the fusion buffer (BlockSink): the part of each
  // tensor inside [first, first + count) elements, copied from `src` into its output.
  struct UnpackRanges {
    const std::vector<Response>* responses;
    const std::vector<std::size_t>* batch;
    const std::size_t* offsets;  // bytes, by position in the batch, ascending
    std::size_t es;
    DataType dtype;
    double postscale;
    int divisor;
    clock::time_point first;  // when the first range came: the timeline's UNPACK starts there

    static void call(void* ctx, std::size_t first, std::size_t count, const std::byte* src) {
      auto& u = *static_cast<UnpackRanges*>(ctx);
      if (u.first == clock::time_point{}) u.first = clock::now();
      const std::size_t lo = first * u.es, hi = (first + count) * u.es;
      const std::size_t nb = u.batch->size();
      // The last tensor starting at or before `lo` (zero-length ones share its offset).
      std::size_t k =
          static_cast<std::size_t>(std::upper_bound(u.offsets, u.offsets + nb, lo) - u.offsets);
      k = k > 0 ? k - 1 : 0;
      for (; k < nb && u.offsets[k] < hi; ++k) {
        const Response& r = (*u.responses)[(*u.batch)[k]];
        if (!r.local) continue;  // joined: nothing to write
        const std::size_t tb = u.offsets[k], te = tb + r.p->count * u.es;
        const std::size_t b = std::max(tb, lo), e = std::min(te, hi);
        if (b >= e) continue;
        detail::scaled_copy(static_cast<std::byte*>(r.local->out.data) + (b - tb), src + (b - lo),
                            (e - b) / u.es, u.dtype, u.postscale, u.divisor);
      }
    }
  };

  // Where element `first` of a fused batch lies in its tensor's input (BlockSource), and how
  // many elements follow it there: the collective reads this rank's own block through it.
  struct OwnInputs {
    const std::vector<Response>* responses;
    const std::vector<std::size_t>* batch;
    const std::size_t* offsets;
    std::size_t es;

    static const std::byte* call(void* ctx, std::size_t first, std::size_t& count) {
      auto& o = *static_cast<OwnInputs*>(ctx);
      const std::size_t at = first * o.es, nb = o.batch->size();
      // The last tensor starting at or before `at`: it holds `at` (a zero-length tensor there
      // is followed by one that starts there too).
      const std::size_t k =
          static_cast<std::size_t>(std::upper_bound(o.offsets, o.offsets + nb, at) - o.offsets) - 1;
      const Response& r = (*o.responses)[(*o.batch)[k]];
      const std::size_t end = o.offsets[k] + r.p->count * o.es;
      count = std::min(count, (end - at) / o.es);
      return static_cast<const std::byte*>(r.local->in.data) + (at - o.offsets[k]);
    }
  };

  // A batch with coalesced submissions runs as the batch of their tensors: each tensor a
  // response of its own (parts_), so that every path below (pieces, fusion buffer, compression,
  // one rank, a joined rank's zeros) handles it as it handles separate submissions. The parts'
  // counts were negotiated, so every rank forms the same batch. Then each submission completes
  // once.
  void run_allreduce(std::vector<Response>& responses, const std::vector<std::size_t>& batch,
                     std::size_t bytes, int active) {
    std::size_t rows = 0;
    bool coalesced = false;
    for (std::size_t j : batch) {
      const std::size_t k = responses[j].p->parts.size();
      coalesced = coalesced || k > 0;
      rows += k > 0 ? k : 1;
    }
    if (!coalesced) {
      run_batch(responses, batch, bytes, active);
      return;
    }
    // The common case, in pieces (see run_batch): the tensors' list straight to the collective.
    const RequestParams& p = *responses[batch.front()].p;
    const int divisor = p.op != ReduceOp::average                     ? 1
                        : p.join_average == JoinAverage::active_ranks ? active
                                                                      : size();
    if (rows > 1 && in_pieces(p, divisor, active)) {
      piece_in_.clear();
      piece_out_.clear();
      for (std::size_t j : batch) {
        const Local* l = responses[j].local;
        if (l->parts.empty()) {
          piece_in_.push_back(l->in);
          piece_out_.push_back(l->out);
        } else {  // in place
          piece_in_.insert(piece_in_.end(), l->parts.begin(), l->parts.end());
          piece_out_.insert(piece_out_.end(), l->parts.begin(), l->parts.end());
        }
      }
      run_unpacked(responses, batch, clock::now(), &EngineStats::piece_collectives,
                   [&] { comm_.allreduce_coalesced(piece_in_, piece_out_, p.op); });
      return;
    }
    part_responses_.clear();
    part_batch_.clear();
    if (part_locals_.size() < rows) part_locals_.resize(rows);  // pointers into them follow
    if (part_params_.size() < rows) part_params_.resize(rows);
    std::size_t at = 0;
    for (std::size_t j : batch) {
      const Response& r = responses[j];
      if (r.p->parts.empty()) {
        part_batch_.push_back(part_responses_.size());
        part_responses_.push_back(r);
        continue;
      }
      for (std::size_t i = 0; i < r.p->parts.size(); ++i, ++at) {
        RequestParams& q = part_params_[at];
        q.kind = r.p->kind;
        q.dtype = r.p->dtype;
        q.op = r.p->op;
        q.count = r.p->parts[i];
        q.prescale = r.p->prescale;
        q.postscale = r.p->postscale;
        q.device = r.p->device;
        q.join_average = r.p->join_average;
        Response e;
        e.name = r.name;
        e.p = &q;
        e.cached = r.cached;
        if (r.local) {
          Local& l = part_locals_[at];
          l.in = l.out = r.local->parts[i];
          l.cache_slot = kPart;
          e.local = &l;
        }
        part_batch_.push_back(part_responses_.size());
        part_responses_.push_back(e);
      }
    }
    run_batch(part_responses_, part_batch_, bytes, active);
    for (std::size_t j : batch) {
      if (!responses[j].p->parts.empty()) complete(responses[j], nullptr);
    }
  }

  void run_batch(std::vector<Response>& responses, const std::vector<std::size_t>& batch,
                 std::size_t bytes, int active) {
    const RequestParams& p = *responses[batch.front()].p;
    const int n = size();
    const ReduceOp wire_op = p.op == ReduceOp::average ? ReduceOp::sum : p.op;
    // An average divides by the number of ranks, or (join_average = active_ranks) by the ranks
    // that contributed, i.e. had not joined.
    const int divisor = p.op != ReduceOp::average                     ? 1
                        : p.join_average == JoinAverage::active_ranks ? active
                                                                      : n;
    const auto tq = clock::now();
    if (p.device != 0) {
      run_device_allreduce(responses, batch, divisor, tq);
      return;
    }
    if (opts_.compression.enabled() && p.dtype == DataType::float32 &&
        (p.op == ReduceOp::sum || p.op == ReduceOp::average)) {
      run_compressed_allreduce(responses, batch, divisor, tq);
      return;
    }
    if (n == 1 && divisor == 1 && run_alone(responses, batch, tq)) return;
    // The Communicator's average divides by n (each block by its owner, count/n divisions per
    // rank, the same bits as dividing while unpacking); another divisor is applied here.
    const bool comm_divides = p.op != ReduceOp::average || divisor == n;
    if (batch.size() == 1) {
      // One tensor: reduce in the caller's output buffer, no fusion copies.
      const Response& r = responses[batch.front()];
      TensorView in = local_input(r);
      TensorView out = r.local ? r.local->out : in;
      const auto ta = clock::now();
      if (p.prescale == 1.0 && p.postscale == 1.0 && comm_divides) {
        // Out of place straight from the input: the collective reads `in` in its first steps
        // anyway, so a copy into `out` first would be a whole extra pass over the tensor.
        comm_.allreduce(in, out, p.op);  // the algorithm folds an average's division in
      } else if (p.postscale == 1.0 && comm_divides) {
        detail::scaled_copy(out.data, in.data, in.count, in.dtype, p.prescale);
        comm_.allreduce(out, p.op);
      } else {
        if (p.prescale != 1.0 || out.data != in.data) {
          detail::scaled_copy(out.data, in.data, in.count, in.dtype, p.prescale);
        }
        comm_.allreduce(out, wire_op);
        detail::scaled_copy(out.data, out.data, out.count, out.dtype, p.postscale, divisor);
      }
      // A tensor in a Buffer from communicator().allocate: read in place by the peers.
      if (comm_.last_allreduce_zero_copy()) bump([](EngineStats& s) { ++s.zero_copy_collectives; });
      const auto tb = clock::now();
      if (timeline_.enabled()) {
        const int tr = track_of(r);
        timeline_.record(tr, "QUEUE", tq, ta, p.dtype, bytes);
        timeline_.record(tr, "ALLREDUCE", ta, tb, p.dtype, bytes);
      }
      complete(r, nullptr);
      return;
    }
    // Fused, in pieces: the ring reads the inputs and writes the outputs where they lie.
    if (in_pieces(p, divisor, active)) {
      piece_in_.clear();
      piece_out_.clear();
      for (std::size_t j : batch) {
        const Local* l = responses[j].local;
        piece_in_.push_back(l->in);
        piece_out_.push_back(l->out);
      }
      run_unpacked(responses, batch, tq, &EngineStats::piece_collectives,
                   [&] { comm_.allreduce_coalesced(piece_in_, piece_out_, p.op); });
      return;
    }
    // Fused: one pass in (copy, times the prescale), the collective on the fusion buffer, one
    // pass out straight into each tensor's output (times the postscale and an average's
    // 1/divisor, unless the collective already divided).
    const std::size_t es = dtype_size(p.dtype);
    const bool post = p.postscale != 1.0 || !comm_divides;
    if (p.prescale == 1.0) {
      locals_.clear();
      for (std::size_t j : batch) locals_.push_back(responses[j].local);
      TensorView in, out;
      if (direct_ranges(locals_, p.dtype, in, out)) {
        run_unpacked(responses, batch, tq, &EngineStats::direct_collectives, [&] {
          comm_.allreduce(in, out, post ? wire_op : p.op);
          if (post) {
            detail::scaled_copy(out.data, out.data, out.count, p.dtype, p.postscale, divisor);
          }
        });
        return;
      }
    }
    auto t_pack = clock::now();
    auto t_coll = t_pack;
    bool skipped_own = false;
    if (take_prepacked(responses, batch)) {
      t_pack = prepack_begin_;
      t_coll = prepack_end_;
      skipped_own = prepack_skipped_own_;
    } else {
      fusion_.reserve(bytes);
      offsets_.clear();
      skipped_own = skips_own_block(p) &&
                    std::all_of(batch.begin(), batch.end(),
                                [&](std::size_t j) { return responses[j].local != nullptr; });
      std::size_t own_lo = 0, own_hi = 0;
      if (skipped_own) own_block_bytes(bytes, es, own_lo, own_hi);
      std::size_t off = 0;
      for (std::size_t j : batch) {
        const Response& r = responses[j];
        offsets_.push_back(off);
        const std::size_t b = r.p->count * es;
        if (skipped_own && off >= own_lo && off + b <= own_hi) {
          // read in place by the collective (own_inputs)
        } else if (r.local) {
          fusion_.pack(off, r.local->in, p.prescale);
        } else if (b > 0) {
          std::memset(fusion_.data() + off, 0, b);  // joined: zeros
        }
        off += b;
      }
      t_coll = clock::now();
    }
    // The collective hands the result over block by block: on the zero-copy path straight from
    // the owners' fusion buffers into the tensors, with no gather into this rank's buffer first.
    UnpackRanges u{
        &responses,         &batch, offsets_.data(), es, p.dtype, post ? p.postscale : 1.0,
        post ? divisor : 1, {}};
    OwnInputs own{&responses, &batch, offsets_.data(), es};
    comm_.allreduce_to(TensorView(fusion_.data(), bytes / es, p.dtype), post ? wire_op : p.op,
                       BlockSink{&u, &UnpackRanges::call},
                       skipped_own ? BlockSource{&own, &OwnInputs::call} : BlockSource{});
    if (comm_.last_allreduce_zero_copy()) bump([](EngineStats& s) { ++s.zero_copy_collectives; });
    const auto t_end = clock::now();
    const auto t_unpack = u.first == clock::time_point{} ? t_end : u.first;
    bump([](EngineStats& s) { ++s.fused_collectives; });
    for (std::size_t j : batch) {
      const Response& r = responses[j];
      if (timeline_.enabled()) {
        const std::size_t b = r.p->count * es;
        const int tr = track_of(r);
        timeline_.record(tr, "QUEUE", tq, t_pack, p.dtype, b);
        timeline_.record(tr, "PACK", t_pack, t_coll, p.dtype, b);
        timeline_.record(tr, "ALLREDUCE", t_coll, t_unpack, p.dtype, b);
        timeline_.record(tr, "UNPACK", t_unpack, t_end, p.dtype, b);
      }
      complete(r, nullptr);
    }
  }

  // Float32 gradients on a 16-bit wire: compress while packing (with the prescale), reduce on
  // the wire type (each step widens to fp32, adds, rounds once), decompress while unpacking
  // (with the postscale and an average's 1/size): the conversion costs no pass of its own.
  void run_compressed_allreduce(std::vector<Response>& responses,
                                const std::vector<std::size_t>& batch, int divisor,
                                clock::time_point tq) {
    const RequestParams& p = *responses[batch.front()].p;
    const CompressionPolicy& c = opts_.compression;
    const std::size_t wes = dtype_size(c.wire);
    std::size_t total = 0;
    for (std::size_t j : batch) total += responses[j].p->count;
    auto t_pack = clock::now();
    auto t_coll = t_pack;
    const bool prepacked = take_prepacked(responses, batch);
    const Response& r0 = responses[batch.front()];
    // The same choice on every rank (prepack() never takes a single tensor, and a rank that
    // has joined reduces zeros in place).
    if (batch.size() == 1 && p.prescale == 1.0 && p.postscale == 1.0 &&
        (divisor == 1 || divisor == size()) && comm_.compresses_on_wire(total, c)) {
      // One unscaled tensor where the ring runs: converted on the wire, segment by segment,
      // straight from the input into the output; no 16-bit copy of the tensor.
      const TensorView in = local_input(r0);
      comm_.allreduce_compressed(in, r0.local ? r0.local->out : in,
                                 divisor == 1 ? ReduceOp::sum : ReduceOp::average, c);
      const auto t_end = clock::now();
      if (timeline_.enabled()) {
        const int tr = track_of(r0);
        timeline_.record(tr, "QUEUE", tq, t_pack, c.wire, total * wes);
        timeline_.record(tr, "ALLREDUCE_WIRE", t_pack, t_end, c.wire, total * wes);
      }
      complete(r0, nullptr);
      return;
    }
    if (prepacked) {
      t_pack = prepack_begin_;
      t_coll = prepack_end_;
    } else {
      fusion_.reserve(total * wes);
      offsets_.clear();
      std::size_t off = 0;
      for (std::size_t j : batch) {
        const Response& r = responses[j];
        offsets_.push_back(off);
        pack_one(off, local_input(r), p);
        off += r.p->count * wes;
      }
      t_coll = clock::now();
    }
    comm_.allreduce(TensorView(fusion_.data(), total, c.wire), ReduceOp::sum);
    if (comm_.last_allreduce_zero_copy()) bump([](EngineStats& s) { ++s.zero_copy_collectives; });
    const auto t_unpack = clock::now();
    const float post = static_cast<float>(p.postscale / divisor);
    for (std::size_t k = 0; k < batch.size(); ++k) {
      const Response& r = responses[batch[k]];
      if (!r.local) continue;
      c.decompress(fusion_.data() + offsets_[k], static_cast<float*>(r.local->out.data),
                   r.local->out.count, post);
    }
    const auto t_end = clock::now();
    bump([](EngineStats& s) { ++s.fused_collectives; });
    for (std::size_t j : batch) {
      const Response& r = responses[j];
      if (timeline_.enabled()) {
        const std::size_t b = r.p->count * wes;
        const int tr = track_of(r);
        timeline_.record(tr, "QUEUE", tq, t_pack, c.wire, b);
        timeline_.record(tr, "PACK_COMPRESS", t_pack, t_coll, c.wire, b);
        timeline_.record(tr, "ALLREDUCE", t_coll, t_unpack, c.wire, b);
        timeline_.record(tr, "UNPACK_DECOMPRESS", t_unpack, t_end, c.wire, b);
      }
      complete(r, nullptr);
    }
  }

  // Device tensors: one pack launch into the device fusion buffer (compressing and prescaling),
  // the collective on the device buffer (NCCL, or staged), one unpack launch (decompressing,
  // postscaling, dividing an average). A single unscaled tensor goes straight through.
  void run_device_allreduce(std::vector<Response>& responses, const std::vector<std::size_t>& batch,
                            int divisor, clock::time_point tq) {
    if constexpr (DeviceFusionTransport<T>) {
      auto& t = comm_.transport();
      const RequestParams& p = *responses[batch.front()].p;
      const CompressionPolicy& c = opts_.compression;
      const bool compress = c.enabled() && p.dtype == DataType::float32 &&
                            (p.op == ReduceOp::sum || p.op == ReduceOp::average);
      const DataType wire = compress ? c.wire : p.dtype;
      const Device dev = Device::cuda(t.device());
      if (batch.size() == 1 && !compress && p.prescale == 1.0 && p.postscale == 1.0 &&
          (p.op != ReduceOp::average ||
           divisor == size())) {  // the Communicator's average divides by size
        // The same decision on every rank (it must be: one collective, one op). A rank that has
        // joined reduces zeros from the fusion buffer and keeps nothing.
        const Response& r = responses[batch.front()];
        TensorView in, out;
        if (r.local != nullptr) {
          in = r.local->in;
          out = r.local->out;
        } else {
          cuda::FusionItem zero;
          zero.count = p.count;
          std::byte* z = t.device_fusion_buffer(p.count * dtype_size(p.dtype));
          t.device_pack(&zero, 1, p.dtype, p.dtype, z, 1.0);
          in = out = TensorView(z, p.count, p.dtype, dev);
        }
        const auto ta = clock::now();
        comm_.allreduce(in, out, p.op);
        if (timeline_.enabled()) {
          const std::size_t b = p.count * dtype_size(p.dtype);
          const int tr = track_of(r);
          timeline_.record(tr, "QUEUE", tq, ta, p.dtype, b);
          timeline_.record(tr, "ALLREDUCE", ta, clock::now(), p.dtype, b);
        }
        complete(r, nullptr);
        return;
      }
      device_items_.clear();
      std::size_t total = 0;
      // Each tensor starts on a 16-byte boundary of the buffer, so the kernels' 16-byte vector
      // path applies to every tensor whose own pointer allows it (+6-8 points of copy bandwidth
      // for 1000 tensors on an H100). The gaps are reduced along and never read back.
      const std::size_t align = std::max<std::size_t>(1, 16 / dtype_size(wire));
      for (std::size_t j : batch) {
        const Response& r = responses[j];
        cuda::FusionItem it;
        it.src = r.local ? r.local->in.data : nullptr;  // joined: zeros
        it.dst = r.local ? r.local->out.data : nullptr;
        it.count = r.p->count;
        it.offset = total;
        device_items_.push_back(it);
        total += (r.p->count + align - 1) / align * align;
      }
      std::byte* buf = t.device_fusion_buffer(total * dtype_size(wire));
      const auto t_pack = clock::now();
      t.device_pack(device_items_.data(), device_items_.size(), p.dtype, wire, buf, p.prescale);
      const auto t_coll = clock::now();
      comm_.allreduce(TensorView(buf, total, wire, dev),
                      p.op == ReduceOp::average ? ReduceOp::sum : p.op);
      const auto t_unpack = clock::now();
      t.device_unpack(device_items_.data(), device_items_.size(), wire, p.dtype, buf, p.postscale,
                      divisor);
      t.device_synchronize(Deadline::after(t.timeout_seconds()), "the fusion unpack");
      const auto t_end = clock::now();
      bump([](EngineStats& s) { ++s.fused_collectives; });
      for (std::size_t j : batch) {
        const Response& r = responses[j];
        if (timeline_.enabled()) {
          const std::size_t b = r.p->count * dtype_size(wire);
          const int tr = track_of(r);
          timeline_.record(tr, "QUEUE", tq, t_pack, wire, b);
          timeline_.record(tr, compress ? "PACK_COMPRESS" : "PACK", t_pack, t_coll, wire, b);
          timeline_.record(tr, "ALLREDUCE", t_coll, t_unpack, wire, b);
          timeline_.record(tr, compress ? "UNPACK_DECOMPRESS" : "UNPACK", t_unpack, t_end, wire, b);
        }
        complete(r, nullptr);
      }
    } else {
      (void)responses;
      (void)batch;
      (void)divisor;
      (void)tq;
      throw Error("engine: a device tensor reached a host-only engine");  // enqueue refuses
    }
  }

  void run_allgather(const Response& r) {
    const std::vector<std::size_t>& counts = r.decided->counts;  // never cached
    std::size_t total = 0;
    for (auto c : counts) total += c;
    const RequestParams& p = *r.p;
    const std::size_t es = dtype_size(p.dtype);
    std::vector<std::byte> owned(total * es);
    TensorView in(nullptr, 0, p.dtype);
    if (r.local) in = r.local->in;
    const auto ta = clock::now();
    comm_.allgatherv(in, TensorView(owned.data(), total, p.dtype), counts);
    if (timeline_.enabled())
      timeline_.record(track_of(r), "ALLGATHER", ta, clock::now(), p.dtype, total * es);
    if (r.local) {
      auto& h = *r.local->handle;
      h.owned = std::move(owned);
      h.counts = counts;
      h.output = TensorView(h.owned.data(), total, p.dtype);
      complete(r, nullptr);
    }
  }

  void run_broadcast(const Response& r) {
    const RequestParams& p = *r.p;
    TensorView buf = local_input(r);
    if constexpr (DeviceFusionTransport<T>) {
      if (p.device != 0 && r.local == nullptr) {  // joined: a device buffer to receive into
        auto& t = comm_.transport();
        buf = TensorView(t.device_fusion_buffer(p.count * dtype_size(p.dtype)), p.count, p.dtype,
                         Device::cuda(t.device()));
      }
    }
    const auto ta = clock::now();
    comm_.broadcast(buf, p.root);
    if (timeline_.enabled()) {
      timeline_.record(track_of(r), "BROADCAST", ta, clock::now(), p.dtype,
                       p.count * dtype_size(p.dtype));
    }
    complete(r, nullptr);
  }

  // Marks the handle done and frees its slot (or pending_ entry); its waiters are woken by
  // notify_completed(), once per batch. r.local must not be used afterwards.
  void complete(const Response& r, std::exception_ptr err) {
    Local* l = r.local;
    if (!l || l->cache_slot == kPart) return;  // a part: its submission completes as a whole
    detail::StateRef h = std::move(l->handle);
    if (l->cache_slot >= 0) {
      const auto k = static_cast<std::size_t>(l->cache_slot);
      cache_[k].busy = false;
      --busy_slots_;
      slot_pending_[k] = 0;
    } else {
      auto it = pending_.find(std::string_view(*r.name));
      if (it != pending_.end()) pending_.erase(it);
    }
    h->mark(std::move(err));
    completed_.push_back(std::move(h));
    if (in_flight() == 0) {  // idle: what was submitted since the last idle moment is a step
      step_size_ = since_idle_;
      since_idle_ = 0;
      step_driven_ = driven_;
    }
  }
  void notify_completed() {
    if (completed_.empty()) return;
    std::atomic_thread_fence(std::memory_order_seq_cst);  // after every mark() (handle.hpp)
    for (auto& h : completed_) h->notify();
    completed_.clear();
  }

  // ---------------- stalls, shutdown, failure ----------------

  void inspect_stalls(const std::vector<bool>& joined) {
    if (opts_.stall_warning_seconds <= 0) return;
    for (auto& e : table_) {
      const double age = seconds_since(e.first_seen);
      if (age >= opts_.stall_warning_seconds && !e.warned) {
        e.warned = true;
        std::fprintf(stderr, "[kolo] stall inspector: %s for %.0f s. %s\n",
                     stall_text(e, joined).c_str(), age, kJoinHint);
      }
      if (opts_.stall_shutdown_seconds > 0 && age >= opts_.stall_shutdown_seconds) {
        stall_shutdown_ = true;  // travels to every rank in the next cycle's flags
      }
    }
  }

  std::string stall_text(const TableEntry& e, const std::vector<bool>& joined) const {
    std::string have, missing;
    for (std::size_t r = 0; r < e.by_rank.size(); ++r) {
      std::string& s = e.by_rank[r] ? have : missing;
      if (!e.by_rank[r] && joined[r]) continue;
      s += (s.empty() ? "" : ", ") + std::to_string(r);
    }
    return "tensor '" + e.name + "' was submitted by rank(s) " + have + " but not by rank(s) " +
           missing;
  }

  static constexpr const char* kJoinHint =
      "If ranks run different numbers of steps (uneven data), a rank that has run out of data "
      "must call Engine::join() instead of stopping or skipping: it then contributes zeros until "
      "every rank has joined";

  // Every rank computes the same text from the same flags and the same table (plus what is
  // pending on this rank).
  std::string shutdown_reason(bool by_stall, const std::vector<int>& stopped,
                              const std::vector<bool>& joined) const {
    std::string s;
    if (by_stall) {
      s = "engine shut down by the stall inspector (rank 0, KOLO_STALL_SHUTDOWN_SECONDS)";
    } else {
      s = "engine shut down by rank" + std::string(stopped.size() > 1 ? "s " : " ") +
          rank_list(stopped) +
          (std::find(stopped.begin(), stopped.end(), rank()) != stopped.end() ? " (this rank)"
                                                                              : "") +
          ", which called Engine::shutdown() or destroyed its Engine";
    }
    std::vector<std::string> waiting;
    for (const auto& e : table_) waiting.push_back(stall_text(e, joined));
    if (!waiting.empty()) s += ", while " + first_few(waiting, "; ", "tensors");
    if (in_flight() > 0) {
      s += "; this rank was still waiting for " + std::to_string(in_flight()) +
           (in_flight() == 1 ? " tensor (" : " tensors (") + pending_names() + ")";
    }
    return s + ". " + kJoinHint + ".";
  }

  // ---------------- the user's words in error messages ----------------

  static std::string rank_list(const std::vector<int>& ranks) {
    std::string s;
    for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
    return s;
  }

  // "'a', 'b', 'c' and 47 more <noun>": the first three items and a count.
  static std::string first_few(const std::vector<std::string>& items, const char* sep,
                               const char* noun) {
    constexpr std::size_t kShown = 3;
    std::string s;
    for (std::size_t i = 0; i < items.size() && i < kShown; ++i) s += (i ? sep : "") + items[i];
    if (items.size() > kShown) {
      s += " and " + std::to_string(items.size() - kShown) + " more";
      if (*noun) s += std::string(" ") + noun;
    }
    return s;
  }

  // This rank's pending tensors, oldest first, and the ops asked for:
  // "'a', 'b', 'c' and 47 more; allreduce(average)".
  std::string pending_names() const {
    std::vector<std::pair<std::uint64_t, std::string>> byage;
    std::set<std::string> ops;
    for (const auto& [name, l] : pending_) {
      byage.emplace_back(l.seq, name);
      ops.insert(op_text(l.p));
    }
    for (const CacheSlot& c : cache_) {
      if (!c.busy) continue;
      byage.emplace_back(c.local.seq, c.name);
      ops.insert(op_text(c.local.p));
    }
    std::sort(byage.begin(), byage.end());
    std::vector<std::string> names;
    for (const auto& [t, name] : byage) names.push_back("'" + name + "'");
    std::string s = first_few(names, ", ", "") + ";";
    for (const auto& op : ops) s += " " + op;
    return s;
  }

  // The operation as the user asked for it: "allreduce(average)", "broadcast(root 2)".
  static std::string op_text(const RequestParams& p) {
    std::string s = op_kind_name(p.kind);
    if (p.kind == OpKind::allreduce) {
      s += "(" + std::string(reduce_op_name(p.op));
      if (p.prescale != 1.0) s += ", prescale " + std::to_string(p.prescale);
      if (p.postscale != 1.0) s += ", postscale " + std::to_string(p.postscale);
      if (p.join_average == JoinAverage::active_ranks) s += ", divided by the active ranks";
      s += ")";
    } else if (p.kind == OpKind::broadcast) {
      s += "(root " + std::to_string(p.root) + ")";
    }
    return s;
  }

  // "engine: allreduce(average) of 50 tensors 'a', 'b', 'c' and 47 more (24500050 x float32
  // in one fused collective) failed"
  std::string failed_text(const std::vector<Response>& rs,
                          const std::vector<std::size_t>& batch) const {
    const RequestParams& p = *rs[batch.front()].p;
    std::vector<std::string> names;
    std::uint64_t total = 0;
    for (std::size_t j : batch) {
      names.push_back("'" + *rs[j].name + "'");
      total += rs[j].p->count;
    }
    std::string s = "engine: " + op_text(p) + " of ";
    s += batch.size() == 1 ? "tensor " : std::to_string(batch.size()) + " tensors ";
    s += first_few(names, ", ", "") + " (";
    if (p.kind == OpKind::allgather) {
      total = 0;
      for (std::size_t c : rs[batch.front()].decided->counts) total += c;
      s += std::to_string(total) + " x " + std::string(dtype_name(p.dtype)) + " from all ranks";
    } else {
      s += std::to_string(total) + " x " + std::string(dtype_name(p.dtype));
      if (batch.size() > 1) s += " in one fused collective";
    }
    return s + ") failed";
  }

  // An error in the cycle's own collectives (or one another rank's collective sent here
  // through the abort channel while this rank was negotiating).
  std::string negotiation_text() const {
    if (in_flight() == 0) return "engine: negotiation failed with no tensor pending on this rank";
    return "engine: negotiation failed with " + std::to_string(in_flight()) +
           (in_flight() == 1 ? " tensor" : " tensors") + " pending on this rank (" +
           pending_names() + ")";
  }

  // Runs one of the engine's collectives. An error it throws is rethrown with the same kind,
  // prefixed with what the user asked for (`what()`): the op, the first tensor names, a count.
  // The Communicator's own words follow (they name the fused buffer and the wire op).
  // The engine negotiates every collective it runs, so a MismatchError from the Communicator
  // means the ranks' engines differ: they fused, converted or counted cache slots differently.
  template <class Run, class What>
  void guarded(Run&& run, What&& what) {
    try {
      run();
    } catch (const Error& e) {
      std::string msg = what() + ": " + e.what();
      if (e.kind() == ErrorKind::mismatch) {
        msg +=
            " (the ranks' engines ran different collectives for the same tensors: every rank "
            "must use the same engine options, e.g. KOLO_FUSION_THRESHOLD, KOLO_COMPRESSION, "
            "KOLO_CACHE_CAPACITY)";
      }
      if (e.kind() == ErrorKind::peer_lost) {
        msg +=
            " (if that rank ended on purpose because it ran out of data, it must call "
            "Engine::join() first)";
      }
      throw_error(e.kind(), msg);
    }
  }

  void fail_pending(std::exception_ptr err) {
    std::vector<Incoming> incoming;
    std::vector<detail::StateRef> waiters;
    {
      std::lock_guard lock(mu_);
      std::lock_guard inbox(inbox_lock_);
      if (!dead_) dead_ = err;
      incoming.swap(inbox_);
      inbox_names_.clear();
      waiters.swap(join_waiters_);
    }
    for (auto& in : incoming) in.local.handle->finish(err);
    for (auto& in : incoming_) {  // taken from the inbox but not filed when the error struck
      if (in.local.handle) in.local.handle->finish(err);
    }
    incoming_.clear();
    for (auto& [name, l] : pending_) l.handle->finish(err);
    pending_.clear();
    for (CacheSlot& c : cache_) {
      if (!c.busy) continue;
      c.local.handle->finish(err);
      c.local = Local{};
      c.busy = false;
    }
    busy_slots_ = 0;
    for (auto& w : waiters) w->finish(err);
  }

  void fail_everything(std::exception_ptr err) {
    notify_completed();  // those already done keep their result
    fail_pending(std::move(err));
  }

  static double seconds_since(clock::time_point t) {
    return std::chrono::duration<double>(clock::now() - t).count();
  }

  template <class F>
  void bump(F&& f) {
    std::lock_guard lock(mu_);
    f(stats_);
  }

  Communicator<T> comm_;
  EngineOptions opts_;
  Timeline timeline_;
  FusionBuffer fusion_;
  bool fusion_attach_tried_ = false;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  // The inbox and what a submission reads are guarded by inbox_lock_, taken after mu_ where
  // both are held (a submission takes inbox_lock_ alone). wake_at_, shutdown_requested_ and
  // dead_ are written holding both locks and read holding either.
  detail::InboxLock inbox_lock_;
  std::vector<Incoming> inbox_;  // submissions, names in inbox_names_
  // Coalesced submissions' lists, kept for reuse (recycle(), allreduce_coalesced_async).
  std::vector<std::vector<TensorView>> spare_views_;
  std::vector<std::vector<std::uint64_t>> spare_counts_;
  std::string inbox_names_;
  clock::time_point inbox_since_;  // when the oldest submission in the inbox arrived
  std::size_t wake_at_ = 1;        // the inbox size at which a submission wakes the engine thread
  std::vector<detail::StateRef> join_waiters_;
  int driving_ = 0;             // waiting threads running cycles (Driver)
  bool stopped_ = false;        // the engine ran its last cycle
  bool joined_mirror_ = false;  // joined_, for the engine thread's sleep
  bool shutdown_requested_ = false;
  std::exception_ptr dead_;
  EngineStats stats_;

  // Progress state, used by whichever thread holds driver_->mu. The steady state reuses every
  // container here: a step of cached names allocates nothing (tests/engine/test_engine_alloc.cpp
  // counts).
  std::vector<Incoming> incoming_;  // the inbox as taken by this cycle (swapped, kept)
  std::string incoming_names_;
  NameMap<Local> pending_;  // in flight without a cache slot (new names, changed parameters)
  std::vector<std::string> to_send_;
  // Cache slots by number: a deque (responses point into slots while others are added) and the
  // slots' addresses, so that a slot number is one load away (a deque's indexing, many times per
  // tensor and cycle, was a visible cost).
  struct SlotTable {
    std::deque<CacheSlot> items;
    std::vector<CacheSlot*> at;
    CacheSlot& operator[](std::size_t k) { return *at[k]; }
    const CacheSlot& operator[](std::size_t k) const { return *at[k]; }
    std::size_t size() const { return at.size(); }
    void emplace_back() {
      at.push_back(nullptr);  // first: if the slot's allocation throws, nothing points past it
      try {
        items.emplace_back();
      } catch (...) {
        at.pop_back();
        throw;
      }
      at.back() = &items.back();
    }
    auto begin() { return items.begin(); }
    auto end() { return items.end(); }
    auto begin() const { return items.begin(); }
    auto end() const { return items.end(); }
  };
  SlotTable cache_;
  NameMap<int> cache_index_;
  // By slot: the slot filed after it last time (-1: none yet), and the slot filed last (intake's
  // guess; checked against the name, so a stale entry only costs the lookup it would have run).
  std::vector<int> next_slot_;
  int last_slot_ = -1;
  std::size_t busy_slots_ = 0;    // cache slots with an operation in flight
  std::size_t since_idle_ = 0;    // operations submitted since nothing was in flight
  std::uint64_t submitted_ = 0;   // operations filed, ever
  std::size_t step_size_ = 0;     // ... and over the stretch before (await_rest_of_step)
  std::size_t free_hint_ = 0;     // no free cache slot below this one
  bool cache_full_said_ = false;  // the "cache is full" note was printed (rank 0, once)
  std::vector<std::uint8_t> slot_pending_, invalid_;
  std::vector<TableEntry> table_;
  std::unordered_map<std::string, std::size_t> table_index_;
  std::vector<Response> responses_, held_scratch_;
  std::deque<Decided> decided_;                     // this cycle's table responses
  std::vector<std::unique_ptr<Decided>> released_;  // this cycle's completed groups
  std::map<std::string, std::vector<Held>> groups_;
  std::set<std::string, std::less<>> held_names_;
  std::vector<detail::StateRef> completed_;  // marked done, not yet woken
  std::vector<std::uint8_t> flags_, done_;
  std::vector<bool> joined_ranks_;
  std::vector<std::size_t> batch_, offsets_;
  std::vector<const Local*> locals_;
  std::vector<TensorView> piece_in_, piece_out_;  // a batch in pieces: its tensors
  // A batch with coalesced submissions, one response per tensor (run_allreduce).
  std::vector<Response> part_responses_;
  std::vector<std::size_t> part_batch_;
  std::vector<Local> part_locals_;
  std::vector<RequestParams> part_params_;
  std::vector<std::size_t> prepacked_, prepack_offsets_;  // prepack(): slots and their offsets
  clock::time_point prepack_begin_, prepack_end_;
  bool prepack_skipped_own_ = false;  // prepack() left this rank's own block to the tensors
  std::vector<std::byte> zeros_;
  std::vector<cuda::FusionItem> device_items_;
  bool stamp_each_ = false;  // each submission reads the clock (for the timeline)
  bool joined_ = false;
  bool driven_ = false;       // this cycle runs on a waiting thread
  bool step_driven_ = false;  // the last step was completed by a waiting thread
  bool stall_shutdown_ = false;
  std::shared_ptr<detail::Driver> driver_ = std::make_shared<detail::Driver>();
  std::thread thread_;
};

template <class T>
EngineCore<T>::EngineCore(Communicator<T> comm, EngineOptions opts)
    : comm_(std::move(comm)), opts_(std::move(opts)) {
  if (!opts_.timeline.empty() && comm_.rank() == 0) timeline_.open(opts_.timeline, 0);
  stamp_each_ = timeline_.enabled();
  driver_->engine = this;
  driver_->run = [](void* e, detail::HandleState& h) { static_cast<EngineCore*>(e)->drive(h); };
  thread_ = std::thread([this] { loop(); });
}

template <class T>
EngineCore<T>::~EngineCore() {
  shutdown();
}

template <class T>
Handle EngineCore<T>::allreduce_async(std::string_view name, const TensorView& tensor, ReduceOp op,
                                      double prescale, double postscale, const TensorView& output) {
  RequestParams p;
  p.kind = OpKind::allreduce;
  p.dtype = tensor.dtype;
  p.op = op;
  p.count = tensor.count;
  p.prescale = prescale;
  p.postscale = postscale;
  if (op == ReduceOp::average) p.join_average = opts_.join_average;
  return enqueue(name, tensor, output.data ? output : tensor, std::move(p));
}

template <class T>
std::vector<Handle> EngineCore<T>::grouped_allreduce_async(
    const std::string& group, const std::vector<std::pair<std::string, TensorView>>& tensors,
    ReduceOp op, double prescale, double postscale) {
  std::vector<Handle> out;
  for (const auto& [name, t] : tensors) {
    RequestParams p;
    p.kind = OpKind::allreduce;
    p.dtype = t.dtype;
    p.op = op;
    p.count = t.count;
    p.prescale = prescale;
    p.postscale = postscale;
    p.group = group;
    p.group_size = static_cast<std::uint32_t>(tensors.size());
    if (op == ReduceOp::average) p.join_average = opts_.join_average;
    out.push_back(enqueue(name, t, t, std::move(p)));
  }
  return out;
}

template <class T>
Handle EngineCore<T>::allreduce_coalesced_async(std::string_view name,
                                                std::span<const TensorView> tensors, ReduceOp op,
                                                double prescale, double postscale) {
  auto fail = [&](const std::string& what) {
    throw ConfigError("engine: coalesced submission '" + std::string(name) + "': " + what);
  };
  if (tensors.empty()) fail("needs at least one tensor");
  RequestParams p;
  p.kind = OpKind::allreduce;
  p.dtype = tensors.front().dtype;
  p.op = op;
  p.prescale = prescale;
  p.postscale = postscale;
  if (op == ReduceOp::average) p.join_average = opts_.join_average;
  std::vector<TensorView> views;  // an earlier submission's lists where one is spare
  {
    std::lock_guard inbox(inbox_lock_);
    if (!spare_views_.empty()) {
      views = std::move(spare_views_.back());
      spare_views_.pop_back();
    }
    if (!spare_counts_.empty()) {
      p.parts = std::move(spare_counts_.back());
      spare_counts_.pop_back();
    }
  }
  p.parts.clear();
  p.parts.reserve(tensors.size());
  // No tensor may overlap another (each is reduced in place). Tensors in address order (the
  // usual case) are checked as they come; otherwise their ranges are sorted afterwards.
  bool ascending = true;
  std::uintptr_t end_so_far = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorView& t = tensors[i];
    if (t.device.kind == Device::Kind::cuda) {
      fail("tensor " + std::to_string(i) +
           " is on a CUDA device; coalesced submissions take host tensors (submit device "
           "tensors one by one, or as a group: grouped_allreduce_async)");
    }
    if (t.dtype != p.dtype) {
      fail("tensor " + std::to_string(i) + " is " + std::string(dtype_name(t.dtype)) +
           " but tensor 0 is " + std::string(dtype_name(p.dtype)) +
           "; all tensors of one submission have one dtype");
    }
    if (t.count > 0 && !t.data) fail("tensor " + std::to_string(i) + " has a null data pointer");
    p.parts.push_back(t.count);
    p.count += t.count;
    if (t.count == 0) continue;
    const auto b = reinterpret_cast<std::uintptr_t>(t.data);
    ascending = ascending && b >= end_so_far;
    end_so_far = b + t.bytes();
  }
  if (!ascending) {
    // Kept per thread: a step that submits the same list every time allocates nothing here.
    // The same list as this thread's last one that passed (a training step resubmits its
    // buckets) passes again without the sort.
    thread_local std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges, passed;
    ranges.clear();
    for (const TensorView& t : tensors) {
      const auto b = reinterpret_cast<std::uintptr_t>(t.data);
      if (t.count > 0) ranges.emplace_back(b, b + t.bytes());
    }
    if (ranges != passed) {
      passed = ranges;
      std::sort(ranges.begin(), ranges.end());
      for (std::size_t i = 1; i < ranges.size(); ++i) {
        if (ranges[i].first < ranges[i - 1].second) {
          passed.clear();
          fail(
              "two of its tensors overlap in memory; each tensor is reduced in place, so they "
              "must be disjoint");
        }
      }
    }
  }
  if (!dtype_is_floating(p.dtype) && (prescale != 1.0 || postscale != 1.0)) {
    fail("prescale/postscale need a floating dtype");
  }
  auto state = detail::make_handle_state();
  const TensorView whole(tensors.front().data, 0, p.dtype);
  views.assign(tensors.begin(), tensors.end());
  return push(name, std::move(state), whole, whole, std::move(p), std::move(views));
}

template <class T>
Handle EngineCore<T>::allgather_async(std::string_view name, const TensorView& tensor) {
  RequestParams p;
  p.kind = OpKind::allgather;
  p.dtype = tensor.dtype;
  p.count = tensor.count;
  return enqueue(name, tensor, tensor, std::move(p));
}

template <class T>
Handle EngineCore<T>::broadcast_async(std::string_view name, const TensorView& tensor, int root) {
  RequestParams p;
  p.kind = OpKind::broadcast;
  p.dtype = tensor.dtype;
  p.count = tensor.count;
  p.root = root;
  return enqueue(name, tensor, tensor, std::move(p));
}

template <class T>
void EngineCore<T>::join() {
  auto state = detail::make_handle_state();
  state->driver.reset();  // the engine thread completes a join (a reused state may have one)
  {
    std::lock_guard lock(mu_);
    if (dead_) std::rethrow_exception(dead_);
    join_waiters_.push_back(state);
  }
  cv_.notify_one();
  Handle(state).wait();
}

template <class T>
void EngineCore<T>::shutdown() {
  {
    std::lock_guard lock(mu_);
    std::lock_guard inbox(inbox_lock_);
    shutdown_requested_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  {
    // Handles still held (all completed by now) no longer lead waiters into this engine.
    std::lock_guard progress(driver_->mu);
    driver_->engine = nullptr;
  }
  timeline_.close();
}

template <class T>
EngineStats EngineCore<T>::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

// ---- Engine<T>: each member hands over to the core ----

template <class T>
Engine<T>::Engine(Communicator<T> comm) : Engine(std::move(comm), EngineOptions::from_env()) {}

template <class T>
Engine<T>::Engine(Communicator<T> comm, EngineOptions opts)
    : rank_(comm.rank()), size_(comm.size()) {
  core_ = std::make_unique<EngineCore<T>>(std::move(comm), std::move(opts));
}

template <class T>
Engine<T>::~Engine() = default;

template <class T>
Handle Engine<T>::allreduce_async(std::string_view name, const TensorView& tensor, ReduceOp op,
                                  double prescale, double postscale, const TensorView& output) {
  return core_->allreduce_async(name, tensor, op, prescale, postscale, output);
}

template <class T>
std::vector<Handle> Engine<T>::grouped_allreduce_async(
    const std::string& group, const std::vector<std::pair<std::string, TensorView>>& tensors,
    ReduceOp op, double prescale, double postscale) {
  return core_->grouped_allreduce_async(group, tensors, op, prescale, postscale);
}

template <class T>
Handle Engine<T>::allreduce_coalesced_async(std::string_view name,
                                            std::span<const TensorView> tensors, ReduceOp op,
                                            double prescale, double postscale) {
  return core_->allreduce_coalesced_async(name, tensors, op, prescale, postscale);
}

template <class T>
Handle Engine<T>::allgather_async(std::string_view name, const TensorView& tensor) {
  return core_->allgather_async(name, tensor);
}

template <class T>
Handle Engine<T>::broadcast_async(std::string_view name, const TensorView& tensor, int root) {
  return core_->broadcast_async(name, tensor, root);
}

template <class T>
void Engine<T>::join() {
  core_->join();
}

template <class T>
void Engine<T>::shutdown() {
  core_->shutdown();
}

template <class T>
EngineStats Engine<T>::stats() const {
  return core_->stats();
}

template <class T>
Communicator<T>& Engine<T>::communicator() {
  return core_->communicator();
}

}  // namespace kolo
