// Fault injection with real processes: bad input must become a clear error that names the
// problem, on every rank, well within the deadline, and never a hang.
//
// Each case starts ranks of fault_worker (see its header for the report lines it prints) either
// under the real kolo-run or forked directly from here with a hand-made environment (to break
// the environment contract kolo-run would otherwise fill in correctly, and to know every data
// port in advance). Every subprocess has a hard wall-clock limit: when it passes, the processes
// are killed and the case fails, so a bug shows up as a failure rather than a stuck CTest.
#include <set>
#include <string>

#include "harness.hpp"

using namespace kolo_faults;

namespace {

const char* const kTransports[] = {"shm", "tcp"};
const int kRankCounts[] = {2, 3, 4};

// (a) mismatched collectives: every rank throws MismatchError naming both sides.
void mismatch_matrix(const char* transport, const std::string& mode,
                     const std::vector<std::string>& needles) {
  for (int np : kRankCounts) {
    CAPTURE(np);
    CAPTURE(transport);
    CAPTURE(mode);
    const JobResult r = kolo_run(
        np, {mode}, {std::string("KOLO_TRANSPORT=") + transport, "KOLO_TIMEOUT_SECONDS=20"});
    expect_all_ranks(r, np, "MismatchError", needles);
    CHECK(r.seconds < 10);  // found at the first message, not by a timeout
  }
}

// Large messages: a rank can be in the middle of a send to a rank that has already reported the
// error and exited. It must still report the real error (which that rank sent before leaving),
// not "connection lost". Timing-dependent, so a few rounds.
void mismatch_large(const char* transport) {
  const std::size_t n = std::size_t{1} << 22;
  for (int round = 0; round < 4; ++round) {
    CAPTURE(transport);
    CAPTURE(round);
    const JobResult r =
        kolo_run(4, {"mismatch-count", std::to_string(n)},
                 {std::string("KOLO_TRANSPORT=") + transport, "KOLO_TIMEOUT_SECONDS=20"});
    expect_all_ranks(r, 4, "MismatchError", {std::to_string(n), std::to_string(n - 1)});
  }
}

}  // namespace

TEST_CASE("mismatched count shm") {
  mismatch_matrix("shm", "mismatch-count", {"999", "1000"});
}
TEST_CASE("mismatched count tcp") {
  mismatch_matrix("tcp", "mismatch-count", {"999", "1000"});
}
TEST_CASE("mismatched count of large messages shm") {
  mismatch_large("shm");
}
TEST_CASE("mismatched count of large messages tcp") {
  mismatch_large("tcp");
}
TEST_CASE("mismatched dtype shm") {
  mismatch_matrix("shm", "mismatch-dtype", {"float32", "int32"});
}
TEST_CASE("mismatched dtype tcp") {
  mismatch_matrix("tcp", "mismatch-dtype", {"float32", "int32"});
}
TEST_CASE("mismatched collective order shm") {
  mismatch_matrix("shm", "mismatch-order", {"broadcast", "allreduce"});
}
TEST_CASE("mismatched collective order tcp") {
  mismatch_matrix("tcp", "mismatch-order", {"broadcast", "allreduce"});
}

// A rank that never reaches a collective (busy elsewhere past the deadline): every rank reports
// a TimeoutError naming it as the rank that never reached the call and suggesting why, agreed
// through the abort (the first rank to time out diagnoses, the others carry its words), and the
// waiting ranks report at the deadline (not before it, and within a quarter of it after: neither
// the diagnosis nor the one-second TCP drain delays the exception).
void skipped_call(const char* transport, int np) {
  CAPTURE(transport);
  CAPTURE(np);
  const double T = 2.0;
  const JobResult r = kolo_run(
      np, {"skip", "3.5"},
      {std::string("KOLO_TRANSPORT=") + transport, "KOLO_TIMEOUT_SECONDS=" + std::to_string(T)});
  expect_all_ranks(r, np, "TimeoutError",
                   {"rank 1 never reached allreduce #", "skipped this call"});
  const auto reports = fault_reports(r.out);
  for (int rank = 0; rank < np; ++rank) {
    if (rank == 1) continue;  // the culprit learns it at its late call
    const auto it = reports.find(std::to_string(rank));
    if (it == reports.end()) continue;  // reported by expect_all_ranks
    CAPTURE(rank);
    CHECK(it->second.after >= T - 0.2);
    CHECK(it->second.after <= T * 1.25);
    // No healthy rank is blamed.
    for (int other = 0; other < np; ++other) {
      if (other == 1) continue;
      CHECK_MESSAGE(!contains(it->second.what, "rank " + std::to_string(other) + " never reached"),
                    it->second.what);
    }
  }
}

