// elastic_worker — the rank program of the shrink tests (test_shrink.cpp): exact collectives
// until a peer is lost, then Communicator::shrink, then 100 exact operations on the survivors'
// communicator.
//
// `elastic_worker SEED [MODE]` under `kolo-run --elastic`. MODE "revoke": at step 20 rank 0
// revokes the communicator (nobody dies; every rank catches RevokedError and all shrink to the
// same size); "exclude": the same, and rank 0 passes the last rank in `excluded` (that rank,
// alive, learns from its shrink that it was excluded); "first": connect, one allreduce, print
// "KOLO_FIRST rank=R mono_first=T" and exit (benchmarks/recovery.py's restart baseline). Each step
// is an int64 allreduce (sum) or an int32 allgather of a random 1..64K elements whose values are a
// function of (rank, index, step), checked element by element on every rank. Lines on stdout (one
// write each):
//   KOLO_PID rank=R pid=P pgid=G store=S   before connecting
//   KOLO_LOOP rank=R                       every rank is in the loop
//   KOLO_SHRUNK rank=R new_rank=r size=n gen=g excluded=1,3 caught=<kind> mono_caught=T
//               mono_first=T               after the shrink and the first allreduce on it
//   KOLO_ELASTIC_OK rank=R new_rank=r ops=100
//   KOLO_WRONG rank=R ...                  a wrong number (exit 5)
//   KOLO_FAULT rank=R kind=K ... what=W    any error not recovered (exit 3)
// KOLO_TEST_SHRINK_DIE="R:S" makes parent rank R SIGKILL itself at shrink step S (the steps of
// ShrinkOptions::test_hook), to kill a rank during the shrink. The mono values are
// CLOCK_MONOTONIC seconds, comparable with the driver's.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <kolo/kolo.hpp>

