// The bad-input sweep over every KOLO_* variable (the one list: tests/common/config_table.hpp):
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
#include <set>
#include <string>
#include <vector>

#include "../common/config_table.hpp"
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

using kolo::config::Kind;
using kolo::config::Reader;
using kolo::config::Var;

// Runs the library's own reader of variables owned by `r` on `env`; false when that reader is
// not part of this binary (GPU, MPI, torch and Spark readers are swept by their own suites:
// tests/gpu gpu/host, tests/mpi, tests/torch, tests/spark).
bool read_with(Reader r, const Env& env) {
  const auto e = lookup(env);
  switch (r) {
    case Reader::topology:
      (void)kolo::Topology::from_env(e);
      return true;
    case Reader::log_level:
      (void)kolo::log_level_from_env(e);
      (void)kolo::Topology::from_env(e);  // the topology checks it too, on every rank alike
      return true;
    case Reader::mesh:
      (void)kolo::MeshOptions::from_env(e);
      return true;
    case Reader::route:
      (void)kolo::route_mode_from_env(e);
      return true;
    case Reader::communicator:
      (void)kolo::CommunicatorOptions::from_env(e);
      return true;
    case Reader::engine:
      (void)kolo::EngineOptions::from_env(e);
      return true;
    case Reader::compression:
      (void)kolo::CompressionPolicy::from_env(e);
      (void)kolo::EngineOptions::from_env(e);
      return true;
    case Reader::gpu:
    case Reader::mpi:
    case Reader::torch:
    case Reader::spark_data:
    case Reader::none:
      return false;
  }
  return false;
}

// The bad values each kind of variable is swept with.
const std::vector<std::string>& bad_values(Kind k) {
  static const std::string huge = "99999999999999999999999";  // beyond 64 bits
  static const std::vector<std::string> integer = {
      "",     " ",   "-1",   huge, "9223372036854775807", "abc", "1.5", "12abc",
      "0x10", "1e3", "true", "+-3"};
  static const std::vector<std::string> flag = {"",    " ",   "-1",  "2",  huge,
                                                "abc", "1.5", "yes", "0x1"};
  static const std::vector<std::string> fd = {"",    " ",   "-1",   huge, "9223372036854775807",
                                              "abc", "1.5", "0x10", "0",  "999"};
  static const std::vector<std::string> real = {
      "", " ", "-1", huge, "1e400", "abc", "5s", "true", "nan", "inf", "-inf", "1,5", "--1", "\t1"};
  static const std::vector<std::string> name = {"",    " ",  "-1",      huge,   "abc",
                                                "1.5", "42", "tcp,shm", "none;"};
  static const std::vector<std::string> rules = {
      "",           " ",         "-1",         huge,
      "abc",        "1.5",       "ring0-max",  "ring;ring:0-max",
      "ring:0-abc", "ring:10-5", "ring:0-100", "ring:0-max;tree:0-max",
      "bogus:0-max"};
  static const std::vector<std::string> host_port = {"",
                                                     " ",
                                                     "-1",
                                                     huge,
                                                     "abc",
                                                     "1.5",
                                                     "host:",
                                                     ":29500",
                                                     "host:0",
                                                     "host:65536",
                                                     "host:-1",
                                                     "host:abc",
                                                     "host:99999999999999999999"};
  static const std::vector<std::string> peers = {"",    " ",       "-1",          huge,     "abc",
                                                 "a:1", "a:1,b:x", "a:1,b:2,c:3", "a:1;b:2"};
  static const std::vector<std::string> devices = {"",     "-1",         huge,  "abc", "1.5",
                                                   "0,-1", "4294967296", "0;1", "gpu0"};
  static const std::vector<std::string> secret = {"", " ", "-1", huge, "abc", "1.5", "x7y6z5w"};
  static const std::vector<std::string> addr = {"",    " ",     "-1",     huge,   "abc", "1.5",
                                                "a b", "-host", "host:1", "a..b", "."};
  static const std::vector<std::string> text = {"", " ", "-1", huge, "abc", "1.5"};
  switch (k) {
    case Kind::integer:
      return integer;
    case Kind::flag:
      return flag;
    case Kind::fd:
      return fd;
    case Kind::real:
      return real;
    case Kind::choice:
      return name;
    case Kind::rules:
      return rules;
    case Kind::host_port:
      return host_port;
    case Kind::host_ports:
      return peers;
    case Kind::id_list:
      return devices;
    case Kind::secret:
      return secret;
    case Kind::address:
      return addr;
    case Kind::text:
      return text;
  }
  return text;
}

// Values that are deliberately accepted, and why (docs/reliability.md repeats this list). An
// empty value of a variable the table marks empty_is_unset is accepted too (it means unset).
struct Accepted {
  const char* name;
  const char* value;  // nullptr: every swept value
  const char* why;
};

