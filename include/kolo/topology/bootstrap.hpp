// kolo/topology/bootstrap.hpp — from the environment contract to a connected control plane.
//
// Bootstrap reads the Topology, connects to the rendezvous store (hosting it on rank 0 when the
// launcher does not: torchrun's MASTER_ADDR/PORT and KOLO_PEERS), and derives local and cross
// ranks by host key when the launcher did not export them. Transports use it to exchange their
// addresses; after that the store is idle. Each Bootstrap in a process gets its own key prefix
// in creation order, so ranks that create communicators in the same order (the rule for every
// collective call) agree on it without talking.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kolo/core/compiled_core.hpp"
#include "kolo/core/error.hpp"
#include "kolo/topology/kv_store.hpp"
#include "kolo/topology/topology.hpp"

namespace kolo {

class StoreServer;  // topology/store.hpp

class Bootstrap {
 public:
  explicit Bootstrap(Topology topo);

  // Rendezvous through a store that exists already — a framework's own (PyTorch's c10d store
  // through kolo_torch, any KvStore): no KOLO_STORE, no store server. topo.rank and topo.size
  // must be set; topo.store/host_store/peers are ignored. `prefix` namespaces this Bootstrap's
  // keys inside the store: ranks that build one communicator together pass the same prefix,
  // different communicators different ones. Without a secret (KOLO_SECRET), rank 0 draws the
  // job secret and publishes it through the store: the TCP connections of the job are then
  // exactly as private as the store itself.
  Bootstrap(Topology topo, std::shared_ptr<KvStore> store, std::string prefix);

  // Out of line: the store server is an incomplete type here.
  ~Bootstrap();
  Bootstrap(Bootstrap&&) noexcept;
  Bootstrap& operator=(Bootstrap&&) noexcept;

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
  std::vector<std::string> allgather(const std::string& name, const std::string& mine);

  // All ranks reach this point before any leaves (through the store: for setup only).
  void barrier(const std::string& name);

  // The local-socket address other ranks should use to reach this rank: the interface through
  // which this rank reaches the store (what Gloo and torch.distributed do), loopback otherwise.
  std::string advertised_ip() const {
    if (auto ip = topo_.advertise_ip; !ip.empty()) return ip;
    return store_ip_.empty() ? std::string("127.0.0.1") : store_ip_;
  }

  // A random token shared by all ranks (names of shared-memory objects).
  const std::string& job_token();

  // Takes over the store server `parent` hosts, if it hosts one (rank 0 under MASTER_ADDR or
  // KOLO_PEERS): a communicator built to replace its parent (Communicator::shrink) keeps the
  // store alive after the parent is destroyed. Nothing when this Bootstrap hosts one already.
  void inherit_server(Bootstrap& parent) noexcept;
  // Whether this rank hosts the rendezvous store (its loss would end the job's store).
  bool hosts_store() const noexcept { return server_ != nullptr; }

 private:
  void derive_hosts();

  // After a timed-out allgather: "rank 2 (of 4) did not reach ..." naming every rank whose
  // contribution is still missing, not only `awaited`, the one this rank was waiting for. When
  // the store cannot tell (it went away with rank 0), only `awaited` is named.
  std::string missing_ranks(const std::string& base, const std::string& name, int awaited);

  Topology topo_;
  std::string prefix_;
  std::unique_ptr<StoreServer> server_;
  std::shared_ptr<KvStore> store_;
  std::vector<std::string> host_keys_;
  std::string store_ip_;
  std::string token_;
};

}  // namespace kolo

// Header-only: the definitions, inline (compiled core: in the library, src/lib/core_impl.cpp).
#if !KOLO_USE_COMPILED_CORE
#include "kolo/topology/detail/bootstrap_impl.hpp"
#endif
