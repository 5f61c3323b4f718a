// kolo/topology/detail/bootstrap_impl.hpp — Bootstrap's definitions (topology/bootstrap.hpp).
//
// Kept out of the public path with the store server and the handshake (OpenSSL) they need:
// header-only, bootstrap.hpp includes this file; with the compiled core only the library does
// (core/compiled_core.hpp, KOLO_IMPL_INLINE).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kolo/core/compiled_core.hpp"
#include "kolo/core/error.hpp"
#include "kolo/net/auth.hpp"
#include "kolo/topology/bootstrap.hpp"
#include "kolo/topology/store.hpp"

namespace kolo {

KOLO_IMPL_INLINE Bootstrap::Bootstrap(Topology topo) : topo_(std::move(topo)) {
  static std::atomic<int> counter{0};
  prefix_ = "kolo/" + std::to_string(counter.fetch_add(1)) + "/";
  if (topo_.size > 1) {
    if (!topo_.store) throw ConfigError("no rendezvous store address for a multi-rank job");
    // The store's handshakes prove the secret bound to the job id (KOLO_JOB_ID): a rank of
    // another job that shares the secret is refused by this store, and this rank by theirs.
    const std::string store_key = net::job_key(topo_.secret, topo_.job);
    if (topo_.host_store && topo_.rank == 0) {
      // Rank 0 serves the store, on the inherited listening socket when the launcher gave one
      // (KOLO_LISTEN_FD with KOLO_PEERS: no bind race), else on the advertised port.
      if (topo_.listen_fd >= 0 && !topo_.peers.empty()) {
        server_ = std::make_unique<StoreServer>(net::Socket(topo_.listen_fd), store_key);
        topo_.listen_fd = -1;  // consumed by the store
      } else {
        try {
          server_ = StoreServer::listen("0.0.0.0", topo_.store->port, store_key);
        } catch (const Error& e) {
          throw ConfigError(std::string(e.what()) +
                            ": rank 0 hosts kolo's rendezvous store on "
                            "port " +
                            std::to_string(topo_.store->port) +
                            " (MASTER_PORT, or MASTER_PORT + 1 under torchrun's agent store); "
                            "choose a free one with MASTER_PORT or KOLO_STORE=host:port");
        }
      }
    }
    store_ =
        std::make_shared<StoreClient>(*topo_.store, store_key, topo_.rank, topo_.timeout_seconds);
  }
  derive_hosts();
}

KOLO_IMPL_INLINE Bootstrap::Bootstrap(Topology topo, std::shared_ptr<KvStore> store,
                                      std::string prefix)
    : topo_(std::move(topo)), prefix_(std::move(prefix)) {
  if (topo_.size < 1 || topo_.rank < 0 || topo_.rank >= topo_.size) {
    throw ConfigError("Bootstrap: rank " + std::to_string(topo_.rank) + " of size " +
                      std::to_string(topo_.size) + " is not a valid rank");
  }
  if (topo_.size > 1) {
    if (!store) throw ConfigError("Bootstrap: a multi-rank job needs a store (got none)");
    store_ = std::move(store);
    if (topo_.secret.empty()) {
      if (topo_.rank == 0) store_->set(prefix_ + "secret", net::generate_secret());
      topo_.secret = store_->get(prefix_ + "secret");
    }
  }
  topo_.store.reset();
  topo_.host_store = false;
  topo_.peers.clear();
  derive_hosts();
}

KOLO_IMPL_INLINE std::vector<std::string> Bootstrap::allgather(const std::string& name,
                                                               const std::string& mine) {
  if (topo_.size == 1) return {mine};
  const std::string base = prefix_ + name + "/";
  store_->set(base + std::to_string(topo_.rank), mine);
  std::vector<std::string> out(static_cast<std::size_t>(topo_.size));
  for (int r = 0; r < topo_.size; ++r) {
    try {
      out[static_cast<std::size_t>(r)] =
          r == topo_.rank ? mine : store_->get(base + std::to_string(r));
    } catch (const TimeoutError& e) {
      throw TimeoutError(missing_ranks(base, name, r) + e.what());
    }
  }
  return out;
}

KOLO_IMPL_INLINE void Bootstrap::inherit_server(Bootstrap& parent) noexcept {
  if (!server_) server_ = std::move(parent.server_);
}

KOLO_IMPL_INLINE void Bootstrap::barrier(const std::string& name) {
  if (topo_.size == 1) return;
  const std::string key = prefix_ + name + "/count";
  const std::int64_t n = store_->add(key, 1);
  if (n == topo_.size) store_->set(key + "/done", "1");
  store_->get(key + "/done");
}

KOLO_IMPL_INLINE const std::string& Bootstrap::job_token() {
  if (token_.empty()) {
    if (topo_.size == 1) {
      token_ = net::generate_secret().substr(0, 16);
    } else {
      if (topo_.rank == 0) store_->set(prefix_ + "token", net::generate_secret().substr(0, 16));
      token_ = store_->get(prefix_ + "token");
    }
  }
  return token_;
}

KOLO_IMPL_INLINE void Bootstrap::derive_hosts() {
  if (store_) {
    if (const auto addr = store_->address()) store_ip_ = net::route_ip_to(addr->host, addr->port);
  }
  host_keys_ = allgather("hostkey", topo_.host_key);
  std::map<std::string, int> host_index;  // host key -> cross rank, in order of first rank
  std::vector<std::string> hosts;
  for (const auto& k : host_keys_) {
    if (host_index.emplace(k, static_cast<int>(hosts.size())).second) hosts.push_back(k);
  }
  int local_rank = 0;
  int local_size = 0;
  for (int r = 0; r < topo_.size; ++r) {
    if (host_keys_[static_cast<std::size_t>(r)] != topo_.host_key) continue;
    if (r < topo_.rank) ++local_rank;
    ++local_size;
  }
  const int cross_rank = host_index[topo_.host_key];
  const int cross_size = static_cast<int>(hosts.size());
  // The launcher's values win when given; they must agree with the host keys.
  auto check = [](const char* what, int given, int derived) {
    if (given >= 0 && given != derived) {
      throw ConfigError(std::string(what) + "=" + std::to_string(given) +
                        " disagrees with the host layout seen through the store (" +
                        std::to_string(derived) + "): ranks on one host must share KOLO_HOST_KEY");
    }
  };
  check("KOLO_LOCAL_SIZE", topo_.local_size, local_size);
  check("KOLO_CROSS_SIZE", topo_.cross_size, cross_size);
  if (topo_.local_rank < 0) topo_.local_rank = local_rank;
  if (topo_.local_size < 0) topo_.local_size = local_size;
  if (topo_.cross_rank < 0) topo_.cross_rank = cross_rank;
  if (topo_.cross_size < 0) topo_.cross_size = cross_size;
}

KOLO_IMPL_INLINE std::string Bootstrap::missing_ranks(const std::string& base,
                                                      const std::string& name, int awaited) {
  std::string ranks;
  int count = 0;
  for (int r = 0; r < topo_.size; ++r) {
    if (r == topo_.rank) continue;
    bool missing = r == awaited;
    if (r != awaited) {
      try {
        missing = !store_->try_get(base + std::to_string(r));
      } catch (const Error&) {
        ranks = std::to_string(awaited);
        count = 1;
        break;
      }
    }
    if (missing) {
      if (count++ > 0) ranks += ", ";
      ranks += std::to_string(r);
    }
  }
  return std::string(count == 1 ? "rank " : "ranks ") + ranks + " (of " +
         std::to_string(topo_.size) + ") did not reach the rendezvous ('" + name +
         "') in time: not started, slow to start, or failed before creating the "
         "communicator; ";
}

KOLO_IMPL_INLINE Bootstrap::~Bootstrap() = default;
KOLO_IMPL_INLINE Bootstrap::Bootstrap(Bootstrap&&) noexcept = default;
KOLO_IMPL_INLINE Bootstrap& Bootstrap::operator=(Bootstrap&&) noexcept = default;

}  // namespace kolo
