// kolo/engine/handle.hpp — the result of an asynchronous collective: wait for it, poll it, read
// its output. Shared between the caller and the engine's progress thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

#include "kolo/core/error.hpp"
#include "kolo/core/tensor.hpp"

namespace kolo {

namespace detail {

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
};

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
  void wait() const {
    std::unique_lock lock(s_->mu);
    s_->cv.wait(lock, [&] { return s_->done; });
    if (s_->error) std::rethrow_exception(s_->error);
  }

  // Like wait(), but gives up after `seconds` with a TimeoutError (the operation goes on).
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
