// fault_worker — the rank program of the fault-injection tests (test_faults.cpp).
//
// `fault_worker MODE [args]` builds a Communicator from the environment contract and does one
// deliberately wrong thing (or, in `clean`, everything right). Every rank reports on stdout in
// one machine-readable line, so the driver can check that *each* rank saw the error, not just
// the one that caused it:
//
//   KOLO_FAULT rank=R kind=MismatchError after=0.012 what=<the exception's message>
//   KOLO_OK rank=R <what was verified>
//   KOLO_NOERROR rank=R <what should have failed but did not>
//   KOLO_RETURNED rank=R <a collective returned; a later call is expected to fail>
//
// Exit codes: 0 success, 3 a kolo::Error was caught (the expected outcome of most modes), 4 an
// expected error did not happen, 5 a result had wrong numbers, 6 anything else.
// `rank` is KOLO_RANK as written in the environment until a communicator exists, because the
// environment itself may be what is broken.
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <kolo/kolo.hpp>

namespace {

using Comm = kolo::Communicator<>;
using WallClock = std::chrono::steady_clock;

enum Exit { kOk = 0, kKoloError = 3, kNoError = 4, kWrongResult = 5, kOther = 6 };

std::string rank_label = [] {
  const char* r = std::getenv("KOLO_RANK");
  return std::string(r ? r : "?");
}();

WallClock::time_point t0 = WallClock::now();

double since_t0() {
  return std::chrono::duration<double>(WallClock::now() - t0).count();
}

// One write() per line: the driver parses lines, and a line cut by another write would not match.
void say(const std::string& line) {
  const std::string s = line + "\n";
  [[maybe_unused]] const ssize_t k = ::write(STDOUT_FILENO, s.data(), s.size());
}

int report(const kolo::Error& e) {
  // Newlines in a message would split the report line; none are expected, but be safe.
  std::string what = e.what();
  for (char& c : what) {
    if (c == '\n') c = ' ';
  }
  char after[32];
  std::snprintf(after, sizeof(after), "%.3f", since_t0());
  say("KOLO_FAULT rank=" + rank_label + " kind=" + kolo::error_kind_name(e.kind()) +
      " after=" + after + " what=" + what);
  return kKoloError;
}

int no_error(const std::string& what) {
  say("KOLO_NOERROR rank=" + rank_label + " " + what);
  return kNoError;
}

std::unique_ptr<Comm> connect() {
  auto c = std::make_unique<Comm>(kolo::Topology::from_env());
  rank_label = std::to_string(c->rank());
  return c;
}

// The rank that misbehaves in the one-bad-rank modes: rank 1 exists in every job of 2+ ranks.
constexpr int kOdd = 1;

// (a) Ranks disagree on the collective: count, dtype, or which collective.
// `n` elements (rank kOdd: n - 1 in the count mode).
int mismatch(const std::string& what, std::size_t n) {
  auto c = connect();
  const bool odd = c->rank() == kOdd;
  std::vector<float> f(n, 1.0f);
  std::vector<std::int32_t> i(n, 1);
  t0 = WallClock::now();
  if (what == "count") {
    c->allreduce(std::span<float>(f.data(), odd ? n - 1 : n));
  } else if (what == "dtype") {
    if (odd) {
      c->allreduce(std::span<std::int32_t>(i));
    } else {
      c->allreduce(std::span<float>(f));
    }
  } else if (what == "order") {
    if (odd) {
      c->broadcast(std::span<float>(f), 0);
    } else {
      c->allreduce(std::span<float>(f));
    }
  } else {
    std::fprintf(stderr, "unknown mismatch '%s'\n", what.c_str());
    return kOther;
  }
  return no_error("mismatch-" + what + " completed");
}

// (a') One rank passes an invalid argument; the others call the collective correctly.
int bad_argument(const std::string& what) {
  auto c = connect();
  const bool odd = c->rank() == kOdd;
  std::vector<float> f(1000, 1.0f);
  t0 = WallClock::now();
  if (what == "null-buffer") {
    c->allreduce(kolo::TensorView(odd ? nullptr : f.data(), f.size(), kolo::DataType::float32));
  } else if (what == "bad-root") {
    c->broadcast(std::span<float>(f), odd ? c->size() : 0);
  } else {
    std::fprintf(stderr, "unknown bad argument '%s'\n", what.c_str());
    return kOther;
  }
  // The root of a broadcast depends on no other rank: its sends are buffered (a shared-memory
  // slot, a socket buffer), so it can return before a receiver fails. The error then surfaces
  // at its next collective; say so, so the driver can tell this from an error that never came.
  say("KOLO_RETURNED rank=" + rank_label + " " + what + " returned; calling barrier");
  c->barrier();
  return no_error(what + " completed");
}

// (b) All ranks loop large allreduces; `victim` SIGKILLs itself `after_ms` in.
int kill_mid_allreduce(int victim, int after_ms, std::size_t elems) {
  auto c = connect();
  const int n = c->size();
  std::vector<float> buf(elems);
  c->barrier();  // everyone is in the loop when the clock starts
  t0 = WallClock::now();
  if (c->rank() == victim) {
    std::thread([after_ms] {
      std::this_thread::sleep_for(std::chrono::milliseconds(after_ms));
      ::kill(::getpid(), SIGKILL);
    }).detach();
  }
  const float want = static_cast<float>(n * (n + 1) / 2);
  long iterations = 0;
  // Bounded: if the death is never noticed this ends anyway, and the driver sees NOERROR.
  while (since_t0() < 30) {
    std::fill(buf.begin(), buf.end(), static_cast<float>(c->rank() + 1));
    try {
      c->allreduce(std::span<float>(buf));
    } catch (const kolo::Error& e) {
      const int code = report(e);
      // Survivors notice the death within a millisecond, so without a pause kolo-run may reap
      // a survivor and the victim in one pass and call the survivor the first failure (its
      // exit status would then be 3, not the victim's 137). The report above is already
      // timed; lingering only keeps kolo-run's verdict about who failed first deterministic.
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      return code;
    }
    if (buf.front() != want || buf[elems / 2] != want || buf.back() != want) {
      say("KOLO_WRONG rank=" + rank_label + " allreduce gave " + std::to_string(buf.front()));
      return kWrongResult;
    }
    ++iterations;
  }
  return no_error("rank " + std::to_string(victim) + " was killed but " +
                  std::to_string(iterations) + " allreduces completed");
}

// Runs `rounds` allreduces with exact checks (integers: every summation order is exact).
bool verified_allreduces(Comm& c, int rounds) {
  const int n = c.size();
  const int r = c.rank();
  for (int k = 0; k < rounds; ++k) {
    const std::size_t count = 1000 + 77777 * static_cast<std::size_t>(k);
    std::vector<std::int32_t> v(count);
    for (std::size_t i = 0; i < count; ++i) {
      v[i] = static_cast<std::int32_t>((i * 13 + static_cast<std::size_t>(r) * 7 + k) % 1001);
    }
    c.allreduce(std::span<std::int32_t>(v));
    for (std::size_t i = 0; i < count; ++i) {
      std::int64_t want = 0;
      for (int q = 0; q < n; ++q) {
        want += static_cast<std::int64_t>((i * 13 + static_cast<std::size_t>(q) * 7 + k) % 1001);
      }
      if (v[i] != want) {
        say("KOLO_WRONG rank=" + rank_label + " round " + std::to_string(k) + " element " +
            std::to_string(i) + ": got " + std::to_string(v[i]) + ", want " + std::to_string(want));
        return false;
      }
    }
  }
  return true;
}

// (c) Setup only: the environment is what is under test.
int setup() {
  auto c = connect();
  if (!verified_allreduces(*c, 1)) return kWrongResult;
  say("KOLO_OK rank=" + rank_label + " setup and one allreduce");
  return kOk;
}

// (d) A healthy job while strangers knock: prints READY once connected, waits for the driver
// (a line on stdin, so it can probe the closed listeners meanwhile), then runs and verifies.
int clean(int rounds) {
  auto c = connect();
  say("KOLO_READY rank=" + rank_label);
  pollfd p{STDIN_FILENO, POLLIN, 0};
  if (::poll(&p, 1, 20000) <= 0) {
    std::fprintf(stderr, "rank %s: no go-ahead from the driver within 20 s\n", rank_label.c_str());
    return kOther;
  }
  if (!verified_allreduces(*c, rounds)) return kWrongResult;
  c->barrier();
  say("KOLO_OK rank=" + rank_label + " " + std::to_string(rounds) + " verified allreduces");
  return kOk;
}

int run(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  auto arg = [&](int i, long dflt) { return argc > i ? std::atol(argv[i]) : dflt; };
  const auto elems = static_cast<std::size_t>(arg(2, 1000));
  if (mode == "mismatch-count") return mismatch("count", elems);
  if (mode == "mismatch-dtype") return mismatch("dtype", elems);
  if (mode == "mismatch-order") return mismatch("order", elems);
  if (mode == "null-buffer" || mode == "bad-root") return bad_argument(mode);
  if (mode == "kill") {
    return kill_mid_allreduce(static_cast<int>(arg(2, 2)), static_cast<int>(arg(3, 300)),
                              static_cast<std::size_t>(arg(4, 1 << 20)));
  }
  if (mode == "setup") return setup();
  if (mode == "clean") return clean(static_cast<int>(arg(2, 4)));
  std::fprintf(
      stderr,
      "usage: fault_worker mismatch-count|mismatch-dtype|mismatch-order [elems]|null-buffer|"
      "bad-root|kill [victim ms elems]|setup|clean [rounds]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const kolo::Error& e) {
    return report(e);
  } catch (const std::exception& e) {
    say("KOLO_OTHER rank=" + rank_label + " " + e.what());
    return kOther;
  }
}
