// The bad-input sweep over every KOLO_* variable kolo reads (docs/environment.md, docs/engine.md):
// each one, given an empty, negative, huge, non-numeric or wrong-type value, must either raise a
// ConfigError whose message names the variable (and its value, except KOLO_SECRET, which is never
// echoed) — or be listed below as a value that is deliberately accepted, with the reason. Nothing
// else is allowed: no other exception, no crash, no silent wrap-around of a huge number.
//
// The readers are the ones the library calls: Topology, MeshOptions, route_mode_from_env,
// CommunicatorOptions, EngineOptions, CompressionPolicy and log_level_from_env, each given the
// variable through an EnvLookup on top of a valid two-rank environment. A few of the same
// values go through real processes in tests/faults (test_abuse.cpp).
#include <doctest/doctest.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kolo/communicator.hpp"
#include "kolo/compression/compressor.hpp"
#include "kolo/core/env.hpp"
#include "kolo/core/error.hpp"
#include "kolo/engine/engine.hpp"
#include "kolo/topology/topology.hpp"
#include "kolo/transport/mesh.hpp"
#include "kolo/transport/routed.hpp"

namespace {

using Env = std::map<std::string, std::string>;

kolo::EnvLookup lookup(const Env& env) {
  return [env](const std::string& name) -> std::optional<std::string> {
    const auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

Env two_ranks() {
  return {{"KOLO_RANK", "1"},
          {"KOLO_SIZE", "2"},
          {"KOLO_STORE", "10.0.0.1:29500"},
          {"KOLO_SECRET", "0123456789abcdef"}};
}

enum class Reader { topology, mesh, transport, communicator, engine, compression, log_level };

// Runs the reader of `r` on `env`.
void read_with(Reader r, const Env& env) {
  const auto e = lookup(env);
  switch (r) {
    case Reader::topology:
      (void)kolo::Topology::from_env(e);
      return;
    case Reader::mesh:
      (void)kolo::MeshOptions::from_env(e);
      return;
    case Reader::transport:
      (void)kolo::route_mode_from_env(e);
      return;
    case Reader::communicator:
      (void)kolo::CommunicatorOptions::from_env(e);
      return;
    case Reader::engine:
      (void)kolo::EngineOptions::from_env(e);
      return;
    case Reader::compression:
      (void)kolo::CompressionPolicy::from_env(e);
      return;
    case Reader::log_level:
      (void)kolo::log_level_from_env(e);
      return;
  }
}

// The kinds of value a variable holds, and the bad values each kind is swept with.
enum class Kind { integer, real, name, rules, host_port, peers, devices, secret, addr, opaque, fd };

const std::vector<std::string>& bad_values(Kind k) {
  static const std::string huge = "99999999999999999999999";  // beyond 64 bits
  static const std::map<Kind, std::vector<std::string>> values = {
      {Kind::integer,
       {"", " ", "-1", huge, "9223372036854775807", "abc", "1.5", "12abc", "0x10", "1e3", "true",
        "+-3"}},
      {Kind::fd, {"", " ", "-1", huge, "9223372036854775807", "abc", "1.5", "0x10", "0", "999"}},
      {Kind::real,
       {"", " ", "-1", huge, "1e400", "abc", "5s", "true", "nan", "inf", "-inf", "1,5", "--1"}},
      {Kind::name, {"", " ", "-1", huge, "abc", "1.5", "42", "tcp,shm", "none;"}},
      {Kind::rules,
       {"", " ", "-1", huge, "abc", "1.5", "ring", "ring:0-abc", "ring:10-5", "ring:0-100",
        "ring:0-max;tree:0-max", "bogus:0-max"}},
      {Kind::host_port,
       {"", " ", "-1", huge, "abc", "1.5", "host:", ":29500", "host:0", "host:65536", "host:-1",
        "host:abc", "host:99999999999999999999"}},
      {Kind::peers, {"", " ", "-1", huge, "abc", "a:1", "a:1,b:x", "a:1,b:2,c:3", "a:1;b:2"}},
      {Kind::devices, {"", "-1", huge, "abc", "1.5", "0,-1", "4294967296", "0;1", "gpu0"}},
      {Kind::secret, {"", " ", "-1", huge, "abc", "1.5", "x7y6z5w"}},
      {Kind::addr, {"", " ", "-1", huge, "abc", "1.5", "a b", "-host", "host:1", "a..b", "."}},
      {Kind::opaque, {"", " ", "-1", huge, "abc", "1.5"}},
  };
  return values.at(k);
}

struct Var {
  const char* name;
  Reader reader;
  Kind kind;
};

// Every KOLO_* variable of docs/environment.md and docs/engine.md, plus KOLO_LOG_LEVEL,
// KOLO_TUNING and the deprecated KOLO_SMALL_ALLREDUCE_BYTES.
const std::vector<Var> kVars = {
    {"KOLO_RANK", Reader::topology, Kind::integer},
    {"KOLO_SIZE", Reader::topology, Kind::integer},
    {"KOLO_LOCAL_RANK", Reader::topology, Kind::integer},
    {"KOLO_LOCAL_SIZE", Reader::topology, Kind::integer},
    {"KOLO_CROSS_RANK", Reader::topology, Kind::integer},
    {"KOLO_CROSS_SIZE", Reader::topology, Kind::integer},
    {"KOLO_STORE", Reader::topology, Kind::host_port},
    {"KOLO_PEERS", Reader::topology, Kind::peers},
    {"KOLO_LISTEN_FD", Reader::topology, Kind::fd},
    {"KOLO_SECRET", Reader::topology, Kind::secret},
    {"KOLO_HOST_KEY", Reader::topology, Kind::opaque},
    {"KOLO_ADDR", Reader::topology, Kind::addr},
    {"KOLO_DEVICES", Reader::topology, Kind::devices},
    {"KOLO_TIMEOUT_SECONDS", Reader::topology, Kind::real},
    {"KOLO_LOG_LEVEL", Reader::topology, Kind::name},
    {"KOLO_LOG_LEVEL", Reader::log_level, Kind::name},
    {"KOLO_TRANSPORT", Reader::transport, Kind::name},
    {"KOLO_SHM_SLOT_BYTES", Reader::mesh, Kind::integer},
    {"KOLO_SHM_SLOTS", Reader::mesh, Kind::integer},
    {"KOLO_SPIN_US", Reader::mesh, Kind::real},
    {"KOLO_SEGMENT_BYTES", Reader::communicator, Kind::integer},
    {"KOLO_SMALL_ALLREDUCE_BYTES", Reader::communicator, Kind::integer},
    {"KOLO_ALLREDUCE", Reader::communicator, Kind::rules},
    {"KOLO_BROADCAST", Reader::communicator, Kind::rules},
    {"KOLO_ALLGATHER", Reader::communicator, Kind::rules},
    {"KOLO_REDUCE_SCATTER", Reader::communicator, Kind::rules},
    {"KOLO_ALLTOALL", Reader::communicator, Kind::rules},
    {"KOLO_TUNING", Reader::communicator, Kind::name},
    {"KOLO_FUSION_THRESHOLD", Reader::engine, Kind::integer},
    {"KOLO_CYCLE_TIME_MS", Reader::engine, Kind::real},
    {"KOLO_STALL_WARNING_SECONDS", Reader::engine, Kind::real},
    {"KOLO_STALL_SHUTDOWN_SECONDS", Reader::engine, Kind::real},
    {"KOLO_CACHE_CAPACITY", Reader::engine, Kind::integer},
    {"KOLO_TIMELINE", Reader::engine, Kind::opaque},
    {"KOLO_COMPRESSION", Reader::engine, Kind::name},
    {"KOLO_COMPRESSION", Reader::compression, Kind::name},
};

// Values that are deliberately accepted, and why (docs/reliability.md repeats this list).
struct Accepted {
  const char* name;
  const char* value;  // nullptr: every swept value
  const char* why;
};

const std::vector<Accepted> kAccepted = {
    // Empty means unset: these variables have a meaningful "absent" and launchers (Spark,
    // shell scripts) export them empty rather than not at all.
    {"KOLO_ADDR", "", "empty = unset: derive the address from the route to the store"},
    {"KOLO_HOST_KEY", "", "empty = unset: hostname + network namespace"},
    {"KOLO_DEVICES", "", "empty = no devices (a CPU-only rank)"},
    {"KOLO_TRANSPORT", "", "empty = unset: routed"},
    {"KOLO_TUNING", "", "empty = unset: probe"},
    {"KOLO_ALLREDUCE", "", "empty = unset: the Selector's cost model decides"},
    {"KOLO_BROADCAST", "", "empty = unset: the Selector's cost model decides"},
    {"KOLO_ALLGATHER", "", "empty = unset: the Selector's cost model decides"},
    {"KOLO_REDUCE_SCATTER", "", "empty = unset: the Selector's cost model decides"},
    {"KOLO_ALLTOALL", "", "empty = unset: the Selector's cost model decides"},
    {"KOLO_COMPRESSION", "", "empty = unset: none"},
    {"KOLO_TIMELINE", "", "empty = unset: no timeline"},
    {"KOLO_LOG_LEVEL", "", "empty = unset: warning"},
    // Free-form by design.
    {"KOLO_HOST_KEY", nullptr, "an opaque name: ranks with equal keys share memory"},
    {"KOLO_TIMELINE", nullptr,
     "a file path; one that cannot be opened is a ConfigError when the engine starts"},
    {"KOLO_SECRET", "99999999999999999999999", "any string of 8 or more characters is a key"},
    {"KOLO_ADDR", "abc",
     "a host name: it is resolved by the ranks that connect to it (an unknown name fails there)"},
};

const Accepted* accepted(const std::string& name, const std::string& value) {
  for (const auto& a : kAccepted) {
    if (name == a.name && (a.value == nullptr || value == a.value)) return &a;
  }
  return nullptr;
}

}  // namespace

TEST_CASE("env sweep: every KOLO_ variable rejects bad values with a ConfigError naming it") {
  int errors = 0, accepted_values = 0;
  for (const Var& v : kVars) {
    for (const std::string& value : bad_values(v.kind)) {
      const std::string var_name = v.name;
      CAPTURE(var_name);
      CAPTURE(value);
      Env env = two_ranks();
      env[v.name] = value;
      const Accepted* ok = accepted(v.name, value);
      std::string outcome;
      try {
        read_with(v.reader, env);
        outcome = "accepted";
      } catch (const kolo::ConfigError& e) {
        outcome = e.what();
      } catch (const std::exception& e) {
        FAIL_CHECK("not a ConfigError: ", e.what());
        continue;
      }
      if (ok) {
        CHECK_MESSAGE(outcome == "accepted", "listed as accepted (", ok->why, ") but: ", outcome);
        ++accepted_values;
        continue;
      }
      REQUIRE_MESSAGE(outcome != "accepted", "bad value accepted");
      ++errors;
      CHECK_MESSAGE(outcome.find(v.name) != std::string::npos,
                    "does not name the variable: ", outcome);
      if (std::string(v.name) == "KOLO_SECRET") {
        // The secret is never echoed, not even a wrong one (it may be a real key, mistyped).
        if (value.size() >= 3) CHECK(outcome.find(value) == std::string::npos);
      } else if (v.kind == Kind::peers) {
        // A list: the message shows the whole list, or the entry that is wrong.
        CHECK_MESSAGE(outcome.find(std::string(v.name) + "=") != std::string::npos, outcome);
      } else if (!value.empty() && value != " ") {
        CHECK_MESSAGE(outcome.find(value) != std::string::npos,
                      "does not show the value: ", outcome);
      }
    }
  }
  MESSAGE(errors << " bad values rejected, " << accepted_values << " deliberately accepted");
  CHECK(errors > 250);
}

// The values that must keep working, so the sweep above is not passing by rejecting everything.
TEST_CASE("env sweep: good values are accepted") {
  const std::vector<std::pair<const char*, const char*>> good = {
      {"KOLO_TIMEOUT_SECONDS", "0.5"}, {"KOLO_TIMEOUT_SECONDS", " 30"},
      {"KOLO_ADDR", "10.1.2.3"},       {"KOLO_ADDR", "::1"},
      {"KOLO_ADDR", "[fe80::1]"},      {"KOLO_ADDR", "node-7.cluster.example"},
      {"KOLO_ADDR", "node7."},         {"KOLO_LOCAL_RANK", "1"},
      {"KOLO_CROSS_RANK", "0"},        {"KOLO_DEVICES", "0, 3"},
      {"KOLO_LOG_LEVEL", "DEBUG"},     {"KOLO_LOG_LEVEL", "warn"},
      {"KOLO_SECRET", "12345678"},     {"KOLO_PEERS", "10.0.0.1:1,10.0.0.2:2"},
  };
  for (const auto& [name, value] : good) {
    CAPTURE(name);
    CAPTURE(value);
    Env env = two_ranks();
    env[name] = value;
    CHECK_NOTHROW((void)kolo::Topology::from_env(lookup(env)));
  }
  const auto t = kolo::Topology::from_env(lookup([] {
    Env e = two_ranks();
    e["KOLO_LOG_LEVEL"] = "Debug";
    return e;
  }()));
  CHECK(t.log_level == kolo::LogLevel::debug);
  CHECK(kolo::MeshOptions::from_env(lookup({{"KOLO_SHM_SLOTS", "16"}})).shm_slots == 16);
  CHECK(kolo::route_mode_from_env(lookup({{"KOLO_TRANSPORT", "tcp"}})) ==
        kolo::RouteMode::tcp_only);
  CHECK(kolo::EngineOptions::from_env(lookup({{"KOLO_CYCLE_TIME_MS", "2.5"}})).cycle_time_ms ==
        2.5);
  CHECK(kolo::CompressionPolicy::from_env(lookup({{"KOLO_COMPRESSION", "bf16"}})).enabled());
}

// Huge numbers must not wrap around into plausible small ones (a cast to int).
TEST_CASE("env sweep: huge indices and device ids do not wrap around") {
  for (const char* var : {"KOLO_LOCAL_RANK", "KOLO_CROSS_RANK"}) {
    CAPTURE(var);
    Env env = two_ranks();
    env[var] = "4294967296";  // 2^32: would be 0 as an int
    CHECK_THROWS_AS((void)kolo::Topology::from_env(lookup(env)), kolo::ConfigError);
  }
  Env env = two_ranks();
  env["KOLO_DEVICES"] = "4294967297";  // would be device 1
  CHECK_THROWS_AS((void)kolo::Topology::from_env(lookup(env)), kolo::ConfigError);
}
