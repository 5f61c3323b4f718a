// kolo-run's shared vocabulary: exit codes, the fixed time limits and line size, and the two
// exceptions that end a launch before the ranks start (bad arguments, anything else).
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace kolo_run {

// Exit codes, following the shells and timeout(1) so scripts can tell the cases apart.
constexpr int kExitInternal = 1;
constexpr int kExitUsage = 2;
constexpr int kExitTimeout = 124;
constexpr int kExitNotExecutable = 126;
constexpr int kExitNotFound = 127;

// After SIGTERM, how long ranks get to exit before SIGKILL (fixed by the spec, like mpirun's).
constexpr double kKillAfterTermSeconds = 2.0;
// A "line" longer than this is emitted in pieces: one rank printing megabytes without a newline
// must not make kolo-run buffer without bound.
constexpr std::size_t kMaxLine = 64 * 1024;
// At the end of a job, how long kolo-run waits for a reader of its stdout/stderr that takes no
// byte, before it drops the rest: after a normal end, and after --timeout or a signal.
constexpr double kFlushStallSeconds = 1.0;
constexpr double kFlushStallTornDown = 0.25;

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Any other failure before the ranks start; carries the exit code to use.
class LaunchError : public std::runtime_error {
 public:
  LaunchError(const std::string& what, int code) : std::runtime_error(what), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

}  // namespace kolo_run
