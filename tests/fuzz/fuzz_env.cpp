// libFuzzer target: every parser of configuration text — the KOLO_* environment contract
// (Topology::from_env and the launcher aliases), the transport, communicator and engine options,
// the selector's size-range overrides (KOLO_ALLREDUCE / KOLO_BROADCAST), KOLO_TUNING and the
// tuning file format, KOLO_COMPRESSION and host:port.
//
// Input: a mode byte, then text. Modes 0, 1, 7: lines "NAME=VALUE" (split at the first '='),
// the environment the whole-environment parsers see; 2: a KOLO_ALLREDUCE value (and a Selector
// applying it); 3: a KOLO_BROADCAST value; 4: integer, number and host:port parsers; 5: the
// name parsers (KOLO_COMPRESSION, KOLO_TUNING, algorithm names); 6: a tuning file. The contract: a
// bad value is a kolo::ConfigError and nothing else — any other exception escapes and libFuzzer
// records the input as a crash — and what parses successfully satisfies the invariants checked
// below.
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <kolo/algorithm/selector.hpp>
#include <kolo/algorithm/tuning_probe.hpp>
#include <kolo/communicator.hpp>
#include <kolo/compression/compressor.hpp>
#include <kolo/core/env.hpp>
#include <kolo/engine/engine.hpp>
#include <kolo/topology/topology.hpp>
#include <kolo/transport/mesh.hpp>
#include <kolo/transport/routed.hpp>

#include "fuzz_common.hpp"

namespace {

// Runs a parser; a ConfigError is the expected answer to bad input, anything else escapes.
template <class F>
void config_errors_only(F&& f) {
  try {
    f();
  } catch (const kolo::ConfigError& e) {
    KOLO_FUZZ_CHECK(std::string_view(e.what()).size() > 0, "a ConfigError without a message");
  }
}

template <class Algo>
void check_rules(const kolo::SizeRules<Algo>& rules) {
  using R = kolo::SizeRules<Algo>;
  const auto& v = rules.rules();
  if (v.empty()) return;
  // Sorted, contiguous, covering 0..max exactly once.
  KOLO_FUZZ_CHECK(v.front().lo == 0, "rules do not start at 0");
  KOLO_FUZZ_CHECK(v.back().hi == R::kMax, "rules do not end at max");
  for (std::size_t i = 0; i < v.size(); ++i) {
    KOLO_FUZZ_CHECK(v[i].lo <= v[i].hi, "an empty range");
    if (i > 0) KOLO_FUZZ_CHECK(v[i].lo == v[i - 1].hi + 1, "a gap or an overlap");
  }
  // Every boundary looks up its own rule.
  for (const auto& r : v) {
    KOLO_FUZZ_CHECK(rules.lookup(r.lo) == r.algo, "lookup(lo) disagrees");
    KOLO_FUZZ_CHECK(rules.lookup(r.hi) == r.algo, "lookup(hi) disagrees");
  }
  // describe() is in the grammar and means the same rules.
  const std::string text = rules.describe();
  const R again = R::parse("roundtrip", text);
  KOLO_FUZZ_CHECK(again.rules().size() == v.size(), "describe() does not parse back: " + text);
  for (std::size_t i = 0; i < v.size(); ++i) {
    const auto& a = again.rules()[i];
    KOLO_FUZZ_CHECK(a.lo == v[i].lo && a.hi == v[i].hi && a.algo == v[i].algo,
                    "describe() round trip changed rule " + std::to_string(i) + ": " + text);
  }
}

void check_topology(const kolo::Topology& t) {
  KOLO_FUZZ_CHECK(t.size >= 1 && t.rank >= 0 && t.rank < t.size, "rank/size out of range");
  if (t.local_size > 0) KOLO_FUZZ_CHECK(t.local_size <= t.size, "local size above size");
  if (t.local_size > 0 && t.local_rank >= 0) {
    KOLO_FUZZ_CHECK(t.local_rank < t.local_size, "local rank not below local size");
  }
  if (t.cross_size > 0 && t.cross_rank >= 0) {
    KOLO_FUZZ_CHECK(t.cross_rank < t.cross_size, "cross rank not below cross size");
  }
  KOLO_FUZZ_CHECK(t.peers.empty() || static_cast<int>(t.peers.size()) == t.size,
                  "peer list of the wrong length");
  if (t.size > 1) {
    KOLO_FUZZ_CHECK(t.store.has_value(), "multi-rank topology without a store");
    KOLO_FUZZ_CHECK(t.secret.size() >= 8, "multi-rank topology with a short secret");
  }
  if (t.store) KOLO_FUZZ_CHECK(t.store->port > 0, "store port 0");
  for (const auto& p : t.peers) KOLO_FUZZ_CHECK(p.port > 0, "peer port 0");
  for (int d : t.devices) KOLO_FUZZ_CHECK(d >= 0, "negative device");
  KOLO_FUZZ_CHECK(t.timeout_seconds >= 0.001 && t.timeout_seconds <= 1e6, "timeout out of range");
  KOLO_FUZZ_CHECK(!t.host_key.empty(), "empty host key");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  // The first byte picks the parser (one per input keeps exceptions, which are slow under the
  // sanitizers, few); the rest is its text.
  const std::uint8_t mode = data[0] % 8;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);

