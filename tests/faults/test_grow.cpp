// Growing a communicator: members under kolo-run run exact collectives, rank 0 starts K new
// processes, the members call Communicator::grow(K, {token}) and the new processes
// Communicator::join(token) (grow_worker.cpp). Checked on every rank of the enlarged
// communicator: its rank (members keep theirs, joiners after them), size N + K, generation 1,
// `joined` K and its parent rank (-1 for a joiner); 100 exact operations on it; a second grow
// with the used token refused with a ConfigError on every rank; every joiner's exit status 0;
// kolo-run's status 0; nothing left behind (no process of the job, no new /dev/shm/kolo-* name).
// Also: a joiner SIGKILLed after the grow is shrunk away by the rest, who go on exactly; a grow
// nobody joins is a TimeoutError on every member, whose old communicator still works; and a
// process beyond the offered places is refused; and the argument checks of grow and join (an
// empty token, one with a "/" or a control character, a count below 1, no store).
#include <kolo/kolo.hpp>

#include <set>
#include <sstream>

#include "harness.hpp"

#ifndef KOLO_GROW_WORKER_EXE
#error "KOLO_GROW_WORKER_EXE (path of grow_worker) must be defined by the build"
#endif

using namespace kolo_faults;

namespace {

struct GrowSpec {
  int np = 2;
  int k = 1;
  std::string transport = "shm";
  std::string mode;  // grow_worker's MODE: "", "lose", "absent", "extra"
  std::uint64_t seed = 1;
};

struct GrowResult {
  std::vector<std::string> failures;
  std::string out;
};

// Every line holding `tag` (from the tag on), by the value of its `new_rank=`/`rank=` field.
std::map<std::string, std::string> lines_by(const std::string& out, const std::string& tag,
                                            const std::string& key) {
  std::map<std::string, std::string> m;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (const auto at = line.find(tag); at != std::string::npos) {
      const std::string l = line.substr(at);
      m[field(l, key)] = l;
    }
  }
  return m;
}

GrowResult run_grow(const GrowSpec& s) {
  GrowResult res;
  auto fail = [&](const std::string& why) { res.failures.push_back(why); };
  const std::vector<std::string> env = {"KOLO_TRANSPORT=" + s.transport, "KOLO_TIMEOUT_SECONDS=10"};
  const double limit = 40;
  std::vector<std::string> args = {std::to_string(s.seed), std::to_string(s.k)};
  if (!s.mode.empty()) args.push_back(s.mode);
  auto job = start_kolo_run(s.np, {}, args, env, limit, /*grace=*/5, {KOLO_GROW_WORKER_EXE});
  const bool finished = finish_all({job.get()}, limit + 5);
  res.out = job->output();
  if (!finished) fail("kolo-run did not finish (a hang)");
  if (job->code() != 0) fail("kolo-run exited with " + std::to_string(job->code()));
  if (contains(res.out, "KOLO_WRONG")) fail("a rank computed a wrong result");
  if (contains(res.out, "KOLO_FAULT") || contains(res.out, "KOLO_OTHER")) {
    fail("a rank failed with an error");
  }
  const int size = s.np + s.k;
  if (s.mode == "absent") {
    const auto ok = lines_by(res.out, "KOLO_ABSENT_OK", "rank");
    for (int r = 0; r < s.np; ++r) {
      const auto it = ok.find(std::to_string(r));
      if (it == ok.end()) {
        fail("member " + std::to_string(r) + " did not go on after the refused grow");
      } else if (!contains(it->second, "0 of " + std::to_string(s.k) + " joiners came")) {
        fail("member " + std::to_string(r) + "'s timeout does not say who came: " + it->second);
      }
    }
  } else {
    const auto grown = lines_by(res.out, "KOLO_GROWN", "new_rank");
    const auto ok = lines_by(res.out, "KOLO_GROW_OK", "rank");
    const auto refused = lines_by(res.out, "KOLO_REUSE_REFUSED", "rank");
    const auto shrunk = lines_by(res.out, "KOLO_SHRUNK_AFTER_GROW", "rank");
    const int victim = s.mode == "lose" ? size - 1 : -1;
    for (int r = 0; r < size; ++r) {
      const std::string who = "rank " + std::to_string(r) + " of the grown communicator";
      const auto it = grown.find(std::to_string(r));
      if (it == grown.end()) {
        fail(who + " did not report it");
        continue;
      }
      const std::string& l = it->second;
      if (field(l, "size") != std::to_string(size)) fail(who + ": size " + field(l, "size"));
      if (field(l, "gen") != "1") fail(who + ": generation " + field(l, "gen"));
      if (field(l, "joined") != std::to_string(s.k)) fail(who + ": joined " + field(l, "joined"));
      const std::string parent = r < s.np ? std::to_string(r) : "-1";
      if (field(l, "parent") != parent) fail(who + ": parent rank " + field(l, "parent"));
      if (r < s.np && field(l, "rank") != std::to_string(r)) {
        fail(who + " was member " + field(l, "rank") + " (members keep their ranks)");
      }
      if (r >= s.np && field(l, "rank") != "joiner") fail(who + " is not a joiner");
      if (r == victim) continue;
      if (!ok.count(std::to_string(r))) fail(who + " did not finish its exact operations");
      if (s.mode.empty() && !refused.count(std::to_string(r))) {
        fail(who + " was not refused a second grow with the used token");
      }
      if (s.mode == "lose") {
        const auto sh = shrunk.find(std::to_string(r));
        if (sh == shrunk.end()) {
          fail(who + " did not shrink after the joiner's loss");
        } else if (field(sh->second, "size") != std::to_string(size - 1) ||
                   field(sh->second, "excluded") != std::to_string(victim) ||
                   field(sh->second, "new_rank") != std::to_string(r)) {
          fail(who + "'s shrink: " + sh->second);
        }
      }
    }
    std::string want;
    for (int j = 0; j < (s.mode == "extra" ? s.k + 1 : s.k); ++j) {
      want += std::string(j ? "," : "") + (s.mode == "lose" && j == s.k - 1 ? "?" : "0");
    }
    const auto done = lines_by(res.out, "KOLO_JOINERS_DONE", "rank");
    const std::string statuses = done.empty() ? "" : field(done.begin()->second, "statuses");
    if (s.mode == "lose") {
      // The victim is the joiner that took the last place, not necessarily the last started.
      const auto n9 = std::count(statuses.begin(), statuses.end(), '9');
      if (statuses.find("sig9") == std::string::npos || n9 != 1 ||
          std::count(statuses.begin(), statuses.end(), '0') != s.k - 1) {
        fail("joiners' exit statuses " + statuses + ", not one sig9 and the rest 0");
      }
    } else if (statuses != want) {
      fail("joiners' exit statuses [" + statuses + "], not [" + want + "]");
    }
    if (s.mode == "extra" &&
        !contains(res.out, "KOLO_JOIN_REFUSED what=join: the grow with token")) {
      fail("the process beyond the offered places was not refused");
    } else if (s.mode == "extra" && !contains(res.out, "all are taken")) {
      fail("the refusal does not say that every place was taken");
    }
  }
  for (pid_t p : leftovers(rank_processes(res.out), 3)) {
    fail("process " + std::to_string(p) + " is still running");
  }
  return res;
}

