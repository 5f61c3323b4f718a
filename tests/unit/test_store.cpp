// Tests of the rendezvous store over real sockets on 127.0.0.1, with threads as clients. Short
// timeouts (0.5 s) keep the timeout cases fast; everything else uses generous ones so a loaded
// 2-core machine does not turn into flaky failures.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kolo/topology/store.hpp"

namespace {

using kolo::Clock;
using kolo::Deadline;
using kolo::StoreClient;
using kolo::StoreServer;
namespace net = kolo::net;
namespace sd = kolo::store_detail;
using namespace std::chrono_literals;

const std::string kSecret = "store-test-secret-0123456789abcdef";

std::unique_ptr<StoreServer> start_server() {
  return StoreServer::listen("127.0.0.1", 0, kSecret);
}

net::HostPort addr_of(const StoreServer& s) {
  return net::HostPort{"127.0.0.1", s.port()};
}

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The message of the E that f throws, or "" if it returns (another exception fails the test).
template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

// A plain TCP connection: a stranger, or (after raw_authenticated) a client speaking raw frames.
net::Socket raw_connect(std::uint16_t port) {
  return net::connect_tcp("127.0.0.1", port, Deadline::after(5.0), "test store");
}

net::Socket raw_authenticated(std::uint16_t port, std::uint32_t purpose = net::kPurposeStore) {
  net::Socket s = raw_connect(port);
  net::authenticate_client(s.fd(), kSecret, net::Hello{purpose, -1, 0}, Deadline::after(5.0),
                           "test store");
  return s;
}

// True if the server closes (EOF or reset) the connection within `seconds`; drains what it sent.
bool closed_by_peer(int fd, double seconds) {
  const Deadline dl = Deadline::after(seconds);
  char buf[4096];
  for (;;) {
    if (net::poll_one(fd, POLLIN, dl) == 0) return false;
    const ssize_t k = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (k == 0) return true;
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
  }
}

void send_raw(int fd, const std::string& bytes) {
  net::send_all(fd, bytes.data(), bytes.size(), Deadline::after(5.0), "test store");
}

struct RawReply {
  std::uint8_t status = 255;
  std::string body;
};

RawReply read_reply(int fd, double seconds = 5.0) {
  const Deadline dl = Deadline::after(seconds);
  char head[4];
  net::recv_all(fd, head, sizeof(head), dl, "test store");
  std::string body(sd::load_u32(head), '\0');
  net::recv_all(fd, body.data(), body.size(), dl, "test store");
  RawReply r;
  r.status = static_cast<std::uint8_t>(body.at(0));
  r.body = body.substr(1);
  return r;
}

std::string set_frame(const std::string& key, const std::string& value) {
  std::string f;
  sd::FrameWriter(f, sd::kSet).str(key).raw(value).finish();
  return f;
}

std::string get_frame(const std::string& key, std::uint64_t wait_ms) {
  std::string f;
  sd::FrameWriter(f, sd::kGet).u64(wait_ms).str(key).finish();
  return f;
}

}  // namespace

TEST_CASE("store: set and get round-trip binary-safe values") {
  auto server = start_server();
  const auto addr = addr_of(*server);
  StoreClient c(addr, kSecret, 0, 5.0);
  CHECK(c.address()->port == server->port());
  CHECK(c.timeout_seconds() == 5.0);

  c.set("a", "1");
  CHECK(c.get("a") == "1");
  c.set("a", "two");  // overwrite
  CHECK(c.get("a") == "two");
  c.set("empty", "");
  CHECK(c.get("empty").empty());

  std::string all_bytes;
  for (int i = 0; i < 256; ++i) all_bytes.push_back(static_cast<char>(i));
  all_bytes += std::string("\0\0x\0", 4);
  const std::string binary_key("k\0\xff", 3);
  c.set(binary_key, all_bytes);
  CHECK(c.get(binary_key) == all_bytes);
  CHECK_FALSE(c.try_get("k").has_value());  // the binary key is not cut at its NUL

  // 8 MiB: many partial sends and receives on both sides, and a reply bigger than a socket
  // buffer queued on the server's output buffer.
  std::string big(std::size_t{8} << 20, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) {
    big[i] = static_cast<char>((i * 2654435761u) >> 13);
  }
  c.set("big", big);
  StoreClient other(addr, kSecret, 1, 5.0);
  CHECK(other.get("big") == big);
  CHECK(other.get("a") == "two");
}