TEST_CASE("a rank that skips a collective is named on every rank shm") {
  skipped_call("shm", 3);
  skipped_call("shm", 4);
}
TEST_CASE("a rank that skips a collective is named on every rank tcp") {
  skipped_call("tcp", 3);
  skipped_call("tcp", 4);
}

// One rank's invalid argument: ConfigError there, the same message tagged with its origin on
// every other rank (the error travels instead of leaving the others to time out).
TEST_CASE("invalid argument on one rank reaches all") {
  const int np = 3;
  struct Case {
    const char* mode;
    const char* needle;
  };
  for (const Case c : {Case{"null-buffer", "null pointer with 1000 elements"},
                       Case{"bad-root", "root 3 is not a rank"}}) {
    for (const char* transport : kTransports) {
      CAPTURE(c.mode);
      CAPTURE(transport);
      const JobResult r = kolo_run(
          np, {c.mode}, {std::string("KOLO_TRANSPORT=") + transport, "KOLO_TIMEOUT_SECONDS=20"});
      expect_all_ranks(r, np, "ConfigError", {c.needle});
      const auto reports = fault_reports(r.out);
      if (reports.size() != static_cast<std::size_t>(np)) continue;
      // No rank returns from the refused call, the broadcast's root included (the error
      // contract, docs/reliability.md: rooted collectives agree on entry).
      CHECK(count_of(r.out, "KOLO_RETURNED") == 0);
      const std::string origin = reports.at("1").what;
      CHECK(!contains(origin, "[reported by"));
      for (const char* other : {"0", "2"}) {
        CHECK(reports.at(other).what == origin + " [reported by rank 1]");
      }
    }
  }
  // KOLO_ROOTED_AGREEMENT=0: the broadcast's root may return from the refused call (its sends
  // wait for nobody) and then fails at its next call with the same error; no other rank returns.
  const JobResult r =
      kolo_run(np, {"bad-root"},
               {"KOLO_TRANSPORT=shm", "KOLO_TIMEOUT_SECONDS=20", "KOLO_ROOTED_AGREEMENT=0"});
  expect_all_ranks(r, np, "ConfigError", {"root 3 is not a rank"});
  CHECK(count_of(r.out, "KOLO_RETURNED") ==
        count_of(r.out, "[0] KOLO_RETURNED rank=0 bad-root returned"));
}

