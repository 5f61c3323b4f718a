// kolo/topology/detail/topology_impl.hpp — Topology's definitions (topology/topology.hpp):
// reading the environment contract.
//
// Header-only, topology.hpp includes this file; with the compiled core only the library does
// (core/compiled_core.hpp, KOLO_IMPL_INLINE).
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
#include "kolo/topology/topology.hpp"

namespace kolo {

KOLO_IMPL_INLINE std::string Topology::default_host_key() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  std::string key(name);
  struct stat st {};
  if (::stat("/proc/self/ns/net", &st) == 0) {
    key += "/netns:" + std::to_string(static_cast<unsigned long long>(st.st_ino));
  }
  return key;
}

KOLO_IMPL_INLINE Topology Topology::from_env(const EnvLookup& env) {
  Topology t;
  // The KOLO_ name, else its first alias present (the aliases are the table's:
  // core/config.hpp); remember which one so errors name what the user set.
  auto first = [&](const config::Var& var) -> std::optional<std::pair<std::string, std::string>> {
    for (const std::string& n : config::names_of(var)) {
      if (auto v = env(n)) return std::make_pair(n, *v);
    }
    return std::nullopt;
  };
  auto int_of = [&](const std::optional<std::pair<std::string, std::string>>& v) {
    return parse_env_int(v->first, v->second);
  };

  const auto size = first(config::vars::size);
  const auto rank = first(config::vars::rank);
  if (!size && !rank) {
    // No launcher at all: one process on its own, as an MPI singleton or hvd.init() without
    // horovodrun (every launcher exports a size). Collectives are then copies.
    if (log_level_from_env(env) == LogLevel::debug) {
      std::fprintf(stderr,
                   "kolo: no launcher variables (KOLO_SIZE, WORLD_SIZE, OMPI_COMM_WORLD_SIZE, "
                   "...): a single-rank job\n");
    }
    t.size = 1;
    t.rank = 0;
    read_knobs(t, env);
    return t;
  }
  if (!size) {
    throw ConfigError(
        "KOLO_SIZE is not set (nor WORLD_SIZE, OMPI_COMM_WORLD_SIZE, HOROVOD_SIZE): start the "
        "program with kolo-run, mpirun, torchrun or the Spark backend");
  }
  if (!rank) {
    throw ConfigError("KOLO_RANK is not set (nor RANK, OMPI_COMM_WORLD_RANK, HOROVOD_RANK)");
  }
  const long long sz = int_of(size);
  const long long rk = int_of(rank);
  if (sz < 1 || sz > static_cast<long long>(config::vars::size.max)) {
    throw ConfigError(size->first + "=" + size->second + " must be in 1.." +
                      std::to_string(static_cast<long long>(config::vars::size.max)));
  }
  if (rk < 0) throw ConfigError(rank->first + "=" + rank->second + " is negative");
  if (rk >= sz) {
    throw ConfigError(rank->first + "=" + rank->second + " is not below " + size->first + "=" +
                      size->second);
  }
  t.size = static_cast<int>(sz);
  t.rank = static_cast<int>(rk);

  auto pair_of = [&](const config::Var& idx_var, const config::Var& cnt_var, int& idx, int& cnt) {
    const auto i = first(idx_var);
    const auto c = first(cnt_var);
    if (!i && !c) return;
    if (c) {
      const long long n = int_of(c);
      if (n < 1 || n > sz) {
        throw ConfigError(c->first + "=" + c->second + " must be in 1.." + std::to_string(sz));
      }
      cnt = static_cast<int>(n);
    }
    if (i) {
      const long long k = int_of(i);
      if (k < 0) throw ConfigError(i->first + "=" + i->second + " is negative");
      if (c && k >= cnt) {
        throw ConfigError(i->first + "=" + i->second + " is not below " + c->first + "=" +
                          c->second);
      }
      // Without a count to compare with, an index is still below the number of ranks (and
      // an int: a huge value must not wrap around into a plausible one).
      if (k >= sz) {
        throw ConfigError(i->first + "=" + i->second + " is not below " + size->first + "=" +
                          size->second);
      }
      idx = static_cast<int>(k);
    }
  };
  pair_of(config::vars::local_rank, config::vars::local_size, t.local_rank, t.local_size);
  pair_of(config::vars::cross_rank, config::vars::cross_size, t.cross_rank, t.cross_size);

  // Rendezvous.
  if (auto s = config::get_text(env, config::vars::store)) {
    t.store = net::parse_host_port(*s, "KOLO_STORE");
    t.host_store = false;  // the launcher hosts it
  }
  if (auto p = config::get_text(env, config::vars::peers)) {
    std::string_view rest = *p;
    while (!rest.empty()) {
      const auto comma = rest.find(',');
      const auto item = rest.substr(0, comma);
      if (!item.empty()) t.peers.push_back(net::parse_host_port(item, "KOLO_PEERS"));
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
    if (static_cast<long long>(t.peers.size()) != sz) {
      throw ConfigError("KOLO_PEERS=" + *p + " lists " + std::to_string(t.peers.size()) +
                        " addresses but " + size->first + "=" + size->second);
    }
    if (!t.store) {  // rank 0 hosts the store at its own advertised address
      t.store = t.peers[0];
      t.host_store = t.rank == 0;
    }
  }
  if (!t.store) {
    const auto addr = env("MASTER_ADDR");
    const auto port = env("MASTER_PORT");
    if (addr && port) {
      t.store = net::parse_host_port(*addr + ":" + *port, "MASTER_ADDR:MASTER_PORT");
      t.host_store = t.rank == 0;  // torchrun convention: rank 0 serves the store
      // torchrun's agent serves torch's own store on MASTER_PORT when it tells its workers
      // TORCHELASTIC_USE_AGENT_STORE=True (the default of its c10d rendezvous): rank 0 then
      // hosts kolo's store one port above (KOLO_STORE chooses another address).
      if (const auto agent = env("TORCHELASTIC_USE_AGENT_STORE");
          agent && (*agent == "True" || *agent == "true" || *agent == "1")) {
        if (t.store->port >= 65535) {
          throw ConfigError("MASTER_PORT=" + *port +
                            " leaves no port above it for kolo's store beside torchrun's agent "
                            "store: set KOLO_STORE=host:port");
        }
        t.store->port = static_cast<std::uint16_t>(t.store->port + 1);
      }
    } else if (addr || port) {
      throw ConfigError(std::string(addr ? "MASTER_PORT" : "MASTER_ADDR") + " is not set but " +
                        (addr ? "MASTER_ADDR" : "MASTER_PORT") +
                        " is: set both, or KOLO_STORE=host:port");
    }
  }
  if (!t.store && sz > 1) {
    if (size->first == "OMPI_COMM_WORLD_SIZE" || size->first == "PMI_SIZE") {
      // Under mpirun without kolo's variables: one message with the one thing to do.
      throw ConfigError(
          "started by mpirun (" + size->first + "=" + size->second +
          ") without a kolo rendezvous: inside an MPI job build the communicator from MPI "
          "(kolo::Communicator<kolo::MpiTransport>(std::make_unique<kolo::MpiTransport>("
          "MPI_COMM_WORLD)), kolo/transport/mpi.hpp), or start the program with kolo-run");
    }
    throw ConfigError("KOLO_STORE is not set (nor KOLO_PEERS, MASTER_ADDR/MASTER_PORT): " +
                      std::to_string(sz) + " ranks need a rendezvous address");
  }
  if (auto fd = config::get_int(env, config::vars::listen_fd)) {
    struct stat st {};
    if (::fstat(static_cast<int>(*fd), &st) != 0 || !S_ISSOCK(st.st_mode)) {
      throw ConfigError("KOLO_LISTEN_FD=" + std::to_string(*fd) +
                        " is not an open socket in this process");
    }
    t.listen_fd = static_cast<int>(*fd);
  }

  t.secret = read_secret(env, t.size, /*required=*/true);
  // The job id the store's handshakes are bound to (net::job_key): KOLO_JOB_ID, else torchrun's
  // run id ("none" when torchrun was given no --rdzv-id: not an id).
  if (auto j = config::get_text(env, config::vars::job_id); j && !j->empty()) {
    t.job = *j;
  } else if (auto r = env("TORCHELASTIC_RUN_ID"); r && !r->empty() && *r != "none") {
    t.job = *r;
  }

  read_knobs(t, env);
  return t;
}

KOLO_IMPL_INLINE Topology Topology::for_rank(int rank, int size, const EnvLookup& env) {
  if (size < 1 || rank < 0 || rank >= size) {
    throw ConfigError("rank " + std::to_string(rank) + " is not a rank of a job of size " +
                      std::to_string(size));
  }
  Topology t;
  t.rank = rank;
  t.size = size;
  // Optional here: without it, rank 0 draws one and passes it through the framework's store.
  t.secret = read_secret(env, size, /*required=*/false);
  read_knobs(t, env);
  return t;
}

KOLO_IMPL_INLINE std::string Topology::read_secret(const EnvLookup& env, int size, bool required) {
  auto s = config::get_text(env, config::vars::secret);
  if (s && s->empty() && !required) s.reset();
  if (!s) {
    if (required && size > 1) {
      throw ConfigError(
          "KOLO_SECRET is not set: every TCP connection of a multi-rank job must prove the job "
          "secret (kolo-run and the Spark backend generate one; set it yourself otherwise)");
    }
    return {};
  }
  if (s->size() < 8 && size > 1) {
    throw ConfigError("KOLO_SECRET is too short (" + std::to_string(s->size()) +
                      " characters; use at least 8, e.g. 32 random hex digits)");
  }
  return *s;
}

KOLO_IMPL_INLINE void Topology::read_knobs(Topology& t, const EnvLookup& env) {
  if (auto d = config::get_text(env, config::vars::devices)) {
    std::string_view rest = *d;
    while (!rest.empty()) {
      const auto comma = rest.find(',');
      const auto item = rest.substr(0, comma);
      if (!item.empty()) {
        const long long id = parse_env_int("KOLO_DEVICES", item);
        if (id < 0) throw ConfigError("KOLO_DEVICES=" + *d + " has a negative device id");
        if (id > static_cast<long long>(config::vars::devices.max)) {
          throw ConfigError("KOLO_DEVICES=" + *d + " has a device id out of range");
        }
        t.devices.push_back(static_cast<int>(id));
      }
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  }
  if (auto to = config::get_real(env, config::vars::timeout_seconds)) t.timeout_seconds = *to;
  if (auto a = config::get_text(env, config::vars::addr)) {
    if (!net::valid_host(*a)) {
      throw ConfigError("KOLO_ADDR=" + *a +
                        " is neither an IP address nor a host name (the address other ranks "
                        "use to reach this one)");
    }
    t.advertise_ip = *a;
  } else if (!t.peers.empty()) {
    t.advertise_ip = t.peers[static_cast<std::size_t>(t.rank)].host;
  }
  t.log_level = log_level_from_env(env);
  if (auto hk = config::get_text(env, config::vars::host_key)) {
    t.host_key = *hk;
  } else {
    t.host_key = default_host_key();
  }
}

}  // namespace kolo
