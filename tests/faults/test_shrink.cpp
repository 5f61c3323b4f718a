// Surviving a lost rank: ranks under `kolo-run --elastic` run exact random collectives; the
// driver SIGKILLs one rank (or two) at a random point; every survivor catches the loss, calls
// Communicator::shrink, and runs 100 exact operations on the new communicator. Checked: every
// survivor reports the same excluded set, equal to the killed ranks, the new size, its new rank
// (the survivors renumbered in their old order), generation 1, no wrong number, kolo-run's
// status 0, and nothing left behind (no process of the job, no new /dev/shm/kolo-* name). Also a
// survivor killed during the shrink (before its "here" record, after it, after the decision,
// after its build): the others retry without it. And a revocation with nobody dead (rank 0 calls
// revoke(): every rank catches RevokedError and the shrink keeps all), and a live rank named in
// `excluded` (it learns from its own shrink that it was excluded). The time from the kill to the
// first completed operation on the shrunk communicator is printed (a figure for
// docs/reliability.md, measured by benchmarks/recovery.sh; not asserted here).
//
// KOLO_SHRINK_TRIALS (default 13) random trials per transport, 2 at a time; KOLO_FAULT_SEED
// replays a run.
#include <set>
#include <sstream>

#include "harness.hpp"

#ifndef KOLO_ELASTIC_WORKER_EXE
#error "KOLO_ELASTIC_WORKER_EXE (path of elastic_worker) must be defined by the build"
#endif

using namespace kolo_faults;

namespace {

struct ShrinkSpec {
  int np = 4;
  std::string transport = "shm";
  std::vector<int> victims;  // killed by the driver
  int die_rank = -1;         // a survivor that kills itself at shrink step die_step
  int die_step = 0;
  int delay_ms = 100;
  std::uint64_t seed = 1;
  std::string mode;  // elastic_worker's MODE: "" (the driver kills), "revoke", "exclude"
};

struct ShrinkResult {
  std::vector<std::string> failures;
  double recovery_max = -1;  // s from the kill to the last survivor's first op on the new comm
  std::string out;
};

ShrinkResult run_shrink(const ShrinkSpec& spec) {
  ShrinkResult res;
  auto fail = [&](const std::string& why) { res.failures.push_back(why); };
  std::vector<std::string> env = {"KOLO_TRANSPORT=" + spec.transport, "KOLO_TIMEOUT_SECONDS=10"};
  if (spec.die_rank >= 0) {
    env.push_back("KOLO_TEST_SHRINK_DIE=" + std::to_string(spec.die_rank) + ":" +
                  std::to_string(spec.die_step));
  }
  const double limit = 40;
  std::vector<std::string> args = {std::to_string(spec.seed)};
  if (!spec.mode.empty()) args.push_back(spec.mode);
  auto job = start_kolo_run(spec.np, {"--elastic"}, args, env, limit,
                            /*grace=*/5, {KOLO_ELASTIC_WORKER_EXE});
  const bool looping =
      pump({job.get()}, 30, [&] { return count_of(job->output(), "KOLO_LOOP rank=") == spec.np; });
  auto ranks = rank_processes(job->output());
  if (!looping || static_cast<int>(ranks.size()) != spec.np) {
    fail("the ranks did not all reach their loop");
    finish_all({job.get()}, 1);
    res.out = job->output();
    return res;
  }
  pump({job.get()}, spec.delay_ms / 1000.0, [] { return false; });
  const double t_kill = mono_now();
  for (int v : spec.victims) ::kill(ranks[v].pid, SIGKILL);
  const bool finished = finish_all({job.get()}, limit + 5);
  res.out = job->output();
  if (!finished) fail("kolo-run did not finish (a hang)");
  if (job->code() != 0) fail("kolo-run exited with " + std::to_string(job->code()));
  if (contains(res.out, "KOLO_WRONG")) fail("a rank computed a wrong result");
  std::set<int> gone(spec.victims.begin(), spec.victims.end());
  if (spec.die_rank >= 0) gone.insert(spec.die_rank);
  if (spec.mode == "exclude") {
    gone.insert(spec.np - 1);
    const auto reports = fault_reports(res.out);
    const auto it = reports.find(std::to_string(spec.np - 1));
    if (it == reports.end() || it->second.kind != "RevokedError" ||
        !contains(it->second.what, "was excluded by the survivors' agreement")) {
      fail("the excluded rank did not report that the survivors excluded it");
    }
  }
  std::string want_ex;
  for (int v : gone) want_ex += (want_ex.empty() ? "" : ",") + std::to_string(v);
  const int new_size = spec.np - static_cast<int>(gone.size());
  int next = 0;
  std::istringstream lines(res.out);
  std::map<int, std::string> shrunk;
  for (std::string line; std::getline(lines, line);) {
    if (const auto at = line.find("KOLO_SHRUNK rank="); at != std::string::npos) {
      shrunk[std::atoi(line.c_str() + at + 17)] = line.substr(at);
    }
  }
  for (int r = 0; r < spec.np; ++r) {
    if (gone.count(r)) continue;
    const std::string who = "survivor " + std::to_string(r);
    const auto it = shrunk.find(r);
    if (it == shrunk.end()) {
      fail(who + " did not shrink");
      ++next;
      continue;
    }
    const std::string& l = it->second;
    if (field(l, "excluded") != want_ex) {
      fail(who + " excluded [" + field(l, "excluded") + "], not [" + want_ex + "]");
    }
    if (field(l, "size") != std::to_string(new_size)) fail(who + ": size " + field(l, "size"));
    if (field(l, "new_rank") != std::to_string(next)) {
      fail(who + ": new rank " + field(l, "new_rank") + ", not " + std::to_string(next));
    }
    if (field(l, "gen") != "1") fail(who + ": generation " + field(l, "gen"));
    if (!spec.mode.empty() && field(l, "caught") != "RevokedError") {
      fail(who + " caught " + field(l, "caught") + ", not RevokedError");
    }
    const std::string ok = "KOLO_ELASTIC_OK rank=" + std::to_string(r) + " ";
    if (!contains(res.out, ok)) fail(who + " did not finish its 100 operations on the new group");
    const double recovered = std::atof(field(l, "mono_first").c_str()) - t_kill;
    res.recovery_max = std::max(res.recovery_max, recovered);
    // The agreement's deadline (60 % of the 10 s shrink budget) would exclude the dead too, only
    // late: half of it proves that the failure detectors found them.
    if (!spec.victims.empty() && recovered > 3.0) {
      fail(who + " was back " + std::to_string(recovered) +
           " s after the kill: the deadline, not the failure detectors, excluded the dead");
    }
    ++next;
  }
  for (int v : gone) {
    if (!contains(res.out, "rank " + std::to_string(v) + " lost; continuing")) {
      fail("kolo-run did not report rank " + std::to_string(v) + " as lost (--elastic)");
    }
  }
  for (pid_t p : leftovers(ranks, 3)) fail("process " + std::to_string(p) + " is still running");
  return res;
}

void check(const std::vector<ShrinkSpec>& specs, const char* what) {
  const std::vector<ShrinkResult> results = run_two_at_a_time(specs, run_shrink);
  double worst = 0;
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const ShrinkSpec& s = specs[i];
    std::string victims;
    for (int v : s.victims) victims += std::to_string(v) + " ";
    CAPTURE(what);
    CAPTURE(s.np);
    CAPTURE(s.transport);
    CAPTURE(victims);
    CAPTURE(s.seed);
    CAPTURE(s.die_rank);
    CAPTURE(s.die_step);
    std::string all;
    for (const auto& f : results[i].failures) all += f + "\n";
    INFO("failures:\n" << all << "output:\n" << results[i].out);
    CHECK(results[i].failures.empty());
    worst = std::max(worst, results[i].recovery_max);
  }
  MESSAGE(std::string(what) << ": worst time from the kill to the first operation on the shrunk "
                            << "communicator " << worst << " s");
}