// The same errors on the routed transport across two "hosts" (host keys: tests/netns/
// keyed_hosts.sh), 2 + 2 ranks: shared memory inside a host, TCP between them. A rank reads a
// TCP socket on which it has no receive posted only now and then (or when poll() finds it
// readable), so an error that crosses hosts while a rank waits on its local peer must still
// reach it, as fast as on one host.
TEST_CASE("errors reach every rank across hosts (routed, 2 + 2 ranks)") {
  const int np = 4;
  const std::vector<std::string> keyed = {KOLO_KEYED_HOSTS_SH, "--rank", "2,2",
                                          KOLO_FAULT_WORKER_EXE};
  const std::vector<std::string> env = {"KOLO_TRANSPORT=routed", "KOLO_TIMEOUT_SECONDS=20"};
  {
    const JobResult r = kolo_run(np, {"mismatch-count"}, env, 30, 10, keyed);
    expect_all_ranks(r, np, "MismatchError", {"999", "1000"});
    CHECK(r.seconds < 10);
  }
  {
    const JobResult r =
        kolo_run(np, {"mismatch-count", std::to_string(1 << 22)}, env, 30, 10, keyed);
    expect_all_ranks(r, np, "MismatchError",
                     {std::to_string(1 << 22), std::to_string((1 << 22) - 1)});
    CHECK(r.seconds < 10);
  }
  {
    const JobResult r = kolo_run(np, {"null-buffer"}, env, 30, 10, keyed);
    expect_all_ranks(r, np, "ConfigError", {"null pointer with 1000 elements"});
    CHECK(r.seconds < 10);
    const auto reports = fault_reports(r.out);
    if (reports.size() == static_cast<std::size_t>(np)) {
      const std::string origin = reports.at("1").what;
      for (const char* other : {"0", "2", "3"}) {
        CHECK(reports.at(other).what == origin + " [reported by rank 1]");
      }
    }
  }
}

// (b) A rank SIGKILLed mid-allreduce: the survivors get PeerLostError within seconds, far
// below KOLO_TIMEOUT_SECONDS, and kolo-run passes on the killed rank's 128+9.
// The same for float32 on an fp16 wire (allreduce_compressed, the ring converting segment by
// segment): 3 ranks, each transport.
// And on Buffers from Communicator::allocate, read in place over shared memory (a Buffer over
// TCP is ordinary memory): the peer dies while the others read its memory, and nothing is left
// in /dev/shm afterwards (the buffers are memfds, without names).

void killed_mid_allreduce(const std::vector<int>& nps, const char* variant) {
  const std::string v = variant;
  for (const char* transport : kTransports) {
    for (int np : nps) {
      CAPTURE(transport);
      CAPTURE(np);
      CAPTURE(v);
      const int victim = 2;
      std::vector<std::string> args = {"kill", std::to_string(victim), "300", "1048576"};
      if (!v.empty()) args.push_back(v);
      const auto shm_before = dev_shm_kolo();
      const JobResult r = kolo_run(
          np, args, {std::string("KOLO_TRANSPORT=") + transport, "KOLO_TIMEOUT_SECONDS=60"},
          /*limit=*/45, /*grace=*/20);
      INFO("kolo-run output:\n" << r.out);
      REQUIRE(r.finished);
      CHECK(r.code == 137);
      CHECK(contains(r.out, "rank 2 killed by signal 9"));
      CHECK(r.seconds < 15);  // the survivors exited on their own, long before the grace ends
      const auto reports = fault_reports(r.out);
      CHECK(reports.count("2") == 0);
      for (int rank = 0; rank < np; ++rank) {
        if (rank == victim) continue;
        CAPTURE(rank);
        const auto it = reports.find(std::to_string(rank));
        REQUIRE_MESSAGE(it != reports.end(), "survivor ", rank, " did not report");
        CHECK(it->second.kind == "PeerLostError");
        CHECK(it->second.after > 0.25);  // it was killed mid-loop, not before it
        CHECK(it->second.after < 10);
        CHECK(contains(it->second.what, "rank 2"));
      }
      if (v == "zerocopy") {
        const bool shm = std::string(transport) == "shm";
        CHECK(count_of(r.out, "KOLO_ZERO_COPY") == np);
        CHECK(count_of(r.out, "shared=1") == (shm ? np : 0));
        CHECK(dev_shm_kolo() == shm_before);
      }
    }
  }
}

TEST_CASE("rank killed mid-allreduce") {
  killed_mid_allreduce({3, 4}, "");
}
TEST_CASE("rank killed mid-allreduce on an fp16 wire") {
  killed_mid_allreduce({3}, "wire");
}
TEST_CASE("rank killed mid-allreduce on Buffers read in place (zero copy)") {
  killed_mid_allreduce({3}, "zerocopy");
}

// ---------------------------------------------------------------- hand-launched ranks