const std::vector<Accepted> kAccepted = {
    // Free-form by design.
    {"KOLO_HOST_KEY", nullptr, "an opaque name: ranks with equal keys share memory"},
    {"KOLO_JOB_ID", nullptr, "an opaque name: the same on every rank of a job"},
    {"KOLO_TIMELINE", nullptr,
     "a file path; one that cannot be opened is a ConfigError when the engine starts"},
    {"KOLO_SECRET", "99999999999999999999999", "any string of 8 or more characters is a key"},
    {"KOLO_ADDR", "abc",
     "a host name: it is resolved by the ranks that connect to it (an unknown name fails there)"},
};

const Accepted* accepted(const Var& v, const std::string& value) {
  static const Accepted empty_unset{"", "", "empty = unset (the table's empty_is_unset)"};
  if (value.empty() && v.empty_is_unset) return &empty_unset;
  for (const auto& a : kAccepted) {
    if (v.name == a.name && (a.value == nullptr || value == a.value)) return &a;
  }
  return nullptr;
}

}  // namespace

TEST_CASE("env sweep: the table declares each variable once, with a doc line and a sane range") {
  std::set<std::string> names;
  for (const Var* v : kolo::config::all_vars()) {
    const std::string name(v->name);
    CAPTURE(name);
    CHECK(name.rfind("KOLO_", 0) == 0);
    CHECK_MESSAGE(names.insert(name).second, "declared twice");
    CHECK(!v->meaning.empty());
    CHECK(kolo::config::find_any(name) == v);
    if (v->kind == Kind::integer || v->kind == Kind::real || v->kind == Kind::flag ||
        v->kind == Kind::fd) {
      CHECK(v->min <= v->max);
    }
    CHECK((v->kind == Kind::choice) == (v->choices != nullptr));
    if (v->choices) CHECK(!v->choices->values.empty());
  }
  CHECK(names.size() >= 40);
}

// Every numeric variable, through the table's own reader: its declared range is enforced and
// the error names the variable and the value, whoever reads it (GPU, MPI and torch included).
TEST_CASE("env sweep: numeric variables reject bad values through the table's readers") {
  int errors = 0;
  for (const Var* v : kolo::config::all_vars()) {
    if (v->kind != Kind::integer && v->kind != Kind::real && v->kind != Kind::flag) continue;
    for (const std::string& value : bad_values(v->kind)) {
      const std::string var_name(v->name);
      CAPTURE(var_name);
      CAPTURE(value);
      Env env{{var_name, value}};
      std::string outcome;
      try {
        if (v->kind == Kind::real) {
          (void)kolo::config::get_real(lookup(env), *v);
        } else {
          (void)kolo::config::get_int(lookup(env), *v);
        }
        outcome = "accepted";
      } catch (const kolo::ConfigError& e) {
        outcome = e.what();
      }
      if (value == "-1" && v->min <= -1) continue;  // inside the declared range
      if (value.empty() && v->empty_is_unset) continue;
      REQUIRE_MESSAGE(outcome != "accepted", "bad value accepted");
      ++errors;
      CHECK(outcome.find(var_name) != std::string::npos);
    }
  }
  CHECK(errors > 100);
}

TEST_CASE("env sweep: every KOLO_ variable rejects bad values with a ConfigError naming it") {
  int errors = 0, accepted_values = 0, swept = 0;
  for (const Var* vp : kolo::config::all_vars()) {
    const Var& v = *vp;
    if (!read_with(v.reader, two_ranks())) continue;  // its reader is another suite's
    ++swept;
    for (const std::string& value : bad_values(v.kind)) {
      const std::string var_name(v.name);
      CAPTURE(var_name);
      CAPTURE(value);
      Env env = two_ranks();
      env[var_name] = value;
      const Accepted* ok = accepted(v, value);
      std::string outcome;
      try {
        (void)read_with(v.reader, env);
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
      CHECK_MESSAGE(outcome.find(var_name) != std::string::npos,
                    "does not name the variable: ", outcome);
      if (var_name == "KOLO_SECRET") {
        // The secret is never echoed, not even a wrong one (it may be a real key, mistyped).
        if (value.size() >= 3) CHECK(outcome.find(value) == std::string::npos);
      } else if (v.kind == Kind::host_ports) {
        // A list: the message shows the whole list, or the entry that is wrong.
        CHECK_MESSAGE(outcome.find(var_name + "=") != std::string::npos, outcome);
      } else if (!value.empty() && value != " ") {
        CHECK_MESSAGE(outcome.find(value) != std::string::npos,
                      "does not show the value: ", outcome);
      }
    }
  }
  MESSAGE(swept << " variables swept: " << errors << " bad values rejected, " << accepted_values
                << " deliberately accepted");
  CHECK(swept >= 30);
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