TEST_CASE("store: get blocks until another client sets the key, and wakes every waiter") {
  auto server = start_server();
  const auto addr = addr_of(*server);
  constexpr int kWaiters = 3;
  std::vector<std::string> got(kWaiters);
  std::vector<Clock::time_point> done(kWaiters);
  std::vector<std::thread> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&, i] {
      StoreClient c(addr, kSecret, i, 5.0);
      got[i] = c.get("late");
      done[i] = Clock::now();
    });
  }
  StoreClient setter(addr, kSecret, kWaiters, 5.0);
  std::this_thread::sleep_for(300ms);
  const auto t_set = Clock::now();
  setter.set("late", "value-from-setter");
  for (auto& t : waiters) t.join();
  for (int i = 0; i < kWaiters; ++i) {
    CAPTURE(i);
    CHECK(got[i] == "value-from-setter");  // it waited (the value did not exist before) ...
    // ... and was answered on the set, not at its 5 s timeout (within half of it).
    CHECK(std::chrono::duration<double>(done[i] - t_set).count() < 5.0 / 2);
  }
}

TEST_CASE("store: add is atomic across 8 threads x 1000 increments") {
  auto server = start_server();
  const auto addr = addr_of(*server);
  StoreClient shared(addr, kSecret, 0, 10.0);  // threads 4..7 share it: the client is thread-safe
  constexpr int kThreads = 8;
  constexpr int kIncrements = 1000;
  std::vector<std::vector<std::int64_t>> seen(kThreads);
  std::mutex mu;
  std::vector<std::string> errors;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        std::unique_ptr<StoreClient> own;
        StoreClient* c = &shared;
        if (t < kThreads / 2) {
          own = std::make_unique<StoreClient>(addr, kSecret, t, 10.0);
          c = own.get();
        }
        for (int i = 0; i < kIncrements; ++i) seen[t].push_back(c->add("counter", 1));
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back(e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(errors.empty());

  // Every returned value 1..8000 exactly once: no increment lost or duplicated.
  std::vector<std::int64_t> all;
  for (const auto& v : seen) {
    CHECK(std::is_sorted(v.begin(), v.end()));  // each thread sees its own adds in order
    all.insert(all.end(), v.begin(), v.end());
  }
  std::sort(all.begin(), all.end());
  REQUIRE(all.size() == std::size_t{kThreads * kIncrements});
  bool dense = true;
  for (std::size_t i = 0; i < all.size(); ++i) dense = dense && all[i] == std::int64_t(i) + 1;
  CHECK(dense);
  CHECK(shared.get("counter") == "8000");  // counters are decimal text

  CHECK(shared.add("counter", -8000) == 0);
  CHECK(shared.add("fresh", 5) == 5);  // a missing key counts as 0
  CHECK(shared.add("fresh", -7) == -2);

  shared.set("text", "abc");
  const auto msg = message_of<kolo::Error>([&] { shared.add("text", 1); });
  CHECK(contains(msg, "'text'"));
  CHECK(contains(msg, "not a decimal integer"));
  CHECK(contains(msg, addr.str()));
  shared.set("max", std::to_string(std::numeric_limits<std::int64_t>::max()));
  CHECK(contains(message_of<kolo::Error>([&] { shared.add("max", 1); }), "overflows"));
  CHECK(shared.get("text") == "abc");  // a refused add leaves the connection usable
}

TEST_CASE("store: wait returns once every key exists, check does not wait") {
  auto server = start_server();
  const auto addr = addr_of(*server);
  StoreClient c(addr, kSecret, 0, 5.0);
  CHECK(c.check({}));
  c.wait({});
  CHECK_FALSE(c.check({"w/a", "w/b"}));
  c.set("w/a", "1");
  CHECK(c.check({"w/a"}));
  CHECK_FALSE(c.check({"w/a", "w/b"}));

  std::thread other([&] {
    StoreClient d(addr, kSecret, 1, 5.0);
    std::this_thread::sleep_for(150ms);
    d.set("w/b", "2");  // one of two missing keys: the wait must go on
    std::this_thread::sleep_for(150ms);
    d.add("w/c", 1);  // add creates keys too
  });
  const auto t0 = Clock::now();
  c.wait({"w/a", "w/b", "w/c", "w/a"});
  const double took = since(t0);
  other.join();
  CHECK(took < 5.0 / 2);  // half the client's timeout: woken by the keys, not the deadline
  CHECK(c.check({"w/a", "w/b", "w/c"}));  // right after the wait: it did not return early
  CHECK(c.get("w/c") == "1");
}

TEST_CASE("store: erase and try_get") {
  auto server = start_server();
  const auto addr = addr_of(*server);
  StoreClient c(addr, kSecret, 0, 5.0);
  CHECK_FALSE(c.try_get("e").has_value());
  c.set("e", "v");
  CHECK(c.try_get("e") == std::optional<std::string>("v"));
  c.erase("e");
  CHECK_FALSE(c.try_get("e").has_value());
  CHECK_FALSE(c.check({"e"}));
  c.erase("never-set");  // erasing a missing key is not an error

  // A get parked on an erased key waits for it to be set again.
  std::thread setter([&] {
    StoreClient d(addr, kSecret, 1, 5.0);
    std::this_thread::sleep_for(100ms);
    d.set("e", "again");
  });
  CHECK(c.get("e") == "again");
  setter.join();
}

TEST_CASE("store: compare_set is torch's compareSet, one atomic map operation") {
  auto server = start_server();
  const auto addr = addr_of(*server);
  StoreClient c(addr, kSecret, 0, 5.0);
  CHECK(c.compare_set("d", "", "1,3") == "1,3");  // absent, expected empty: set, won
  CHECK(c.get("d") == "1,3");
  CHECK(c.compare_set("d", "", "2") == "1,3");  // lost: learns the first value, nothing changed
  CHECK(c.get("d") == "1,3");
  CHECK(c.compare_set("d", "2", "5") == "1,3");  // a wrong expected changes nothing
  CHECK(c.compare_set("d", "1,3", "4") == "4");  // matching expected: replaced
  CHECK(c.get("d") == "4");
  CHECK(c.compare_set("absent", "x", "y") == "x");  // torch's answer, and nothing stored
  CHECK_FALSE(c.try_get("absent").has_value());
  const std::string bin("\0v\xff", 3);
  CHECK(c.compare_set(std::string("b\0", 2), "", bin) == bin);
  CHECK(c.compare_set(std::string("b\0", 2), bin, "") == "");  // to an empty value
  CHECK(c.try_get(std::string("b\0", 2)) == std::optional<std::string>(""));
  c.set("c", "");
  CHECK(c.compare_set("c", "", "filled") == "filled");  // an empty value matches ""

  // A get parked on the key is woken by the compare_set that creates it.
  std::thread waiter([&] {
    StoreClient d(addr, kSecret, 1, 5.0);
    CHECK(d.get("late") == "cas");
  });
  std::this_thread::sleep_for(100ms);
  CHECK(c.compare_set("late", "", "cas") == "cas");
  waiter.join();

  const auto msg = message_of<kolo::Error>(
      [&] { c.compare_set("k", "", std::string(sd::kMaxValueBytes + 1, 'v')); });
  CHECK(contains(msg, "compare_set('k')"));
  CHECK(contains(msg, std::to_string(sd::kMaxValueBytes)));
  CHECK(c.get("d") == "4");  // refused before sending: the connection is fine
}

TEST_CASE("store: compare_set from 4 threads on one key: exactly one wins, all agree") {
  auto server = start_server();
  const auto addr = addr_of(*server);
  constexpr int kThreads = 4;
  constexpr int kRounds = 50;
  std::vector<std::vector<std::string>> got(kThreads);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  std::atomic<int> ready{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        StoreClient c(addr, kSecret, t, 10.0);
        ready.fetch_add(1);
        while (ready.load() < kThreads) std::this_thread::yield();
        for (int r = 0; r < kRounds; ++r) {
          got[t].push_back(
              c.compare_set("round/" + std::to_string(r), "", "t" + std::to_string(t)));
        }
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  StoreClient c(addr, kSecret, 9, 5.0);
  for (int t = 0; t < kThreads; ++t) {
    CAPTURE(t);
    CHECK(errors[t].empty());
    REQUIRE(got[t].size() == std::size_t{kRounds});
  }
  for (int r = 0; r < kRounds; ++r) {
    CAPTURE(r);
    const std::string stored = c.get("round/" + std::to_string(r));
    int winners = 0;
    for (int t = 0; t < kThreads; ++t) {
      CHECK(got[t][r] == stored);  // every caller learns the same value ...
      if (got[t][r] == "t" + std::to_string(t)) ++winners;
    }
    CHECK(winners == 1);  // ... and exactly one of them wrote it
  }
}

TEST_CASE("store: wait_for answers true or false in time, without throwing") {
  auto server = start_server();
  const auto addr = addr_of(*server);
  StoreClient c(addr, kSecret, 0, 0.5);  // a short client timeout: wait_for is not bound by it
  c.set("here", "1");
  CHECK(c.wait_for({}, 0.0));
  CHECK(c.wait_for({"here"}, 0.0));
  CHECK_FALSE(c.wait_for({"here", "gone"}, 0.0));
  CHECK_FALSE(c.wait_for({"gone"}, -1.0));

  auto t0 = Clock::now();
  CHECK_FALSE(c.wait_for({"here", "gone"}, 0.3));
  double took = since(t0);
  CHECK(took >= 0.29);
  CHECK(took < 3.0);

  // Longer than the client's 0.5 s timeout: the server holds the request, no TimeoutError.
  t0 = Clock::now();
  CHECK_FALSE(c.wait_for({"gone"}, 1.0));
  took = since(t0);
  CHECK(took >= 0.99);
  CHECK(took < 4.0);

  std::thread setter([&] {
    StoreClient d(addr, kSecret, 1, 5.0);
    std::this_thread::sleep_for(200ms);
    d.set("gone", "back");
  });
  t0 = Clock::now();
  CHECK(c.wait_for({"here", "gone"}, 10.0));
  took = since(t0);
  setter.join();
  CHECK(took >= 0.15);
  CHECK(took < 5.0);               // woken by the set, not at its 10 s
  CHECK(c.get("gone") == "back");  // the connection is still in step after the expiries
}

TEST_CASE("store: erase through the KvStore interface, and PrefixStore forwards to the server") {
  auto server = start_server();
  const auto addr = addr_of(*server);
  auto client = std::make_shared<StoreClient>(addr, kSecret, 0, 5.0);
  kolo::KvStore& kv = *client;
  kv.set("x", "1");
  kv.erase("x");
  CHECK_FALSE(kv.try_get("x").has_value());

  kolo::PrefixStore p(client, "job/");
  CHECK(p.compare_set("d", "", "0,2") == "0,2");
  CHECK(p.compare_set("d", "", "1") == "0,2");
  CHECK(client->get("job/d") == "0,2");
  CHECK_FALSE(client->try_get("d").has_value());
  CHECK_FALSE(p.wait_for({"d", "e"}, 0.05));
  client->set("job/e", "");
  CHECK(p.wait_for({"d", "e"}, 0.05));
  p.erase("d");
  CHECK_FALSE(client->try_get("job/d").has_value());
  CHECK_FALSE(p.wait_for({"d"}, 0.0));
}

TEST_CASE("store: get and wait time out naming the missing keys and the store address") {
  auto server = start_server();
  const auto addr = addr_of(*server);
  const double kT = 0.5;  // the client's timeout: each wait ends at it, not much later
  StoreClient c(addr, kSecret, 0, kT);
  c.set("present", "1");

  auto t0 = Clock::now();
  const auto get_msg = message_of<kolo::TimeoutError>([&] { c.get("missing-key"); });
  double took = since(t0);
  CHECK(contains(get_msg, "'missing-key'"));
  CHECK(contains(get_msg, addr.str()));
  CHECK(took >= 0.9 * kT);
  CHECK(took < 4 * kT);

  t0 = Clock::now();
  const auto wait_msg = message_of<kolo::TimeoutError>([&] { c.wait({"present", "m1", "m2"}); });
  took = since(t0);
  CHECK(contains(wait_msg, "'m1', 'm2'"));
  CHECK_FALSE(contains(wait_msg, "'present'"));  // only the missing ones are listed
  CHECK(contains(wait_msg, addr.str()));
  CHECK(took >= 0.9 * kT);
  CHECK(took < 4 * kT);

  // The server answered the timeout, so the connection is still in step.
  CHECK(c.get("present") == "1");
  c.set("missing-key", "now");
  CHECK(c.get("missing-key") == "now");
}

TEST_CASE("store: a client with the wrong secret is refused and the store keeps serving") {
  auto server = start_server();
  const auto addr = addr_of(*server);
  const auto msg =
      message_of<kolo::Error>([&] { StoreClient bad(addr, "not-the-job-secret-at-all", 3, 2.0); });
  CHECK(contains(lower(msg), "secret"));
  CHECK(contains(msg, addr.str()));

  // The right secret for another purpose (a data connection) is not let into the store: its
  // requests are never executed.
  {
    net::Socket data_conn = raw_authenticated(server->port(), net::kPurposeData);
    try {
      send_raw(data_conn.fd(), set_frame("smuggled", "x"));
    } catch (const kolo::PeerLostError&) {
      // already closed by the server: just as good
    }
    CHECK(closed_by_peer(data_conn.fd(), 2.0));
  }

  StoreClient good(addr, kSecret, 0, 5.0);
  good.set("k", "v");
  CHECK(good.get("k") == "v");
  CHECK_FALSE(good.try_get("smuggled").has_value());
}

TEST_CASE("store: strangers that send garbage or stay silent do not delay good clients") {
  auto server = start_server();
  const auto addr = addr_of(*server);
  std::vector<net::Socket> silent;
  for (int i = 0; i < 5; ++i) silent.push_back(raw_connect(server->port()));
  std::vector<net::Socket> partial;  // the start of a handshake, then nothing
  for (int i = 0; i < 3; ++i) {
    partial.push_back(raw_connect(server->port()));
    send_raw(partial.back().fd(), std::string(net::kAuthMagic, 8) + "0123456789");
  }
  std::vector<net::Socket> garbage;
  for (int i = 0; i < 3; ++i) {
    garbage.push_back(raw_connect(server->port()));
    std::string http = "GET / HTTP/1.1\r\nHost: store\r\n\r\n";
    http.resize(200, 'x');
    send_raw(garbage.back().fd(), http);
  }
  // Right magic, wrong proof: someone who knows the protocol but not the secret.
  net::Socket forger = raw_connect(server->port());
  {
    char challenge[net::kChallengeSize];
    net::recv_all(forger.fd(), challenge, sizeof(challenge), Deadline::after(5.0), "test");
    std::string response(net::kAuthMagic, 8);
    response.resize(net::kResponseSize, '\0');
    send_raw(forger.fd(), response);
  }

  const auto t0 = Clock::now();
  StoreClient good(addr, kSecret, 0, 5.0);
  StoreClient good2(addr, kSecret, 1, 5.0);
  for (int i = 0; i < 20; ++i) {
    good.set("k" + std::to_string(i), std::to_string(i));
    CHECK(good2.get("k" + std::to_string(i)) == std::to_string(i));
  }
  CHECK(since(t0) < 10.0 / 4);  // served promptly, not after the strangers' 10 s budget

  for (auto& g : garbage) CHECK(closed_by_peer(g.fd(), 2.0));
  CHECK(closed_by_peer(forger.fd(), 2.0));
  // The silent ones are merely waiting out their budget (nothing closes them early).
  CHECK_FALSE(closed_by_peer(silent.front().fd(), 0.1));
}

TEST_CASE("store: a connection that never authenticates is closed after its budget") {
  const double kBudget = 0.3, kDefaultBudget = 10.0;
  StoreServer server(net::listen_tcp("127.0.0.1", 0), kSecret, StoreServer::Options{kBudget});
  net::Socket silent = raw_connect(server.port());
  const auto t0 = Clock::now();
  // At its own budget, not the default one: within a quarter of that.
  CHECK(closed_by_peer(silent.fd(), kDefaultBudget / 4));
  const double took = since(t0);
  CHECK(took >= kBudget - 0.05);
  CHECK(took < kDefaultBudget / 4);
  StoreClient good(addr_of(server), kSecret, 0, 5.0);
  good.set("k", "v");
  CHECK(good.get("k") == "v");
}

TEST_CASE("store: malformed requests close only the offending connection") {
  auto server = start_server();
  const auto addr = addr_of(*server);

  // The raw framing is right: a well-formed request gets its reply.
  {
    net::Socket raw = raw_authenticated(server->port());
    send_raw(raw.fd(), set_frame("raw", "ok"));
    const RawReply r = read_reply(raw.fd());
    CHECK(r.status == sd::kOk);
    CHECK(r.body.empty());
  }

  struct Case {
    const char* name;
    std::string bytes;
  };
  std::vector<Case> cases;
  {
    std::string f;
    sd::put_u32(f, 0xffffffffu);
    f += "x";
    cases.push_back({"length over the limit", f});
  }
  {
    std::string f;
    sd::put_u32(f, 0);
    cases.push_back({"zero length", f});
  }
  {
    std::string f;
    sd::FrameWriter(f, 99).str("k").finish();
    cases.push_back({"unknown op", f});
  }
  {
    std::string f;
    sd::FrameWriter(f, sd::kSet).u32(1000).raw("ab").finish();
    cases.push_back({"key overruns its frame", f});
  }
  {
    std::string f;
    sd::FrameWriter(f, sd::kGet).u64(0).str("k").raw("junk").finish();
    cases.push_back({"trailing bytes after a GET", f});
  }
  cases.push_back({"key over 4 KiB", set_frame(std::string(5000, 'k'), "v")});
  {
    std::string f;
    sd::FrameWriter(f, sd::kWait).u64(0).u32(1000000).finish();
    cases.push_back({"WAIT count beyond its frame", f});
  }
  {
    std::string f;
    sd::FrameWriter(f, sd::kAdd).str("counter").finish();
    cases.push_back({"ADD without a delta", f});
  }
  {
    std::string f;
    sd::FrameWriter(f, sd::kCompareSet).str("k").u32(1000).raw("short").finish();
    cases.push_back({"COMPARE_SET expected overruns its frame", f});
  }
  for (const auto& c : cases) {
    CAPTURE(c.name);
    net::Socket raw = raw_authenticated(server->port());
    send_raw(raw.fd(), c.bytes);
    CHECK(closed_by_peer(raw.fd(), 2.0));
  }

  StoreClient good(addr, kSecret, 0, 5.0);
  CHECK(good.get("raw") == "ok");
  CHECK_FALSE(good.try_get("counter").has_value());
}

TEST_CASE("store: pipelined requests are answered in order, behind a parked get") {
  auto server = start_server();
  const auto addr = addr_of(*server);
  net::Socket raw = raw_authenticated(server->port());
  send_raw(raw.fd(), set_frame("p/a", "A") + get_frame("p/b", 5000) + set_frame("p/c", "C") +
                         get_frame("p/c", 0));
  StoreClient other(addr, kSecret, 0, 5.0);
  CHECK(read_reply(raw.fd()).status == sd::kOk);  // SET p/a
  std::this_thread::sleep_for(100ms);
  // The parked GET holds back the SET behind it.
  CHECK_FALSE(other.try_get("p/c").has_value());
  other.set("p/b", "B");
  const RawReply get_b = read_reply(raw.fd());
  CHECK(get_b.status == sd::kOk);
  CHECK(get_b.body == "B");
  CHECK(read_reply(raw.fd()).status == sd::kOk);  // SET p/c
  const RawReply get_c = read_reply(raw.fd());
  CHECK(get_c.status == sd::kOk);
  CHECK(get_c.body == "C");

  // A parked request whose client disconnects is forgotten; setting its key later is harmless.
  send_raw(raw.fd(), get_frame("p/gone", 10000));
  std::this_thread::sleep_for(50ms);
  raw.close();
  std::this_thread::sleep_for(50ms);
  other.set("p/gone", "x");
  CHECK(other.get("p/gone") == "x");
}

TEST_CASE("store: a client that never reads its replies does not block others") {
  auto server = start_server();
  const auto addr = addr_of(*server);
  StoreClient good(addr, kSecret, 0, 5.0);
  const std::string blob(std::size_t{1} << 20, 'b');
  good.set("blob", blob);

  // 64 pipelined GETs = 64 MiB of replies that nobody reads for now.
  constexpr int kGets = 64;
  net::Socket hog = raw_authenticated(server->port());
  std::string requests;
  for (int i = 0; i < kGets; ++i) requests += get_frame("blob", 0);
  send_raw(hog.fd(), requests);
  std::this_thread::sleep_for(200ms);

  const auto t0 = Clock::now();
  StoreClient good2(addr, kSecret, 1, 5.0);
  for (int i = 0; i < 20; ++i) {
    good.set("n", std::to_string(i));
    CHECK(good2.get("n") == std::to_string(i));
  }
  CHECK(since(t0) < 5.0 / 4);  // a quarter of good2's timeout: nobody waited for the hog

  // Once the hog reads, the server resumes it: every reply arrives, in full.
  int complete = 0;
  for (int i = 0; i < kGets; ++i) {
    const RawReply r = read_reply(hog.fd(), 10.0);
    complete += (r.status == sd::kOk && r.body == blob) ? 1 : 0;
  }
  CHECK(complete == kGets);
}

TEST_CASE("store: stop() while clients wait raises PeerLostError, not a hang") {
  auto server = start_server();
  const auto addr = addr_of(*server);
  StoreClient getter(addr, kSecret, 0, 10.0);
  StoreClient waiter(addr, kSecret, 1, 10.0);
  std::string get_msg, wait_msg;
  double get_took = -1, wait_took = -1;
  std::thread t1([&] {
    const auto t0 = Clock::now();
    get_msg = message_of<kolo::PeerLostError>([&] { getter.get("never"); });
    get_took = since(t0);
  });
  std::thread t2([&] {
    const auto t0 = Clock::now();
    wait_msg = message_of<kolo::PeerLostError>([&] { waiter.wait({"never", "nor-this"}); });
    wait_took = since(t0);
  });
  std::this_thread::sleep_for(200ms);
  server->stop();
  server->stop();  // idempotent
  t1.join();
  t2.join();
  CHECK(contains(get_msg, addr.str()));
  CHECK(contains(wait_msg, addr.str()));
  CHECK(get_took < 10.0 / 2);  // at stop(), not at the clients' 10 s timeout
  CHECK(wait_took < 10.0 / 2);

  // Later calls fail at once; nothing listens any more.
  const auto t0 = Clock::now();
  CHECK(contains(message_of<kolo::PeerLostError>([&] { getter.set("x", "y"); }), addr.str()));
  CHECK(since(t0) < 10.0 / 4);
  CHECK_THROWS_AS(StoreClient(addr, kSecret, 2, 0.3), kolo::TimeoutError);
  server.reset();  // the destructor after stop() is fine
}

TEST_CASE("store: serves an already-listening socket and clients may arrive before it serves") {
  net::Socket listener = net::listen_tcp("127.0.0.1", 0);
  const std::uint16_t port = net::local_port(listener.fd());
  std::string got, err;
  std::thread early([&] {
    try {
      StoreClient c(net::HostPort{"127.0.0.1", port}, kSecret, 0, 5.0);
      got = c.get("ready");
    } catch (const std::exception& e) {
      err = e.what();
    }
  });
  std::this_thread::sleep_for(300ms);  // the early client sits in the accept queue meanwhile
  StoreServer server(std::move(listener), kSecret);
  CHECK(server.port() == port);
  StoreClient late(addr_of(server), kSecret, 1, 5.0);
  late.set("ready", "yes");
  early.join();
  CHECK(err.empty());
  CHECK(got == "yes");

  net::Socket not_listening(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const auto msg =
      message_of<kolo::ConfigError>([&] { StoreServer s(std::move(not_listening), kSecret); });
  CHECK(contains(msg, "not a listening"));
}

TEST_CASE("store: oversize keys and values are refused by the client, naming the limit") {
  auto server = start_server();
  const auto addr = addr_of(*server);
  StoreClient c(addr, kSecret, 0, 5.0);
  CHECK(contains(message_of<kolo::Error>([&] { c.set(std::string(5000, 'k'), "v"); }), "4096"));
  CHECK(contains(message_of<kolo::Error>([&] { c.get(std::string(5000, 'k')); }), "4096"));
  const std::string huge(sd::kMaxValueBytes + 1, 'v');
  CHECK(contains(message_of<kolo::Error>([&] { c.set("huge", huge); }), "limit"));
  c.set("k", "v");  // nothing was sent: the connection is fine
  CHECK(c.get("k") == "v");
  CHECK(contains(message_of<kolo::ConfigError>([&] { StoreClient z(addr, kSecret, 0, 0.0); }),
                 "timeout_seconds"));
}

TEST_CASE("store: 200 concurrent clients rendezvous") {
  auto server = start_server();
  const auto addr = addr_of(*server);
  constexpr int kClients = 200;
  auto key = [](int i) { return "smoke/" + std::to_string(i); };
  auto value = [](int i) { return "v" + std::to_string(i * i); };
  std::vector<std::string> keys;
  for (int i = 0; i < kClients; ++i) keys.push_back(key(i));

  std::vector<std::string> got(kClients);
  std::atomic<int> failures{0};
  std::mutex mu;
  std::string first_error;
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      try {
        StoreClient c(addr, kSecret, i, 30.0);
        c.set(key(i), value(i));
        c.add("smoke/arrived", 1);
        c.wait(keys);  // a barrier: everyone has set its key
        got[i] = c.get(key((i + 1) % kClients));
      } catch (const std::exception& e) {
        failures.fetch_add(1);
        std::lock_guard<std::mutex> lock(mu);
        if (first_error.empty()) first_error = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  const double took = since(t0);
  CAPTURE(first_error);
  CHECK(failures.load() == 0);
  int wrong = 0;
  for (int i = 0; i < kClients; ++i) wrong += got[i] == value((i + 1) % kClients) ? 0 : 1;
  CHECK(wrong == 0);
  StoreClient check(addr, kSecret, -1, 5.0);
  CHECK(check.get("smoke/arrived") == std::to_string(kClients));
  CHECK(took < 20.0);
}
