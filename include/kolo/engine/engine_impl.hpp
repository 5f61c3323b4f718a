// kolo/engine/engine_impl.hpp — the engine's machinery behind Engine<T> (engine.hpp): the
// progress thread and its wake-ups, and one cycle wiring the engine's parts together, plus
// Engine<T>'s members. The parts are in engine/detail/, one job each: the inbox (inbox.hpp),
// this rank's operations in flight (tensor_queue.hpp, over response_cache.hpp), negotiation
// (negotiator.hpp: flags, request table, decisions, stall texts; no transport), the group table
// (group_table.hpp), the batch plan (batch_plan.hpp) and the executors (executors.hpp, the
// only code that calls the communicator besides the Exchange bound here).
//
// Header-only, engine.hpp includes this file. With the compiled core (KOLO_COMPILED_CORE) the
// library holds the Engine of the standard transports (MeshTransport = DefaultTransport,
// RoutedTransport, ShmTransport, TcpTransport) and a user's file does not parse this one; a
// file that builds an Engine of another transport (InprocTransport, MpiTransport,
// NcclTransport, CudaStagedTransport, its own) includes it.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "kolo/communicator.hpp"
#include "kolo/core/checked_size.hpp"
#include "kolo/core/compiled_core.hpp"
#include "kolo/core/error.hpp"
#include "kolo/core/tensor.hpp"
#include "kolo/engine/detail/batch_plan.hpp"
#include "kolo/engine/detail/executors.hpp"
#include "kolo/engine/detail/group_table.hpp"
#include "kolo/engine/detail/inbox.hpp"
#include "kolo/engine/detail/messages.hpp"
#include "kolo/engine/detail/negotiator.hpp"
#include "kolo/engine/detail/records.hpp"
#include "kolo/engine/detail/response_cache.hpp"
#include "kolo/engine/detail/submission.hpp"
#include "kolo/engine/detail/tensor_queue.hpp"
#include "kolo/engine/engine.hpp"
#include "kolo/engine/handle.hpp"
#include "kolo/engine/request.hpp"
#include "kolo/engine/timeline.hpp"

namespace kolo {
namespace detail {
template <class T>
struct engine_defined<T, std::void_t<T>> : std::true_type {};
}  // namespace detail

// What Engine<T> holds by pointer; its public members are Engine<T>'s, one to one.
template <class T>
class EngineCore {
  static_assert(check_transport<T>());  // names the member T lacks (transport/transport.hpp)
  using clock = detail::engine::clock;
  using Local = detail::engine::Local;
  using Response = detail::engine::Response;
  using Decided = detail::engine::Decided;
  using Incoming = detail::engine::Incoming;

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
  const EngineOptions& options() const { return opts_; }
  // Stops the progress thread for Engine::recover: a healthy engine's communicator is revoked
  // first (every rank's engine fails), then the thread is joined.
  void halt();
  int rank() const { return comm_.rank(); }
  int size() const { return comm_.size(); }

 private:
  // The cycle's two collectives on the communicator (negotiator.hpp's Exchange), each failing
  // with the words of a failed negotiation.
  struct CommExchange final : detail::engine::Exchange {
    EngineCore* e;
    explicit CommExchange(EngineCore* core) : e(core) {}
    void min(std::vector<std::uint8_t>& flags) override {
      e->comm_.allreduce(TensorView(flags.data(), flags.size(), DataType::uint8), ReduceOp::min);
    }
    void gather(const std::string& mine, std::string& all,
                std::vector<std::size_t>& counts) override {
      const auto n = static_cast<std::size_t>(e->size());
      std::vector<std::int64_t> sizes(n);
      std::int64_t my_size = static_cast<std::int64_t>(mine.size());
      e->comm_.allgather(TensorView(&my_size, 1, DataType::int64),
                         TensorView(sizes.data(), sizes.size(), DataType::int64));
      counts.assign(sizes.begin(), sizes.end());
      std::size_t total = 0;
      for (auto c : counts) total += c;
      all.assign(total, '\0');
      e->comm_.allgatherv(TensorView(const_cast<char*>(mine.data()), mine.size(), DataType::uint8),
                          TensorView(all.data(), all.size(), DataType::uint8), counts);
    }
  };

