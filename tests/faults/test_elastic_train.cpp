// Elastic training after a lost rank: ranks under `kolo-run --elastic` train a model with
// DistributedOptimizer under kolo::run_elastic (elastic_train_worker.cpp); the driver SIGKILLs
// one rank (or two) at a random moment of the training, or a rank kills itself in the middle of
// an engine step (half its buckets submitted). Checked on every survivor: it finished all steps,
// its parameters equal the worker's bit-for-bit replay of the recorded world sizes (no step
// applied twice or lost, every update summed over the right ranks), all survivors hold the same
// parameters (one digest), the history starts at N ranks and ends at N minus the dead, it went
// through at least one reset naming the dead ranks, kolo-run's status is 0, and nothing is left
// behind (no process of the job, no new /dev/shm/kolo-* name). Also a process joining the loop
// (ElasticState::admit_joiners, kolo::join_elastic), as one more rank and as the replacement of
// a lost one: every rank, the joiner included, ends with the same bit-exact parameters over the
// expected sequence of world sizes, each member reset once for it, the joiner ran only the steps
// after it joined.
//
// KOLO_ELASTIC_TRAIN_TRIALS (default 12) random trials per transport, 2 at a time;
// KOLO_FAULT_SEED replays a run.
#include <set>
#include <sstream>

#include "harness.hpp"

#ifndef KOLO_ELASTIC_TRAIN_WORKER_EXE
#error "KOLO_ELASTIC_TRAIN_WORKER_EXE (path of elastic_train_worker) must be defined by the build"
#endif

using namespace kolo_faults;