namespace {

using Comm = kolo::Communicator<>;

void say(const std::string& line) {
  const std::string s = line + "\n";
  [[maybe_unused]] const ssize_t k = ::write(STDOUT_FILENO, s.data(), s.size());
}

double mono_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string label = [] {
  const char* r = std::getenv("KOLO_RANK");
  return std::string(r ? r : "?");
}();

int report(const kolo::Error& e) {
  std::string what = e.what();
  for (char& c : what) {
    if (c == '\n') c = ' ';
  }
  char t[64];
  std::snprintf(t, sizeof(t), "0 mono=%.6f", mono_now());
  say("KOLO_FAULT rank=" + label + " kind=" + kolo::error_kind_name(e.kind()) + " after=" + t +
      " what=" + what);
  return 3;
}

std::int64_t value(int rank, std::size_t i, long step) {
  return static_cast<std::int64_t>(rank) * 100003 + static_cast<std::int64_t>(i % 9973) + step;
}

// One random exact step on c; false (after a KOLO_WRONG line) on a wrong number.
bool step(Comm& c, std::mt19937_64& gen, long it) {
  const std::size_t n = 1 + gen() % 65536;
  const int N = c.size(), r = c.rank();
  if (gen() % 2 == 0) {
    std::vector<std::int64_t> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = value(r, i, it);
    c.allreduce(std::span<std::int64_t>(v));
    for (std::size_t i = 0; i < n; ++i) {
      std::int64_t want = 0;
      for (int q = 0; q < N; ++q) want += value(q, i, it);
      if (v[i] != want) {
        say("KOLO_WRONG rank=" + label + " allreduce step " + std::to_string(it) + " index " +
            std::to_string(i) + ": " + std::to_string(v[i]) + " != " + std::to_string(want));
        return false;
      }
    }
  } else {
    std::vector<std::int32_t> in(n), out(n * static_cast<std::size_t>(N), -1);
    for (std::size_t i = 0; i < n; ++i) in[i] = static_cast<std::int32_t>(value(r, i, it));
    c.allgather(kolo::TensorView(std::span<std::int32_t>(in)),
                kolo::TensorView(std::span<std::int32_t>(out)));
    for (int q = 0; q < N; ++q) {
      for (std::size_t i = 0; i < n; ++i) {
        const auto want = static_cast<std::int32_t>(value(q, i, it));
        if (out[static_cast<std::size_t>(q) * n + i] != want) {
          say("KOLO_WRONG rank=" + label + " allgather step " + std::to_string(it));
          return false;
        }
      }
    }
  }
  return true;
}

int run(std::uint64_t seed, const std::string& mode) {
  const char* store = std::getenv("KOLO_STORE");
  say("KOLO_PID rank=" + label + " pid=" + std::to_string(::getpid()) +
      " pgid=" + std::to_string(::getpgrp()) + " store=" + (store ? store : "-"));
  Comm c(kolo::Topology::from_env());
  label = std::to_string(c.rank());
  if (mode == "first") {
    std::vector<std::int64_t> one{1};
    c.allreduce(std::span<std::int64_t>(one));
    char t[64];
    std::snprintf(t, sizeof(t), "%.6f", mono_now());
    say("KOLO_FIRST rank=" + label + " mono_first=" + t);
    return one[0] == c.size() ? 0 : 5;
  }
  std::mt19937_64 gen(seed);  // the same sequence on every rank
  long it = 0;
  double caught = -1;
  std::string kind;
  try {
    c.barrier();
    say("KOLO_LOOP rank=" + label);
    const double until = mono_now() + 60;
    for (;; ++it) {
      if (mono_now() > until) {
        say("KOLO_NOERROR rank=" + label + " no peer was lost in 60 s");
        return 4;
      }
      if (it == 20 && c.rank() == 0 && (mode == "revoke" || mode == "exclude")) {
        c.revoke("the test revokes at step 20");
      }
      if (!step(c, gen, it)) return 5;
    }
  } catch (const kolo::Error& e) {
    if (!kolo::recoverable(e)) return report(e);
    caught = mono_now();
    kind = kolo::error_kind_name(e.kind());
  }
  kolo::ShrinkOptions so;
  if (const char* die = std::getenv("KOLO_TEST_SHRINK_DIE")) {
    int who = -1, at = -1;
    if (std::sscanf(die, "%d:%d", &who, &at) == 2 && who == c.rank()) {
      so.test_hook = [at](int s) {
        if (s == at) ::raise(SIGKILL);
      };
    }
  }
  try {
    std::vector<int> excluded;
    if (mode == "exclude" && c.rank() == 0) excluded.push_back(c.size() - 1);
    Comm next = c.shrink(excluded, so);
    // The first operation on the new communicator completes: recovery is over.
    std::vector<std::int64_t> one{1};
    next.allreduce(std::span<std::int64_t>(one));
    const double first = mono_now();
    if (one[0] != next.size()) {
      say("KOLO_WRONG rank=" + label + " first allreduce " + std::to_string(one[0]));
      return 5;
    }
    std::string ex;
    for (int r : next.lineage().excluded) ex += (ex.empty() ? "" : ",") + std::to_string(r);
    char t[96];
    std::snprintf(t, sizeof(t), " mono_caught=%.6f mono_first=%.6f", caught, first);
    say("KOLO_SHRUNK rank=" + label + " new_rank=" + std::to_string(next.rank()) + " size=" +
        std::to_string(next.size()) + " gen=" + std::to_string(next.lineage().generation) +
        " excluded=" + ex + " caught=" + kind + t);
    std::mt19937_64 gen2(seed + 1);
    for (long k = 0; k < 100; ++k) {
      if (!step(next, gen2, k)) return 5;
    }
    next.barrier();
    say("KOLO_ELASTIC_OK rank=" + label + " new_rank=" + std::to_string(next.rank()) + " ops=100");
    return 0;
  } catch (const kolo::Error& e) {
    return report(e);
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1, argc > 2 ? argv[2] : "");
  } catch (const kolo::Error& e) {
    return report(e);
  } catch (const std::exception& e) {
    say("KOLO_OTHER rank=" + label + " " + e.what());
    return 6;
  }
}