  // The tensors by reference: copies of them on the stack, read back piecewise, stalled the
  // loads here (a submission is about 100 ns in all).
  Handle enqueue(std::string_view name, const TensorView& in, const TensorView& out,
                 RequestParams&& p) {
    auto state = detail::make_handle_state();
    state->output = out;
    detail::engine::check_submission(name, in, out, p, size(), DeviceFusionTransport<T>);
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
    const bool wake = inbox_.add(name, std::move(state), in, out, std::move(p), std::move(parts),
                                 now, stamp_each_);
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
      busy = r == CycleResult::progress && (q_.in_flight() > 0 || !q_.to_send.empty());
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
        std::lock_guard inbox(inbox_.lock);
        empty = inbox_.entries.empty();
        waiting = inbox_.entries.size();
        since = inbox_.since;
      }
      if (driving_ == 0) {
        if (busy || inbox_.shutdown_requested || (!join_waiters_.empty() && !joined_mirror_))
          return true;
        if (empty ? now >= tick : waiting >= inbox_.wake_at || now >= since + cycle) {
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
    q_.notify_completed();  // nothing marked done stays unannounced past a cycle
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
    q_.driven = true;
    for (;;) {
      bump([](EngineStats& s) { ++s.driven_cycles; });
      const CycleResult r = run_cycle();
      if (r != CycleResult::progress || h.is_done()) break;
    }
    q_.driven = false;
    const bool more = q_.in_flight() > 0 || !q_.to_send.empty();
    const std::size_t wake = wake_threshold();
    bool notify;
    {
      std::lock_guard lock(mu_);
      std::lock_guard inbox(inbox_.lock);
      --driving_;
      inbox_.wake_at = wake;
      notify = more || stopped_ || !inbox_.entries.empty() || inbox_.shutdown_requested ||
               (!join_waiters_.empty() && !joined_mirror_);
    }
    if (notify) cv_.notify_all();
  }

  // The inbox size at which a submission wakes the engine thread: 1; the rest of the step while
  // one is being submitted (all cached names, and this rank submitted more than that over the
  // previous stretch between idle moments); never while the steps are run by the threads that
  // wait for them (then the cycle clock takes anything nobody waits for, within cycle_time_ms).
  std::size_t wake_threshold() const {
    if (!q_.to_send.empty() || joined_ || q_.step_size == 0) return 1;
    if (q_.step_driven) return std::numeric_limits<std::size_t>::max();
    return q_.step_size > q_.since_idle ? q_.step_size - q_.since_idle : 1;
  }
  void set_wake_at() {
    const std::size_t w = wake_threshold();
    std::lock_guard lock(mu_);
    std::lock_guard inbox(inbox_.lock);
    inbox_.wake_at = w;
  }

  void set_joined(bool j) {
    joined_ = j;
    std::lock_guard lock(mu_);
    joined_mirror_ = j;
  }

  // Files the inbox's submissions; says whether a shutdown or a join is asked for.
  void take_inbox(bool& want_shutdown, bool& want_join) {
    {
      std::lock_guard lock(mu_);
      std::lock_guard inbox(inbox_.lock);
      incoming_.swap(inbox_.entries);
      incoming_names_.swap(inbox_.names);
      want_shutdown = inbox_.shutdown_requested;
      want_join = !join_waiters_.empty();
    }
    const std::string_view names = incoming_names_;
    const auto now = incoming_.empty() || stamp_each_ ? clock::time_point{} : clock::now();
    for (auto& in : incoming_) {
      if (!stamp_each_) in.local.enqueued = now;
      q_.intake(names.substr(in.name_at, in.name_len), std::move(in.local), rank(), joined_,
                groups_, inbox_);
    }
    incoming_.clear();
    incoming_names_.clear();
  }

  CycleResult cycle() {
    const int me = rank();
    const auto t0 = clock::now();
    // 1. Take new work.
    bool want_shutdown, want_join;
    take_inbox(want_shutdown, want_join);
    // A join takes effect once this rank's own submissions have completed: a joined rank then
    // contributes only zeros, so "ranks that contributed" is exactly "ranks not joined".
    if (want_join && q_.in_flight() == 0) set_joined(true);
    const bool stall_stop = stall_shutdown_;
    // Cached names stuck in negotiation past half the warning time leave the cache, so the
    // table can say who is missing them.
    detail::engine::ResponseCache& cache = q_.cache;
    const std::size_t slots = cache.size();
    if (opts_.stall_warning_seconds > 0 && cache.busy > 0) {
      cache.invalidate_older(t0 -
                             std::chrono::duration_cast<clock::duration>(
                                 std::chrono::duration<double>(opts_.stall_warning_seconds / 2)));
    }

    // Pack now what will most likely be this cycle's fused batch, while the other ranks may
    // still be on their way to the negotiation (Executors::prepack).
    exec_.prepack(joined_);

    // 2. The one collective of a steady-state cycle (the flags: negotiator.hpp).
    detail::engine::FlagsIn in;
    in.want_shutdown = want_shutdown;
    in.stall_stop = stall_stop;
    in.has_new = !q_.to_send.empty();
    in.joined = joined_;
    in.pending = &cache.pending;
    in.invalid = &cache.invalid;
    std::vector<std::uint8_t>& flags = neg_.flags(in);
    detail::engine::guarded([&] { exchange_.min(flags); }, [&] { return negotiation_text(); });
    bump([](EngineStats& s) { ++s.cycles; });
    neg_.read_flags();
    const int active = neg_.active();  // ranks that have not joined: they contribute
    if (neg_.shutdown()) {
      fail_pending(std::make_exception_ptr(Error(neg_.shutdown_reason(
          q_.in_flight(), q_.in_flight() > 0 ? q_.pending_text() : std::string()))));
      return CycleResult::stop;
    }
    exec_.attach_once();

    // Last cycle's responses are done with (their handles completed or failed).
    responses_.clear();
    if (!decided_.empty()) decided_.clear();
    groups_.end_cycle();
    // 3. Evictions first (identical on every rank), then cached names ready everywhere.
    for (std::size_t k = 0; k < slots; ++k) {
      if (neg_.slot_evicted(k) && cache[k].used) q_.evict(k, groups_);
    }
    if (!neg_.all_joined()) {
      for (std::size_t k = 0; k < slots; ++k) {
        if (cache[k].used && neg_.slot_ready(k)) {
          Response r;
          r.name = &cache[k].name;
          r.p = &cache[k].p;
          r.slot = static_cast<int>(k);
          r.cached = true;
          responses_.push_back(r);
          cache.pending[k] = 0;
        }
      }
    }

    // 4. New names: gather every rank's requests, file them, decide.
    bool exchanged = false;
    if (neg_.new_names()) {
      exchanged = true;
      detail::engine::guarded([&] { exchange_requests(); }, [&] { return negotiation_text(); });
    }
    const auto t1 = clock::now();
    bump([&](EngineStats& s) {
      s.negotiation_seconds += std::chrono::duration<double>(t1 - t0).count();
      if (exchanged) ++s.uncached_cycles;
    });
    if (me == 0 && neg_.inspect_stalls(opts_.stall_warning_seconds, opts_.stall_shutdown_seconds,
                                       clock::now())) {
      stall_shutdown_ = true;  // travels to every rank in the next cycle's flags
    }

    // 5. Groups execute only when complete.
    groups_.hold_incomplete(responses_);

    // 6. Run them.
    const bool did = !responses_.empty();
    exec_.execute(responses_, active);

    // 7. Join completes when every rank has joined.
    if (neg_.all_joined() && joined_) {
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

  // This rank's requests out, every rank's in; the ready names decided (in table order, the
  // same on every rank) become responses, and those the cache takes get slots.
  void exchange_requests() {
    mine_.clear();
    for (const std::string& name : q_.to_send) {
      auto it = q_.pending.find(std::string_view(name));
      if (it == q_.pending.end()) continue;
      detail::engine::Negotiator::encode(mine_, name, it->second.p);
    }
    q_.to_send.clear();
    const std::size_t first = decided_.size();
    neg_.exchange(exchange_, mine_, decided_);
    for (std::size_t i = first; i < decided_.size(); ++i) {
      const Decided& d = decided_[i];  // a deque: d stays put
      if (detail::engine::Negotiator::cacheable(d)) {
        // The request that just completed through the table is executed now, not via its slot.
        q_.cache.insert(d.name, d.p, opts_.cache_capacity, rank());
      }
      Response resp;
      resp.name = &d.name;
      resp.p = &d.p;
      resp.decided = &d;
      responses_.push_back(resp);
    }
  }

  std::string negotiation_text() const {
    return detail::engine::negotiation_text(q_.in_flight(),
                                            q_.in_flight() > 0 ? q_.pending_text() : std::string());
  }

  void fail_pending(std::exception_ptr err) {
    std::vector<Incoming> incoming;
    std::vector<detail::StateRef> waiters;
    {
      std::lock_guard lock(mu_);
      std::lock_guard inbox(inbox_.lock);
      if (!inbox_.dead) inbox_.dead = err;
      incoming.swap(inbox_.entries);
      inbox_.names.clear();
      waiters.swap(join_waiters_);
    }
    for (auto& in : incoming) in.local.handle->finish(err);
    for (auto& in : incoming_) {  // taken from the inbox but not filed when the error struck
      if (in.local.handle) in.local.handle->finish(err);
    }
    incoming_.clear();
    q_.fail_all(err);
    for (auto& w : waiters) w->finish(err);
  }

  void fail_everything(std::exception_ptr err) {
    q_.notify_completed();  // those already done keep their result
    fail_pending(std::move(err));
  }

  template <class F>
  void bump(F&& f) {
    std::lock_guard lock(mu_);
    f(stats_);
  }

  Communicator<T> comm_;
  EngineOptions opts_;
  Timeline timeline_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  // The inbox (inbox.hpp: its lock is taken after mu_ where both are held).
  detail::engine::Inbox inbox_;
  std::vector<detail::StateRef> join_waiters_;
  int driving_ = 0;             // waiting threads running cycles (Driver)
  bool stopped_ = false;        // the engine ran its last cycle
  bool joined_mirror_ = false;  // joined_, for the engine thread's sleep
  EngineStats stats_;

  // Progress state, used by whichever thread holds driver_->mu. The steady state reuses every
  // container here: a step of cached names allocates nothing (tests/engine/test_engine_alloc.cpp
  // counts).
  std::vector<Incoming> incoming_;  // the inbox as taken by this cycle (swapped, kept)
  std::string incoming_names_;
  detail::engine::TensorQueue q_;
  detail::engine::GroupTable groups_;
  detail::engine::Negotiator neg_{comm_.rank(), comm_.size()};
  CommExchange exchange_{this};
  detail::engine::Executors<T> exec_{comm_, opts_, timeline_, q_,
                                     detail::engine::StatsSink{&mu_, &stats_}};
  std::vector<Response> responses_;
  std::deque<Decided> decided_;  // this cycle's table responses
  std::string mine_;             // this rank's requests, encoded
  bool stamp_each_ = false;      // each submission reads the clock (for the timeline)
  bool joined_ = false;
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
  if (tensors.empty()) detail::engine::coalesced_error(name, "needs at least one tensor");
  RequestParams p;
  p.kind = OpKind::allreduce;
  p.dtype = tensors.front().dtype;
  p.op = op;
  p.prescale = prescale;
  p.postscale = postscale;
  if (op == ReduceOp::average) p.join_average = opts_.join_average;
  std::vector<TensorView> views;  // an earlier submission's lists where one is spare
  inbox_.take_spares(views, p.parts);
  detail::engine::check_coalesced(name, tensors, p);
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
    if (inbox_.dead) std::rethrow_exception(inbox_.dead);
    join_waiters_.push_back(state);
  }
  cv_.notify_one();
  Handle(state).wait();
}

template <class T>
void EngineCore<T>::shutdown() {
  {
    std::lock_guard lock(mu_);
    std::lock_guard inbox(inbox_.lock);
    inbox_.shutdown_requested = true;
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
void EngineCore<T>::halt() {
  bool running;
  {
    std::lock_guard lock(mu_);
    running = !stopped_ && !inbox_.dead;
  }
  if (running) {
    if constexpr (requires(T & t) { t.interrupt(ErrorKind::revoked, std::string()); }) {
      comm_.transport().interrupt(ErrorKind::revoked,
                                  "Engine::recover on rank " + std::to_string(rank()));
    } else {
      throw ConfigError(
          "Engine::recover: the engine has not failed, and its transport cannot be interrupted "
          "from another thread; call recover() after the engine failed (a PeerLostError)");
    }
  }
  shutdown();
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
void Engine<T>::recover(const std::vector<int>& excluded, const ShrinkOptions& so) {
  core_->halt();
  Communicator<T> next = core_->communicator().shrink(excluded, so);
  EngineOptions opts = core_->options();
  if (!opts.timeline.empty()) {
    opts.timeline += ".g" + std::to_string(next.lineage().generation);
  }
  core_.reset();  // the failed engine and its revoked communicator
  rank_ = next.rank();
  size_ = next.size();
  core_ = std::make_unique<EngineCore<T>>(std::move(next), std::move(opts));
}

template <class T>
void Engine<T>::grow(int count, const GrowOptions& go) {
  core_->shutdown();  // a negotiated stop: every member's last cycle is the same
  EngineOptions opts = core_->options();
  std::optional<Communicator<T>> next;
  try {
    next.emplace(core_->communicator().grow(count, go));
  } catch (...) {
    // The communicator is as it was: a fresh engine over it, so the caller can go on.
    Communicator<T> same = std::move(core_->communicator());
    core_.reset();
    core_ = std::make_unique<EngineCore<T>>(std::move(same), std::move(opts));
    throw;
  }
  if (!opts.timeline.empty()) {
    opts.timeline += ".g" + std::to_string(next->lineage().generation);
  }
  core_.reset();
  rank_ = next->rank();
  size_ = next->size();
  core_ = std::make_unique<EngineCore<T>>(std::move(*next), std::move(opts));
}

template <class T>
std::uint64_t Engine<T>::generation() {
  return core_->communicator().lineage().generation;
}

template <class T>
Communicator<T>& Engine<T>::communicator() {
  return core_->communicator();
}

}  // namespace kolo
