// kolo/core/wait.hpp — the one wait policy of kolo: how a thread waits for what another thread,
// process or device does, in every transport and backend (the mesh's PollLoop, the MPI
// transports, the CUDA and NCCL waits, the torch backend's work).
//
// A wait first spins: cheap re-checks while the other side is likely running right now, one
// pause instruction per check, and never without yielding the core — sched_yield at most every
// `yield_every` checks and at least every 20 µs (kYieldAfter; a check may be a system call). A
// yield that returns late (> 5 µs, kBusyYield) handed the core to another task, typically the one
// waited for: from then on the spinner yields at every check, and a prompt yield doubles the
// interval again, back to yield_every (YieldCadence, learned across waits). Then it blocks: in
// poll() on a file descriptor where there is one (the mesh, mesh/poll_loop.hpp), else in sleeps
// that start at 20 µs and double up to a cap (Sleeper), never past the wait's deadline. How long
// to spin can be learned too (SpinBudget): a wait that slept but ended within the cap raises the
// budget to twice that wait, a longer one halves it, down to a floor.
//
//   wait::YieldCadence cadence;                       // per waiting thread, kept across waits
//   wait::Spin spin(budget, cadence);
//   while (spin.next()) { if (done()) return; }       // the spin
//   wait::Sleeper sleeper;                            // then block
//   while (!done()) sleeper.sleep(&deadline);
//
// or, for waits with nothing to block on, both in one object called once per failed check:
//   wait::Backoff b({.spin = 50us});  while (!done()) b.pause(&deadline);
//
// The constants are the mesh's (the fast path, tuned on 2-core VMs with up to 8 ranks:
// docs/performance.md, "Waiting").
#pragma once

#include <sched.h>
#include <time.h>

#include <algorithm>
#include <chrono>

#include "kolo/core/deadline.hpp"

namespace kolo::wait {

using namespace std::chrono_literals;

// One spin-wait hint to the CPU (x86 pause: ~140 cycles; arm yield).
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();  // the builtin: <immintrin.h> alone costs ~0.6 s of compile time
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// A spinning thread offers its core at least this often, however long its checks take.
inline constexpr std::chrono::microseconds kYieldAfter{20};
// A sched_yield that returns later than this handed the core to another task.
inline constexpr std::chrono::microseconds kBusyYield{5};
// Sleeps without a descriptor to block on start at this and double up to their cap.
inline constexpr std::chrono::microseconds kFirstSleep{20};
inline constexpr std::chrono::microseconds kMaxSleep{1000};

// How many checks a spinning thread makes between two yields, learned across its waits.
struct YieldCadence {
  int max = 1024;    // at most (KOLO_YIELD_EVERY; 1: yield at every check)
  int every = 1024;  // now: 1 .. max

  explicit YieldCadence(int max_checks = 1024) { set_max(max_checks); }
  void set_max(int m) {
    max = std::max(1, m);
    every = max;
  }
  // After a yield: a late one hands the core on at every check from now on, a prompt one
  // doubles the interval, up to max.
  void after_yield(bool late) { every = late ? 1 : std::min(max, 2 * every); }
};

// The spin phase of one wait: call next() before each check; it pauses, yields when the cadence
// says so, and returns false once the budget is spent. A yield that returned late calls
// on_late() (after the cadence has noted it; the mesh moves off a shared core there).
class Spin {
 public:
  Spin(Clock::duration budget, YieldCadence& cadence)
      : t0_(Clock::now()), now_(t0_), end_(t0_ + budget), last_yield_(t0_), cadence_(cadence) {}

  template <class OnLate>
  bool next(OnLate&& on_late) {
    if (started_) {
      if (++iter_ >= cadence_.every || now_ - last_yield_ >= kYieldAfter) {
        iter_ = 0;
        ::sched_yield();
        const auto after = Clock::now();
        const bool late = after - now_ > kBusyYield;
        cadence_.after_yield(late);
        if (late) on_late();
        // The clock read after the yield serves the budget too: with more ranks than cores every
        // check yields, and a second read per check was half of the clock reads that perf put
        // at about 5 % of a waiting rank's time.
        now_ = after;
        last_yield_ = after;
      } else {
        now_ = Clock::now();
      }
    }
    started_ = true;
    if (now_ >= end_) return false;
    cpu_relax();
    return true;
  }
  bool next() {
    return next([] {});
  }