// (c) A broken environment contract on every rank: each rank exits non-zero with a ConfigError
// naming the variable and its value, before any rendezvous (so nothing waits for a timeout).
TEST_CASE("invalid environment on every rank") {
  struct Case {
    const char* name;
    std::function<void(std::vector<RankEnv>&)> edit;  // applied to a valid 2-rank contract
    std::vector<std::string> needles;
  };
  auto set_var = [](std::vector<RankEnv>& ranks, const std::string& name,
                    const std::function<std::string(int)>& value) {
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      auto& v = ranks[r].vars;
      std::erase_if(v, [&](const std::string& s) { return s.rfind(name + "=", 0) == 0; });
      v.push_back(name + "=" + value(static_cast<int>(r)));
    }
  };
  auto unset = [](std::vector<RankEnv>& ranks, const std::string& name) {
    for (auto& r : ranks) {
      std::erase_if(r.vars, [&](const std::string& s) { return s.rfind(name + "=", 0) == 0; });
    }
  };
  const std::vector<Case> cases = {
      {"KOLO_RANK not a number",
       [&](auto& rk) { set_var(rk, "KOLO_RANK", [](int) { return "abc"; }); },
       {"KOLO_RANK=abc", "not an integer"}},
      {"KOLO_RANK not below KOLO_SIZE",
       [&](auto& rk) { set_var(rk, "KOLO_RANK", [](int r) { return std::to_string(r + 2); }); },
       {"KOLO_RANK=", "is not below KOLO_SIZE=2"}},
      {"KOLO_SIZE zero",
       [&](auto& rk) { set_var(rk, "KOLO_SIZE", [](int) { return "0"; }); },
       {"KOLO_SIZE=0"}},
      {"KOLO_SECRET missing",
       [&](auto& rk) { unset(rk, "KOLO_SECRET"); },
       {"KOLO_SECRET is not set"}},
      {"KOLO_STORE nonsense",
       [&](auto& rk) { set_var(rk, "KOLO_STORE", [](int) { return "nonsense"; }); },
       {"KOLO_STORE=nonsense"}},
      {"KOLO_TIMEOUT_SECONDS not a number",
       [&](auto& rk) { set_var(rk, "KOLO_TIMEOUT_SECONDS", [](int) { return "abc"; }); },
       {"KOLO_TIMEOUT_SECONDS=abc"}},
      {"KOLO_TRANSPORT bogus",
       [&](auto& rk) { set_var(rk, "KOLO_TRANSPORT", [](int) { return "bogus"; }); },
       {"KOLO_TRANSPORT=bogus"}},
      {"KOLO_LISTEN_FD not a socket",
       [&](auto& rk) { set_var(rk, "KOLO_LISTEN_FD", [](int) { return "999"; }); },
       {"KOLO_LISTEN_FD=999"}},
  };
  const std::string secret = kolo::net::generate_secret();
  for (const auto& c : cases) {
    CAPTURE(c.name);
    auto ranks = torchrun_env(2, unused_port(), secret, {"KOLO_TIMEOUT_SECONDS=5"});
    c.edit(ranks);
    auto procs = start_ranks(ranks, {"setup"});
    const bool finished = finish_all(raw(procs), 15);
    expect_each(procs, finished, "ConfigError", c.needles, 4);
  }
}

// The same through kolo-run, which passes the variables it does not own on to every rank.
TEST_CASE("invalid environment through kolo-run") {
  for (const char* var : {"KOLO_TIMEOUT_SECONDS=abc", "KOLO_TRANSPORT=bogus"}) {
    CAPTURE(var);
    const JobResult r = kolo_run(3, {"setup"}, {var}, 20, 5);
    expect_all_ranks(r, 3, "ConfigError", {var});
    CHECK(r.seconds < 5);
  }
}