namespace {

struct TrainSpec {
  int np = 4;
  std::string transport = "shm";
  std::vector<int> victims;  // killed by the driver after delay_ms
  int die_rank = -1;         // kills itself in step die_step, its buckets half submitted
  long die_step = 0;
  int delay_ms = 100;
  std::uint64_t seed = 1;
};

struct TrainResult {
  std::vector<std::string> failures;
  std::string out;
};

// "4x120,3x180": the sizes in order and the steps they sum to.
std::vector<std::pair<int, long>> parse_history(const std::string& h) {
  std::vector<std::pair<int, long>> out;
  std::istringstream in(h);
  for (std::string part; std::getline(in, part, ',');) {
    const auto x = part.find('x');
    if (x == std::string::npos) return {};
    out.emplace_back(std::atoi(part.c_str()), std::atol(part.c_str() + x + 1));
  }
  return out;
}

TrainResult run_train(const TrainSpec& spec) {
  TrainResult res;
  auto fail = [&](const std::string& why) { res.failures.push_back(why); };
  const long steps = 300;
  std::vector<std::string> env = {"KOLO_TRANSPORT=" + spec.transport, "KOLO_TIMEOUT_SECONDS=10",
                                  "KOLO_TRAIN_STEPS=" + std::to_string(steps)};
  if (spec.die_rank >= 0) {
    env.push_back("KOLO_TEST_TRAIN_DIE=" + std::to_string(spec.die_rank) + ":" +
                  std::to_string(spec.die_step));
  }
  const double limit = 40;
  auto job = start_kolo_run(spec.np, {"--elastic"}, {}, env, limit, /*grace=*/5,
                            {KOLO_ELASTIC_TRAIN_WORKER_EXE});
  const bool looping =
      pump({job.get()}, 30, [&] { return count_of(job->output(), "KOLO_LOOP rank=") == spec.np; });
  auto ranks = rank_processes(job->output());
  if (!looping || static_cast<int>(ranks.size()) != spec.np) {
    fail("the ranks did not all start training");
    finish_all({job.get()}, 1);
    res.out = job->output();
    return res;
  }
  if (!spec.victims.empty()) {
    pump({job.get()}, spec.delay_ms / 1000.0, [] { return false; });
    for (int v : spec.victims) ::kill(ranks[v].pid, SIGKILL);
  }
  const bool finished = finish_all({job.get()}, limit + 5);
  res.out = job->output();
  if (!finished) fail("kolo-run did not finish (a hang)");
  if (job->code() != 0) fail("kolo-run exited with " + std::to_string(job->code()));
  if (contains(res.out, "KOLO_WRONG")) fail("a rank's parameters differ from the replay");
  std::set<int> gone(spec.victims.begin(), spec.victims.end());
  if (spec.die_rank >= 0) gone.insert(spec.die_rank);
  std::string want_lost;
  for (int v : gone) want_lost += (want_lost.empty() ? "" : ",") + std::to_string(v);
  const int new_size = spec.np - static_cast<int>(gone.size());
  std::map<int, std::string> trained;
  std::map<int, std::set<std::string>> lost_named;  // survivor -> the lost= of its resets
  std::set<int> reset_at_zero;  // survivors whose first reset restored step 0 (no N-rank step)
  std::istringstream lines(res.out);
  for (std::string line; std::getline(lines, line);) {
    if (const auto at = line.find("KOLO_TRAINED rank="); at != std::string::npos) {
      trained[std::atoi(line.c_str() + at + 18)] = line.substr(at);
    }
    if (const auto at = line.find("KOLO_RESET rank="); at != std::string::npos) {
      const int who = std::atoi(line.c_str() + at + 16);
      if (!lost_named.count(who) && field(line.substr(at), "step") == "0") {
        reset_at_zero.insert(who);
      }
      lost_named[who].insert(field(line.substr(at), "lost"));
    }
  }
  std::string digest;
  int next = 0;
  for (int r = 0; r < spec.np; ++r) {
    if (gone.count(r)) continue;
    const std::string who = "survivor " + std::to_string(r);
    const auto it = trained.find(r);
    if (it == trained.end()) {
      fail(who + " did not finish training");
      ++next;
      continue;
    }
    const std::string& l = it->second;
    if (field(l, "steps") != std::to_string(steps)) fail(who + ": steps " + field(l, "steps"));
    if (field(l, "size") != std::to_string(new_size)) fail(who + ": size " + field(l, "size"));
    if (field(l, "new_rank") != std::to_string(next)) {
      fail(who + ": new rank " + field(l, "new_rank") + ", not " + std::to_string(next));
    }
    if (std::atoi(field(l, "resets").c_str()) < 1) fail(who + " went through no reset");
    if (digest.empty()) digest = field(l, "digest");
    if (field(l, "digest") != digest) fail(who + "'s parameters differ from the other survivors'");
    const auto h = parse_history(field(l, "history"));
    long total = 0;
    for (std::size_t i = 0; i < h.size(); ++i) {
      total += h[i].second;
      if (i > 0 && h[i].first >= h[i - 1].first) fail(who + ": the world size grew in its history");
    }
    // A rank killed before the first step completed leaves no step at N ranks.
    const bool front_ok = !h.empty() && (reset_at_zero.count(r) ? h.front().first <= spec.np
                                                                : h.front().first == spec.np);
    if (!front_ok || h.back().first != new_size || total != steps) {
      fail(who + ": history " + field(l, "history") + " is not " + std::to_string(spec.np) +
           " ranks, then " + std::to_string(new_size) + ", over " + std::to_string(steps) +
           " steps");
    }
    // Two deaths may be handled by one reset or by two; together they name every dead rank.
    std::set<int> named;
    for (const std::string& s : lost_named[r]) {
      std::istringstream in(s);
      for (std::string q; std::getline(in, q, ',');) named.insert(std::atoi(q.c_str()));
    }
    std::string named_text;
    for (int q : named) named_text += (named_text.empty() ? "" : ",") + std::to_string(q);
    // The resets name parent ranks of each generation; with one death (or two in one reset)
    // they are the driver's ranks.
    if (gone.size() == 1 || lost_named[r].size() == 1) {
      if (named_text != want_lost) {
        fail(who + "'s resets named [" + named_text + "] lost, not [" + want_lost + "]");
      }
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

void check(const std::vector<TrainSpec>& specs, const char* what) {
  const std::vector<TrainResult> results = run_two_at_a_time(specs, run_train);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const TrainSpec& s = specs[i];
    std::string victims;
    for (int v : s.victims) victims += std::to_string(v) + " ";
    CAPTURE(what);
    CAPTURE(s.np);
    CAPTURE(s.transport);
    CAPTURE(victims);
    CAPTURE(s.delay_ms);
    CAPTURE(s.die_rank);
    CAPTURE(s.die_step);
    std::string all;
    for (const auto& f : results[i].failures) all += f + "\n";
    INFO("failures:\n" << all << "output:\n" << results[i].out);
    CHECK(results[i].failures.empty());
  }
}

// A process joining the training loop (ElasticState::admit_joiners, kolo::join_elastic): parent
// rank 0 starts it at step `spawn_at`, after `die_rank` (if any) killed itself at `die_step`.
struct JoinSpec {
  int np = 3;
  std::string transport = "shm";
  int die_rank = -1;
  long die_step = 0;
  long spawn_at = 100;
};

TrainResult run_join(const JoinSpec& spec) {
  TrainResult res;
  auto fail = [&](const std::string& why) { res.failures.push_back(why); };
  const long steps = 300;
  std::vector<std::string> env = {"KOLO_TRANSPORT=" + spec.transport, "KOLO_TIMEOUT_SECONDS=10",
                                  "KOLO_TRAIN_STEPS=" + std::to_string(steps),
                                  "KOLO_TRAIN_JOIN=test-join",
                                  "KOLO_TRAIN_SPAWN_AT=" + std::to_string(spec.spawn_at)};
  if (spec.die_rank >= 0) {
    env.push_back("KOLO_TEST_TRAIN_DIE=" + std::to_string(spec.die_rank) + ":" +
                  std::to_string(spec.die_step));
  }
  const double limit = 40;
  auto job = start_kolo_run(spec.np, {"--elastic"}, {}, env, limit, /*grace=*/5,
                            {KOLO_ELASTIC_TRAIN_WORKER_EXE});
  const bool finished = finish_all({job.get()}, limit + 5);
  res.out = job->output();
  if (!finished) fail("kolo-run did not finish (a hang)");
  if (job->code() != 0) fail("kolo-run exited with " + std::to_string(job->code()));
  if (contains(res.out, "KOLO_WRONG")) fail("a rank's parameters differ from the replay");
  if (contains(res.out, "KOLO_FAULT") || contains(res.out, "KOLO_OTHER")) fail("a rank failed");
  if (!contains(res.out, "KOLO_JOINER_DONE status=0")) fail("the joiner did not exit 0");
  const int members = spec.np - (spec.die_rank >= 0 ? 1 : 0);
  const int final_size = members + 1;
  std::vector<int> want_sizes = {spec.np};
  if (spec.die_rank >= 0) want_sizes.push_back(spec.np - 1);
  want_sizes.push_back(final_size);
  std::map<std::string, std::string> trained;
  std::map<std::string, int> joined_resets;
  std::istringstream lines(res.out);
  for (std::string line; std::getline(lines, line);) {
    if (const auto at = line.find("KOLO_TRAINED rank="); at != std::string::npos) {
      trained[field(line.substr(at), "rank")] = line.substr(at);
    }
    if (const auto at = line.find("KOLO_RESET rank="); at != std::string::npos) {
      if (field(line.substr(at), "joined") == "1") ++joined_resets[field(line.substr(at), "rank")];
    }
  }
  std::string digest;
  int next = 0;
  std::vector<std::string> who_all;
  for (int r = 0; r < spec.np; ++r) {
    if (r != spec.die_rank) who_all.push_back(std::to_string(r));
  }
  who_all.push_back("j");
  for (const std::string& r : who_all) {
    const std::string who = r == "j" ? std::string("the joiner") : "member " + r;
    const auto it = trained.find(r);
    if (it == trained.end()) {
      fail(who + " did not finish training");
      ++next;
      continue;
    }
    const std::string& l = it->second;
    if (field(l, "steps") != std::to_string(steps)) fail(who + ": steps " + field(l, "steps"));
    if (field(l, "size") != std::to_string(final_size)) fail(who + ": size " + field(l, "size"));
    if (field(l, "new_rank") != std::to_string(next)) {
      fail(who + ": new rank " + field(l, "new_rank") + ", not " + std::to_string(next));
    }
    if (digest.empty()) digest = field(l, "digest");
    if (field(l, "digest") != digest) fail(who + "'s parameters differ from the others'");
    const auto h = parse_history(field(l, "history"));
    std::vector<int> sizes;
    long total = 0;
    for (const auto& [n, k] : h) {
      sizes.push_back(n);
      total += k;
    }
    if (sizes != want_sizes || total != steps) {
      fail(who + ": history " + field(l, "history") + " is not the expected world sizes");
    }
    // The joiner trained only from the step it joined at (after spawn_at).
    const long executed = std::atol(field(l, "executed").c_str());
    if (r == "j" && (executed <= 0 || executed > steps - spec.spawn_at)) {
      fail("the joiner executed " + std::to_string(executed) + " steps");
    }
    if (r != "j" && joined_resets[r] != 1) fail(who + " did not reset once for the joiner");
    ++next;
  }
  for (pid_t p : leftovers(rank_processes(res.out), 3)) {
    fail("process " + std::to_string(p) + " is still running");
  }
  return res;
}

std::vector<TrainSpec> random_specs(const char* transport) {
  const std::uint64_t seed = base_seed();
  MESSAGE("KOLO_FAULT_SEED=" << seed);
  const long trials = env_long("KOLO_ELASTIC_TRAIN_TRIALS", 12);
  std::vector<TrainSpec> specs;
  for (long t = 0; t < trials; ++t) {
    std::mt19937_64 rng(seed + static_cast<std::uint64_t>(t) * 104729);
    TrainSpec s;
    s.transport = transport;
    s.seed = seed + static_cast<std::uint64_t>(t);
    s.np = rng() % 3 == 0 ? 8 : 4;
    s.delay_ms = 20 + static_cast<int>(rng() % 200);
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

TEST_CASE("elastic training goes on with the survivors of SIGKILLed ranks shm") {
  const auto before = dev_shm_kolo();
  check(random_specs("shm"), "shm");
  check_no_new_dev_shm(before);
}

TEST_CASE("elastic training goes on with the survivors of SIGKILLed ranks tcp") {
  check(random_specs("tcp"), "tcp");
}

TEST_CASE("a rank dying with its step's buckets half submitted: the survivors redo the step") {
  std::vector<TrainSpec> specs;
  for (const char* transport : {"shm", "tcp"}) {
    TrainSpec s;
    s.transport = transport;
    s.np = 4;
    s.die_rank = 2;
    s.die_step = 40;
    specs.push_back(s);
  }
  check(specs, "in a step");
}

TEST_CASE("a process joins the training loop: one more, and a replacement after a loss") {
  const auto before = dev_shm_kolo();
  std::vector<JoinSpec> specs;
  JoinSpec more;
  specs.push_back(more);  // shm, 3 -> 4 at step 100
  JoinSpec replacement;
  replacement.transport = "tcp";
  replacement.die_rank = 2;
  replacement.die_step = 60;
  replacement.spawn_at = 120;  // 3 -> 2 at 60, -> 3 after 120
  specs.push_back(replacement);
  JoinSpec two;
  two.transport = "tcp";
  two.np = 2;
  two.spawn_at = 50;
  specs.push_back(two);
  const std::vector<TrainResult> results = run_two_at_a_time(specs, run_join);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    CAPTURE(specs[i].np);
    CAPTURE(specs[i].transport);
    CAPTURE(specs[i].die_rank);
    std::string all;
    for (const auto& f : results[i].failures) all += f + "\n";
    INFO("failures:\n" << all << "output:\n" << results[i].out);
    CHECK(results[i].failures.empty());
  }
  check_no_new_dev_shm(before);
}
