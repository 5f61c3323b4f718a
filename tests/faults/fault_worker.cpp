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
//   KOLO_PID rank=R pid=P pgid=G store=S        (chaos, verify: before connecting)
//   KOLO_LOOP rank=R                             (chaos: every rank is in the collective loop)
//
// KOLO_FAULT lines also carry mono=T, the CLOCK_MONOTONIC time (seconds) the error was caught:
// that clock is shared by every process on the machine (network namespaces included), so the
// driver can subtract the moment it injected a fault and get the detection time.
//
// Test hooks read from the environment before connecting (comma-separated, one entry per rank,
// "-" or empty for none), so that a driver can put a relay into the data path:
//   KOLO_TEST_LISTEN_PORTS  bind the rank's TCP data listener to 0.0.0.0:PORT (KOLO_LISTEN_FD)
//   KOLO_TEST_ADDRS         the address the rank advertises to its peers (KOLO_ADDR)
//   KOLO_TEST_DELAY_MS      sleep this long before connecting (a late rank)
//
// KOLO_TEST_SABOTAGE (one value for every rank) makes `chaos` misreport a fault on purpose, to
// show that the kill trials' checks fail when a survivor does not see the loss as documented:
//   timeout  ignore the error, wait out KOLO_TIMEOUT_SECONDS, then report a TimeoutError naming
//            the peer (a survivor that never noticed the loss and hit its deadline)
//   late     report the real error, but only after KOLO_TIMEOUT_SECONDS (noticed at the deadline)
//   blame    report a PeerLostError at once that names this rank as the lost one
//
// Exit codes: 0 success, 3 a kolo::Error was caught (the expected outcome of most modes), 4 an
// expected error did not happen, 5 a result had wrong numbers, 6 anything else.
// `rank` is KOLO_RANK as written in the environment until a communicator exists, because the
// environment itself may be what is broken.
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <kolo/engine/engine.hpp>
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

double mono_now() {
  return std::chrono::duration<double>(WallClock::now().time_since_epoch()).count();
}

int report(const kolo::Error& e) {
  // Newlines in a message would split the report line; none are expected, but be safe.
  std::string what = e.what();
  for (char& c : what) {
    if (c == '\n') c = ' ';
  }
  char after[64];
  std::snprintf(after, sizeof(after), "%.3f mono=%.6f", since_t0(), mono_now());
  say("KOLO_FAULT rank=" + rank_label + " kind=" + kolo::error_kind_name(e.kind()) +
      " after=" + after + " what=" + what);
  return kKoloError;
}

int no_error(const std::string& what) {
  say("KOLO_NOERROR rank=" + rank_label + " " + what);
  return kNoError;
}

// This rank's entry of a per-rank list variable (see the header); "" when absent.
std::string per_rank(const char* var) {
  const char* v = std::getenv(var);
  const char* r = std::getenv("KOLO_RANK");
  if (!v || !r) return "";
  const int rank = std::atoi(r);
  std::string_view rest = v;
  for (int i = 0; i < rank; ++i) {
    const auto comma = rest.find(',');
    if (comma == std::string_view::npos) return "";
    rest.remove_prefix(comma + 1);
  }
  std::string item(rest.substr(0, rest.find(',')));
  return item == "-" ? "" : item;
}

void apply_test_hooks() {
  if (const std::string port = per_rank("KOLO_TEST_LISTEN_PORTS"); !port.empty()) {
    kolo::net::Socket l =
        kolo::net::listen_tcp("0.0.0.0", static_cast<std::uint16_t>(std::atoi(port.c_str())));
    ::setenv("KOLO_LISTEN_FD", std::to_string(l.release()).c_str(), 1);
  }
  if (const std::string addr = per_rank("KOLO_TEST_ADDRS"); !addr.empty()) {
    ::setenv("KOLO_ADDR", addr.c_str(), 1);
  }
  if (const std::string ms = per_rank("KOLO_TEST_DELAY_MS"); !ms.empty()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atol(ms.c_str())));
  }
}

void announce() {
  const char* store = std::getenv("KOLO_STORE");
  say("KOLO_PID rank=" + rank_label + " pid=" + std::to_string(::getpid()) +
      " pgid=" + std::to_string(::getpgrp()) + " store=" + (store ? store : "-"));
}

