// kolo/topology/topology.hpp — who am I, who are my peers: the environment contract
// (docs/environment.md).
//
// One contract, many launchers: kolo-run, mpirun, torchrun, horovodrun and the Spark backend all
// end by exporting these variables. KOLO_* names win; the aliases of the launchers people already
// use are accepted when the KOLO_ names are absent. Anything inconsistent is a ConfigError that
// names the variable and its value.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kolo/core/compiled_core.hpp"
#include "kolo/core/core_config.hpp"
#include "kolo/core/env.hpp"
#include "kolo/core/error.hpp"
#include "kolo/net/socket.hpp"

namespace kolo {

struct Topology {
  int rank = 0;
  int size = 1;
  // -1 means "not given by the launcher": Bootstrap derives it through the store by host key.
  int local_rank = -1;
  int local_size = -1;
  int cross_rank = -1;
  int cross_size = -1;

  // Rendezvous: a store address, and whether this rank hosts the store there (rank 0 does for
  // torchrun's MASTER_ADDR/PORT and for KOLO_PEERS; kolo-run hosts it itself for KOLO_STORE).
  std::optional<net::HostPort> store;
  bool host_store = false;
  std::vector<net::HostPort> peers;  // KOLO_PEERS, in rank order
  int listen_fd = -1;                // KOLO_LISTEN_FD: inherited, already bound and listening

  std::string secret;        // KOLO_SECRET
  std::string job;           // KOLO_JOB_ID (or TORCHELASTIC_RUN_ID): bound into store handshakes
  std::vector<int> devices;  // KOLO_DEVICES
  double timeout_seconds = 30.0;
  std::string host_key;      // ranks with equal keys share a host (shared memory reaches them)
  std::string advertise_ip;  // KOLO_ADDR: the address peers use to reach this rank (else derived)
  LogLevel log_level = LogLevel::warning;  // KOLO_LOG_LEVEL (checked here, on every rank alike)

  bool is_local_complete() const {
    return local_rank >= 0 && local_size > 0 && cross_rank >= 0 && cross_size > 0;
  }

  // The default host key: hostname plus the network namespace, so ranks in different network
  // namespaces (the test "hosts") count as different hosts even on one machine.
  static std::string default_host_key();

  static Topology from_env() { return from_env(process_env()); }

  static Topology from_env(const EnvLookup& env);

  // A topology for a framework that already knows rank and size and has its own store (see
  // Bootstrap's store constructor, kolo_torch): no launcher variable is needed; the optional
  // KOLO_* knobs still apply (KOLO_SECRET, KOLO_TIMEOUT_SECONDS, KOLO_DEVICES, KOLO_ADDR,
  // KOLO_HOST_KEY, KOLO_LOG_LEVEL). Local and cross ranks are derived through the store.
  static Topology for_rank(int rank, int size, const EnvLookup& env = process_env());

 private:
  // KOLO_SECRET, never echoed in an error. `required`: a multi-rank job from the environment
  // must have one; a framework's store (for_rank) lets rank 0 draw it instead, so there an
  // empty value means unset.
  static std::string read_secret(const EnvLookup& env, int size, bool required);

  // The knobs every way of building a topology reads the same way.
  static void read_knobs(Topology& t, const EnvLookup& env);
};

}  // namespace kolo

// Header-only: the definitions, inline (compiled core: in the library, src/lib/core_impl.cpp).
#if !KOLO_USE_COMPILED_CORE
#include "kolo/topology/detail/topology_impl.hpp"
#endif