  // When the wait began (the spin's start).
  Clock::time_point start() const { return t0_; }

 private:
  Clock::time_point t0_, now_, end_, last_yield_;
  YieldCadence& cadence_;
  int iter_ = 0;
  bool started_ = false;
};

// Spins up to `budget` until pred() holds; true if it did (pred() is asked once more at the end).
template <class Pred>
bool spin_until(Pred&& pred, Clock::duration budget, YieldCadence& cadence) {
  Spin spin(budget, cadence);
  while (spin.next()) {
    if (pred()) return true;
  }
  return pred();
}

// The spin budget, learned from the waits that went on to block (or fixed).
class SpinBudget {
 public:
  // Adaptive between min_us and max_us, starting at max_us; fixed_us >= 0: fixed, no learning.
  void set(double min_us, double max_us, double fixed_us = -1) {
    min_ns_ = min_us * 1000;
    max_ns_ = std::max(max_us, min_us) * 1000;
    fixed_ = fixed_us >= 0;
    ns_ = fixed_ ? fixed_us * 1000 : max_ns_;
  }
  bool adaptive() const { return !fixed_; }
  double ns() const { return ns_; }
  Clock::duration budget() const {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::nanoseconds(static_cast<long long>(ns_)));
  }
  // A wait that spun the whole budget and blocked, `ns` long in all: one that ended within the
  // cap raises the budget to twice its length (spinning would have answered it without a
  // wake-up), a longer one halves the budget, down to the floor.
  void learn(double ns) {
    if (fixed_) return;
    if (ns <= max_ns_) {
      ns_ = std::min(max_ns_, std::max(ns_, 2 * ns));
    } else {
      ns_ = std::max(min_ns_, ns_ / 2);
    }
  }

 private:
  double min_ns_ = 50000, max_ns_ = 1000000, ns_ = 50000;
  bool fixed_ = false;
};

// Blocking without a descriptor: sleeps that start at `first` and double up to `cap`, never
// past the deadline when one is given.
class Sleeper {
 public:
  explicit Sleeper(std::chrono::nanoseconds first = kFirstSleep,
                   std::chrono::nanoseconds cap = kMaxSleep)
      : step_(first), cap_(std::max(first, cap)) {}

  void sleep(const Deadline* dl = nullptr) {
    auto d = step_;
    if (dl) {
      const auto left =
          std::chrono::duration_cast<std::chrono::nanoseconds>(dl->time() - Clock::now());
      d = std::max(std::chrono::nanoseconds(0), std::min(d, left));
    }
    timespec ts{static_cast<time_t>(d.count() / 1000000000),
                static_cast<long>(d.count() % 1000000000)};
    ::nanosleep(&ts, nullptr);
    step_ = std::min(cap_, 2 * step_);
  }

 private:
  std::chrono::nanoseconds step_, cap_;
};

// A whole wait with nothing to block on, one pause() per failed check: the spin (pauses and
// yields, `spin` long), then `yield_for` of yielding at every check, then the Sleeper's sleeps.
struct BackoffPolicy {
  std::chrono::nanoseconds spin = 50us;
  int yield_every = 1024;  // checks between yields while spinning (1: every check)
  std::chrono::nanoseconds yield_for = 0us;
  std::chrono::nanoseconds first_sleep = kFirstSleep;
  std::chrono::nanoseconds max_sleep = kMaxSleep;
};

class Backoff {
 public:
  explicit Backoff(const BackoffPolicy& p = {})
      : cadence_(p.yield_every),
        spin_(std::chrono::duration_cast<Clock::duration>(p.spin), cadence_),
        yield_end_(spin_.start() + std::chrono::duration_cast<Clock::duration>(p.spin) +
                   std::chrono::duration_cast<Clock::duration>(p.yield_for)),
        sleeper_(p.first_sleep, p.max_sleep) {}

  // After a check that found nothing.
  void pause(const Deadline* dl = nullptr) {
    if (spinning_ && spin_.next()) return;
    spinning_ = false;
    if (Clock::now() < yield_end_) {
      ::sched_yield();
      return;
    }
    sleeper_.sleep(dl);
  }

 private:
  YieldCadence cadence_;
  Spin spin_;
  Clock::time_point yield_end_;
  Sleeper sleeper_;
  bool spinning_ = true;
};

}  // namespace kolo::wait
