// kolo/topology/store/server.hpp — the rendezvous store's server: one thread, one poll() loop
// over the listener, a self-pipe (stop) and every client, the timers, the data and the requests
// (decoded by store/protocol.hpp) with their parked waiters. Its connection handling (accepting,
// handshakes, reads, writes, framing) is defined in store/server_conn.hpp, included at the end.
//
// Handshakes run incrementally (net::ServerHandshake) with a budget of 10 s each, at most 64 at
// once (beyond that, the oldest one if it has had 0.5 s, else the newcomer, is closed); a blocking
// GET or WAIT becomes a waiter parked on its keys and answered the moment a write creates them,
// or with MISSING when its deadline passes — no polling, no spinning. Sockets are non-blocking with
// per-connection output buffers, so a client that stops reading only stalls itself. The server
// answers pipelined requests in order: it stops reading a connection's requests while that
// connection has a waiter parked. ADD keeps counters as decimal text, so get() on a counter
// returns "42" (as torch's store does). Anything malformed closes that connection without a reply.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kolo/core/config.hpp"
#include "kolo/core/deadline.hpp"
#include "kolo/core/env.hpp"
#include "kolo/core/error.hpp"
#include "kolo/net/auth.hpp"
#include "kolo/net/socket.hpp"
#include "kolo/topology/store/protocol.hpp"

namespace kolo {

namespace store_detail {

inline std::string peer_name(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {};
  std::uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
    port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
    port = ntohs(a->sin6_port);
  } else {
    return "unknown peer";
  }
  return std::string(buf) + ":" + std::to_string(port);
}

}  // namespace store_detail

class StoreServer {
 public:
  struct Options {
    // How long an accepted connection may take to prove the secret before it is closed.
    double auth_timeout_seconds = 10.0;
    // How many connections may be handshaking at once; beyond it the oldest one is closed.
    std::size_t max_pending_handshakes = net::kMaxPendingHandshakes;
  };

  // Serves on an already-listening socket (from net::listen_tcp or an inherited KOLO_LISTEN_FD)
  // in a background thread; every connection must pass net::ServerHandshake with
  // Hello.purpose == net::kPurposeStore before any command is read. Failures are closed silently
  // (one line on stderr each when KOLO_LOG_LEVEL=debug) and never disturb other clients.
  StoreServer(net::Socket listener, std::string secret)
      : StoreServer(std::move(listener), std::move(secret), Options{}) {}

