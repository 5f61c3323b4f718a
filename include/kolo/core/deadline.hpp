// kolo/core/deadline.hpp — absolute deadlines, so every wait in kolo is bounded.
#pragma once

#include <algorithm>
#include <chrono>

namespace kolo {

using Clock = std::chrono::steady_clock;

// A point in time that waits give up at. after() reads the clock at once; lazy() only when the
// deadline is first asked about (time, expired, remaining_*, earlier). Every collective carries
// a lazy one: most complete before they would ever wait, so it costs them no clock read (on a VM
// a clock read was a quarter of a small allreduce's time), and its countdown starts at its first
// question, the collective's first sleep: later than the call by the time the call spent
// spinning and computing before it, never earlier. A lazy deadline is written by its first
// question: not for sharing between threads before that.
class Deadline {
 public:
  // A deadline `seconds` from now; a non-positive or huge value still terminates (clamped).
  static Deadline after(double seconds) {
    Deadline d = lazy(seconds);
    d.start();
    return d;
  }
  // A deadline `seconds` from the first time it is asked about (clamped as after()).
  static Deadline lazy(double seconds) {
    seconds = std::clamp(seconds, 0.0, 1.0e7);
    Deadline d;
    d.span_ = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    return d;
  }
  static Deadline at(Clock::time_point t) {
    Deadline d;
    d.t_ = t;
    d.started_ = true;
    return d;
  }

  Clock::time_point time() const {
    start();
    return t_;
  }
  bool expired() const { return Clock::now() >= time(); }
  // Milliseconds left, at least 0, at most `cap_ms` (for poll()/futex timeouts).
  int remaining_ms(int cap_ms = 1 << 30) const {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(time() - Clock::now()).count();
    if (left < 0) left = 0;
    return static_cast<int>(std::min<long long>(left, cap_ms));
  }
  double remaining_seconds() const {
    return std::chrono::duration<double>(time() - Clock::now()).count();
  }
  Deadline earlier(const Deadline& o) const { return time() < o.time() ? *this : o; }

 private:
  Deadline() = default;
  void start() const {
    if (!started_) {
      t_ = Clock::now() + span_;
      started_ = true;
    }
  }
  mutable Clock::time_point t_{};
  Clock::duration span_{};
  mutable bool started_ = false;
};

}  // namespace kolo
