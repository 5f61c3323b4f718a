// kolo/topology/bootstrap.hpp — from the environment contract to a connected control plane.
//
// Bootstrap reads the Topology, connects to the rendezvous store (hosting it on rank 0 when the
// launcher does not: torchrun's MASTER_ADDR/PORT and KOLO_PEERS), and derives local and cross
// ranks by host key when the launcher did not export them. Transports use it to exchange their
// addresses; after that the store is idle. Each Bootstrap in a process gets its own key prefix
// in creation order, so ranks that create communicators in the same order (the rule for every
// collective call) agree on it without talking.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kolo/core/error.hpp"
#include "kolo/net/auth.hpp"
#include "kolo/topology/kv_store.hpp"
#include "kolo/topology/store.hpp"
#include "kolo/topology/topology.hpp"

namespace kolo {

class Bootstrap {
 public:
  explicit Bootstrap(Topology topo) : topo_(std::move(topo)) {
    static std::atomic<int> counter{0};
    prefix_ = "kolo/" + std::to_string(counter.fetch_add(1)) + "/";
    if (topo_.size > 1) {
      if (!topo_.store) throw ConfigError("no rendezvous store address for a multi-rank job");
      if (topo_.host_store && topo_.rank == 0) {
        // Rank 0 serves the store, on the inherited listening socket when the launcher gave one
        // (KOLO_LISTEN_FD with KOLO_PEERS: no bind race), else on the advertised port.
        if (topo_.listen_fd >= 0 && !topo_.peers.empty()) {
          server_ = std::make_unique<StoreServer>(net::Socket(topo_.listen_fd), topo_.secret);
          topo_.listen_fd = -1;  // consumed by the store
        } else {
          try {
            server_ = StoreServer::listen("0.0.0.0", topo_.store->port, topo_.secret);
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
      store_ = std::make_shared<StoreClient>(*topo_.store, topo_.secret, topo_.rank,
                                             topo_.timeout_seconds);
    }
    derive_hosts();
  }

  // Rendezvous through a store that exists already — a framework's own (PyTorch's c10d store
  // through kolo_torch, any KvStore): no KOLO_STORE, no store server. topo.rank and topo.size
  // must be set; topo.store/host_store/peers are ignored. `prefix` namespaces this Bootstrap's
  // keys inside the store: ranks that build one communicator together pass the same prefix,
  // different communicators different ones. Without a secret (KOLO_SECRET), rank 0 draws the
  // job secret and publishes it through the store: the TCP connections of the job are then
  // exactly as private as the store itself.
  Bootstrap(Topology topo, std::shared_ptr<KvStore> store, std::string prefix)
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

  static Bootstrap from_env() { return Bootstrap(Topology::from_env()); }

  const Topology& topology() const { return topo_; }
  int rank() const { return topo_.rank; }
  int size() const { return topo_.size; }
  const std::vector<std::string>& host_keys() const { return host_keys_; }
  bool same_host(int peer) const { return host_keys_[peer] == host_keys_[topo_.rank]; }
  // The rendezvous store (nullptr for a single rank); keys under prefix() are this Bootstrap's.
  KvStore* store() { return store_.get(); }
  // The same store, shared (Communicator::split builds its children's Bootstraps on it).
  std::shared_ptr<KvStore> shared_store() const { return store_; }
  const std::string& prefix() const { return prefix_; }

  // Every rank contributes `mine`; returns all contributions in rank order.
  std::vector<std::string> allgather(const std::string& name, const std::string& mine) {
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

  // All ranks reach this point before any leaves (through the store: for setup only).
  void barrier(const std::string& name) {
    if (topo_.size == 1) return;
    const std::string key = prefix_ + name + "/count";
    const std::int64_t n = store_->add(key, 1);
    if (n == topo_.size) store_->set(key + "/done", "1");
    store_->get(key + "/done");
  }

  // The local-socket address other ranks should use to reach this rank: the interface through
  // which this rank reaches the store (what Gloo and torch.distributed do), loopback otherwise.
  std::string advertised_ip() const {
    if (auto ip = topo_.advertise_ip; !ip.empty()) return ip;
    return store_ip_.empty() ? std::string("127.0.0.1") : store_ip_;
  }

  // A random token shared by all ranks (names of shared-memory objects).
  const std::string& job_token() {
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

 private:
  void derive_hosts() {
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
                          std::to_string(derived) +
                          "): ranks on one host must share KOLO_HOST_KEY");
      }
    };
    check("KOLO_LOCAL_SIZE", topo_.local_size, local_size);
    check("KOLO_CROSS_SIZE", topo_.cross_size, cross_size);
    if (topo_.local_rank < 0) topo_.local_rank = local_rank;
    if (topo_.local_size < 0) topo_.local_size = local_size;
    if (topo_.cross_rank < 0) topo_.cross_rank = cross_rank;
    if (topo_.cross_size < 0) topo_.cross_size = cross_size;
  }

  // After a timed-out allgather: "rank 2 (of 4) did not reach ..." naming every rank whose
  // contribution is still missing, not only `awaited`, the one this rank was waiting for. When
  // the store cannot tell (it went away with rank 0), only `awaited` is named.
  std::string missing_ranks(const std::string& base, const std::string& name, int awaited) {
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

  Topology topo_;
  std::string prefix_;
  std::unique_ptr<StoreServer> server_;
  std::shared_ptr<KvStore> store_;
  std::vector<std::string> host_keys_;
  std::string store_ip_;
  std::string token_;
};

}  // namespace kolo