std::unique_ptr<Comm> connect() {
  apply_test_hooks();
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

// (a'') One rank skips a collective: it is busy elsewhere (sleeps past the others' timeout),
// then makes the call the others made long ago. Every rank must report the timeout naming it.
int skip(double sleep_seconds) {
  std::vector<float> f(1000, 1.0f);
  // The communicator lives inside the try block, as in a program whose handler is outside the
  // scope that owns it: the exception reaches the handler only after the communicator's
  // destructor ran, so the reported time includes that destructor (an aborted TCP mesh used to
  // drain its sockets there for up to a second).
  try {
    auto c = connect();
    c->barrier();
    t0 = WallClock::now();
    if (c->rank() == kOdd) {
      std::this_thread::sleep_for(std::chrono::duration<double>(sleep_seconds));
      say("KOLO_RETURNED rank=" + rank_label + " woke after " + std::to_string(sleep_seconds) +
          " s; calling allreduce");
    }
    c->allreduce(std::span<float>(f));
    // The late rank can complete its call from what its peers sent before they gave up (their
    // data sits ahead of their ABORT in the stream or slots): the error then reaches it at its
    // next call, as a real program's next step would.
    say("KOLO_RETURNED rank=" + rank_label + " allreduce returned; calling barrier");
    c->barrier();
  } catch (const kolo::Error& e) {
    return report(e);
  }
  return no_error("skip: allreduce and barrier completed");
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
  } else if (what == "overflow-allreduce") {
    // count * sizeof(float) wraps to 4 bytes: must be refused, never reduce 4 bytes.
    const std::size_t huge = SIZE_MAX / sizeof(float) + 1;
    c->allreduce(kolo::TensorView(f.data(), odd ? huge : f.size(), kolo::DataType::float32));
  } else if (what == "overflow-allgather") {
    // size x count wraps to a small output count on every rank.
    const std::size_t huge = SIZE_MAX / static_cast<std::size_t>(c->size()) + 1;
    c->allgather(kolo::TensorView(f.data(), huge, kolo::DataType::uint8),
                 kolo::TensorView(f.data(), huge * static_cast<std::size_t>(c->size()),
                                  kolo::DataType::uint8));
  } else if (what == "overflow-allocate") {
    auto b = c->allocate<float>(odd ? SIZE_MAX / sizeof(float) + 1 : f.size());
    say("KOLO_ALLOCATED rank=" + rank_label + " " + std::to_string(b.size()));
  } else {
    std::fprintf(stderr, "unknown bad argument '%s'\n", what.c_str());
    return kOther;
  }
  // No rank may return from the refused call (the error contract: a broadcast's root too, whose
  // sends alone would not wait for the others — rooted calls agree on entry); say so if one
  // does, so the driver can tell this from an error that never came.
  say("KOLO_RETURNED rank=" + rank_label + " " + what + " returned; calling barrier");
  c->barrier();
  return no_error(what + " completed");
}

