// The mesh's wait policy (transport/mesh/poll_loop.hpp), in process: a fake engine whose one
// operation completes at a set time stands in for MeshTransport. The checks are on what the
// policy decides (the spin budget it learns, the hooks it calls), never on how long a wait took:
// every wait here is built to be longer than the cap (it must outlast a 200 ms poll round) or to
// be answered while spinning within a budget of a second.
#include <doctest/doctest.h>
#include <poll.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kolo/core/deadline.hpp"
#include "kolo/core/error.hpp"
#include "kolo/transport/mesh/poll_loop.hpp"

namespace {

using kolo::Clock;
using kolo::Deadline;
using kolo::detail::PollLoop;
using kolo::detail::WaitPolicy;

// One operation that completes once the clock passes `ready`.
struct FakeEngine {
  Clock::time_point ready;
  std::uint64_t done = 0;
  int still_waiting_calls = 0;
  int noted_cpu = -2;

  explicit FakeEngine(std::chrono::microseconds after) : ready(Clock::now() + after) {}

  void progress() {
    if (done == 0 && Clock::now() >= ready) done = 1;
  }
  std::uint64_t completions() const { return done; }
  std::size_t pending() const { return done == 0 ? 1 : 0; }
  kolo::detail::Doorbell* doorbell() { return nullptr; }
  void watch(std::vector<pollfd>&) const {}
  void woken(const std::vector<pollfd>&) {}
  void note_cpu(int cpu) { noted_cpu = cpu; }
  bool lower_peer_on_cpu(int) const { return false; }
  void still_waiting() { ++still_waiting_calls; }
  [[noreturn]] void timed_out() { throw kolo::TimeoutError("fake engine timed out"); }
};

WaitPolicy adaptive(double min_us, double max_us) {
  WaitPolicy p;
  p.min_us = min_us;
  p.max_us = max_us;
  p.yield_every = 1;
  return p;
}

}  // namespace

TEST_CASE("wait policy: the adaptive budget starts at the cap") {
  PollLoop loop;
  loop.set_policy(adaptive(50, 1000));
  CHECK(loop.spin_us() == 1000);
}

TEST_CASE("wait policy: a wait longer than the cap halves the budget, down to the floor") {
  PollLoop loop;
  loop.set_policy(adaptive(50, 1000));
  const double expect[] = {500, 250, 125, 62.5, 50, 50};
  for (double want : expect) {
    FakeEngine e(std::chrono::milliseconds(5));  // > cap: spins 1 ms at most, then sleeps
    loop.block(e, Deadline::after(10));
    CHECK(e.done == 1);
    CHECK(loop.spin_us() == want);
  }
}

TEST_CASE("wait policy: a wait answered while spinning leaves the budget as it is") {
  PollLoop loop;
  loop.set_policy(adaptive(50, 1e6));  // a budget of one second: the wait ends inside it
  FakeEngine e(std::chrono::microseconds(200));
  loop.block(e, Deadline::after(10));
  CHECK(e.done == 1);
  CHECK(loop.spin_us() == 1e6);
}

TEST_CASE("wait policy: KOLO_SPIN_US's fixed budget is not learned") {
  PollLoop loop;
  WaitPolicy p;
  p.fixed_us = 20;
  loop.set_policy(p);
  FakeEngine e(std::chrono::milliseconds(5));
  loop.block(e, Deadline::after(10));
  CHECK(e.done == 1);
  CHECK(loop.spin_us() == 20);
}

TEST_CASE("wait policy: a sleeping rank reports that it still waits, and the deadline ends it") {
  PollLoop loop;
  loop.set_policy(adaptive(0, 10));
  FakeEngine e(std::chrono::seconds(30));  // never within the deadline
  CHECK_THROWS_AS(loop.block(e, Deadline::after(0.5)), kolo::TimeoutError);
  CHECK(e.done == 0);
  CHECK(e.still_waiting_calls >= 1);  // each 200 ms poll round that brings nothing
}

TEST_CASE("wait policy: the CPU a rank spins on is published only when spreading") {
  PollLoop loop;
  WaitPolicy p = adaptive(0, 1e6);
  loop.set_policy(p);
  FakeEngine quiet(std::chrono::microseconds(100));
  loop.block(quiet, Deadline::after(10));
  CHECK(quiet.noted_cpu == -2);
  p.spread = true;
  loop.set_policy(p);
  FakeEngine spreading(std::chrono::microseconds(100));
  loop.block(spreading, Deadline::after(10));
  CHECK(spreading.noted_cpu >= 0);
}

TEST_CASE("wait policy: nothing outstanding returns at once") {
  PollLoop loop;
  loop.set_policy(adaptive(50, 1000));
  FakeEngine e(std::chrono::microseconds(0));
  e.done = 1;
  loop.block(e, Deadline::after(10));
  CHECK(loop.spin_us() == 1000);
}
