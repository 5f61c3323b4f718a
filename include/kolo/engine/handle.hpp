// kolo/engine/handle.hpp — the result of an asynchronous collective: wait for it, poll it, read
// its output. Shared between the caller and the engine's progress thread.
//
// A training step submits every gradient, every step: the handles' shared state comes from a
// process-wide pool of blocks (make_handle_state), so a steady state allocates nothing. A block
// returns to the pool when the last Handle referring to it goes, which may be after the Engine
// that made it has gone.
#pragma once

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

struct HandleState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
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
    std::lock_guard lock(mu);
    done = true;
    error = std::move(e);
  }
  void notify() { cv.notify_all(); }

  bool is_done() {
    std::lock_guard lock(mu);
    return done;
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

  T* allocate(std::size_t n) {
    if (n == 1 && pooled()) return static_cast<T*>(pool().get());
    return std::allocator<T>().allocate(n);
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (n == 1 && pooled()) {
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
  bool ready() const {
    std::lock_guard lock(s_->mu);
    return s_->done;
  }

  // Blocks until the operation finishes; rethrows its error (MismatchError, PeerLostError, ...).
  // While no other thread is running the engine's cycles, this thread runs them.
  void wait() const {
    if (s_->driver) s_->driver->help(*s_);
    std::unique_lock lock(s_->mu);
    s_->cv.wait(lock, [&] { return s_->done; });
    if (s_->error) std::rethrow_exception(s_->error);
  }

  // Like wait(), but gives up after `seconds` with a TimeoutError (the operation goes on). It
  // leaves the engine's cycles to the engine thread (a cycle may block longer than `seconds`).
  void wait_for(double seconds) const {
    std::unique_lock lock(s_->mu);
    if (!s_->cv.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return s_->done; })) {
      throw TimeoutError("operation not finished after " + std::to_string(seconds) + " s");
    }
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