  StoreServer(net::Socket listener, std::string secret, Options options)
      : listener_(std::move(listener)), secret_(std::move(secret)), options_(options) {
    if (!listener_.valid()) throw Error("StoreServer needs a listening socket, got none");
    int listening = 0;
    socklen_t len = sizeof(listening);
    if (::getsockopt(listener_.fd(), SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 ||
        !listening) {
      throw ConfigError("StoreServer: socket fd " + std::to_string(listener_.fd()) +
                        " is not a listening TCP socket");
    }
    // Non-blocking so that draining the accept queue can never block the loop (a connection
    // may be reset between poll() and accept()). For an inherited KOLO_LISTEN_FD this flag is
    // shared with the launcher's copy, which does not accept on it any more.
    net::set_nonblocking(listener_.fd(), true);
    net::set_cloexec(listener_.fd());
    port_ = net::local_port(listener_.fd());
    name_ = "store :" + std::to_string(port_);
    debug_ = log_level_from_env() == LogLevel::debug;  // a bad value is a ConfigError
    int p[2];
    if (::pipe(p) != 0) throw Error("StoreServer: pipe() failed: " + net::errno_text(errno));
    wake_read_ = net::Socket(p[0]);
    wake_write_ = net::Socket(p[1]);
    for (int fd : p) {
      net::set_cloexec(fd);
      net::set_nonblocking(fd, true);
    }
    thread_ = std::thread([this] { run(); });
  }

  // Convenience: listen on host:port (port 0 = ephemeral) and serve.
  static std::unique_ptr<StoreServer> listen(const std::string& bind_host, std::uint16_t port,
                                             std::string secret) {
    return std::make_unique<StoreServer>(net::listen_tcp(bind_host, port), std::move(secret));
  }

  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  std::uint16_t port() const { return port_; }
  // Connections closed because max_pending_handshakes were in progress (a flood): handshakes
  // closed unfinished to make room, and new connections closed before their challenge.
  std::uint64_t evicted_handshakes() const { return evicted_.load(); }
  std::uint64_t refused_handshakes() const { return refused_.load(); }

  // Idempotent: closes the listener and every connection (clients blocked in get/wait see
  // PeerLostError at once rather than waiting out their timeout) and joins the thread.
  void stop() {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (!thread_.joinable()) return;
    stopping_.store(true);
    const char byte = 1;
    // The pipe only has to be non-empty: EAGAIN means a wake-up is already pending.
    [[maybe_unused]] const ssize_t k = ::write(wake_write_.fd(), &byte, 1);
    thread_.join();
  }

  ~StoreServer() { stop(); }

 private:
  using Id = std::uint64_t;

  struct Pending {
    store_detail::Op op = store_detail::kGet;
    std::vector<std::string> keys;
  };

  struct Conn {
    Id id = 0;
    net::Socket sock;
    std::string peer;
    std::optional<net::ServerHandshake> handshake;  // engaged until the client is authenticated
    int rank = -1;
    std::string in;
    std::size_t in_off = 0;
    std::string out;
    std::size_t out_off = 0;
    std::optional<Pending> pending;  // a parked GET/WAIT; no further request is read meanwhile
    std::optional<Clock::time_point> timer;  // auth budget, or the parked request's deadline
    bool dead = false;

    std::size_t unsent() const { return out.size() - out_off; }
    std::size_t unread() const { return in.size() - in_off; }
  };

  void run() noexcept {
    try {
      loop();
    } catch (const std::exception& e) {
      // Nothing else can report it: the clients will see PeerLostError naming the store.
      std::fprintf(stderr, "kolo: %s stopped serving: %s\n", name_.c_str(), e.what());
    }
    conns_.clear();
    watchers_.clear();
    timers_.clear();
    listener_.close();
  }

  void loop() {
    std::vector<pollfd> fds;
    std::vector<Id> ids;
    for (;;) {
      reap();
      fire_timers();
      resume_ready();
      reap();

      fds.clear();
      ids.clear();
      fds.push_back(pollfd{wake_read_.fd(), POLLIN, 0});
      const bool accepting = Clock::now() >= accept_paused_until_;
      fds.push_back(pollfd{accepting ? listener_.fd() : -1, POLLIN, 0});  // -1: ignored by poll
      for (const auto& [id, c] : conns_) {
        short events = 0;
        if (wants_read(*c)) events |= POLLIN;
        if (c->unsent() > 0) events |= POLLOUT;
        fds.push_back(pollfd{c->sock.fd(), events, 0});
        ids.push_back(id);
      }
      int timeout_ms = -1;
      if (!timers_.empty()) timeout_ms = ms_until(timers_.begin()->first);
      if (!accepting) {
        const int t = ms_until(accept_paused_until_);
        timeout_ms = timeout_ms < 0 ? t : std::min(timeout_ms, t);
      }
      const int rc = ::poll(fds.data(), fds.size(), timeout_ms);
      if (rc < 0) {
        if (errno == EINTR) continue;
        throw Error("poll failed: " + net::errno_text(errno));
      }
      if (fds[0].revents != 0) {
        char buf[64];
        while (::read(wake_read_.fd(), buf, sizeof(buf)) > 0) {
        }
      }
      if (stopping_.load()) return;
      if (fds[1].revents != 0) accept_new();
      for (std::size_t i = 0; i < ids.size(); ++i) {
        if (fds[i + 2].revents != 0) on_events(ids[i], fds[i + 2].revents);
      }
    }
  }

  // Rounded up, so a timer a fraction of a millisecond away does not turn into a 0 ms spin.
  static int ms_until(Clock::time_point t) {
    const auto now = Clock::now();
    if (t <= now) return 0;
    const auto us = std::chrono::duration_cast<std::chrono::microseconds>(t - now).count();
    return static_cast<int>(std::min<long long>((us + 999) / 1000, 1 << 30));
  }

  bool wants_read(const Conn& c) const {
    if (c.handshake) return true;
    if (c.unsent() >= store_detail::kOutputHighWater) return false;
    // While parked, buffer at most one more frame (only a pipelining client gets here).
    return !c.pending || c.unread() < store_detail::kMaxFrameBytes + 4;
  }

  void log(const Conn& c, const std::string& why) const {
    if (!debug_) return;
    const std::string who = c.handshake ? "unauthenticated" : "rank " + std::to_string(c.rank);
    std::fprintf(stderr, "kolo: %s closed the connection from %s (%s): %s\n", name_.c_str(),
                 c.peer.c_str(), who.c_str(), why.c_str());
  }

  // Marks a connection dead and detaches it from every index; reap() closes it at a point
  // where no caller is still holding a reference.
  void drop(Conn& c, const std::string& why, bool failure = true) {
    if (c.dead) return;
    if (failure) log(c, why);
    if (c.handshake) --handshaking_;
    c.dead = true;
    unpark(c);
    clear_timer(c);
    dead_.push_back(c.id);
  }

  void reap() {
    for (Id id : dead_) conns_.erase(id);
    dead_.clear();
  }

  void set_timer(Conn& c, Clock::time_point t) {
    clear_timer(c);
    c.timer = t;
    timers_.emplace(t, c.id);
  }

  void clear_timer(Conn& c) {
    if (c.timer) timers_.erase({*c.timer, c.id});
    c.timer.reset();
  }

  Conn* find(Id id) {
    const auto it = conns_.find(id);
    return it == conns_.end() || it->second->dead ? nullptr : it->second.get();
  }

  void fire_timers() {
    const auto now = Clock::now();
    while (!timers_.empty() && timers_.begin()->first <= now) {
      const Id id = timers_.begin()->second;
      timers_.erase(timers_.begin());
      Conn* c = find(id);
      if (!c) continue;
      c->timer.reset();
      if (c->handshake) {
        drop(*c, "did not authenticate within " +
                     store_detail::seconds_text(options_.auth_timeout_seconds) + " s");
      } else if (c->pending) {
        answer_parked(*c);  // the deadline passed: MISSING with the keys still absent
      }
    }
  }

  void accept_new();

  // Before a new handshake (net::AcceptGate's rule): below the cap start it; at the cap close
  // the oldest handshake in progress if it has had kEvictableAfterSeconds (a real client answers
  // within a round trip), else refuse the new one (closed before its challenge: the client sees
  // the store busy and retries). Strangers never hold more than the cap in descriptors.
  bool make_room();

  // Closes the oldest handshake in progress if it has had kEvictableAfterSeconds (counted).
  // Also used when descriptors run out: the closed one's is free after the next reap().
  enum class Evict { done, too_young, none };
  Evict evict_oldest_handshake();

  void on_events(Id id, short revents);

  void advance_handshake(Conn& c);

  // Reads what is available (within this turn's budget); false if the connection is gone.
  bool read_input(Conn& c);

  // Sends what the socket takes now; false if the connection is gone.
  bool flush(Conn& c);

  void process_input(Conn& c);

  void resume_ready() {
    while (!ready_.empty()) {
      std::vector<Id> batch;
      batch.swap(ready_);
      for (Id id : batch) {
        if (Conn* c = find(id)) process_input(*c);
      }
    }
  }

  // Executes one request; returns why it is malformed, or nullptr.
  const char* handle(Conn& c, std::string_view body) {
    using namespace store_detail;
    if (const char* bad = decode_request(body, request_)) return bad;
    const store_detail::Request& q = request_;
    switch (q.op) {
      case kSet: {
        const auto it = data_.try_emplace(std::string(q.key)).first;
        it->second.assign(q.value);
        reply_ok(c);
        wake(it->first);
        break;
      }
      case kGet:
        park_or_answer(c, kGet, {std::string(q.key)}, q.wait_ms);
        break;
      case kAdd:
        add(c, std::string(q.key), q.delta);
        break;
      case kWait:
        park_or_answer(c, kWait, std::vector<std::string>(q.keys.begin(), q.keys.end()), q.wait_ms);
        break;
      case kErase:
        data_.erase(std::string(q.key));
        reply_ok(c);
        break;
      case kCompareSet:
        compare_set(c, std::string(q.key), q.expected, q.value);
        break;
    }
    return nullptr;
  }

  void add(Conn& c, const std::string& key, std::int64_t delta) {
    using namespace store_detail;
    std::int64_t current = 0;
    auto it = data_.find(key);
    if (it != data_.end()) {
      const std::string& v = it->second;
      const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), current);
      if (v.empty() || ec != std::errc() || ptr != v.data() + v.size()) {
        reply_failed(c, "store key " + printable(key) +
                            " holds a value that is not a decimal integer, so add() cannot "
                            "count on it");
        return;
      }
    }
    std::int64_t next = 0;
    if (__builtin_add_overflow(current, delta, &next)) {
      reply_failed(c, "store add(" + printable(key) + ", " + std::to_string(delta) +
                          ") overflows the 64-bit counter at " + std::to_string(current));
      return;
    }
    if (it == data_.end()) it = data_.emplace(key, std::string()).first;
    it->second = std::to_string(next);
    encode_ok_i64(c.out, next);
    wake(it->first);
  }

  // One map operation on the loop thread, so atomic against every other request: torch's
  // compareSet (store/protocol.hpp). A key it creates or changes wakes its parked waiters.
  void compare_set(Conn& c, const std::string& key, std::string_view expected,
                   std::string_view desired) {
    const auto it = data_.find(key);
    if (it == data_.end()) {
      if (!expected.empty()) {
        store_detail::encode_ok(c.out, expected);  // absent: nothing stored (torch's answer)
        return;
      }
      const auto created = data_.emplace(key, std::string(desired)).first;
      store_detail::encode_ok(c.out, created->second);
      wake(created->first);
      return;
    }
    const bool swap = it->second == expected;
    if (swap) it->second.assign(desired);
    store_detail::encode_ok(c.out, it->second);
    if (swap) wake(it->first);
  }

  void reply_ok(Conn& c) { store_detail::encode_ok(c.out); }

  void reply_failed(Conn& c, const std::string& message) {
    store_detail::encode_failed(c.out, message);
  }

  // Answers now if the keys exist or the request does not wait; otherwise parks it on its keys.
  void park_or_answer(Conn& c, store_detail::Op op, std::vector<std::string> keys,
                      std::uint64_t wait_ms) {
    c.pending = Pending{op, std::move(keys)};
    if (satisfied(*c.pending) || wait_ms == 0) {
      answer_parked(c);
      return;
    }
    for (const auto& k : c.pending->keys) watchers_[k].insert(c.id);
    const auto wait = std::chrono::milliseconds(std::min(wait_ms, store_detail::kMaxWaitMs));
    set_timer(c, Clock::now() + std::chrono::duration_cast<Clock::duration>(wait));
  }

  bool satisfied(const Pending& p) const {
    return std::all_of(p.keys.begin(), p.keys.end(),
                       [&](const std::string& k) { return data_.count(k) != 0; });
  }

  // Replies to c's pending request from the current data (OK, or MISSING with what is absent)
  // and lets c's next requests run.
  void answer_parked(Conn& c) {
    using namespace store_detail;
    Pending p = std::move(*c.pending);
    unpark(c);
    clear_timer(c);
    std::vector<std::string> missing;
    for (auto& k : p.keys) {
      if (!data_.count(k)) missing.push_back(std::move(k));
    }
    if (missing.empty()) {
      encode_ok(c.out, p.op == kGet ? std::string_view(data_.find(p.keys.front())->second)
                                    : std::string_view());
    } else {
      encode_missing(c.out, missing);
    }
    ready_.push_back(c.id);  // process_input flushes the reply and reads on
  }

  void unpark(Conn& c) {
    if (!c.pending) return;
    for (const auto& k : c.pending->keys) {
      const auto it = watchers_.find(k);
      if (it == watchers_.end()) continue;
      it->second.erase(c.id);
      if (it->second.empty()) watchers_.erase(it);
    }
    c.pending.reset();
  }

  // A key was created or changed: answer every parked request it completes.
  void wake(const std::string& key) {
    const auto it = watchers_.find(key);
    if (it == watchers_.end()) return;
    const std::vector<Id> ids(it->second.begin(), it->second.end());  // answer_parked edits it
    for (Id id : ids) {
      Conn* w = find(id);
      if (w && w->pending && satisfied(*w->pending)) answer_parked(*w);
    }
  }

  net::Socket listener_;
  std::string secret_;
  Options options_;
  std::uint16_t port_ = 0;
  std::string name_;
  bool debug_ = false;
  net::Socket wake_read_;
  net::Socket wake_write_;
  std::atomic<bool> stopping_{false};
  std::mutex stop_mu_;

  // Loop state: touched only by the server thread.
  std::unordered_map<std::string, std::string> data_;
  store_detail::Request request_;  // the one being handled (its key list's capacity is kept)
  std::unordered_map<Id, std::unique_ptr<Conn>> conns_;
  std::unordered_map<std::string, std::unordered_set<Id>> watchers_;  // key -> parked requests
  std::set<std::pair<Clock::time_point, Id>> timers_;
  std::vector<Id> ready_;  // connections whose next requests may run
  std::vector<Id> dead_;
  Id next_id_ = 1;
  Clock::time_point accept_paused_until_{};
  std::size_t handshaking_ = 0;     // connections with a handshake in progress
  std::deque<Id> handshake_order_;  // in accept order (may hold finished ones)
  std::atomic<std::uint64_t> evicted_{0};
  std::atomic<std::uint64_t> refused_{0};

  std::thread thread_;  // last: starts after everything above is initialised
};

}  // namespace kolo

#include "kolo/topology/store/server_conn.hpp"  // the definitions of the connection handling
