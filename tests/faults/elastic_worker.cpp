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

#include "exact_ops.hpp"

namespace {

using Comm = kolo::Communicator<>;
using kolo_exact::mono_now;
using kolo_exact::report;
using kolo_exact::say;
using kolo_exact::step;

int run(std::uint64_t seed, const std::string& mode) {
  const char* store = std::getenv("KOLO_STORE");
  say("KOLO_PID rank=" + kolo_exact::label() + " pid=" + std::to_string(::getpid()) +
      " pgid=" + std::to_string(::getpgrp()) + " store=" + (store ? store : "-"));
  Comm c(kolo::Topology::from_env());
  kolo_exact::label() = std::to_string(c.rank());
  if (mode == "first") {
    std::vector<std::int64_t> one{1};
    c.allreduce(std::span<std::int64_t>(one));
    char t[64];
    std::snprintf(t, sizeof(t), "%.6f", mono_now());
    say("KOLO_FIRST rank=" + kolo_exact::label() + " mono_first=" + t);
    return one[0] == c.size() ? 0 : 5;
  }
  std::mt19937_64 gen(seed);  // the same sequence on every rank
  long it = 0;
  double caught = -1;
  std::string kind;
  try {
    c.barrier();
    say("KOLO_LOOP rank=" + kolo_exact::label());
    const double until = mono_now() + 60;
    for (;; ++it) {
      if (mono_now() > until) {
        say("KOLO_NOERROR rank=" + kolo_exact::label() + " no peer was lost in 60 s");
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
      say("KOLO_WRONG rank=" + kolo_exact::label() + " first allreduce " + std::to_string(one[0]));
      return 5;
    }
    std::string ex;
    for (int r : next.lineage().excluded) ex += (ex.empty() ? "" : ",") + std::to_string(r);
    char t[96];
    std::snprintf(t, sizeof(t), " mono_caught=%.6f mono_first=%.6f", caught, first);
    say("KOLO_SHRUNK rank=" + kolo_exact::label() + " new_rank=" + std::to_string(next.rank()) +
        " size=" + std::to_string(next.size()) + " gen=" +
        std::to_string(next.lineage().generation) + " excluded=" + ex + " caught=" + kind + t);
    std::mt19937_64 gen2(seed + 1);
    for (long k = 0; k < 100; ++k) {
      if (!step(next, gen2, k)) return 5;
    }
    next.barrier();
    say("KOLO_ELASTIC_OK rank=" + kolo_exact::label() + " new_rank=" + std::to_string(next.rank()) +
        " ops=100");
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
    say("KOLO_OTHER rank=" + kolo_exact::label() + " " + e.what());
    return 6;
  }
}
