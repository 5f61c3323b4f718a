// kolo/communicator/watched_store.hpp — WatchedStore: the rendezvous store as a communicator
// being built by shrink or grow sees it (communicator/fault.hpp, communicator/grow.hpp), its
// waits cut into slices between which a check may end them.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

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

}  // namespace kolo::detail
