// gloo_kolo_store.hpp — a gloo::rendezvous::Store on top of kolo::KvStore (kolo's store client).
//
// So Gloo rendezvouses through the store that kolo-run already hosts (KOLO_STORE, authenticated
// with KOLO_SECRET): Gloo runs under the same launcher as kolo, with no Redis or shared file
// system. Keys get a prefix so that Gloo's ("rank_0", …) cannot collide with kolo's own.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>
#include <kolo/topology/kv_store.hpp>

namespace kolo::bench {

class KoloGlooStore final : public gloo::rendezvous::Store {
 public:
  KoloGlooStore(KvStore& client, std::string prefix)
      : client_(client), prefix_(std::move(prefix)) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    client_.set(prefix_ + key, std::string(data.begin(), data.end()));
  }

  // kolo's get already blocks until the key exists (bounded by KOLO_TIMEOUT_SECONDS).
  std::vector<char> get(const std::string& key) override {
    const std::string v = client_.get(prefix_ + key);
    return {v.begin(), v.end()};
  }

  void wait(const std::vector<std::string>& keys) override { client_.wait(prefixed(keys)); }

  // The deadline is the StoreClient's own (KOLO_TIMEOUT_SECONDS): one timeout for the job.
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override {
    client_.wait(prefixed(keys));
  }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& k : keys) out.push_back(prefix_ + k);
    return out;
  }

  KvStore& client_;
  std::string prefix_;
};

}  // namespace kolo::bench
