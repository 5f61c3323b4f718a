// kolo/engine/handle.hpp — the result of an asynchronous collective: wait for it, poll it, read
// its output. Shared between the caller and the engine's progress thread.
//
// A training step submits every gradient, every step: the handles' shared states are reused
// (make_handle_state, StatePool), so a steady state allocates nothing and constructs nothing. A
// state returns to the pool when the last Handle referring to it goes, which may be after the
// Engine that made it has gone.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include "kolo/core/error.hpp"
#include "kolo/core/tensor.hpp"

namespace kolo {

namespace detail {

struct HandleState;

// The engine's progress, as a waiting thread sees it. A thread that waits for a handle runs the
// engine's cycles itself while no other thread is running them, instead of sleeping until the
// engine thread has run them: a step then costs no hand-off between threads (a wake-up of the
// engine thread, another of the waiter), which on a busy host is a scheduling delay each.
struct Driver {
  std::mutex mu;  // held by the thread that runs the engine's cycles (its own or a waiter)
  // Runs cycles on the calling thread (mu held) while they make progress and `h` is not done.
  // Set by the engine; cleared (under mu) once it has stopped.
  void (*run)(void* engine, HandleState& h) = nullptr;
  void* engine = nullptr;

  void help(HandleState& h);
};

// Completion is an atomic flag: marking a handle done, asking whether it is, and waiting for
// one that is take no lock. The mutex and condition variable serve only threads that sleep,
// counted in `waiters` (a thread announces itself, a sequentially consistent increment, before
// it checks `done`; the engine sets `done`, then a sequentially consistent fence, then checks
// `waiters`: one of them sees the other).
struct StateCache;

struct HandleState {
  std::atomic<int> refs{0};    // StateRef's count
  StateCache* home = nullptr;  // the cache of the thread that took it from the pool
  std::atomic<bool> done{false};
  std::atomic<int> waiters{0};
  std::mutex mu;
  std::condition_variable cv;
  std::exception_ptr error;  // written before `done`, read after it
  // Allgather: the engine allocates the output (ranks' counts are only known after negotiation).
  std::vector<std::byte> owned;
  std::vector<std::size_t> counts;
  TensorView output;

  void finish(std::exception_ptr e = nullptr) {
    mark(std::move(e));
    std::atomic_thread_fence(std::memory_order_seq_cst);
    notify();
  }
  // finish() in two halves: the engine marks every handle of a fused batch done first and wakes
  // their waiters afterwards. Waking each in turn let a waiting thread run between completions
  // (on a busy host it preempts the engine) and block again on the next handle, a context
  // switch per tensor.
  // `done` is a release store: the sequentially consistent fence that pairs it with the
  // waiters' count comes before notify(), once for a whole batch (a full barrier per handle
  // was the largest single cost of completing one).
  void mark(std::exception_ptr e = nullptr) {
    error = std::move(e);
    done.store(true, std::memory_order_release);
  }
  // Call after a std::atomic_thread_fence(seq_cst) that follows mark().
  void notify() {
    if (waiters.load() == 0) return;
    { std::lock_guard lock(mu); }  // a waiter between its check and its sleep finishes either
    cv.notify_all();
  }

  bool is_done() const { return done.load(std::memory_order_acquire); }

  // Sleeps until done, or until `until` (false then).
  template <class Until>
  bool sleep_until_done(const Until& until) {
    if (is_done()) return true;
    waiters.fetch_add(1);
    bool ok;
    {
      std::unique_lock lock(mu);
      ok = until(lock, [&] { return done.load(); });
    }
    waiters.fetch_sub(1);
    return ok;
  }

  // The engine that completes this handle (null: none to help, e.g. a join). A reused state keeps
  // the last one (a stopped engine's Driver has no engine): the engine sets it only when it
  // differs, which saves two atomic operations per submission in the steady state.
  std::shared_ptr<Driver> driver;
};

inline void Driver::help(HandleState& h) {
  if (h.is_done()) return;
  std::unique_lock lock(mu, std::try_to_lock);
  if (!lock.owns_lock() || engine == nullptr) return;  // the engine thread is at it, or gone
  run(engine, h);
}

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAsan = true;
#else
inline constexpr bool kAsan = false;
#endif
#else
inline constexpr bool kAsan = false;
#endif

// Handle states are reused, not destroyed: a state whose last reference goes is reset (the
// fields an operation wrote) and kept, with its mutex, condition variable and driver, for the
// next submission. A free list shared by every thread; never destroyed, since handles may
// outlive static destruction. It keeps at most kMaxFree states; more are deleted. Under ASan
// every state is new and deleted, so that a use after release is reported.
class StatePool {
 public:
  static constexpr std::size_t kMaxFree = 1u << 16;

  static StatePool& instance() {
    static StatePool* p = new StatePool;  // leaked on purpose (see above)
    return *p;
  }
  HandleState* get() {
    {
      std::lock_guard lock(mu_);
      if (!free_.empty()) {
        HandleState* h = free_.back();
        free_.pop_back();
        return h;
      }
    }
    return new HandleState;
  }
  void put(HandleState* h) noexcept {
    {
      std::lock_guard lock(mu_);
      if (free_.size() < kMaxFree) {
        try {
          free_.push_back(h);  // grows only while the number of live handles sets a new high
          return;
        } catch (...) {
        }
      }
    }
    delete h;
  }