// (b) All ranks loop large allreduces; `victim` SIGKILLs itself `after_ms` in. `wire`: float32
// through allreduce_compressed on the ring (fp16 messages, converted segment by segment).
// `zero_copy`: on a Buffer from Communicator::allocate, which shared memory reads in place.
int kill_mid_allreduce(int victim, int after_ms, std::size_t elems, bool wire, bool zero_copy) {
  auto c = connect();
  const int n = c->size();
  const auto fp16 = kolo::CompressionPolicy::parse("fp16");
  if (wire) c->selector().force_allreduce(kolo::AllreduceAlgorithm::ring);
  kolo::Buffer<float> shared;
  if (zero_copy) {
    shared = c->allocate<float>(elems);
    say("KOLO_ZERO_COPY rank=" + rank_label + " shared=" + (shared.shared() ? "1" : "0"));
  }
  std::vector<float> heap(zero_copy ? 0 : elems);
  std::span<float> buf = zero_copy ? shared.span() : std::span<float>(heap);
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
      if (wire) {
        c->allreduce_compressed(kolo::TensorView(std::span<float>(buf)),
                                kolo::TensorView(std::span<float>(buf)), kolo::ReduceOp::sum, fp16);
      } else if (zero_copy) {
        c->allreduce(shared);
      } else {
        c->allreduce(buf);
      }
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
  announce();
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

// (c') The engine's variables: one fused allreduce through kolo::Engine, checked.
int engine_setup() {
  apply_test_hooks();
  kolo::Engine<> engine(Comm(kolo::Topology::from_env()));
  rank_label = std::to_string(engine.rank());
  const int n = engine.size();
  std::vector<float> v(1000, static_cast<float>(engine.rank() + 1));
  engine.allreduce_async("x", kolo::TensorView(std::span<float>(v))).wait();
  const float want = static_cast<float>(n * (n + 1) / 2);
  if (v.front() != want || v.back() != want) {
    say("KOLO_WRONG rank=" + rank_label + " engine allreduce gave " + std::to_string(v.front()));
    return kWrongResult;
  }
  say("KOLO_OK rank=" + rank_label + " engine allreduce");
  return kOk;
}

// (e) Random collectives. Every rank derives the same sequence from the seed — which collective,
// how many elements, which algorithm, which root — so they stay in step without talking, and
// every result is checked element by element (int32 values below 1001: every sum is exact).
// `chaos` runs until a fault (the driver kills a rank or cuts the network at a random moment);
// `verify` runs a fixed number of steps and reports how long they took.

std::int32_t value(int q, std::size_t i, long it) {
  return static_cast<std::int32_t>(
      (i * 13 + static_cast<std::size_t>(q) * 7 + static_cast<std::size_t>(it) * 3) % 1001);
}

struct Step {
  enum Kind {
    allreduce_sum,
    allreduce_max,
    allgather,
    allgatherv,
    broadcast,
    reduce_scatter,
    alltoall,
    barrier,
    kinds
  };
  int kind = 0;
  std::size_t n = 0;  // elements (per rank where the collective has blocks)
  unsigned algo = 0;
  int root = 0;
};

Step next_step(std::mt19937_64& g, int size, std::size_t max_elems) {
  Step s;
  s.kind = static_cast<int>(g() % Step::kinds);
  // Log-uniform sizes from 0 up to max_elems: many small messages, some large ones.
  unsigned bits = 0;
  while ((std::size_t{1} << (bits + 1)) <= max_elems) ++bits;
  const std::size_t cap = std::size_t{1} << (g() % (bits + 1));
  s.n = static_cast<std::size_t>(g() % (cap + 1));
  s.algo = static_cast<unsigned>(g() % 8);
  s.root = static_cast<int>(g() % static_cast<unsigned>(size));
  return s;
}

bool wrong(const char* what, long it, std::size_t i, long long got, long long want) {
  say("KOLO_WRONG rank=" + rank_label + " " + what + " step " + std::to_string(it) + " element " +
      std::to_string(i) + ": got " + std::to_string(got) + ", want " + std::to_string(want));
  return false;
}

// Runs one step and checks its result; false (after a KOLO_WRONG line) on a wrong number.
bool run_step(Comm& c, const Step& s, long it, bool hierarchical_ok) {
  const int n_ranks = c.size();
  const int r = c.rank();
  const auto N = static_cast<std::size_t>(n_ranks);
  const std::size_t n = s.n;
  switch (s.kind) {
    case Step::allreduce_sum:
    case Step::allreduce_max: {
      // Every allreduce algorithm; hierarchical only where the host layout allows it.
      constexpr kolo::AllreduceAlgorithm algos[] = {kolo::AllreduceAlgorithm::ring,
                                                    kolo::AllreduceAlgorithm::tree,
                                                    kolo::AllreduceAlgorithm::halving_doubling,
                                                    kolo::AllreduceAlgorithm::recursive_doubling,
                                                    kolo::AllreduceAlgorithm::direct,
                                                    kolo::AllreduceAlgorithm::hierarchical};
      const unsigned choices = hierarchical_ok ? 6 : 5;
      c.selector().force_allreduce(algos[s.algo % choices]);
      if (s.kind == Step::allreduce_sum) {
        std::vector<std::int32_t> v(n);
        for (std::size_t i = 0; i < n; ++i) v[i] = value(r, i, it);
        c.allreduce(std::span<std::int32_t>(v));
        for (std::size_t i = 0; i < n; ++i) {
          long long want = 0;
          for (int q = 0; q < n_ranks; ++q) want += value(q, i, it);
          if (v[i] != want) return wrong("allreduce-sum", it, i, v[i], want);
        }
      } else {
        std::vector<double> v(n);
        for (std::size_t i = 0; i < n; ++i) v[i] = value(r, i, it);
        c.allreduce(std::span<double>(v), kolo::ReduceOp::max);
        for (std::size_t i = 0; i < n; ++i) {
          long long want = 0;
          for (int q = 0; q < n_ranks; ++q) want = std::max<long long>(want, value(q, i, it));
          if (v[i] != static_cast<double>(want)) {
            return wrong("allreduce-max", it, i, static_cast<long long>(v[i]), want);
          }
        }
      }
      return true;
    }
    case Step::allgather: {
      std::vector<std::int32_t> in(n), out(n * N, -1);
      for (std::size_t i = 0; i < n; ++i) in[i] = value(r, i, it);
      c.allgather(kolo::TensorView(std::span<std::int32_t>(in)),
                  kolo::TensorView(std::span<std::int32_t>(out)));
      for (std::size_t q = 0; q < N; ++q) {
        for (std::size_t i = 0; i < n; ++i) {
          const auto want = value(static_cast<int>(q), i, it);
          if (out[q * n + i] != want)
            return wrong("allgather", it, q * n + i, out[q * n + i], want);
        }
      }
      return true;
    }
    case Step::allgatherv: {
      std::vector<std::size_t> counts(N);
      std::size_t total = 0;
      for (std::size_t q = 0; q < N; ++q) total += counts[q] = n + q;
      std::vector<std::int32_t> in(counts[static_cast<std::size_t>(r)]), out(total, -1);
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = value(r, i, it);
      c.allgatherv(kolo::TensorView(std::span<std::int32_t>(in)),
                   kolo::TensorView(std::span<std::int32_t>(out)), counts);
      std::size_t off = 0;
      for (std::size_t q = 0; q < N; ++q) {
        for (std::size_t i = 0; i < counts[q]; ++i) {
          const auto want = value(static_cast<int>(q), i, it);
          if (out[off + i] != want) return wrong("allgatherv", it, off + i, out[off + i], want);
        }
        off += counts[q];
      }
      return true;
    }
    case Step::broadcast: {
      c.selector().force_broadcast(kolo::all_broadcast_algorithms[s.algo % 2]);
      std::vector<std::int32_t> v(n, -1);
      if (r == s.root) {
        for (std::size_t i = 0; i < n; ++i) v[i] = value(s.root, i, it);
      }
      c.broadcast(std::span<std::int32_t>(v), s.root);
      for (std::size_t i = 0; i < n; ++i) {
        if (v[i] != value(s.root, i, it))
          return wrong("broadcast", it, i, v[i], value(s.root, i, it));
      }
      return true;
    }
    case Step::reduce_scatter: {
      std::vector<std::int32_t> in(n * N), out(n, -1);
      for (std::size_t j = 0; j < in.size(); ++j) in[j] = value(r, j, it);
      c.reduce_scatter(kolo::TensorView(std::span<std::int32_t>(in)),
                       kolo::TensorView(std::span<std::int32_t>(out)));
      for (std::size_t i = 0; i < n; ++i) {
        long long want = 0;
        for (int q = 0; q < n_ranks; ++q) want += value(q, static_cast<std::size_t>(r) * n + i, it);
        if (out[i] != want) return wrong("reduce_scatter", it, i, out[i], want);
      }
      return true;
    }
    case Step::alltoall: {
      std::vector<std::int32_t> in(n * N), out(n * N, -1);
      for (std::size_t j = 0; j < in.size(); ++j) in[j] = value(r, j, it);
      c.alltoall(kolo::TensorView(std::span<std::int32_t>(in)),
                 kolo::TensorView(std::span<std::int32_t>(out)));
      for (std::size_t q = 0; q < N; ++q) {
        for (std::size_t i = 0; i < n; ++i) {
          const auto want = value(static_cast<int>(q), static_cast<std::size_t>(r) * n + i, it);
          if (out[q * n + i] != want) return wrong("alltoall", it, q * n + i, out[q * n + i], want);
        }
      }
      return true;
    }
    default:
      c.barrier();
      return true;
  }
}

// report(e), or the misreport KOLO_TEST_SABOTAGE asks for (see the header).
int sabotaged_report(const kolo::Error& e) {
  const char* how = std::getenv("KOLO_TEST_SABOTAGE");
  const std::string sabotage = how ? how : "";
  if (sabotage.empty()) return report(e);
  const char* t = std::getenv("KOLO_TIMEOUT_SECONDS");
  const double deadline = t ? std::atof(t) : 30.0;
  if (sabotage == "timeout" || sabotage == "late") {
    std::this_thread::sleep_for(std::chrono::duration<double>(deadline));
  }
  if (sabotage == "timeout") {
    return report(kolo::TimeoutError("timed out after " + std::string(t ? t : "30") +
                                     " s waiting for a peer: " + e.what()));
  }
  if (sabotage == "blame") {
    return report(kolo::PeerLostError("rank " + rank_label + " exited or was killed (sabotage)"));
  }
  return report(e);
}

// `iterations` <= 0: until a fault (bounded at 60 s, after which NOERROR is reported).
int random_collectives(std::uint64_t seed, long iterations, std::size_t max_elems) {
  announce();
  auto c = connect();
  const auto& g = c->host_groups();
  const bool hierarchical_ok = g.known && g.uniform && g.hosts > 1 && c->local_size() > 1;
  std::mt19937_64 gen(seed);
  long it = 0;
  try {
    c->barrier();
    say("KOLO_LOOP rank=" + rank_label);
    t0 = WallClock::now();
    for (; iterations <= 0 || it < iterations; ++it) {
      if (iterations <= 0 && since_t0() > 60) {
        return no_error(std::to_string(it) + " random collectives and no fault");
      }
      const Step s = next_step(gen, c->size(), max_elems);
      if (!run_step(*c, s, it, hierarchical_ok)) return kWrongResult;
    }
    c->barrier();
  } catch (const kolo::Error& e) {
    const int code = sabotaged_report(e);
    // As in kill_mid_allreduce: keep kolo-run's verdict about who failed first deterministic.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    return code;
  }
  char secs[32];
  std::snprintf(secs, sizeof(secs), "%.3f", since_t0());
  say("KOLO_OK rank=" + rank_label + " steps=" + std::to_string(it) + " seconds=" + secs);
  return kOk;
}

int run(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  auto arg = [&](int i, long dflt) { return argc > i ? std::atol(argv[i]) : dflt; };
  const auto elems = static_cast<std::size_t>(arg(2, 1000));
  if (mode == "mismatch-count") return mismatch("count", elems);
  if (mode == "mismatch-dtype") return mismatch("dtype", elems);
  if (mode == "mismatch-order") return mismatch("order", elems);
  if (mode == "null-buffer" || mode == "bad-root" || mode.rfind("overflow-", 0) == 0) {
    return bad_argument(mode);
  }
  if (mode == "kill") {
    return kill_mid_allreduce(static_cast<int>(arg(2, 2)), static_cast<int>(arg(3, 300)),
                              static_cast<std::size_t>(arg(4, 1 << 20)),
                              argc > 5 && std::string(argv[5]) == "wire",
                              argc > 5 && std::string(argv[5]) == "zerocopy");
  }
  if (mode == "skip") return skip(argc > 2 ? std::atof(argv[2]) : 3.0);
  if (mode == "setup") return setup();
  if (mode == "engine") return engine_setup();
  if (mode == "clean") return clean(static_cast<int>(arg(2, 4)));
  if (mode == "chaos" || mode == "verify") {
    const std::uint64_t seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1;
    const long steps = mode == "chaos" ? 0 : arg(3, 100);
    return random_collectives(seed, steps, static_cast<std::size_t>(arg(4, 1 << 16)));
  }
  std::fprintf(
      stderr,
      "usage: fault_worker mismatch-count|mismatch-dtype|mismatch-order [elems]|null-buffer|"
      "bad-root|skip [seconds]|kill [victim ms elems]|setup|engine|clean [rounds]|chaos seed [0 "
      "max_elems]|\n"
      "verify seed [steps max_elems]\n");
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