void check(const std::vector<GrowSpec>& specs, const char* what) {
  const auto before = dev_shm_kolo();
  const std::vector<GrowResult> results = run_two_at_a_time(specs, run_grow);
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const GrowSpec& s = specs[i];
    CAPTURE(what);
    CAPTURE(s.np);
    CAPTURE(s.k);
    CAPTURE(s.transport);
    CAPTURE(s.mode);
    std::string all;
    for (const auto& f : results[i].failures) all += f + "\n";
    INFO("failures:\n" << all << "output:\n" << results[i].out);
    CHECK(results[i].failures.empty());
  }
  check_no_new_dev_shm(before);
}

GrowSpec spec(int np, int k, const char* transport, const char* mode) {
  GrowSpec s;
  s.np = np;
  s.k = k;
  s.transport = transport;
  s.mode = mode;
  s.seed = base_seed() + static_cast<std::uint64_t>(np * 10 + k);
  return s;
}

}  // namespace

TEST_CASE("new processes join a grown communicator and every rank computes exactly") {
  check(
      {spec(2, 1, "shm", ""), spec(4, 2, "shm", ""), spec(2, 1, "tcp", ""), spec(3, 2, "tcp", "")},
      "grow by one and by two");
}

TEST_CASE("a joiner SIGKILLed after the grow is shrunk away and the rest go on") {
  check({spec(3, 1, "shm", "lose"), spec(2, 2, "tcp", "lose")}, "lose a joiner");
}

TEST_CASE("a grow nobody joins times out on every member and the old communicator goes on") {
  check({spec(3, 1, "tcp", "absent"), spec(2, 2, "shm", "absent")}, "absent joiners");
}

TEST_CASE("a process beyond the offered places is refused and the grow goes on") {
  check({spec(2, 1, "shm", "extra"), spec(2, 1, "tcp", "extra")}, "one too many");
}

TEST_CASE("grow and join refuse a bad token or count before anything is sent") {
  using Comm = kolo::Communicator<>;
  Comm one(kolo::Topology::for_rank(0, 1));  // no store: the argument checks come first
  const auto message = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const kolo::ConfigError& e) {
      return e.what();
    }
    return "(no ConfigError)";
  };
  CHECK(message([&] { (void)one.grow(1, {}); }).find("grow: the join token is empty") == 0);
  CHECK(message([&] { (void)one.grow(1, {"a/b"}); }).find("has a '/' or a control character") !=
        std::string::npos);
  CHECK(message([&] { (void)one.grow(1, {"a\nb"}); }).find("has a '/' or a control character") !=
        std::string::npos);
  for (int count : {0, -1}) {
    CHECK(message([&] { (void)one.grow(count, {"t"}); }) ==
          "grow: count must be at least 1 (got " + std::to_string(count) + ")");
  }
  CHECK(message([&] { (void)one.grow(1, {"t"}); })
            .find("grow: this communicator has no "
                  "rendezvous store") == 0);
  CHECK(message([] { (void)Comm::join(nullptr, "", {}); }).find("join: the join token is empty") ==
        0);
  CHECK(message([] { (void)Comm::join(nullptr, "x/y", {}); }).find("has a '/'") !=
        std::string::npos);
  CHECK(message([] { (void)Comm::join(nullptr, "ok", {}); }) ==
        "join: no store (the members' rendezvous store is needed)");
}
