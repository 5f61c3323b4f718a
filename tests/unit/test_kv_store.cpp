// The store interface: PrefixStore, Bootstrap over a store it did not create (what a framework
// such as PyTorch hands kolo), and a Communicator built on it — ranks as threads of this process
// sharing one in-memory store.
#include <doctest/doctest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kolo/communicator.hpp"
#include "kolo/topology/bootstrap.hpp"
#include "kolo/topology/kv_store.hpp"

namespace {

// A KvStore in memory, for ranks that are threads; get/wait give up after `timeout`.
class MemoryStore final : public kolo::KvStore {
 public:
  explicit MemoryStore(double timeout = 10.0) : timeout_(timeout) {}

  void set(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    map_[key] = value;
    ++sets_;
    cv_.notify_all();
  }
  std::string get(const std::string& key) override {
    wait({key});
    std::lock_guard<std::mutex> lock(mu_);
    return map_.at(key);
  }
  std::optional<std::string> try_get(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = map_.find(key);
    if (it == map_.end()) return std::nullopt;
    return it->second;
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::int64_t v = 0;
    if (const auto it = map_.find(key); it != map_.end()) v = std::stoll(it->second);
    v += delta;
    map_[key] = std::to_string(v);
    cv_.notify_all();
    return v;
  }
  void wait(const std::vector<std::string>& keys) override {
    std::unique_lock<std::mutex> lock(mu_);
    const auto all = [&] {
      for (const auto& k : keys) {
        if (!map_.count(k)) return false;
      }
      return true;
    };
    if (!cv_.wait_for(lock, std::chrono::duration<double>(timeout_), all)) {
      throw kolo::TimeoutError("memory store: wait timed out for " + keys.front());
    }
  }
  std::string describe() const override { return "memory store"; }

  std::vector<std::string> keys() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> out;
    for (const auto& [k, v] : map_) out.push_back(k);
    return out;
  }

 private:
  double timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> map_;
  int sets_ = 0;
};

}  // namespace

TEST_CASE("PrefixStore puts every key under its prefix") {
  auto mem = std::make_shared<MemoryStore>(0.2);
  kolo::PrefixStore a(mem, "a/");
  kolo::PrefixStore b(mem, "b/");
  a.set("k", "1");
  b.set("k", "2");
  CHECK(a.get("k") == "1");
  CHECK(b.get("k") == "2");
  CHECK(mem->get("a/k") == "1");
  CHECK(a.add("n", 5) == 5);
  CHECK(a.add("n", -2) == 3);
  CHECK(!b.try_get("n"));
  CHECK(*a.try_get("n") == "3");
  a.wait({"k", "n"});
  CHECK_THROWS_AS(b.wait({"k", "n"}), kolo::TimeoutError);
  CHECK(!a.address());
  CHECK(a.describe() == "memory store");
}

TEST_CASE("Bootstrap over a given store: host layout and a secret drawn by rank 0") {
  auto mem = std::make_shared<MemoryStore>();
  constexpr int n = 3;
  std::vector<std::unique_ptr<kolo::Bootstrap>> boots(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      kolo::Topology t;
      t.rank = r;
      t.size = n;
      t.host_key = r < 2 ? "hostA" : "hostB";
      boots[static_cast<std::size_t>(r)] = std::make_unique<kolo::Bootstrap>(t, mem, "job/1/");
    });
  }
  for (auto& t : threads) t.join();
  const std::string secret = boots[0]->topology().secret;
  CHECK(secret.size() >= 16);
  for (int r = 0; r < n; ++r) {
    const auto& topo = boots[static_cast<std::size_t>(r)]->topology();
    CHECK(topo.secret == secret);
    CHECK(topo.local_size == (r < 2 ? 2 : 1));
    CHECK(topo.local_rank == (r == 1 ? 1 : 0));
    CHECK(topo.cross_size == 2);
    CHECK(topo.cross_rank == (r < 2 ? 0 : 1));
    // No TCP address for a memory store: ranks advertise loopback (or KOLO_ADDR).
    CHECK(boots[static_cast<std::size_t>(r)]->advertised_ip() == "127.0.0.1");
  }
  for (const auto& k : mem->keys()) CHECK(k.rfind("job/1/", 0) == 0);
}

TEST_CASE("Bootstrap over a given store rejects a bad rank and a missing store") {
  kolo::Topology t;
  t.rank = 3;
  t.size = 2;
  CHECK_THROWS_AS(kolo::Bootstrap(t, std::make_shared<MemoryStore>(), "p/"), kolo::ConfigError);
  t.rank = 1;
  CHECK_THROWS_AS(kolo::Bootstrap(t, nullptr, "p/"), kolo::ConfigError);
  CHECK_THROWS_AS(kolo::Topology::for_rank(2, 2), kolo::ConfigError);
}

TEST_CASE("Communicator over a given store: ranks as threads, two communicators by prefix") {
  auto mem = std::make_shared<MemoryStore>();
  constexpr int n = 3;
  std::vector<std::vector<float>> results(n);
  std::vector<std::vector<float>> results2(n);
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        const kolo::Topology topo = kolo::Topology::for_rank(r, n);
        kolo::Communicator<> a(topo, mem, "comm/a/");
        kolo::Communicator<> b(topo, mem, "comm/b/");
        std::vector<float> x(1000, static_cast<float>(r + 1));
        a.allreduce(std::span<float>(x), kolo::ReduceOp::sum);
        results[static_cast<std::size_t>(r)] = x;
        std::vector<float> y(7, static_cast<float>(10 * r));
        b.allreduce(std::span<float>(y), kolo::ReduceOp::max);
        results2[static_cast<std::size_t>(r)] = y;
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r << ": " << errors[static_cast<std::size_t>(r)]);
    CHECK(errors[static_cast<std::size_t>(r)].empty());
    CHECK(results[static_cast<std::size_t>(r)] == std::vector<float>(1000, 6.0f));
    CHECK(results2[static_cast<std::size_t>(r)] == std::vector<float>(7, 20.0f));
  }
}
