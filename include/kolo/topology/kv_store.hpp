// kolo/topology/kv_store.hpp — the store interface behind kolo's rendezvous.
//
// Bootstrap needs five things of a key-value store: set, a get that waits for the key, a get that
// does not, an atomic add, and a wait for several keys. kolo's own TCP store client
// (StoreClient, store.hpp) is one implementation; a framework's store (PyTorch's c10d::Store, a
// Ray or etcd client) is another, so a framework that already rendezvoused can hand its store
// to kolo instead of running a second one. PrefixStore gives one store many namespaces.
//
// Survivors of a lost rank agree through the store too (Communicator::shrink/grow): a
// compare-and-set makes a write-once decision register, wait_for waits within their own deadline,
// erase tidies up. Those three have defaults, so a store written for rendezvous alone still
// compiles: compare_set then refuses (ConfigError), wait_for polls try_get, erase does nothing.
//
// Contract for implementations:
//  - set/add/compare_set are visible to every rank's later get/try_get/wait once they return;
//  - compare_set is atomic with respect to every other call on the same key;
//  - get and wait block until the keys exist or the store's own deadline passes, then throw
//    kolo::TimeoutError naming the missing key(s) (a framework adapter translates its
//    exception into kolo's error types: TimeoutError, PeerLostError when the store is gone,
//    Error otherwise);
//  - values are binary-safe strings;
//  - calls may come from several threads (one at a time is enough: Bootstrap serialises).
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kolo/core/error.hpp"
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

  // Atomic compare-and-set, with torch's c10d::Store::compareSet semantics:
  //  - key absent, `expected` empty: sets `desired`, returns `desired`;
  //  - key present and equal to `expected`: sets `desired`, returns `desired`;
  //  - key present and different: changes nothing, returns the value it holds;
  //  - key absent, `expected` non-empty: changes nothing and returns `expected` (torch's answer,
  //    kept so that every store answers alike: the return value does not tell absence).
  // So compare_set(k, "", d) is a write-once register: the caller won exactly when the result
  // is `d` (and every caller learns the same winning value). Keys and values are binary-safe.
  // Default: ConfigError naming the store (only stores that implement it can decide).
  virtual std::string compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) {
    (void)key;
    (void)expected;
    (void)desired;
    throw ConfigError(describe() +
                      " cannot compare-and-set: shrink/grow need kolo's store or torch's");
  }
  // Waits until every key exists, at most `seconds` (<= 0 or NaN: checks once); true
  // when all exist, false when the time ran out first — expiry is an answer here, not an error
  // (a lost store still throws, as every call does). The store's own deadline does not apply.
  // Default: polls try_get every 2 ms (sleeping between passes), remembering the keys already
  // seen, so a key erased during the wait still counts as seen.
  virtual bool wait_for(const std::vector<std::string>& keys, double seconds) {
    using clock = std::chrono::steady_clock;
    // NaN: one check; beyond ~115 days: ~115 days (keeps the deadline arithmetic finite).
    const double limit = std::isnan(seconds) ? 0.0 : std::min(seconds, 1e7);
    const auto deadline = clock::now() + std::chrono::duration_cast<clock::duration>(
                                             std::chrono::duration<double>(std::max(limit, 0.0)));
    std::vector<std::string> missing(keys);
    for (;;) {
      std::erase_if(missing, [&](const std::string& k) { return try_get(k).has_value(); });
      if (missing.empty()) return true;
      if (clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  // Removes key if it exists (erasing a missing key is not an error). Best effort: the default
  // does nothing, so callers use it only to tidy up, never for correctness.
  virtual void erase(const std::string& key) { (void)key; }

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
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override {
    return inner_->compare_set(prefix_ + key, expected, desired);
  }
  bool wait_for(const std::vector<std::string>& keys, double seconds) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& k : keys) full.push_back(prefix_ + k);
    return inner_->wait_for(full, seconds);
  }
  void erase(const std::string& key) override { inner_->erase(prefix_ + key); }
  std::optional<net::HostPort> address() const override { return inner_->address(); }
  std::string describe() const override { return inner_->describe(); }

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<KvStore>& inner() const { return inner_; }

 private:
  std::shared_ptr<KvStore> inner_;
  std::string prefix_;
};

}  // namespace kolo