// A store address nobody serves: TimeoutError naming the store, within the (short) timeout.
TEST_CASE("store address with nobody listening times out") {
  const std::uint16_t port = unused_port();
  const std::string store = "127.0.0.1:" + std::to_string(port);
  std::vector<RankEnv> ranks(2);
  for (int r = 0; r < 2; ++r) {
    ranks[static_cast<std::size_t>(r)].vars = {
        "KOLO_RANK=" + std::to_string(r), "KOLO_SIZE=2", "KOLO_STORE=" + store,
        "KOLO_SECRET=" + kolo::net::generate_secret(), "KOLO_TIMEOUT_SECONDS=2"};
  }
  auto procs = start_ranks(ranks, {"setup"});
  const bool finished = finish_all(raw(procs), 15);
  expect_each(procs, finished, "TimeoutError", {"store " + store}, 6);
  for (const auto& p : procs) CHECK(p->seconds() >= 1.9);  // it did wait for the deadline
}

// Known limitation: when only one rank has a bad variable, it alone can say so (ConfigError);
// the others cannot learn why it never arrived. They time out in the rendezvous, naming the
// store key of the rank that is missing, within KOLO_TIMEOUT_SECONDS rather than hanging.
// Under kolo-run the store outlives every rank, so each waiting rank reports that timeout.
TEST_CASE("invalid environment on one rank only under kolo-run") {
  // A shell between kolo-run and the worker breaks rank 1's environment alone.
  const std::vector<std::string> wrapper = {
      "/bin/sh", "-c",
      "if [ \"$KOLO_RANK\" = 1 ]; then KOLO_TIMEOUT_SECONDS=abc; export KOLO_TIMEOUT_SECONDS; "
      "fi; exec \"$0\" \"$@\"",
      KOLO_FAULT_WORKER_EXE};
  const JobResult r = kolo_run(3, {"setup"}, {"KOLO_TIMEOUT_SECONDS=3"}, 20, 10, wrapper);
  INFO("kolo-run output:\n" << r.out);
  REQUIRE(r.finished);
  CHECK(r.code == 3);
  CHECK(r.seconds < 9);  // the others gave up at their timeout, not at kolo-run's grace
  const auto reports = fault_reports(r.out);
  REQUIRE(reports.size() == 3);
  CHECK(reports.at("1").kind == "ConfigError");
  CHECK(contains(reports.at("1").what, "KOLO_TIMEOUT_SECONDS=abc"));
  CHECK(reports.at("1").after < 2);
  for (const char* rank : {"0", "2"}) {
    CAPTURE(rank);
    const Report& rep = reports.at(rank);
    CHECK(rep.kind == "TimeoutError");
    CHECK(contains(rep.what, "hostkey/1'"));  // the key rank 1 never wrote
    CHECK(contains(rep.what, "rank 1 (of 3) did not reach the rendezvous"));  // who is missing
  }
}

// The same with torchrun's convention, where rank 0 hosts the store: rank 0 times out as above;
// when it exits it takes the store with it, so a rank still waiting may see that first
// (PeerLostError naming the store) instead of its own timeout. Either way: in time, no hang.
TEST_CASE("invalid environment on one rank only with rank 0 hosting the store") {
  const int np = 3;
  auto ranks =
      torchrun_env(np, unused_port(), kolo::net::generate_secret(), {"KOLO_TIMEOUT_SECONDS=3"});
  for (auto& v : ranks[1].vars) {
    if (v.rfind("KOLO_TIMEOUT_SECONDS=", 0) == 0) v = "KOLO_TIMEOUT_SECONDS=abc";
  }
  auto procs = start_ranks(ranks, {"setup"});
  const bool finished = finish_all(raw(procs), 20);
  REQUIRE(finished);
  for (int r = 0; r < np; ++r) {
    const Proc& p = *procs[static_cast<std::size_t>(r)];
    CAPTURE(r);
    INFO("output:\n" << p.output());
    CHECK(p.code() == 3);
    const auto reports = fault_reports(p.output());
    REQUIRE(reports.size() == 1);
    const Report& rep = reports.begin()->second;
    if (r == 1) {
      CHECK(rep.kind == "ConfigError");
      CHECK(contains(rep.what, "KOLO_TIMEOUT_SECONDS=abc"));
      CHECK(p.seconds() < 2);
      continue;
    }
    if (r == 0) {
      CHECK(rep.kind == "TimeoutError");
      CHECK(contains(rep.what, "rank 1 (of 3) did not reach the rendezvous"));
    } else {
      CHECK((rep.kind == "TimeoutError" || rep.kind == "PeerLostError"));
      CHECK(contains(rep.what, "store"));
    }
    CHECK(contains(rep.what, "hostkey/1'"));
    CHECK(p.seconds() >= 2.9);
    CHECK(p.seconds() < 9);
  }
}

