// SIGKILL at a random point of random collectives: every surviving rank raises PeerLostError
// naming the killed rank, within a quarter of KOLO_TIMEOUT_SECONDS (30 s: a survivor that missed
// the loss and waited for its deadline fails), kolo-run names the killed rank, no process of the
// job is left, and no rank hangs or computes a wrong number before the kill.
//
// Each trial is a kolo-run job of `fault_worker chaos SEED`: every rank runs the same random
// sequence of collectives (allreduce with a random algorithm, allgather(v), broadcast,
// reduce_scatter, alltoall, barrier; 0..256K elements) and checks every element; the driver
// kills a random rank a random 0..400 ms after all ranks entered the loop (harness.hpp).
//
// CI size: KOLO_FAULT_TRIALS (default 25) trials per transport, KOLO_FAULT_PARALLEL (default 2)
// jobs at a time: with faults/netns/sigkill_routed's 12, 62 per CI run, and the 50 here alone
// meet issue 10's "at least 50" where namespaces cannot be made. tests/faults/nightly_kill.sh
// runs many more. KOLO_FAULT_SEED replays a run
// (the seed of each trial is printed with a failure).
#include "harness.hpp"

using namespace kolo_faults;

namespace {

void kill_trials(const char* transport, int np_min, int np_max) {
  const std::uint64_t seed = base_seed();
  const long trials = env_long("KOLO_FAULT_TRIALS", 25);
  const int parallel = static_cast<int>(env_long("KOLO_FAULT_PARALLEL", 2));
  MESSAGE("KOLO_FAULT_SEED=" << seed);
  std::vector<KillTrialSpec> specs;
  for (long t = 0; t < trials; ++t) {
    KillTrialSpec s;
    s.transport = transport;
    s.seed = seed + static_cast<std::uint64_t>(t);
    s.np = np_min + static_cast<int>(s.seed % static_cast<std::uint64_t>(np_max - np_min + 1));
    specs.push_back(s);
  }
  const auto results = run_kill_trials(specs, parallel);
  check_kill_trials(results, (std::string("SIGKILL ") + transport).c_str());
}

}  // namespace

TEST_CASE("random rank SIGKILLed in random collectives shm") {
  kill_trials("shm", 3, 4);
}

TEST_CASE("random rank SIGKILLed in random collectives tcp") {
  kill_trials("tcp", 3, 4);
}

// The checks above can fail: survivors that misreport the loss on purpose (fault_worker's
// KOLO_TEST_SABOTAGE) fail every trial, each for its own reason — a TimeoutError at the deadline
// instead of PeerLostError, the right error but only at the deadline, the wrong rank blamed.
// Before issue 57 the first two passed (TimeoutError and "rank " anywhere were accepted, within
// KOLO_TIMEOUT_SECONDS + 5 s). KOLO_TIMEOUT_SECONDS=1 keeps this case near a second.
TEST_CASE("the kill trials reject survivors that misreport the loss") {
  struct Case {
    const char* sabotage;
    const char* failure;  // what the trial's failures must say
  };
  const Case cases[] = {{"timeout", "raised TimeoutError, not PeerLostError"},
                        {"late", "s after the kill (limit: "},
                        {"blame", "did not name the killed rank"}};
  std::vector<KillTrialSpec> specs;
  for (const Case& c : cases) {
    KillTrialSpec s;
    s.np = 3;
    s.transport = "shm";
    s.timeout = 1;
    s.seed = base_seed();
    s.max_delay_ms = 100;
    s.sabotage = c.sabotage;
    specs.push_back(s);
  }
  const auto results = run_kill_trials(specs, 3);
  for (std::size_t i = 0; i < results.size(); ++i) {
    const KillTrialResult& r = results[i];
    CAPTURE(cases[i].sabotage);
    INFO("trial output:\n" << r.out);
    std::string all;
    for (const auto& f : r.failures) all += f + "\n";
    INFO("failures:\n" << all);
    CHECK(contains(all, cases[i].failure));
  }
}

