// kolo::Topology::from_env: the environment contract of docs/environment.md, read through a map so
// each case states its whole environment. Every bad value must be a ConfigError that names the
// variable and the value the user set, because that message is all a user sees when a job fails to
// start.
#include <doctest/doctest.h>

#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <optional>
#include <string>

#include "kolo/core/env.hpp"
#include "kolo/core/error.hpp"
#include "kolo/topology/topology.hpp"

namespace {

using Env = std::map<std::string, std::string>;

kolo::EnvLookup lookup(const Env& env) {
  return [env](const std::string& name) -> std::optional<std::string> {
    const auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

kolo::Topology topo(const Env& env) {
  return kolo::Topology::from_env(lookup(env));
}

// The message of the ConfigError that `env` must raise; a marker string when none or another
// exception is raised, so the substring checks below fail with a readable message.
std::string config_error(const Env& env) {
  try {
    topo(env);
  } catch (const kolo::ConfigError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<not a ConfigError: ") + e.what() + ">";
  }
  return "<no error>";
}

// Asserts that `env` fails with a ConfigError whose message contains every one of `parts`.
void check_error(const Env& env, std::initializer_list<std::string> parts) {
  const std::string msg = config_error(env);
  for (const auto& p : parts) {
    CHECK_MESSAGE(msg.find(p) != std::string::npos, "message \"", msg, "\" lacks \"", p, "\"");
  }
}

// A valid two-rank environment to break one variable at a time.
Env two_ranks() {
  return {{"KOLO_RANK", "1"},
          {"KOLO_SIZE", "2"},
          {"KOLO_STORE", "10.0.0.1:29500"},
          {"KOLO_SECRET", "0123456789abcdef"}};
}

Env with(Env env, const std::string& name, const std::string& value) {
  env[name] = value;
  return env;
}

Env without(Env env, const std::string& name) {
  env.erase(name);
  return env;
}

}  // namespace

TEST_CASE("topology: a single rank needs nothing but rank and size") {
  const auto t = topo({{"KOLO_RANK", "0"}, {"KOLO_SIZE", "1"}});
  CHECK(t.rank == 0);
  CHECK(t.size == 1);
  CHECK_FALSE(t.store.has_value());
  CHECK_FALSE(t.host_store);
  CHECK(t.peers.empty());
  CHECK(t.secret.empty());
  CHECK(t.listen_fd == -1);
  CHECK(t.devices.empty());
  CHECK(t.timeout_seconds == 30.0);
  CHECK(t.local_rank == -1);  // left for Bootstrap to derive
  CHECK(t.cross_size == -1);
  CHECK_FALSE(t.is_local_complete());
  CHECK_FALSE(t.host_key.empty());
  if (::access("/proc/self/ns/net", F_OK) == 0) {
    // Ranks in different network namespaces must count as different hosts.
    CHECK(t.host_key.find("/netns:") != std::string::npos);
  }
}

TEST_CASE("topology: every KOLO_ variable is read") {
  const auto t = topo({{"KOLO_RANK", "3"},
                       {"KOLO_SIZE", "4"},
                       {"KOLO_LOCAL_RANK", "1"},
                       {"KOLO_LOCAL_SIZE", "2"},
                       {"KOLO_CROSS_RANK", "1"},
                       {"KOLO_CROSS_SIZE", "2"},
                       {"KOLO_STORE", "store.example:29500"},
                       {"KOLO_SECRET", "0123456789abcdef"},
                       {"KOLO_DEVICES", "2,3"},
                       {"KOLO_TIMEOUT_SECONDS", "12.5"},
                       {"KOLO_HOST_KEY", "node-7"}});
  CHECK(t.rank == 3);
  CHECK(t.size == 4);
  CHECK(t.local_rank == 1);
  CHECK(t.local_size == 2);
  CHECK(t.cross_rank == 1);
  CHECK(t.cross_size == 2);
  CHECK(t.is_local_complete());
  REQUIRE(t.store.has_value());
  CHECK(t.store->host == "store.example");
  CHECK(t.store->port == 29500);
  CHECK_FALSE(t.host_store);  // KOLO_STORE is hosted by the launcher
  CHECK(t.secret == "0123456789abcdef");
  CHECK(t.devices == std::vector<int>{2, 3});
  CHECK(t.timeout_seconds == 12.5);
  CHECK(t.host_key == "node-7");
}

TEST_CASE("topology: integers tolerate surrounding spaces, an IPv6 store its brackets") {
  const auto t = topo(with(with(two_ranks(), "KOLO_RANK", " 1 "), "KOLO_STORE", "[::1]:7000"));
  CHECK(t.rank == 1);
  REQUIRE(t.store.has_value());
  CHECK(t.store->host == "::1");
  CHECK(t.store->port == 7000);
}

TEST_CASE("topology: torchrun aliases, rank 0 hosts the store at MASTER_ADDR:MASTER_PORT") {
  Env env{{"RANK", "0"},
          {"WORLD_SIZE", "4"},
          {"LOCAL_RANK", "0"},
          {"LOCAL_WORLD_SIZE", "2"},
          {"GROUP_RANK", "0"},
          {"MASTER_ADDR", "10.1.2.3"},
          {"MASTER_PORT", "29400"},
          {"KOLO_SECRET", "0123456789abcdef"}};
  auto t = topo(env);
  CHECK(t.rank == 0);
  CHECK(t.size == 4);
  CHECK(t.local_rank == 0);
  CHECK(t.local_size == 2);
  CHECK(t.cross_rank == 0);
  REQUIRE(t.store.has_value());
  CHECK(t.store->host == "10.1.2.3");
  CHECK(t.store->port == 29400);
  CHECK(t.host_store);

  // Any other rank connects to the store rank 0 serves.
  env["RANK"] = "3";
  env["LOCAL_RANK"] = "1";
  env["GROUP_RANK"] = "1";
  t = topo(env);
  CHECK(t.rank == 3);
  CHECK(t.local_rank == 1);
  CHECK(t.cross_rank == 1);
  REQUIRE(t.store.has_value());
  CHECK(t.store->str() == "10.1.2.3:29400");
  CHECK_FALSE(t.host_store);
}

TEST_CASE("topology: mpirun (Open MPI) aliases") {
  const auto t = topo({{"OMPI_COMM_WORLD_RANK", "5"},
                       {"OMPI_COMM_WORLD_SIZE", "8"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                       {"KOLO_STORE", "head:29500"},
                       {"KOLO_SECRET", "0123456789abcdef"}});
  CHECK(t.rank == 5);
  CHECK(t.size == 8);
  CHECK(t.local_rank == 1);
  CHECK(t.local_size == 4);
  CHECK(t.cross_rank == -1);  // Open MPI does not export it: derived later
  CHECK_FALSE(t.is_local_complete());
  CHECK(t.store->str() == "head:29500");
}

TEST_CASE("topology: Horovod aliases") {
  const auto t = topo({{"HOROVOD_RANK", "2"},
                       {"HOROVOD_SIZE", "4"},
                       {"HOROVOD_LOCAL_RANK", "0"},
                       {"HOROVOD_LOCAL_SIZE", "2"},
                       {"HOROVOD_CROSS_RANK", "1"},
                       {"HOROVOD_CROSS_SIZE", "2"},
                       {"KOLO_STORE", "head:29500"},
                       {"KOLO_SECRET", "0123456789abcdef"}});
  CHECK(t.rank == 2);
  CHECK(t.size == 4);
  CHECK(t.local_rank == 0);
  CHECK(t.local_size == 2);
  CHECK(t.cross_rank == 1);
  CHECK(t.cross_size == 2);
  CHECK(t.is_local_complete());
}

TEST_CASE("topology: KOLO_ names win over every alias") {
  const auto t = topo({{"KOLO_RANK", "1"},
                       {"KOLO_SIZE", "2"},
                       {"KOLO_LOCAL_RANK", "1"},
                       {"KOLO_LOCAL_SIZE", "2"},
                       {"RANK", "7"},
                       {"WORLD_SIZE", "16"},
                       {"LOCAL_RANK", "3"},
                       {"LOCAL_WORLD_SIZE", "8"},
                       {"OMPI_COMM_WORLD_RANK", "9"},
                       {"OMPI_COMM_WORLD_SIZE", "32"},
                       {"HOROVOD_RANK", "11"},
                       {"HOROVOD_SIZE", "64"},
                       {"KOLO_STORE", "launcher:1234"},
                       {"MASTER_ADDR", "elsewhere"},
                       {"MASTER_PORT", "29500"},
                       {"KOLO_SECRET", "0123456789abcdef"}});
  CHECK(t.rank == 1);
  CHECK(t.size == 2);
  CHECK(t.local_rank == 1);
  CHECK(t.local_size == 2);
  REQUIRE(t.store.has_value());
  CHECK(t.store->str() == "launcher:1234");
  CHECK_FALSE(t.host_store);  // the launcher's store, not torchrun's rank-0 store

  // Among the aliases the order is torchrun, Open MPI, Horovod.
  const auto a = topo({{"RANK", "1"},
                       {"WORLD_SIZE", "2"},
                       {"OMPI_COMM_WORLD_RANK", "0"},
                       {"OMPI_COMM_WORLD_SIZE", "3"},
                       {"KOLO_STORE", "h:1"},
                       {"KOLO_SECRET", "0123456789abcdef"}});
  CHECK(a.rank == 1);
  CHECK(a.size == 2);
}

TEST_CASE("topology: KOLO_PEERS gives every address, rank 0 hosts the store at the first") {
  Env env = without(two_ranks(), "KOLO_STORE");
  env["KOLO_SIZE"] = "3";
  env["KOLO_RANK"] = "0";
  env["KOLO_PEERS"] = "10.0.0.1:4000,node-b:4001,[fe80::1]:4002";
  auto t = topo(env);
  REQUIRE(t.peers.size() == 3);
  CHECK(t.peers[0].str() == "10.0.0.1:4000");
  CHECK(t.peers[1].str() == "node-b:4001");
  CHECK(t.peers[2].host == "fe80::1");
  CHECK(t.peers[2].port == 4002);
  REQUIRE(t.store.has_value());
  CHECK(t.store->str() == "10.0.0.1:4000");
  CHECK(t.host_store);

  env["KOLO_RANK"] = "2";
  t = topo(env);
  CHECK(t.store->str() == "10.0.0.1:4000");
  CHECK_FALSE(t.host_store);

  // With KOLO_STORE as well, the launcher's store is used and the peers are kept.
  env["KOLO_STORE"] = "launcher:9000";
  env["KOLO_RANK"] = "0";
  t = topo(env);
  CHECK(t.store->str() == "launcher:9000");
  CHECK_FALSE(t.host_store);
  CHECK(t.peers.size() == 3);

  // Empty entries (a trailing comma) are not addresses.
  env.erase("KOLO_STORE");
  env["KOLO_PEERS"] = "a:1,b:2,c:3,";
  CHECK(topo(env).peers.size() == 3);
}

TEST_CASE("topology: KOLO_PEERS errors name the variable and the value") {
  Env env = without(two_ranks(), "KOLO_STORE");
  check_error(with(env, "KOLO_PEERS", "a:1"), {"KOLO_PEERS=a:1", "lists 1", "KOLO_SIZE=2"});
  check_error(with(env, "KOLO_PEERS", "a:1,b:2,c:3"), {"KOLO_PEERS=a:1,b:2,c:3", "lists 3"});
  check_error(with(env, "KOLO_PEERS", ""), {"KOLO_PEERS=", "lists 0"});
  check_error(with(env, "KOLO_PEERS", "a:1,b"), {"KOLO_PEERS", "b", "not host:port"});
  check_error(with(env, "KOLO_PEERS", "a:1,b:99999"), {"KOLO_PEERS", "b:99999"});
}

TEST_CASE("topology: rank and size errors name the variable and the value") {
  check_error(with(with(two_ranks(), "KOLO_RANK", "5"), "KOLO_SIZE", "4"),
              {"KOLO_RANK=5 is not below KOLO_SIZE=4"});
  check_error(with(two_ranks(), "KOLO_RANK", "2"), {"KOLO_RANK=2 is not below KOLO_SIZE=2"});
  check_error({{"RANK", "5"}, {"WORLD_SIZE", "4"}}, {"RANK=5 is not below WORLD_SIZE=4"});
  check_error({{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}},
              {"OMPI_COMM_WORLD_RANK=4 is not below OMPI_COMM_WORLD_SIZE=4"});
  check_error(with(two_ranks(), "KOLO_RANK", "abc"), {"KOLO_RANK=abc", "not an integer"});
  check_error(with(two_ranks(), "KOLO_RANK", "1.5"), {"KOLO_RANK=1.5", "not an integer"});
  check_error(with(two_ranks(), "KOLO_RANK", ""), {"KOLO_RANK=", "not an integer"});
  check_error(with(two_ranks(), "KOLO_RANK", "0x1"), {"KOLO_RANK=0x1", "not an integer"});
  check_error(with(two_ranks(), "KOLO_RANK", "99999999999999999999999"),
              {"KOLO_RANK=99999999999999999999999", "not an integer"});
  check_error(with(two_ranks(), "KOLO_RANK", "-1"), {"KOLO_RANK=-1", "negative"});
  check_error(with(two_ranks(), "KOLO_SIZE", "two"), {"KOLO_SIZE=two", "not an integer"});
  check_error(with(two_ranks(), "KOLO_SIZE", "0"), {"KOLO_SIZE=0"});
  check_error(with(two_ranks(), "KOLO_SIZE", "-4"), {"KOLO_SIZE=-4"});
  check_error(with(two_ranks(), "KOLO_SIZE", "2000000"), {"KOLO_SIZE=2000000", "1..1048576"});
  check_error(without(two_ranks(), "KOLO_SIZE"), {"KOLO_SIZE is not set"});
  check_error(without(two_ranks(), "KOLO_RANK"), {"KOLO_RANK is not set"});
  check_error({{"WORLD_SIZE", "2"}}, {"KOLO_RANK is not set", "RANK"});
  // mpirun without kolo's rendezvous: one message that names what to do
  check_error({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}},
              {"started by mpirun (OMPI_COMM_WORLD_SIZE=2)", "MpiTransport", "kolo-run"});
}

TEST_CASE("topology: no launcher variables at all is a single-rank job") {
  const auto t = topo({});
  CHECK(t.size == 1);
  CHECK(t.rank == 0);
  CHECK(!t.store);
  CHECK(t.timeout_seconds == 30.0);
  // the knobs still apply, and bad ones are still errors
  CHECK(topo({{"KOLO_TIMEOUT_SECONDS", "5"}}).timeout_seconds == 5.0);
  check_error({{"KOLO_TIMEOUT_SECONDS", "soon"}}, {"KOLO_TIMEOUT_SECONDS=soon"});
}

TEST_CASE("topology: local and cross rank errors name the variable and the value") {
  check_error(with(with(two_ranks(), "KOLO_LOCAL_RANK", "2"), "KOLO_LOCAL_SIZE", "2"),
              {"KOLO_LOCAL_RANK=2 is not below KOLO_LOCAL_SIZE=2"});
  check_error(with(two_ranks(), "KOLO_LOCAL_SIZE", "3"), {"KOLO_LOCAL_SIZE=3", "1..2"});
  check_error(with(two_ranks(), "KOLO_LOCAL_SIZE", "0"), {"KOLO_LOCAL_SIZE=0"});
  check_error(with(two_ranks(), "KOLO_LOCAL_RANK", "-1"), {"KOLO_LOCAL_RANK=-1", "negative"});
  check_error(with(two_ranks(), "KOLO_LOCAL_RANK", "x"), {"KOLO_LOCAL_RANK=x", "not an integer"});
  check_error(with(with(two_ranks(), "LOCAL_RANK", "4"), "LOCAL_WORLD_SIZE", "2"),
              {"LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=2"});
  check_error(with(with(two_ranks(), "KOLO_CROSS_RANK", "1"), "KOLO_CROSS_SIZE", "1"),
              {"KOLO_CROSS_RANK=1 is not below KOLO_CROSS_SIZE=1"});
  check_error(with(two_ranks(), "HOROVOD_CROSS_SIZE", "9"), {"HOROVOD_CROSS_SIZE=9", "1..2"});
}

TEST_CASE("topology: the secret is required and long enough, and never echoed") {
  check_error(without(two_ranks(), "KOLO_SECRET"), {"KOLO_SECRET is not set"});
  const std::string msg = config_error(with(two_ranks(), "KOLO_SECRET", "hunter2"));
  CHECK(msg.find("KOLO_SECRET") != std::string::npos);
  CHECK(msg.find("too short") != std::string::npos);
  // The one variable whose value stays out of the message: it ends up in logs.
  CHECK(msg.find("hunter2") == std::string::npos);
  // A single rank talks to nobody: no secret needed, a short one tolerated.
  CHECK(topo({{"KOLO_RANK", "0"}, {"KOLO_SIZE", "1"}, {"KOLO_SECRET", "x"}}).secret == "x");
  CHECK(topo(with(two_ranks(), "KOLO_SECRET", "12345678")).secret == "12345678");
}

TEST_CASE("topology: rendezvous address errors name the variable and the value") {
  for (const char* bad : {"nocolon", "host:", "host:0", "host:65536", "host:http", ":29500",
                          "host:29500x", "host:-1"}) {
    CAPTURE(bad);
    check_error(with(two_ranks(), "KOLO_STORE", bad),
                {std::string("KOLO_STORE=") + bad, "not host:port"});
  }
  check_error(without(two_ranks(), "KOLO_STORE"), {"KOLO_STORE is not set", "2 ranks"});

  Env torch = without(two_ranks(), "KOLO_STORE");
  check_error(with(torch, "MASTER_ADDR", "10.0.0.1"), {"MASTER_PORT is not set", "MASTER_ADDR"});
  check_error(with(torch, "MASTER_PORT", "29500"), {"MASTER_ADDR is not set", "MASTER_PORT"});
  check_error(with(with(torch, "MASTER_ADDR", "10.0.0.1"), "MASTER_PORT", "port"),
              {"MASTER_ADDR:MASTER_PORT=10.0.0.1:port", "not host:port"});
  // A single rank needs no rendezvous, but a half-given one is still a mistake worth reporting.
  check_error({{"KOLO_RANK", "0"}, {"KOLO_SIZE", "1"}, {"MASTER_PORT", "29500"}},
              {"MASTER_ADDR is not set"});
}

TEST_CASE("topology: KOLO_TIMEOUT_SECONDS must be a positive number") {
  CHECK(topo(with(two_ranks(), "KOLO_TIMEOUT_SECONDS", "0.5")).timeout_seconds == 0.5);
  CHECK(topo(with(two_ranks(), "KOLO_TIMEOUT_SECONDS", "600")).timeout_seconds == 600.0);
  for (const char* bad : {"abc", "0", "-5", "", "10s", "nan", "inf", "1e9"}) {
    CAPTURE(bad);
    check_error(with(two_ranks(), "KOLO_TIMEOUT_SECONDS", bad),
                {std::string("KOLO_TIMEOUT_SECONDS=") + bad});
  }
  check_error(with(two_ranks(), "KOLO_TIMEOUT_SECONDS", "abc"), {"not a number"});
  check_error(with(two_ranks(), "KOLO_TIMEOUT_SECONDS", "0"), {"out of range"});
}

TEST_CASE("topology: KOLO_LISTEN_FD must be an open socket of this process") {
  const int sock = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(sock >= 0);
  CHECK(topo(with(two_ranks(), "KOLO_LISTEN_FD", std::to_string(sock))).listen_fd == sock);

  int pipe_fds[2];
  REQUIRE(::pipe(pipe_fds) == 0);
  const std::string pipe_fd = std::to_string(pipe_fds[0]);
  check_error(with(two_ranks(), "KOLO_LISTEN_FD", pipe_fd),
              {"KOLO_LISTEN_FD=" + pipe_fd, "not an open socket"});
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  // The pipe's descriptor number is closed now: still an error, not a crash.
  check_error(with(two_ranks(), "KOLO_LISTEN_FD", pipe_fd),
              {"KOLO_LISTEN_FD=" + pipe_fd, "not an open socket"});
  ::close(sock);

  check_error(with(two_ranks(), "KOLO_LISTEN_FD", "abc"), {"KOLO_LISTEN_FD=abc", "integer"});
  check_error(with(two_ranks(), "KOLO_LISTEN_FD", "-1"), {"KOLO_LISTEN_FD=-1", "out of range"});
}

TEST_CASE("topology: KOLO_DEVICES is a comma-separated list of non-negative ids") {
  CHECK(topo(with(two_ranks(), "KOLO_DEVICES", "0")).devices == std::vector<int>{0});
  CHECK(topo(with(two_ranks(), "KOLO_DEVICES", "3, 1")).devices == std::vector<int>{3, 1});
  CHECK(topo(with(two_ranks(), "KOLO_DEVICES", "")).devices.empty());
  check_error(with(two_ranks(), "KOLO_DEVICES", "0,x"), {"KOLO_DEVICES", "x", "not an integer"});
  check_error(with(two_ranks(), "KOLO_DEVICES", "gpu0"), {"KOLO_DEVICES=gpu0"});
  check_error(with(two_ranks(), "KOLO_DEVICES", "1,-2"), {"KOLO_DEVICES=1,-2", "negative"});
}

TEST_CASE("topology: from_env() reads the process environment") {
  // Only when the test is not itself started by a launcher: then its variables are the truth.
  if (kolo::process_env()("KOLO_SIZE") || kolo::process_env()("WORLD_SIZE") ||
      kolo::process_env()("OMPI_COMM_WORLD_SIZE") || kolo::process_env()("HOROVOD_SIZE") ||
      kolo::process_env()("PMI_SIZE")) {
    return;
  }
  // Not started by a launcher: a single-rank job.
  const auto t = kolo::Topology::from_env();
  CHECK(t.size == 1);
  CHECK(t.rank == 0);
}