  switch (mode) {
    case 0:
    case 1:
    case 7: {  // an environment: lines NAME=VALUE (split at the first '=')
      std::map<std::string, std::string> vars;
      for (std::string_view rest = text; !rest.empty();) {
        const auto nl = rest.find('\n');
        const std::string_view line = rest.substr(0, nl);
        rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
        const auto eq = line.find('=');
        if (eq == std::string_view::npos) continue;
        // A real environment has no NUL in a name; values keep whatever bytes they have.
        std::string name(line.substr(0, eq));
        if (name.find('\0') != std::string::npos) continue;
        vars[std::move(name)] = std::string(line.substr(eq + 1));
      }
      const kolo::EnvLookup env = [&vars](const std::string& name) -> std::optional<std::string> {
        const auto it = vars.find(name);
        if (it == vars.end()) return std::nullopt;
        return it->second;
      };
      config_errors_only([&] { check_topology(kolo::Topology::from_env(env)); });
      config_errors_only([&] {
        const auto o = kolo::MeshOptions::from_env(env);
        KOLO_FUZZ_CHECK(o.shm_slot_bytes >= 4096 && o.shm_slot_bytes % 64 == 0, "slot bytes");
        KOLO_FUZZ_CHECK(o.shm_slots >= 2 && o.shm_slots <= 1024, "slot count");
      });
      config_errors_only([&] { (void)kolo::route_mode_from_env(env); });
      config_errors_only([&] {
        const auto o = kolo::CommunicatorOptions::from_env(env);
        KOLO_FUZZ_CHECK(o.segment_bytes >= 64, "segment bytes");
        check_rules(o.allreduce_rules);
        check_rules(o.broadcast_rules);
        check_rules(o.allgather_rules);
        check_rules(o.reduce_scatter_rules);
        check_rules(o.alltoall_rules);
        check_rules(o.effective_allreduce_rules());
      });
      config_errors_only([&] {
        const auto o = kolo::EngineOptions::from_env(env);
        KOLO_FUZZ_CHECK(o.cycle_time_ms >= 0 && std::isfinite(o.cycle_time_ms), "cycle time");
        KOLO_FUZZ_CHECK(o.compression.enabled() == (o.compression.name != "none"), "compression");
      });
      break;
    }
    case 2:  // KOLO_ALLREDUCE, and the Selector that applies it
      config_errors_only([&] {
        check_rules(kolo::SizeRules<kolo::AllreduceAlgorithm>::parse("KOLO_ALLREDUCE", text));
      });
      config_errors_only([&] {
        kolo::Selector sel;
        sel.set_allreduce_rules(text);
        (void)sel.allreduce(0);
        (void)sel.allreduce(std::numeric_limits<std::size_t>::max());
        (void)sel.describe();
      });
      break;
    case 3:  // KOLO_BROADCAST
      config_errors_only([&] {
        check_rules(kolo::SizeRules<kolo::BroadcastAlgorithm>::parse("KOLO_BROADCAST", text));
      });
      break;
    case 4:  // numbers and addresses
      config_errors_only([&] { (void)kolo::parse_env_int("KOLO_FUZZ", text); });
      config_errors_only([&] { (void)kolo::parse_env_double("KOLO_FUZZ", text); });
      config_errors_only([&] {
        const auto hp = kolo::net::parse_host_port(text, "KOLO_FUZZ");
        KOLO_FUZZ_CHECK(hp.port >= 1, "port 0 accepted");
      });
      break;
    case 5:  // names
      config_errors_only([&] { (void)kolo::CompressionPolicy::parse(text); });
      config_errors_only([&] { (void)kolo::TuningSource::parse(text); });
      config_errors_only([&] { (void)kolo::parse_allreduce_algorithm(text); });
      config_errors_only([&] { (void)kolo::parse_broadcast_algorithm(text); });
      break;
    case 6:  // the tuning file (KOLO_TUNING=file:PATH)
      config_errors_only([&] {
        const kolo::Tuning t = kolo::Tuning::from_text(text, "fuzz.tuning");
        for (double x : {t.shm.alpha, t.shm.beta, t.tcp.alpha, t.tcp.beta, t.gamma}) {
          KOLO_FUZZ_CHECK(x >= 0 && std::isfinite(x), "tuning constant negative or not finite");
        }
        KOLO_FUZZ_CHECK(t.cores >= 0, "negative core count");
        (void)kolo::Tuning::from_text(t.to_text(), "roundtrip");  // to_text() writes the format
      });
      break;
  }
  return 0;
}
