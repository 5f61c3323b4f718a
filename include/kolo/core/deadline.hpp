// kolo/core/deadline.hpp — absolute deadlines, so every wait in kolo is bounded.
#pragma once

#include <algorithm>
#include <chrono>

namespace kolo {

using Clock = std::chrono::steady_clock;

class Deadline {
 public:
  // A deadline `seconds` from now; a non-positive or huge value still terminates (clamped).
  static Deadline after(double seconds) {
    seconds = std::clamp(seconds, 0.0, 1.0e7);
    return Deadline(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(seconds)));
  }
  static Deadline at(Clock::time_point t) { return Deadline(t); }

  Clock::time_point time() const { return t_; }
  bool expired() const { return Clock::now() >= t_; }
  // Milliseconds left, at least 0, at most `cap_ms` (for poll()/futex timeouts).
  int remaining_ms(int cap_ms = 1 << 30) const {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(t_ - Clock::now()).count();
    if (left < 0) left = 0;
    return static_cast<int>(std::min<long long>(left, cap_ms));
  }
  double remaining_seconds() const {
    return std::chrono::duration<double>(t_ - Clock::now()).count();
  }
  Deadline earlier(const Deadline& o) const { return t_ < o.t_ ? *this : o; }

 private:
  explicit Deadline(Clock::time_point t) : t_(t) {}
  Clock::time_point t_;
};

}  // namespace kolo
