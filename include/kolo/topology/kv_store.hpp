// kolo/topology/kv_store.hpp — the store interface behind kolo's rendezvous.
//
// Bootstrap needs five things of a key-value store: set, a get that waits for the key, a get that
// does not, an atomic add, and a wait for several keys. kolo's own TCP store client
// (StoreClient, store.hpp) is one implementation; a framework's store (PyTorch's c10d::Store, a
// Ray or etcd client) is another, so a framework that already rendezvoused can hand its store
// to kolo instead of running a second one. PrefixStore gives one store many namespaces.
//
// Contract for implementations:
//  - set/add are visible to every rank's later get/try_get/wait once they return;
//  - get and wait block until the keys exist or the store's own deadline passes, then throw
//    kolo::TimeoutError naming the missing key(s) (a framework adapter translates its
//    exception into kolo's error types: TimeoutError, PeerLostError when the store is gone,
//    Error otherwise);
//  - values are binary-safe strings;
//  - calls may come from several threads (one at a time is enough: Bootstrap serialises).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kolo/net/socket.hpp"

namespace kolo {

class KvStore {
 public:
  virtual ~KvStore() = default;

  // Stores value under key (replacing any earlier value).
  virtual void set(const std::string& key, const std::string& value) = 0;
  // The key's value; waits until the key exists (TimeoutError after the store's deadline).
  virtual std::string get(const std::string& key) = 0;
  // The key's value if it exists now; never waits.
  virtual std::optional<std::string> try_get(const std::string& key) = 0;
  // Adds delta to the integer under key (a missing key counts as 0); returns the new value.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
  // Waits until every key exists (TimeoutError naming the missing ones).
  virtual void wait(const std::vector<std::string>& keys) = 0;
  // The TCP address of the store, when it has one: ranks advertise the local address through
  // which they reach it (the interface the other ranks can reach too). nullopt for stores
  // without one (a file store): then ranks advertise KOLO_ADDR, or loopback.
  virtual std::optional<net::HostPort> address() const { return std::nullopt; }
  // Words for error messages ("store 10.0.0.1:29500", "c10d TCPStore").
  virtual std::string describe() const { return "store"; }
};

// Every key of `inner` seen under `prefix`: PrefixStore(s, "job/7/").set("a", v) sets "job/7/a".
class PrefixStore final : public KvStore {
 public:
  PrefixStore(std::shared_ptr<KvStore> inner, std::string prefix)
      : inner_(std::move(inner)), prefix_(std::move(prefix)) {}

  void set(const std::string& key, const std::string& value) override {
    inner_->set(prefix_ + key, value);
  }
  std::string get(const std::string& key) override { return inner_->get(prefix_ + key); }
  std::optional<std::string> try_get(const std::string& key) override {
    return inner_->try_get(prefix_ + key);
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    return inner_->add(prefix_ + key, delta);
  }
  void wait(const std::vector<std::string>& keys) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& k : keys) full.push_back(prefix_ + k);
    inner_->wait(full);
  }
  std::optional<net::HostPort> address() const override { return inner_->address(); }
  std::string describe() const override { return inner_->describe(); }

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<KvStore>& inner() const { return inner_; }

 private:
  std::shared_ptr<KvStore> inner_;
  std::string prefix_;
};

}  // namespace kolo