// The store's host dies during the rendezvous (torchrun's convention: rank 0 serves it). Rank 1,
// waiting in the store for rank 2, loses its connection at once (PeerLostError naming the
// store); rank 2, arriving later, cannot connect and gives up at its deadline (TimeoutError
// naming the store). Nobody waits longer than KOLO_TIMEOUT_SECONDS + 5 s.
TEST_CASE("the store's host SIGKILLed during the rendezvous") {
  const double timeout = 5;
  auto ranks = torchrun_env(3, unused_port(), kolo::net::generate_secret(),
                            {"KOLO_TIMEOUT_SECONDS=5", "KOLO_TEST_DELAY_MS=-,-,1500"});
  auto procs = start_ranks(ranks, {"chaos", "1"});
  const auto all = raw(procs);
  // Rank 1 announces itself before connecting; give it time to be waiting in the store.
  const bool started = pump(all, 10, [&] {
    return contains(all[0]->output(), "KOLO_PID") && contains(all[1]->output(), "KOLO_PID");
  });
  REQUIRE(started);
  pump(all, 0.5, [] { return false; });
  const double t_kill = mono_now();
  ::kill(all[0]->pid(), SIGKILL);
  const bool finished = finish_all(all, 2 * timeout + 10);
  std::string outputs;
  for (std::size_t i = 0; i < all.size(); ++i) {
    outputs += "--- rank " + std::to_string(i) + ":\n" + all[i]->output();
  }
  double detect = -1, late_detect = -1;
  std::string late_kind;
  {
    INFO(outputs);
    REQUIRE(finished);
    CHECK(all[0]->code() == 128 + SIGKILL);
    const auto r1 = fault_reports(all[1]->output());
    const auto r2 = fault_reports(all[2]->output());
    REQUIRE(r1.size() == 1);
    REQUIRE(r2.size() == 1);
    const Report& lost = r1.begin()->second;
    const Report& late = r2.begin()->second;
    CHECK(lost.kind == "PeerLostError");
    CHECK(contains(lost.what, "store"));
    detect = lost.mono - t_kill;
    CHECK(detect < timeout + 5);
    CHECK((late.kind == "TimeoutError" || late.kind == "PeerLostError"));
    CHECK(contains(late.what, "store"));
    late_detect = late.mono - t_kill;
    CHECK(late_detect < timeout + 5);
    late_kind = late.kind;
  }
  char line[200];
  std::snprintf(line, sizeof(line),
                "store host killed: the waiting rank raised after %.3f s, the late rank after "
                "%.3f s (%s)",
                detect, late_detect, late_kind.c_str());
  MESSAGE(line);
  if (std::getenv("KOLO_FAULTS_VERBOSE")) std::fprintf(stderr, "%s\n", line);
}

// The launcher itself SIGKILLed mid-job: its ranks die with it (PR_SET_PDEATHSIG), none is left.
TEST_CASE("kolo-run SIGKILLed mid-job leaves no rank behind") {
  for (const char* transport : {"shm", "tcp"}) {
    CAPTURE(transport);
    auto job = start_kolo_run(
        3, {}, {"chaos", "7"},
        {std::string("KOLO_TRANSPORT=") + transport, "KOLO_TIMEOUT_SECONDS=5"}, 30, 5);
    const bool looping =
        pump({job.get()}, 20, [&] { return count_of(job->output(), "KOLO_LOOP rank=") == 3; });
    INFO("kolo-run output:\n" << job->output());
    REQUIRE(looping);
    const auto ranks = rank_processes(job->output());
    REQUIRE(ranks.size() == 3);
    pump({job.get()}, 0.2, [] { return false; });
    ::kill(job->pid(), SIGKILL);
    finish_all({job.get()}, 5);
    CHECK(leftovers(ranks, 3).empty());
  }
}