std::vector<ShrinkSpec> random_specs(const char* transport) {
  const std::uint64_t seed = base_seed();
  MESSAGE("KOLO_FAULT_SEED=" << seed);
  const long trials = env_long("KOLO_SHRINK_TRIALS", 13);
  std::vector<ShrinkSpec> specs;
  for (long t = 0; t < trials; ++t) {
    std::mt19937_64 rng(seed + static_cast<std::uint64_t>(t) * 7919);
    ShrinkSpec s;
    s.transport = transport;
    s.seed = seed + static_cast<std::uint64_t>(t);
    s.np = rng() % 3 == 0 ? 8 : 4;
    s.delay_ms = static_cast<int>(rng() % 301);
    const int kills = rng() % 4 == 0 ? 2 : 1;
    while (static_cast<int>(s.victims.size()) < kills) {
      const int v = static_cast<int>(rng() % static_cast<std::uint64_t>(s.np));
      if (std::find(s.victims.begin(), s.victims.end(), v) == s.victims.end()) {
        s.victims.push_back(v);
      }
    }
    specs.push_back(s);
  }
  return specs;
}

}  // namespace

TEST_CASE("survivors of SIGKILLed ranks shrink and go on shm") {
  const auto before = dev_shm_kolo();
  check(random_specs("shm"), "shm");
  check_no_new_dev_shm(before);
}

TEST_CASE("survivors of SIGKILLed ranks shrink and go on tcp") {
  check(random_specs("tcp"), "tcp");
}

TEST_CASE("a survivor killed during the shrink is excluded by a second round") {
  std::vector<ShrinkSpec> specs;
  for (const char* transport : {"shm", "tcp"}) {
    for (int step : {1, 2, 3, 4}) {
      ShrinkSpec s;
      s.transport = transport;
      s.np = 4;
      s.victims = {1};
      s.die_rank = 3;
      s.die_step = step;
      s.seed = base_seed() + static_cast<std::uint64_t>(step);
      specs.push_back(s);
    }
  }
  check(specs, "killed during the shrink");
}

TEST_CASE("a revoked communicator fails on every rank and shrinks to all or to the agreed rest") {
  std::vector<ShrinkSpec> specs;
  for (const char* transport : {"shm", "tcp"}) {
    for (const char* mode : {"revoke", "exclude"}) {
      ShrinkSpec s;
      s.transport = transport;
      s.np = 3;
      s.mode = mode;
      s.delay_ms = 0;
      s.seed = base_seed();
      specs.push_back(s);
    }
  }
  check(specs, "revoke");
}
