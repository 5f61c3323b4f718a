// grow_worker — the rank program of the grow tests (test_grow.cpp): members run exact collectives,
// rank 0 starts new processes, the members grow their communicator by K, the new processes join
// it, and every rank of the enlarged communicator runs 100 exact operations on it.
//
//   grow_worker SEED K [MODE]          a member, under kolo-run (any size N)
//   grow_worker SEED K join TOKEN      a new process (rank 0 starts K of them)
// MODE:
//   ""      after the 100 operations every rank calls grow(1) again with the same token: each
//           must get a ConfigError (a token serves one grow)
//   lose    the last joiner SIGKILLs itself at operation 50; everyone else catches the loss,
//           shrinks, and runs 50 more exact operations (a joiner is a member like any other)
//   absent  rank 0 starts no one: grow(K) with a 1.5 s timeout must be a TimeoutError on every
//           member, after which the old communicator still runs 20 exact operations
//   extra   rank 0 starts K + 1 processes: one of them must be refused (every place taken)
// Lines on stdout (one write each; the joiners share rank 0's):
//   KOLO_GROWN rank=R new_rank=r size=n gen=g joined=k parent=p   on the enlarged communicator
//   KOLO_GROW_OK rank=r ops=100                                    after its operations
//   KOLO_REUSE_REFUSED rank=r                                      ("" mode)
//   KOLO_SHRUNK_AFTER_GROW rank=r new_rank=q size=m excluded=x      (lose)
//   KOLO_ABSENT_OK rank=R what=W                                   (absent)
//   KOLO_JOIN_REFUSED what=W                                       (extra)
//   KOLO_JOINERS_DONE statuses=s,s                                 rank 0, after reaping them
//   KOLO_WRONG / KOLO_FAULT rank=R ...                             a wrong number / an error
#include <signal.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <kolo/kolo.hpp>

#include "exact_ops.hpp"
#include "spawn_joiner.hpp"

