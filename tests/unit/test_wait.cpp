// The one wait policy (core/wait.hpp): the spin ends at its budget and yields while it spins,
// the yield cadence and the spin budget learn as the mesh's always did, sleeps double up to
// their cap and never run past the deadline, and Backoff goes spin -> yields -> sleeps.
#include <doctest/doctest.h>

#include <chrono>

#include "kolo/core/deadline.hpp"
#include "kolo/core/wait.hpp"

using namespace std::chrono_literals;
namespace kw = kolo::wait;

TEST_CASE("wait: a spin checks until its budget is spent, and a zero budget checks nothing") {
  kw::YieldCadence cadence(4);
  int checks = 0;
  const auto t0 = kolo::Clock::now();
  kw::Spin spin(200us, cadence);
  while (spin.next()) ++checks;
  CHECK(kolo::Clock::now() - t0 >= 200us);
  CHECK(checks > 0);
  kw::Spin none(0us, cadence);
  CHECK_FALSE(none.next());
  int asked = 0;
  CHECK_FALSE(kw::spin_until([&] { return ++asked > 1000000000; }, 0us, cadence));
  CHECK(asked == 1);  // a zero budget still looks once
  asked = 0;
  CHECK(kw::spin_until([&] { return ++asked == 3; }, 10s, cadence));
  CHECK(asked == 3);
}

TEST_CASE("wait: the yield cadence drops to every check after a late yield and doubles back") {
  kw::YieldCadence c(1024);
  CHECK(c.every == 1024);
  c.after_yield(true);
  CHECK(c.every == 1);
  c.after_yield(false);
  CHECK(c.every == 2);
  for (int i = 0; i < 20; ++i) c.after_yield(false);
  CHECK(c.every == 1024);
  kw::YieldCadence one(0);  // at least one check between yields
  CHECK(one.max == 1);
}

TEST_CASE("wait: the spin budget starts at its cap, doubles short waits, halves long ones") {
  kw::SpinBudget b;
  b.set(50, 1000);
  CHECK(b.adaptive());
  CHECK(b.ns() == doctest::Approx(1000000));
  b.learn(2000000);  // longer than the cap: halve
  CHECK(b.ns() == doctest::Approx(500000));
  for (int i = 0; i < 20; ++i) b.learn(5000000);
  CHECK(b.ns() == doctest::Approx(50000));  // the floor
  b.learn(300000);                          // slept but within the cap: twice that wait
  CHECK(b.ns() == doctest::Approx(600000));
  b.learn(900000);
  CHECK(b.ns() == doctest::Approx(1000000));  // capped
  kw::SpinBudget fixed;
  fixed.set(50, 1000, 7);
  CHECK_FALSE(fixed.adaptive());
  fixed.learn(1);
  CHECK(fixed.ns() == doctest::Approx(7000));
}

TEST_CASE("wait: sleeps never run past the deadline, and Backoff ends in sleeps") {
  const auto dl = kolo::Deadline::after(0.002);
  kw::Sleeper s(100ms, 100ms);
  const auto t0 = kolo::Clock::now();
  s.sleep(&dl);
  CHECK(kolo::Clock::now() - t0 < 90ms);
  kw::Backoff b({.spin = 50us, .yield_for = 50us, .max_sleep = 40us});
  int pauses = 0;
  const auto t1 = kolo::Clock::now();
  while (kolo::Clock::now() - t1 < 3ms) {
    b.pause();
    ++pauses;
  }
  CHECK(pauses > 0);
  CHECK(pauses < 3000000);  // it sleeps in the end, it does not spin for 3 ms
}