 private:
  std::mutex mu_;
  std::vector<HandleState*> free_;
};

// Each thread keeps states of its own, so that the usual pattern — a thread submits a step's
// tensors, waits and drops their handles, step after step — takes no lock and no atomic
// operation beyond the reference counts; beyond kMax, and once the thread is ending, states go
// through the shared pool.
struct StateCache {
  static constexpr int kMax = 4096;
  HandleState* items[kMax];
  int n = 0;
  StateCache() { state() = 1; }
  ~StateCache() {
    state() = 2;
    while (n > 0) StatePool::instance().put(items[--n]);
  }
  static int& state() {  // this thread's cache: 0 not made yet, 1 alive, 2 destroyed
    static thread_local int s = 0;
    return s;
  }
  static StateCache* mine() {
    if (state() == 2) return nullptr;
    static thread_local StateCache c;
    return &c;
  }
};

inline HandleState* acquire_state() {
  if constexpr (kAsan) return new HandleState;
  StateCache* c = StateCache::mine();
  HandleState* h = c && c->n > 0 ? c->items[--c->n] : StatePool::instance().get();
  h->home = c;
  return h;
}

// The last reference went: no other thread can see `h` any more.
inline void release_state(HandleState* h) noexcept {
  if constexpr (kAsan) {
    delete h;
    return;
  }
  h->error = nullptr;
  if (h->owned.capacity() > 0) std::vector<std::byte>().swap(h->owned);  // an allgather's output
  if (h->counts.capacity() > 64) std::vector<std::size_t>().swap(h->counts);
  h->counts.clear();
  h->output = TensorView{};
  h->done.store(false, std::memory_order_relaxed);
  // Back to the cache of the thread that took it (the submitting thread, which takes the next
  // one): a state another thread releases last (the engine's, on a busy host) goes through the
  // pool, where the submitting thread finds it, instead of filling a cache it never takes from.
  StateCache* c = StateCache::mine();
  if (c && c == h->home && c->n < StateCache::kMax) {
    c->items[c->n++] = h;
    return;
  }
  StatePool::instance().put(h);
}

// A counted reference to a HandleState (as std::shared_ptr, without its control block and
// with reuse instead of destruction). Copies share the state; the last one to go releases it.
class StateRef {
 public:
  StateRef() = default;
  // A fresh state, not done, with this one reference.
  static StateRef make() {
    StateRef r;
    r.p_ = acquire_state();
    r.p_->refs.store(1, std::memory_order_relaxed);
    return r;
  }
  StateRef(const StateRef& o) noexcept : p_(o.p_) {
    if (p_) p_->refs.fetch_add(1, std::memory_order_relaxed);
  }
  StateRef(StateRef&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  StateRef& operator=(const StateRef& o) noexcept {
    StateRef(o).swap(*this);
    return *this;
  }
  StateRef& operator=(StateRef&& o) noexcept {
    StateRef(std::move(o)).swap(*this);
    return *this;
  }
  ~StateRef() { reset(); }

  // The last reference needs no read-modify-write: a count of 1 seen by its holder means no
  // other thread holds one, so none can change the count any more (the acquire load pairs with
  // the release half of the other holders' decrements). A training step's handles are dropped
  // by the caller after the engine dropped its reference: one atomic operation per handle less.
  void reset() noexcept {
    HandleState* p = p_;
    p_ = nullptr;
    if (p && (p->refs.load(std::memory_order_acquire) == 1 ||
              p->refs.fetch_sub(1, std::memory_order_acq_rel) == 1)) {
      release_state(p);
    }
  }
  void swap(StateRef& o) noexcept { std::swap(p_, o.p_); }
  // A second reference to a state that no other thread can see yet (just made): the count
  // changes without an atomic read-modify-write.
  StateRef share_unpublished() const {
    p_->refs.store(p_->refs.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    StateRef r;
    r.p_ = p_;
    return r;
  }

  HandleState* get() const noexcept { return p_; }
  HandleState* operator->() const noexcept { return p_; }
  HandleState& operator*() const noexcept { return *p_; }
  explicit operator bool() const noexcept { return p_ != nullptr; }

 private:
  HandleState* p_ = nullptr;
};

// A fresh handle state (from this thread's cache or the pool).
inline StateRef make_handle_state() {
  return StateRef::make();
}

}  // namespace detail

class Handle {
 public:
  Handle() = default;
  explicit Handle(detail::StateRef s) : s_(std::move(s)) {}

  bool valid() const { return static_cast<bool>(s_); }

  // True once the operation has finished (successfully or not); never blocks.
  bool ready() const { return s_->is_done(); }

  // Blocks until the operation finishes; rethrows its error (MismatchError, PeerLostError, ...).
  // While no other thread is running the engine's cycles, this thread runs them.
  void wait() const {
    if (s_->driver && !s_->is_done()) s_->driver->help(*s_);
    s_->sleep_until_done([&](std::unique_lock<std::mutex>& lock, auto pred) {
      s_->cv.wait(lock, pred);
      return true;
    });
    if (s_->error) std::rethrow_exception(s_->error);
  }

  // Like wait(), but gives up after `seconds` with a TimeoutError (the operation goes on). It
  // leaves the engine's cycles to the engine thread (a cycle may block longer than `seconds`).
  void wait_for(double seconds) const {
    const bool done = s_->sleep_until_done([&](std::unique_lock<std::mutex>& lock, auto pred) {
      return s_->cv.wait_for(lock, std::chrono::duration<double>(seconds), pred);
    });
    if (!done) throw TimeoutError("operation not finished after " + std::to_string(seconds) + " s");
    if (s_->error) std::rethrow_exception(s_->error);
  }

  // The result: the output tensor (allreduce/broadcast: the caller's own buffer; allgather: a
  // buffer owned by the handle, every rank's contribution in rank order).
  TensorView output() const {
    wait();
    return s_->output;
  }
  // Allgather: elements contributed by each rank.
  const std::vector<std::size_t>& counts() const {
    wait();
    return s_->counts;
  }

 private:
  detail::StateRef s_;
};

}  // namespace kolo