namespace {

using Comm = kolo::Communicator<>;
using kolo_exact::label;
using kolo_exact::report;
using kolo_exact::say;
using kolo_exact::step;

// Starts `grow_worker SEED K join TOKEN`.
pid_t start_joiner(const std::string& seed, const std::string& k, const std::string& token) {
  const pid_t pid = kolo_exact::spawn_joiner({seed, k, "join", token});
  if (pid < 0) {
    say("KOLO_OTHER rank=0 posix_spawn failed: " + std::string(std::strerror(errno)));
    std::exit(6);
  }
  return pid;
}

// The grown communicator's part, the same on members and joiners.
int after_grow(Comm& g, std::uint64_t seed, const std::string& mode, const std::string& token) {
  label() = std::to_string(g.rank());
  std::mt19937_64 gen(seed + 7);
  const bool lose = mode == "lose";
  const int victim = g.size() - 1;
  long k = 0;
  try {
    for (; k < 100; ++k) {
      if (lose && k == 50 && g.rank() == victim) ::raise(SIGKILL);
      if (!step(g, gen, k)) return 5;
    }
  } catch (const kolo::Error& e) {
    if (!lose || !kolo::recoverable(e)) return report(e);
    Comm s = g.shrink();
    std::string ex;
    for (int r : s.lineage().excluded) ex += (ex.empty() ? "" : ",") + std::to_string(r);
    say("KOLO_SHRUNK_AFTER_GROW rank=" + label() + " new_rank=" + std::to_string(s.rank()) +
        " size=" + std::to_string(s.size()) + " excluded=" + ex);
    std::mt19937_64 gen2(seed + 9);
    for (long j = 0; j < 50; ++j) {
      if (!step(s, gen2, j)) return 5;
    }
    s.barrier();
    say("KOLO_GROW_OK rank=" + label() + " ops=" + std::to_string(k + 50));
    return 0;
  }
  if (lose) {
    say("KOLO_WRONG rank=" + label() + " no loss was seen after the joiner's kill");
    return 5;
  }
  say("KOLO_GROW_OK rank=" + label() + " ops=100");
  if (mode.empty()) {
    try {
      (void)g.grow(1, kolo::GrowOptions{token, 2.0});
      say("KOLO_WRONG rank=" + label() + " a second grow with a used token succeeded");
      return 5;
    } catch (const kolo::ConfigError&) {
      say("KOLO_REUSE_REFUSED rank=" + label());
    }
  }
  g.barrier();
  return 0;
}

std::string grown_line(const Comm& g, const std::string& who) {
  const auto& l = g.lineage();
  return "KOLO_GROWN rank=" + who + " new_rank=" + std::to_string(g.rank()) +
         " size=" + std::to_string(g.size()) + " gen=" + std::to_string(l.generation) +
         " joined=" + std::to_string(l.joined) +
         " parent=" + std::to_string(l.parent_rank[static_cast<std::size_t>(g.rank())]);
}

int joiner(std::uint64_t seed, const std::string& token, const std::string& mode) {
  label() = "joiner";
  try {
    Comm g = Comm::join(token);
    say(grown_line(g, "joiner"));
    return after_grow(g, seed, mode, token);
  } catch (const kolo::ConfigError& e) {
    if (mode == "extra") {
      std::string what = e.what();
      for (char& c : what) {
        if (c == '\n') c = ' ';
      }
      say("KOLO_JOIN_REFUSED what=" + what);
      return 0;
    }
    return report(e);
  } catch (const kolo::Error& e) {
    return report(e);
  }
}

int member(std::uint64_t seed, int k, const std::string& mode) {
  Comm c(kolo::Topology::from_env());
  label() = std::to_string(c.rank());
  const std::string token = "grow-test-" + std::to_string(seed);
  std::vector<pid_t> joiners;
  if (c.rank() == 0 && mode != "absent") {
    const int starts = mode == "extra" ? k + 1 : k;
    for (int j = 0; j < starts; ++j) {
      joiners.push_back(start_joiner(std::to_string(seed), std::to_string(k), token + "." + mode));
    }
  }
  int rc = 0;
  try {
    std::mt19937_64 gen(seed);
    for (long it = 0; it < 20; ++it) {
      if (!step(c, gen, it)) return 5;
    }
    if (mode == "absent") {
      try {
        (void)c.grow(k, kolo::GrowOptions{token, 1.5});
        say("KOLO_WRONG rank=" + label() + " a grow nobody joined succeeded");
        return 5;
      } catch (const kolo::TimeoutError& e) {
        std::string what = e.what();
        for (char& ch : what) {
          if (ch == '\n') ch = ' ';
        }
        for (long it = 20; it < 40; ++it) {
          if (!step(c, gen, it)) return 5;
        }
        say("KOLO_ABSENT_OK rank=" + label() + " what=" + what);
        return 0;
      }
    }
    Comm g = c.grow(k, kolo::GrowOptions{token + "." + mode, -1});
    say(grown_line(g, label()));
    rc = after_grow(g, seed, mode, token + "." + mode);
  } catch (const kolo::Error& e) {
    rc = report(e);
  }
  if (!joiners.empty()) {
    std::string statuses;
    for (pid_t p : joiners) statuses += (statuses.empty() ? "" : ",") + kolo_exact::reap(p);
    say("KOLO_JOINERS_DONE statuses=" + statuses);
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1;
    const int k = argc > 2 ? std::atoi(argv[2]) : 1;
    const std::string mode = argc > 3 ? argv[3] : "";
    if (mode == "join") {
      const std::string token = argc > 4 ? argv[4] : "";
      const std::string jmode = token.substr(token.rfind('.') + 1);
      return joiner(seed, token, jmode);
    }
    return member(seed, k, mode);
  } catch (const kolo::Error& e) {
    return report(e);
  } catch (const std::exception& e) {
    say("KOLO_OTHER rank=" + label() + " " + e.what());
    return 6;
  }
}
