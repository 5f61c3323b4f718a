// kolo/transport/mesh/poll_loop.hpp — the one place a mesh rank waits.
//
// Progress is made by the thread that waits (no progress thread). When a wait cannot be answered
// at once, the loop first spins: cheap re-checks of the shared-memory flags while the peer is
// likely running right now, for spin_us (50 µs while every local rank has a core, 2 µs when
// ranks outnumber cores: spinning then steals the core the peer needs to produce the data), with
// a sched_yield every 1024 checks. Then it sleeps in one poll() on everything that can bring
// progress, whatever the route: this rank's doorbell (local peers ring it, doorbell.hpp), its
// local peers' pidfds (readable when a peer dies), and its TCP sockets (readable, or writable
// when a send is stalled). One wait for all of them is why the mesh is one engine and not a
// shared-memory transport composed with a TCP one: two transports would block in two primitives
// and one of them would always be late. The sleep is capped at 200 ms, and the deadline ends the
// wait with the engine's TimeoutError.
//
// The loop owns only the waiting; what counts as progress and what to wait on is the engine's:
//   e.progress()         non-blocking progress on every peer (throws the engine's error)
//   e.completions()      operations completed so far; e.pending(): operations outstanding
//   e.doorbell()         this rank's Doorbell, or nullptr without local peers
//   e.watch(fds)         appends the pollfds to sleep on besides the doorbell
//   e.woken(fds)         after poll(): acts on their revents (a dead peer's pidfd, say)
//   e.timed_out()        [[noreturn]]: the deadline passed
// A different waiting strategy (a futex or eventfd doorbell, a busier or lazier spin) changes
// this file and doorbell.hpp, nothing else.
#pragma once

#include <poll.h>
#include <sched.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <vector>

#include "kolo/core/deadline.hpp"
#include "kolo/core/error.hpp"
#include "kolo/net/socket.hpp"
#include "kolo/transport/mesh/doorbell.hpp"

namespace kolo::detail {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();  // the builtin: <immintrin.h> alone costs ~0.6 s of compile time
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class PollLoop {
 public:
  // How long to spin before sleeping.
  void set_spin_us(double us) { spin_us_ = us; }
  double spin_us() const { return spin_us_; }

  // Returns once an operation of `e` has completed since the call, or at once when nothing is
  // outstanding; e.timed_out() when the deadline passes first.
  template <class Engine>
  void block(Engine& e, const Deadline& dl) {
    const std::uint64_t before = e.completions();
    e.progress();
    if (e.completions() != before || e.pending() == 0) return;
    // Spin: cheap polling of shared-memory flags while the peer is likely running right now.
    const auto spin_until =
        Clock::now() + std::chrono::nanoseconds(static_cast<long long>(spin_us_ * 1000));
    // One pause per check: on current x86 a pause is ~140 cycles, so a longer pause burst is
    // pure added latency once the peer's store lands.
    int iter = 0;
    while (Clock::now() < spin_until) {
      cpu_relax();
      e.progress();
      if (e.completions() != before) return;
      if (++iter % 1024 == 0) ::sched_yield();
    }
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

 private:
  double spin_us_ = 0;
  std::vector<pollfd> fds_;
};

}  // namespace kolo::detail
