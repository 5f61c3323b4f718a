// kolo/engine/handle.hpp — the result of an asynchronous collective: wait for it, poll it, read
// its output. Shared between the caller and the engine's progress thread.
//
// A training step submits every gradient, every step: the handles' shared state comes from a
// process-wide pool of blocks (make_handle_state), so a steady state allocates nothing. A block
// returns to the pool when the last Handle referring to it goes, which may be after the Engine
// that made it has gone.
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
// counted in `waiters` (a thread announces itself before it checks `done`, the engine checks
// `waiters` after it sets `done`, both sequentially consistent: one of them sees the other).
struct HandleState {
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
    notify();
  }
  // finish() in two halves: the engine marks every handle of a fused batch done first and wakes
  // their waiters afterwards. Waking each in turn let a waiting thread run between completions
  // (on a busy host it preempts the engine) and block again on the next handle, a context
  // switch per tensor.
  void mark(std::exception_ptr e = nullptr) {
    error = std::move(e);
    done.store(true);
  }
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

  // The engine that completes this handle (null: none to help, e.g. a join).
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

// A free list of equal-sized blocks, shared by every thread (allocation on the submitting thread,
// release on whichever thread drops the last reference). It keeps at most kMaxFree blocks; more
// go back to the heap. Never destroyed: handles may outlive static destruction.
class BlockPool {
 public:
  static constexpr std::size_t kMaxFree = 1u << 16;

  explicit BlockPool(std::size_t bytes) : bytes_(bytes) {}

  void* get() {
    {
      std::lock_guard lock(mu_);
      if (!free_.empty()) {
        void* p = free_.back();
        free_.pop_back();
        return p;
      }
    }
    return ::operator new(bytes_);
  }

  void put(void* p) noexcept {
    {
      std::lock_guard lock(mu_);
      if (free_.size() < kMaxFree) {
        try {
          free_.push_back(p);  // grows only while the number of live handles sets a new high
          return;
        } catch (...) {
        }
      }
    }
    ::operator delete(p);
  }

 private:
  std::size_t bytes_;
  std::mutex mu_;
  std::vector<void*> free_;
};

// The allocator allocate_shared uses for HandleState: single objects of one type (the control
// block with the state inside) come from a pool of that size; anything else from the heap.
// Under AddressSanitizer blocks are not recycled, so that a use after release is still caught.
template <class T>
struct PoolAllocator {
  using value_type = T;
  PoolAllocator() = default;
  template <class U>
  PoolAllocator(const PoolAllocator<U>&) noexcept {}

  static BlockPool& pool() {
    static BlockPool* p = new BlockPool(sizeof(T));  // leaked on purpose (see BlockPool)
    return *p;
  }
  static constexpr bool pooled() {
    return !kAsan && alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__;
  }

  // Each thread keeps a few blocks of its own, so that the usual pattern — a thread submits,
  // waits and drops its handles, step after step — takes no lock at all; beyond those, and
  // once the thread is ending, blocks go through the shared pool.
  struct Cache {
    static constexpr int kMax = 256;
    void* blocks[kMax];
    int n = 0;
    Cache() { state() = 1; }
    ~Cache() {
      state() = 2;
      while (n > 0) pool().put(blocks[--n]);
    }
  };
  static int& state() {  // this thread's cache: 0 not made yet, 1 alive, 2 destroyed
    static thread_local int s = 0;
    return s;
  }
  static Cache* cache() {
    if (state() == 2) return nullptr;
    static thread_local Cache c;
    return &c;
  }

  T* allocate(std::size_t n) {
    if (n == 1 && pooled()) {
      Cache* c = cache();
      if (c && c->n > 0) return static_cast<T*>(c->blocks[--c->n]);
      return static_cast<T*>(pool().get());
    }
    return std::allocator<T>().allocate(n);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (n == 1 && pooled()) {
      Cache* c = cache();
      if (c && c->n < Cache::kMax) {
        c->blocks[c->n++] = p;
        return;
      }
      pool().put(p);
      return;
    }
    std::allocator<T>().deallocate(p, n);
  }
  template <class U>
  friend bool operator==(const PoolAllocator&, const PoolAllocator<U>&) noexcept {
    return true;
  }
};

// A fresh handle state from the pool.
inline std::shared_ptr<HandleState> make_handle_state() {
  return std::allocate_shared<HandleState>(PoolAllocator<HandleState>());
}

}  // namespace detail

class Handle {
 public:
  Handle() = default;
  explicit Handle(std::shared_ptr<detail::HandleState> s) : s_(std::move(s)) {}

  bool valid() const { return s_ != nullptr; }

  // True once the operation has finished (successfully or not); never blocks.
  bool ready() const { return s_->is_done(); }

  // Blocks until the operation finishes; rethrows its error (MismatchError, PeerLostError, ...).
  // While no other thread is running the engine's cycles, this thread runs them.
  void wait() const {
    if (s_->driver) s_->driver->help(*s_);
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
  std::shared_ptr<detail::HandleState> s_;
};

}  // namespace kolo