// ---------------------------------------------------------------- strangers

namespace {
// What one stranger thread saw.
struct Outcome {
  std::string who;
  bool refused = false;  // authentication failed with a kolo::Error, or the connection was closed
  std::string detail;
};

// A client that runs the real handshake with `secret` and `hello`; refused if it fails or the
// server closes the connection right after it (an authenticated but unwanted client).
Outcome handshake_stranger(std::string who, std::uint16_t port, std::string secret,
                           kolo::net::Hello hello) {
  Outcome o;
  o.who = std::move(who);
  try {
    kolo::net::Socket s = dial(port, 20);
    kolo::net::authenticate_client(s.fd(), secret, hello, kolo::Deadline::after(20), o.who);
    o.refused = closed_by_peer(s.fd(), 20);
    o.detail = o.refused ? "authenticated, then disconnected" : "authenticated and kept open";
  } catch (const kolo::Error& e) {
    o.refused = true;
    o.detail = std::string(kolo::error_kind_name(e.kind())) + ": " + e.what();
  }
  return o;
}

// (d) np ranks over TCP with pre-bound listeners (KOLO_LISTEN_FD) so every data port is known
// before the ranks start; strangers queue up on those ports ahead of the real peers, and hit the
// store once rank 0 serves it. The job must run and verify its allreduces regardless.
void strangers_at_the_door(int np) {
  const std::string secret = kolo::net::generate_secret();
  const std::string wrong = kolo::net::generate_secret();
  const std::uint16_t master_port = unused_port();
  auto ranks =
      torchrun_env(np, master_port, secret, {"KOLO_TRANSPORT=tcp", "KOLO_TIMEOUT_SECONDS=20"});
  std::vector<std::uint16_t> ports;
  for (auto& r : ranks) {
    kolo::net::Socket l = kolo::net::listen_tcp("127.0.0.1", 0);
    ports.push_back(kolo::net::local_port(l.fd()));
    r.listen_fd = l.release();
    r.vars.push_back("KOLO_LISTEN_FD=" + std::to_string(r.listen_fd));
  }

  // Queued before any rank runs: the ranks' acceptors meet these before their real peers.
  std::vector<kolo::net::Socket> silent, garbage;
  for (std::uint16_t p : ports) {
    silent.push_back(dial(p, 5));
    garbage.push_back(dial(p, 5));
    send_garbage(garbage.back().fd());
  }
  std::vector<Outcome> outcomes(static_cast<std::size_t>(4 * np + 2));
  std::vector<std::thread> threads;
  for (int r = 0; r < np; ++r) {
    const auto p = ports[static_cast<std::size_t>(r)];
    const std::string at = " at rank " + std::to_string(r);
    const int next = (r + 1) % np;  // a rank this one may expect: the hello looks plausible
    Outcome* o = &outcomes[static_cast<std::size_t>(4 * r)];  // fixed size: never moves
    threads.emplace_back([=, &wrong] {
      o[0] = handshake_stranger("wrong secret" + at, p, wrong, {kolo::net::kPurposeData, next, 0});
    });
    threads.emplace_back([=, &secret] {
      o[1] =
          handshake_stranger("store purpose" + at, p, secret, {kolo::net::kPurposeStore, next, 0});
    });
    threads.emplace_back([=, &secret] {
      o[2] = handshake_stranger("bogus rank 99" + at, p, secret, {kolo::net::kPurposeData, 99, 0});
    });
    threads.emplace_back([=, &secret] {
      o[3] = handshake_stranger("own rank" + at, p, secret, {kolo::net::kPurposeData, r, 0});
    });
  }
  // The store: garbage and a wrong secret, once rank 0 listens (dial retries until then).
  threads.emplace_back([&] {
    Outcome& o = outcomes[static_cast<std::size_t>(4 * np)];
    o.who = "garbage at the store";
    try {
      kolo::net::Socket s = dial(master_port, 20);
      send_garbage(s.fd());
      o.refused = closed_by_peer(s.fd(), 20);
      o.detail = o.refused ? "disconnected" : "kept open";
    } catch (const kolo::Error& e) {
      o.refused = true;
      o.detail = e.what();
    }
  });
  threads.emplace_back([&] {
    outcomes[static_cast<std::size_t>(4 * np + 1)] = handshake_stranger(
        "wrong secret at the store", master_port, wrong, {kolo::net::kPurposeStore, 0, 0});
  });
  struct Joiner {
    std::vector<std::thread>& t;
    ~Joiner() {
      for (auto& x : t) {
        if (x.joinable()) x.join();
      }
    }
  } joiner{threads};

  auto procs = start_ranks(ranks, {"clean", "4"}, /*with_stdin=*/true);
  const auto all = raw(procs);
  auto ready = [&] {
    for (Proc* p : all) {
      if (!contains(p->output(), "KOLO_READY")) return false;
    }
    return true;
  };
  const bool connected = pump(all, 25, ready) && ready();
  std::string outputs;
  for (std::size_t i = 0; i < all.size(); ++i) {
    outputs += "--- rank " + std::to_string(i) + ":\n" + all[i]->output();
  }
  INFO(outputs);
  REQUIRE_MESSAGE(connected, "the ranks did not all connect");

  // Setup is over: the data listeners are closed, so the kernel refuses new connections.
  for (std::size_t r = 0; r < ports.size(); ++r) {
    CAPTURE(r);
    CHECK(connect_refused(ports[r]));
    CHECK_MESSAGE(closed_by_peer(silent[r].fd(), 5), "the silent stranger is still connected");
    CHECK_MESSAGE(closed_by_peer(garbage[r].fd(), 5), "the garbage sender is still connected");
  }
  for (auto& t : threads) t.join();
  const bool verbose = std::getenv("KOLO_FAULTS_VERBOSE") != nullptr;
  for (const auto& o : outcomes) {
    if (verbose) std::fprintf(stderr, "%s: %s\n", o.who.c_str(), o.detail.c_str());
    INFO(o.who << ": " << o.detail);
    CHECK(o.refused);
  }
  // The wrong secret is never accepted: the client fails the handshake itself.
  for (int r = 0; r < np; ++r) {
    const auto& o = outcomes[static_cast<std::size_t>(4 * r)];
    INFO(o.who << ": " << o.detail);
    CHECK(contains(o.detail, "Error"));
  }
  CHECK(contains(outcomes[static_cast<std::size_t>(4 * np + 1)].detail, "Error"));

  for (Proc* p : all) p->write_stdin("go\n");
  const bool finished = finish_all(all, 30);
  for (std::size_t i = 0; i < all.size(); ++i) {
    outputs += "--- rank " + std::to_string(i) + " (end):\n" + all[i]->output();
  }
  INFO(outputs);
  REQUIRE(finished);
  for (Proc* p : all) {
    CHECK(p->code() == 0);
    CHECK(count_of(p->output(), "KOLO_OK") == 1);
  }
}

}  // namespace

TEST_CASE("strangers are refused and the job is unaffected np3") {
  strangers_at_the_door(3);
}
TEST_CASE("strangers are refused and the job is unaffected np4") {
  strangers_at_the_door(4);
}
