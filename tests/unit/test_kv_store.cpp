// The store interface: KvStore's defaults (compare_set refuses, wait_for polls, erase does
// nothing), PrefixStore, Bootstrap over a store it did not create (what a framework
// such as PyTorch hands kolo), and a Communicator built on it — ranks as threads of this process
// sharing one in-memory store.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
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
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override {
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = map_.find(key);
    if (it == map_.end()) {
      if (!expected.empty()) return expected;  // torch's answer for an absent key
      map_[key] = desired;
      cv_.notify_all();
      return desired;
    }
    if (it->second == expected) {
      it->second = desired;
      cv_.notify_all();
    }
    return it->second;
  }
  bool wait_for(const std::vector<std::string>& keys, double seconds) override {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(std::max(seconds, 0.0)), [&] {
      for (const auto& k : keys) {
        if (!map_.count(k)) return false;
      }
      return true;
    });
  }
  void erase(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    map_.erase(key);
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

// Only what rendezvous needs: KvStore's defaults provide the rest.
class MinimalStore final : public kolo::KvStore {
 public:
  void set(const std::string& key, const std::string& value) override {
    std::lock_guard<std::mutex> lock(mu_);
    map_[key] = value;
  }
  std::string get(const std::string& key) override { return try_get(key).value(); }
  std::optional<std::string> try_get(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++lookups_;
    const auto it = map_.find(key);
    if (it == map_.end()) return std::nullopt;
    return it->second;
  }
  std::int64_t add(const std::string&, std::int64_t) override { return 0; }
  void wait(const std::vector<std::string>&) override {}
  std::string describe() const override { return "minimal store"; }

  int lookups() {
    std::lock_guard<std::mutex> lock(mu_);
    return lookups_;
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::string> map_;
  int lookups_ = 0;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE(
    "KvStore defaults: compare_set refuses naming the store, wait_for polls, erase is a no-op") {
  MinimalStore s;
  std::string msg;
  try {
    s.compare_set("k", "", "v");
  } catch (const kolo::ConfigError& e) {
    msg = e.what();
  }
  CHECK(msg.find("minimal store") != std::string::npos);
  CHECK(msg.find("compare-and-set") != std::string::npos);
  CHECK(msg.find("shrink/grow") != std::string::npos);
  CHECK(!s.try_get("k"));  // the refusal stored nothing

  s.set("a", "1");
  CHECK(s.wait_for({"a"}, 0.0));
  CHECK(s.wait_for({}, 0.0));
  CHECK_FALSE(s.wait_for({"a", "b"}, 0.0));  // <= 0: one check, no waiting

  // Expiry: false after about the given time, polling (every 2 ms), not spinning.
  const int before = s.lookups();
  auto t0 = std::chrono::steady_clock::now();
  CHECK_FALSE(s.wait_for({"a", "b"}, 0.2));
  double took = seconds_since(t0);
  CHECK(took >= 0.2);
  CHECK(took < 2.0);
  const int polls = s.lookups() - before;
  CHECK(polls >= 2);
  CHECK(polls <= 0.2 / 0.002 + 10);  // at most one pass per 2 ms sleep (+ the first, + "a" once)

  // A key set meanwhile ends the wait early.
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    s.set("b", "2");
  });
  t0 = std::chrono::steady_clock::now();
  CHECK(s.wait_for({"a", "b"}, 10.0));
  took = seconds_since(t0);
  setter.join();
  CHECK(took >= 0.04);
  CHECK(took < 5.0);

  s.erase("a");  // best effort: the default keeps the key
  CHECK(s.try_get("a") == std::optional<std::string>("1"));
}

TEST_CASE("PrefixStore forwards compare_set, wait_for and erase under its prefix") {
  auto mem = std::make_shared<MemoryStore>(0.2);
  kolo::PrefixStore a(mem, "a/");
  kolo::PrefixStore b(mem, "b/");
  CHECK(a.compare_set("d", "", "1,3") == "1,3");  // absent, expected empty: wins
  CHECK(a.compare_set("d", "", "2") == "1,3");    // loses, learns the winner
  CHECK(b.compare_set("d", "", "2") == "2");      // another namespace: its own register
  CHECK(a.compare_set("d", "1,3", "4") == "4");   // matching expected: replaced
  CHECK(a.compare_set("nope", "x", "y") == "x");  // absent, expected non-empty: torch's answer
  CHECK(!a.try_get("nope"));
  CHECK(mem->try_get("a/d") == std::optional<std::string>("4"));
  CHECK(mem->try_get("b/d") == std::optional<std::string>("2"));
  CHECK(!mem->try_get("d"));

  CHECK(a.wait_for({"d"}, 0.0));
  CHECK_FALSE(a.wait_for({"d", "e"}, 0.05));
  mem->set("a/e", "here");
  CHECK(a.wait_for({"d", "e"}, 0.05));
  CHECK_FALSE(b.wait_for({"e"}, 0.0));

  a.erase("d");
  CHECK(!a.try_get("d"));
  CHECK(!mem->try_get("a/d"));
  CHECK(b.try_get("d") == std::optional<std::string>("2"));  // only under a's prefix
}

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
