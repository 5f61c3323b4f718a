// kolo/communicator/watched_store.hpp — what shrink and grow (communicator/fault.hpp,
// communicator/grow.hpp) build their new communicator with: WatchedStore, the rendezvous store
// whose waits are cut into slices between which a check may end them, and the commit barrier
// after the build.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kolo/core/error.hpp"
#include "kolo/topology/kv_store.hpp"

namespace kolo::detail {

// The store as a shrink's or grow's new communicator sees it while it is being built: every wait is
// cut into 5 ms slices, between which `check` may end it (a member died, another member's build
// failed, the shrink's time is up) instead of the wait running to the store's own deadline.
// Disarmed once the build is over: from then on it only forwards.
class WatchedStore final : public KvStore {
 public:
  WatchedStore(std::shared_ptr<KvStore> inner, std::function<void()> check)
      : inner_(std::move(inner)), check_(std::move(check)) {}
  void disarm() { check_ = nullptr; }

  void set(const std::string& key, const std::string& value) override { inner_->set(key, value); }
  std::string get(const std::string& key) override {
    if (!check_) return inner_->get(key);
    for (;;) {
      if (auto v = inner_->try_get(key)) return *v;
      check_();
      inner_->wait_for({key}, 0.005);
    }
  }
  std::optional<std::string> try_get(const std::string& key) override {
    return inner_->try_get(key);
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    return inner_->add(key, delta);
  }
  void wait(const std::vector<std::string>& keys) override {
    if (!check_) return inner_->wait(keys);
    while (!inner_->wait_for(keys, 0.005)) check_();
  }
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override {
    return inner_->compare_set(key, expected, desired);
  }
  bool wait_for(const std::vector<std::string>& keys, double seconds) override {
    return inner_->wait_for(keys, seconds);
  }
  void erase(const std::string& key) override { inner_->erase(key); }
  std::optional<net::HostPort> address() const override { return inner_->address(); }
  std::string describe() const override { return inner_->describe(); }

 private:
  std::shared_ptr<KvStore> inner_;
  std::function<void()> check_;
};

// The commit barrier after a new communicator's build: this rank writes base/built/<rank>, then
// waits for every rank's, or for `check` to throw (a member died, another's build failed, the
// time is up). Every member built, or none returns: a rank whose check throws first looks once
// more, because the built/* keys stay — if they are all there, the others may have returned.
inline void commit_barrier(KvStore& st, const std::string& base, int rank, int size,
                           const std::function<void()>& check) {
  st.set(base + "built/" + std::to_string(rank), "1");
  std::vector<std::string> built;
  for (int j = 0; j < size; ++j) built.push_back(base + "built/" + std::to_string(j));
  while (!st.wait_for(built, 0.005)) {
    try {
      check();
    } catch (const Error&) {
      if (st.wait_for(built, 0)) return;
      throw;
    }
  }
}

}  // namespace kolo::detail
