// kolo/transport/mesh/poll_loop.hpp — the one place a mesh rank waits.
//
// Progress is made by the thread that waits (no progress thread). When a wait cannot be answered
// at once, the loop first spins: cheap re-checks of the shared-memory flags while the peer is
// likely running right now. Then it sleeps in one poll() on everything that can bring progress,
// whatever the route: this rank's doorbell (local peers ring it, doorbell.hpp), its local peers'
// pidfds (readable when a peer dies), and its TCP sockets (readable, or writable when a send is
// stalled). One wait for all of them is why the mesh is one engine and not a shared-memory
// transport composed with a TCP one: two transports would block in two primitives and one of
// them would always be late. The sleep is capped at 200 ms, and the deadline ends the wait with
// the engine's TimeoutError.
//
// The wait policy (WaitPolicy; docs/performance.md, "Waiting"):
//   - The spin budget adapts to the waits this rank has seen. It starts at the cap
//     (KOLO_SPIN_MAX_US), so the first operations of a job are not slowed by a guess. A wait
//     that went to sleep but ended within the cap raises the budget to twice that wait: spinning
//     would have answered it without a wake-up, and a wake-up here costs 50-100 µs, longer than
//     the old fixed 50 µs window, so once one rank slept its peer slept too, operation after
//     operation. A wait longer than the cap halves the budget, down to the floor
//     (KOLO_SPIN_MIN_US): spinning through waits that long (a peer computing) only burns a core.
//   - Spinning yields the core, and how often is learned too. At most every yield_every checks
//     (KOLO_YIELD_EVERY: 1024 while every local rank has a core, 1 when local ranks outnumber
//     cores), and at least every 20 µs of spinning (wait::kYieldAfter: a check that polls a TCP
//     socket is a system call, so 1024 of them can take milliseconds). A sched_yield that
//     returns late (> 5 µs) means another task ran on this core,
//     typically the peer we wait for, which the scheduler's wake-up placement put on our core:
//     from then on the rank yields at every check, so each check hands the core over (2 µs a
//     round trip instead of 50 µs: 1024 checks between yields). A prompt yield doubles the
//     interval again, back to yield_every.
//   - Two ranks on one core (the scheduler's wake-up placement puts a woken rank next to the one
//     that woke it, and on a busy host the load balancer sees no reason to part them) can only
//     take turns. Each spinning rank publishes its CPU (sched_getcpu) in its control block; after
//     a late yield, a rank that finds a lower-ranked local peer on its CPU moves itself to another
//     CPU of its affinity mask (set the mask without this CPU, then back: the thread is not
//     pinned). Only while ranks <= cores (KOLO_WAIT_SPREAD).
//   - KOLO_SPIN_US sets a fixed budget instead (no learning).
//
// The loop owns only the waiting; what counts as progress and what to wait on is the engine's:
//   e.progress()         non-blocking progress on every peer (throws the engine's error)
//   e.completions()      operations completed so far; e.pending(): operations outstanding
//   e.doorbell()         this rank's Doorbell, or nullptr without local peers
//   e.watch(fds)         appends the pollfds to sleep on besides the doorbell
//   e.woken(fds)         after poll(): acts on their revents (a dead peer's pidfd, say)
//   e.note_cpu(c)        publishes the CPU this rank spins on; e.lower_peer_on_cpu(c): whether a
//                        lower-ranked local peer spins on CPU c
//   e.still_waiting()    after each wake from poll() that brought no completion
//   e.timed_out()        [[noreturn]]: the deadline passed
// A different waiting strategy changes core/wait.hpp (the spin, shared with every other wait of
// kolo), or this file and doorbell.hpp (a futex or eventfd doorbell), nothing else.
#pragma once

#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <vector>

#include "kolo/core/deadline.hpp"
#include "kolo/core/error.hpp"
#include "kolo/core/wait.hpp"
#include "kolo/net/socket.hpp"
#include "kolo/transport/mesh/doorbell.hpp"

namespace kolo::detail {

// How a waiting rank spins before it sleeps; see the top of this file.
struct WaitPolicy {
  double min_us = 50;      // floor of the adaptive budget
  double max_us = 1000;    // cap and starting value of the adaptive budget
  double fixed_us = -1;    // >= 0: a fixed budget, no learning (KOLO_SPIN_US)
  int yield_every = 1024;  // checks between two sched_yield calls while spinning
  bool spread = false;     // move off a core that a local peer spins on (KOLO_WAIT_SPREAD)

  bool adaptive() const { return fixed_us < 0; }
};

class PollLoop {
 public:
  void set_policy(const WaitPolicy& p) {
    policy_ = p;
    if (policy_.max_us < policy_.min_us) policy_.max_us = policy_.min_us;
    if (policy_.yield_every < 1) policy_.yield_every = 1;
    budget_.set(policy_.min_us, policy_.max_us, p.fixed_us);
    cadence_.set_max(policy_.yield_every);
  }
  const WaitPolicy& policy() const { return policy_; }
  // The spin budget the next wait starts with, in microseconds.
  double spin_us() const { return budget_.ns() / 1000; }

  // Returns once an operation of `e` has completed since the call, or at once when nothing is
  // outstanding; e.timed_out() when the deadline passes first.
  template <class Engine>
  void block(Engine& e, const Deadline& dl) {
    const std::uint64_t before = e.completions();
    e.progress();
    if (e.completions() != before || e.pending() == 0) return;
    // Spin: cheap polling of shared-memory flags while the peer is likely running right now
    // (core/wait.hpp: one pause per check, a yield at least every 20 us and at most every
    // yield_every checks, at every check after a late yield). A check that polls a TCP socket
    // is a system call, so the clock bounds the interval between yields, not only the count.
    wait::Spin spin(budget_.budget(), cadence_);
    bool moved = false;
    if (policy_.spread) e.note_cpu(::sched_getcpu());
    // A late yield: another task ran on this core, likely the peer we wait for. With spread,
    // once per wait, a rank that finds a lower-ranked local peer on its CPU moves off it.
    auto on_late = [&] {
      if (policy_.spread && !moved) {
        moved = true;
        const int cpu = ::sched_getcpu();
        if (e.lower_peer_on_cpu(cpu) && move_off(cpu)) {
          e.note_cpu(::sched_getcpu());
          cadence_.every = policy_.yield_every;
        }
      }
    };
    while (spin.next(on_late)) {
      e.progress();
      if (e.completions() != before) return;
    }
    sleep_until_progress(e, dl, before);
    if (budget_.adaptive()) {
      budget_.learn(std::chrono::duration<double, std::nano>(Clock::now() - spin.start()).count());
    }
  }

 private:
  // Moves the calling thread off `cpu` to another CPU its affinity mask allows, and gives the
  // mask back as it was: the thread stays where it landed until the scheduler moves it again.
  static bool move_off(int cpu) {
    if (cpu < 0 || cpu >= CPU_SETSIZE) return false;
    cpu_set_t mask;
    CPU_ZERO(&mask);
    if (::sched_getaffinity(0, sizeof(mask), &mask) != 0) return false;
    if (!CPU_ISSET(cpu, &mask) || CPU_COUNT(&mask) < 2) return false;
    cpu_set_t others = mask;
    CPU_CLR(cpu, &others);
    if (::sched_setaffinity(0, sizeof(others), &others) != 0) return false;
    [[maybe_unused]] const int rc = ::sched_setaffinity(0, sizeof(mask), &mask);
    return true;
  }

  template <class Engine>
  void sleep_until_progress(Engine& e, const Deadline& dl, std::uint64_t before) {
    Doorbell* bell = e.doorbell();
    for (;;) {
      if (dl.expired()) e.timed_out();
      if (bell) bell->arm();
      e.progress();
      if (e.completions() != before) {
        if (bell) bell->disarm();
        return;
      }
      fds_.clear();
      if (bell) fds_.push_back({bell->fd(), POLLIN, 0});
      e.watch(fds_);
      const int rc = ::poll(fds_.data(), fds_.size(), dl.remaining_ms(200));
      if (bell) bell->disarm();
      if (rc < 0 && errno != EINTR) throw Error("poll failed: " + net::errno_text(errno));
      if (bell) bell->drain();
      e.woken(fds_);
      e.progress();
      if (e.completions() != before) return;
      e.still_waiting();  // a long wait is noted where the other ranks see it (mesh.hpp)
    }
  }

  WaitPolicy policy_;
  wait::SpinBudget budget_;     // the spin budget, learned (or fixed: KOLO_SPIN_US)
  wait::YieldCadence cadence_;  // checks between yields now: 1 .. policy_.yield_every
  std::vector<pollfd> fds_;
};

}  // namespace kolo::detail
