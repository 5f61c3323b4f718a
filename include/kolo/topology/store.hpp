// kolo/topology/store.hpp — the rendezvous key-value store: how ranks find each other.
//
// One process (the launcher, or rank 0) runs a StoreServer; every rank opens a StoreClient and
// uses set/get/add/wait to exchange addresses, host keys and barrier counters. It is the first
// thing a job talks to, so it has to be robust against what is out there on the network: every
// connection proves the job secret (net/auth.hpp) before a single command is read, and a silent
// or malicious peer can never stall the others.
//
// Server: one thread, one poll() loop over the listener, a self-pipe (stop) and every client.
// Handshakes run incrementally (net::ServerHandshake) with a budget of 10 s each, at most 64 at
// once (beyond that, the oldest one if it has had 0.5 s, else the newcomer, is closed); a blocking
// GET or WAIT becomes a waiter parked on its keys and answered the moment a SET/ADD creates them,
// or with MISSING when its deadline passes — no polling, no spinning. Sockets are non-blocking with
// per-connection output buffers, so a client that stops reading only stalls itself.
//
// Wire protocol (after the handshake; every integer little-endian):
//
//   frame     := len:u32 | tag:u8 | payload        len counts tag + payload, 1..kMaxFrameBytes
//   string    := n:u32 | n bytes                   keys: n <= kMaxKeyBytes (4 KiB)
//
//   requests (tag = op)                            replies (tag = status)
//   SET   1 : key:string | value: rest of frame    OK
//   GET   2 : wait_ms:u64 | key:string             OK value: rest of frame  | MISSING
//   ADD   3 : key:string | delta:i64               OK new:i64               | FAILED
//   WAIT  4 : wait_ms:u64 | n:u32 | n x string     OK                       | MISSING
//   ERASE 5 : key:string                           OK
//
//   OK 0 : as above;  MISSING 1 : n:u32 | n x string (the keys still absent);
//   FAILED 2 : message text (e.g. ADD on a value that is not an integer).
//
// A client sends one request and reads its reply before the next (the client's mutex), but the
// server also answers pipelined requests in order: it stops reading a connection's requests
// while that connection has a waiter parked. GET/WAIT with wait_ms = 0 answer at once (try_get,
// check); otherwise the server holds the request up to wait_ms and answers MISSING when it
// expires, so the connection stays in step and a timed-out get() leaves the client usable.
// ADD keeps counters as decimal text, so get() on a counter returns "42" (as torch's store does).
// Anything malformed — a length out of range, an unknown op, a string overrunning its frame,
// trailing bytes — closes that connection without a reply.
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
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
#include "kolo/topology/kv_store.hpp"

namespace kolo {

namespace store_detail {

inline constexpr std::size_t kMaxKeyBytes = 4096;
inline constexpr std::size_t kMaxValueBytes = std::size_t{64} << 20;
// Room for the largest SET (key + value + headers); a WAIT's key list must fit in it too.
inline constexpr std::size_t kMaxFrameBytes = kMaxValueBytes + kMaxKeyBytes + 64;
// Stop reading a connection's requests while this much of its replies is still unsent: a client
// that never reads cannot make the server buffer without bound.
inline constexpr std::size_t kOutputHighWater = std::size_t{8} << 20;
// At most this much is read from one connection per loop turn, so one client streaming a huge
// value does not starve the rest.
inline constexpr std::size_t kReadBudgetPerTurn = std::size_t{4} << 20;
// The longest wait a request may ask for (~115 days): keeps deadline arithmetic far from overflow.
inline constexpr std::uint64_t kMaxWaitMs = std::uint64_t{10'000'000'000};

enum Op : std::uint8_t { kSet = 1, kGet = 2, kAdd = 3, kWait = 4, kErase = 5 };
enum Status : std::uint8_t { kOk = 0, kMissing = 1, kFailed = 2 };

inline void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline void put_u64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline std::uint32_t load_u32(const char* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::uint32_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}
inline std::uint64_t load_u64(const char* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}

// Appends one frame to `out` in place (no intermediate copy of a large value); the length is
// patched in by finish().
class FrameWriter {
 public:
  FrameWriter(std::string& out, std::uint8_t tag) : out_(out), start_(out.size()) {
    put_u32(out_, 0);
    out_.push_back(static_cast<char>(tag));
  }
  FrameWriter& u32(std::uint32_t v) {
    put_u32(out_, v);
    return *this;
  }
  FrameWriter& u64(std::uint64_t v) {
    put_u64(out_, v);
    return *this;
  }
  FrameWriter& i64(std::int64_t v) { return u64(static_cast<std::uint64_t>(v)); }
  FrameWriter& str(std::string_view s) {
    put_u32(out_, static_cast<std::uint32_t>(s.size()));
    out_.append(s);
    return *this;
  }
  FrameWriter& raw(std::string_view s) {
    out_.append(s);
    return *this;
  }
  void finish() {
    const auto len = static_cast<std::uint32_t>(out_.size() - start_ - 4);
    for (int i = 0; i < 4; ++i) out_[start_ + i] = static_cast<char>((len >> (8 * i)) & 0xff);
  }

 private:
  std::string& out_;
  std::size_t start_;
};

// Bounds-checked decoding of one frame's payload: any overrun clears ok() instead of reading
// past the frame, so a hostile length field can only get its connection closed.
class FrameReader {
 public:
  explicit FrameReader(std::string_view s) : rest_(s) {}
  bool ok() const { return ok_; }
  bool at_end() const { return ok_ && rest_.empty(); }
  std::uint8_t u8() {
    if (!need(1)) return 0;
    const auto v = static_cast<std::uint8_t>(rest_[0]);
    rest_.remove_prefix(1);
    return v;
  }
  std::uint32_t u32() {
    if (!need(4)) return 0;
    const auto v = load_u32(rest_.data());
    rest_.remove_prefix(4);
    return v;
  }
  std::uint64_t u64() {
    if (!need(8)) return 0;
    const auto v = load_u64(rest_.data());
    rest_.remove_prefix(8);
    return v;
  }
  std::int64_t i64() { return static_cast<std::int64_t>(u64()); }
  std::string_view str(std::size_t max_len) {
    const std::uint32_t n = u32();
    if (!ok_ || n > max_len || !need(n)) {
      ok_ = false;
      return {};
    }
    const auto v = rest_.substr(0, n);
    rest_.remove_prefix(n);
    return v;
  }
  std::string_view rest() {
    const auto v = rest_;
    rest_ = {};
    return v;
  }

 private:
  bool need(std::size_t n) {
    if (!ok_ || rest_.size() < n) ok_ = false;
    return ok_;
  }
  std::string_view rest_;
  bool ok_ = true;
};

// A key as it appears in messages: escaped (keys may be binary) and cut short if long.
inline std::string printable(std::string_view key, std::size_t max_len = 120) {
  std::string out = "'";
  for (std::size_t i = 0; i < key.size(); ++i) {
    if (i == max_len) {
      out += "...(" + std::to_string(key.size()) + " bytes)";
      break;
    }
    const auto c = static_cast<unsigned char>(key[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\x";
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  return out + "'";
}

inline std::string key_list(const std::vector<std::string>& keys, std::size_t max_shown = 20) {
  std::string out;
  for (std::size_t i = 0; i < keys.size() && i < max_shown; ++i) {
    if (i) out += ", ";
    out += printable(keys[i]);
  }
  if (keys.size() > max_shown) {
    out += " and " + std::to_string(keys.size() - max_shown) + " more";
  }
  return out;
}

inline std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", s);
  return buf;
}

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

  void accept_new() {
    // Bounded per turn so a connection flood cannot monopolise the loop.
    for (int n = 0; n < 64; ++n) {
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      const int fd = ::accept4(listener_.fd(), reinterpret_cast<sockaddr*>(&ss), &len,
                               SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        // Out of descriptors or memory: the listener stays readable, so back off instead of
        // spinning on it; existing clients keep being served.
        const int err = errno;
        if (debug_) {
          std::fprintf(stderr, "kolo: %s cannot accept: %s (pausing 100 ms)\n", name_.c_str(),
                       net::errno_text(err).c_str());
        }
        // A stranger's descriptor is worth less than a newcomer's: free the oldest one's.
        if ((err == EMFILE || err == ENFILE) && evict_oldest_handshake() == Evict::done) {
          return;  // reaped at the top of the next turn, then accepted
        }
        accept_paused_until_ = Clock::now() + std::chrono::milliseconds(100);
        return;
      }
      if (!make_room()) {
        ::close(fd);  // busy: before the challenge, so the client retries
        continue;
      }
      auto c = std::make_unique<Conn>();
      c->id = next_id_++;
      c->sock = net::Socket(fd);
      c->peer = store_detail::peer_name(ss);
      net::set_nodelay(fd);
      try {
        c->handshake.emplace(fd, secret_);  // sends the challenge
      } catch (const std::exception& e) {
        log(*c, e.what());
        continue;  // the unique_ptr closes the socket
      }
      set_timer(*c, Deadline::after(options_.auth_timeout_seconds).time());
      ++handshaking_;
      handshake_order_.push_back(c->id);
      conns_.emplace(c->id, std::move(c));
    }
  }

  // Before a new handshake (net::AcceptGate's rule): below the cap start it; at the cap close
  // the oldest handshake in progress if it has had kEvictableAfterSeconds (a real client answers
  // within a round trip), else refuse the new one (closed before its challenge: the client sees
  // the store busy and retries). Strangers never hold more than the cap in descriptors.
  bool make_room() {
    while (!handshake_order_.empty()) {  // forget finished ones at the front
      const Conn* c = find(handshake_order_.front());
      if (c && c->handshake) break;
      handshake_order_.pop_front();
    }
    if (handshake_order_.size() > 2 * options_.max_pending_handshakes + 64) {
      std::erase_if(handshake_order_, [&](Id id) {
        const Conn* c = find(id);
        return !c || !c->handshake;
      });
    }
    if (handshaking_ < std::max<std::size_t>(options_.max_pending_handshakes, 1)) return true;
    if (evict_oldest_handshake() == Evict::too_young) {
      refused_.fetch_add(1);
      return false;
    }
    return true;
  }

  // Closes the oldest handshake in progress if it has had kEvictableAfterSeconds (counted).
  // Also used when descriptors run out: the closed one's is free after the next reap().
  enum class Evict { done, too_young, none };
  Evict evict_oldest_handshake() {
    while (!handshake_order_.empty()) {  // forget finished ones at the front
      const Conn* c = find(handshake_order_.front());
      if (c && c->handshake) break;
      handshake_order_.pop_front();
    }
    Conn* oldest = handshake_order_.empty() ? nullptr : find(handshake_order_.front());
    if (!oldest || !oldest->timer) return Evict::none;
    const auto started =
        *oldest->timer - std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(options_.auth_timeout_seconds));
    if (Clock::now() - started < std::chrono::duration<double>(net::kEvictableAfterSeconds)) {
      return Evict::too_young;
    }
    handshake_order_.pop_front();
    evicted_.fetch_add(1);
    drop(*oldest, "closed unauthenticated to make room: " + std::to_string(handshaking_) +
                      " handshakes in progress");
    return Evict::done;
  }

  void on_events(Id id, short revents) {
    Conn* c = find(id);
    if (!c) return;
    if (revents & POLLNVAL) {
      drop(*c, "invalid descriptor");
      return;
    }
    if (c->handshake) {
      if (revents & (POLLIN | POLLHUP | POLLERR)) advance_handshake(*c);
      return;
    }
    if (revents & POLLOUT) {
      if (!flush(*c)) return;
    }
    if (revents & (POLLIN | POLLHUP | POLLERR)) {
      if ((revents & POLLIN) == 0 && !wants_read(*c)) {
        drop(*c, "connection reset", false);  // hung up while we were not reading it
        return;
      }
      if (!read_input(*c)) return;
      process_input(*c);
    }
  }

  void advance_handshake(Conn& c) {
    try {
      if (!c.handshake->on_readable()) return;
    } catch (const std::exception& e) {
      drop(c, e.what());
      return;
    }
    const net::Hello hello = c.handshake->hello();
    c.handshake.reset();
    --handshaking_;
    clear_timer(c);
    c.rank = hello.rank;
    if (hello.purpose != net::kPurposeStore) {
      drop(c, "authenticated for purpose " + std::to_string(hello.purpose) + ", not the store (" +
                  std::to_string(net::kPurposeStore) + ")");
      return;
    }
    // Requests may already be queued behind the handshake bytes; poll is level-triggered, so
    // the next turn picks them up.
  }

  // Reads what is available (within this turn's budget); false if the connection is gone.
  bool read_input(Conn& c) {
    constexpr std::size_t kChunk = 64 * 1024;
    std::size_t budget = store_detail::kReadBudgetPerTurn;
    while (budget > 0 && wants_read(c)) {
      const std::size_t old = c.in.size();
      c.in.resize(old + kChunk);
      const ssize_t k = ::recv(c.sock.fd(), c.in.data() + old, kChunk, MSG_DONTWAIT);
      if (k > 0) {
        c.in.resize(old + static_cast<std::size_t>(k));
        budget -= std::min(budget, static_cast<std::size_t>(k));
        continue;
      }
      c.in.resize(old);
      if (k == 0) {
        // An orderly close between requests is how clients say goodbye; mid-frame is not.
        const bool clean = c.unread() == 0;
        drop(c, "closed by the client in the middle of a request", !clean);
        return false;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      drop(c, "receive failed: " + net::errno_text(errno));
      return false;
    }
    return true;
  }

  // Sends what the socket takes now; false if the connection is gone.
  bool flush(Conn& c) {
    const bool was_full = c.unsent() >= store_detail::kOutputHighWater;
    while (c.unsent() > 0) {
      const ssize_t k =
          ::send(c.sock.fd(), c.out.data() + c.out_off, c.unsent(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k > 0) {
        c.out_off += static_cast<std::size_t>(k);
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      drop(c, "send failed: " + net::errno_text(errno), errno != EPIPE && errno != ECONNRESET);
      return false;
    }
    if (c.unsent() == 0) {
      c.out.clear();
      c.out_off = 0;
    } else if (c.out_off > (std::size_t{1} << 20) && c.out_off * 2 > c.out.size()) {
      c.out.erase(0, c.out_off);
      c.out_off = 0;
    }
    // Requests held back by the high-water mark can go on now.
    if (was_full && c.unsent() < store_detail::kOutputHighWater) ready_.push_back(c.id);
    return true;
  }

  void process_input(Conn& c) {
    while (!c.dead && !c.pending && c.unsent() < store_detail::kOutputHighWater &&
           c.unread() >= 4) {
      const std::uint32_t len = store_detail::load_u32(c.in.data() + c.in_off);
      if (len == 0 || len > store_detail::kMaxFrameBytes) {
        drop(c, "frame length " + std::to_string(len) + " is outside 1.." +
                    std::to_string(store_detail::kMaxFrameBytes));
        return;
      }
      if (c.unread() < 4 + std::size_t{len}) {
        c.in.reserve(c.in_off + 4 + len);  // one allocation for a large value
        break;
      }
      const std::string_view body(c.in.data() + c.in_off + 4, len);
      const char* bad = handle(c, body);
      c.in_off += 4 + std::size_t{len};
      if (bad) {
        drop(c, std::string("malformed request: ") + bad);
        return;
      }
    }
    if (c.dead) return;
    if (c.in_off == c.in.size()) {
      c.in.clear();
      c.in_off = 0;
    } else if (c.in_off > (std::size_t{1} << 20)) {
      c.in.erase(0, c.in_off);
      c.in_off = 0;
    }
    flush(c);
  }

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
    FrameReader r(body);
    const std::uint8_t op = r.u8();
    switch (op) {
      case kSet: {
        const auto key = r.str(kMaxKeyBytes);
        const auto value = r.rest();
        if (!r.ok()) return "bad SET";
        if (value.size() > kMaxValueBytes) return "SET value too large";
        const auto it = data_.try_emplace(std::string(key)).first;
        it->second.assign(value);
        reply_ok(c);
        wake(it->first);
        return nullptr;
      }
      case kGet: {
        const std::uint64_t wait_ms = r.u64();
        const auto key = r.str(kMaxKeyBytes);
        if (!r.at_end()) return "bad GET";
        park_or_answer(c, kGet, {std::string(key)}, wait_ms);
        return nullptr;
      }
      case kAdd: {
        const auto key = r.str(kMaxKeyBytes);
        const std::int64_t delta = r.i64();
        if (!r.at_end()) return "bad ADD";
        add(c, std::string(key), delta);
        return nullptr;
      }
      case kWait: {
        const std::uint64_t wait_ms = r.u64();
        const std::uint32_t n = r.u32();
        // Each key costs at least its 4-byte length, so n is bounded by the frame already.
        if (!r.ok() || n > body.size() / 4) return "bad WAIT";
        std::vector<std::string> keys;
        keys.reserve(n);
        for (std::uint32_t i = 0; i < n && r.ok(); ++i) keys.emplace_back(r.str(kMaxKeyBytes));
        if (!r.at_end()) return "bad WAIT";
        park_or_answer(c, kWait, std::move(keys), wait_ms);
        return nullptr;
      }
      case kErase: {
        const auto key = r.str(kMaxKeyBytes);
        if (!r.at_end()) return "bad ERASE";
        data_.erase(std::string(key));
        reply_ok(c);
        return nullptr;
      }
      default:
        return "unknown op";
    }
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
    FrameWriter(c.out, kOk).i64(next).finish();
    wake(it->first);
  }

  void reply_ok(Conn& c) { store_detail::FrameWriter(c.out, store_detail::kOk).finish(); }

  void reply_failed(Conn& c, const std::string& message) {
    store_detail::FrameWriter(c.out, store_detail::kFailed).raw(message).finish();
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
      FrameWriter w(c.out, kOk);
      if (p.op == kGet) w.raw(data_.find(p.keys.front())->second);
      w.finish();
    } else {
      FrameWriter w(c.out, kMissing);
      w.u32(static_cast<std::uint32_t>(missing.size()));
      for (const auto& k : missing) w.str(k);
      w.finish();
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

class StoreClient final : public KvStore {
 public:
  // Connects (retrying until timeout: the server may not be up yet) and authenticates with
  // Hello{kPurposeStore, rank}. `timeout_seconds` bounds the connect and every later call.
  StoreClient(const net::HostPort& addr, std::string secret, int rank, double timeout_seconds)
      : addr_(addr), who_("store " + addr.str()), timeout_(timeout_seconds) {
    if (!(timeout_seconds > 0)) {
      throw ConfigError("StoreClient for " + addr_.str() +
                        ": timeout_seconds must be positive (got " +
                        store_detail::seconds_text(timeout_seconds) + ")");
    }
    const Deadline dl = Deadline::after(timeout_);
    try {
      // Retries while the store is at its handshake cap (a flood of strangers).
      sock_ = net::connect_authenticated(addr_.host, addr_.port, secret,
                                         net::Hello{net::kPurposeStore, rank, 0}, dl, who_);
    } catch (const TimeoutError& e) {
      if (std::string_view(e.what()).find("cannot connect to") != std::string_view::npos) throw;
      throw TimeoutError(who_ +
                         " accepted the connection but did not complete authentication "
                         "within " +
                         store_detail::seconds_text(timeout_) +
                         " s (is a kolo store serving there?): " + e.what());
    }
  }

  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  // Binary-safe: keys up to 4 KiB, values up to 64 MiB.
  void set(const std::string& key, const std::string& value) override {
    check_key(key);
    if (value.size() > store_detail::kMaxValueBytes) {
      throw Error("store set(" + store_detail::printable(key) + "): value of " +
                  std::to_string(value.size()) + " bytes exceeds the " +
                  std::to_string(store_detail::kMaxValueBytes) + "-byte limit");
    }
    std::string req;
    req.reserve(key.size() + value.size() + 16);
    store_detail::FrameWriter(req, store_detail::kSet).str(key).raw(value).finish();
    const Reply r = call("set(" + store_detail::printable(key) + ")", req, false);
    expect_ok(r, "set", key);
  }

  // Blocks until the key exists; TimeoutError naming the key and the store after the timeout.
  std::string get(const std::string& key) override {
    check_key(key);
    std::string req;
    store_detail::FrameWriter(req, store_detail::kGet).u64(wait_ms()).str(key).finish();
    const std::string what = "get(" + store_detail::printable(key) + ")";
    Reply r = call(what, req, true);
    if (r.status == store_detail::kMissing) {
      throw TimeoutError("store " + what + " timed out after " +
                         store_detail::seconds_text(timeout_) + " s: key " +
                         store_detail::printable(key) + " was not set at " + who_);
    }
    expect_ok(r, "get", key);
    return std::move(r.body);
  }

  // The value if the key exists now; never waits for it.
  std::optional<std::string> try_get(const std::string& key) override {
    check_key(key);
    std::string req;
    store_detail::FrameWriter(req, store_detail::kGet).u64(0).str(key).finish();
    Reply r = call("try_get(" + store_detail::printable(key) + ")", req, false);
    if (r.status == store_detail::kMissing) return std::nullopt;
    expect_ok(r, "try_get", key);
    return std::move(r.body);
  }

  // Atomic on the server; a missing key counts as 0. Returns the new value.
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    check_key(key);
    std::string req;
    store_detail::FrameWriter(req, store_detail::kAdd).str(key).i64(delta).finish();
    const Reply r = call("add(" + store_detail::printable(key) + ")", req, false);
    expect_ok(r, "add", key);
    if (r.body.size() != 8) malformed("add");
    return static_cast<std::int64_t>(store_detail::load_u64(r.body.data()));
  }

  // Until all keys exist; TimeoutError lists the ones still missing.
  void wait(const std::vector<std::string>& keys) override {
    if (keys.empty()) return;
    const Reply r = call("wait", wait_request(keys, wait_ms()), true);
    if (r.status == store_detail::kMissing) {
      const auto missing = decode_missing(r, "wait");
      throw TimeoutError("store wait for " + std::to_string(keys.size()) +
                         " key(s) timed out after " + store_detail::seconds_text(timeout_) +
                         " s at " + who_ + "; still missing: " + store_detail::key_list(missing));
    }
    expect_ok(r, "wait", keys.front());
  }

  // Do all keys exist now?
  bool check(const std::vector<std::string>& keys) {
    if (keys.empty()) return true;
    const Reply r = call("check", wait_request(keys, 0), false);
    if (r.status == store_detail::kMissing) return false;
    expect_ok(r, "check", keys.front());
    return true;
  }

  void erase(const std::string& key) {
    check_key(key);
    std::string req;
    store_detail::FrameWriter(req, store_detail::kErase).str(key).finish();
    const Reply r = call("erase(" + store_detail::printable(key) + ")", req, false);
    expect_ok(r, "erase", key);
  }

  double timeout_seconds() const { return timeout_; }
  std::optional<net::HostPort> address() const override { return addr_; }
  std::string describe() const override { return who_; }

 private:
  struct Reply {
    std::uint8_t status = 0;
    std::string body;
  };

  void check_key(const std::string& key) const {
    if (key.size() > store_detail::kMaxKeyBytes) {
      throw Error("store key " + store_detail::printable(key, 40) + " is " +
                  std::to_string(key.size()) + " bytes long; the limit is " +
                  std::to_string(store_detail::kMaxKeyBytes));
    }
  }

  std::uint64_t wait_ms() const {
    return static_cast<std::uint64_t>(std::clamp(std::ceil(timeout_ * 1000.0), 1.0,
                                                 static_cast<double>(store_detail::kMaxWaitMs)));
  }

  std::string wait_request(const std::vector<std::string>& keys, std::uint64_t wait_ms) const {
    std::size_t bytes = 32;
    for (const auto& k : keys) {
      check_key(k);
      bytes += 4 + k.size();
    }
    if (bytes > store_detail::kMaxFrameBytes) {
      throw Error("store wait/check on " + std::to_string(keys.size()) + " keys (" +
                  std::to_string(bytes) + " bytes) exceeds the " +
                  std::to_string(store_detail::kMaxFrameBytes) + "-byte request limit");
    }
    std::string req;
    req.reserve(bytes);
    store_detail::FrameWriter w(req, store_detail::kWait);
    w.u64(wait_ms).u32(static_cast<std::uint32_t>(keys.size()));
    for (const auto& k : keys) w.str(k);
    w.finish();
    return req;
  }

  // One request/response under the mutex. `waits`: the server may hold the reply up to the
  // timeout, so our own deadline gets a grace period on top — the server's MISSING answer must
  // arrive first, or the connection would fall out of step with a late reply still in flight.
  Reply call(const std::string& what, const std::string& request, bool waits) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!sock_.valid()) {
      throw PeerLostError(who_ + " is unreachable for " + what +
                          ": the connection was lost earlier (" + lost_ + ")");
    }
    const double grace = waits ? 1.0 + 0.05 * timeout_ : 0.0;
    const Deadline dl = Deadline::after(timeout_ + grace);
    Reply r;
    try {
      net::send_all(sock_.fd(), request.data(), request.size(), dl, who_);
      char head[4];
      net::recv_all(sock_.fd(), head, sizeof(head), dl, who_);
      const std::uint32_t len = store_detail::load_u32(head);
      if (len == 0 || len > store_detail::kMaxFrameBytes) {
        lose("reply length " + std::to_string(len) + " out of range");
        throw Error(who_ + " sent a malformed reply to " + what + " (length " +
                    std::to_string(len) + "); is it a kolo store?");
      }
      r.body.resize(len);
      net::recv_all(sock_.fd(), r.body.data(), len, dl, who_);
    } catch (const TimeoutError& e) {
      // The reply may still come: the stream is out of step, so this connection is finished.
      lose(e.what());
      throw TimeoutError("store " + what + " at " + who_ + " got no reply within " +
                         store_detail::seconds_text(timeout_ + grace) + " s: " + e.what());
    } catch (const PeerLostError& e) {
      lose(e.what());
      throw PeerLostError(who_ + " was lost during " + what + ": " + e.what());
    }
    r.status = static_cast<std::uint8_t>(r.body[0]);
    r.body.erase(0, 1);
    return r;
  }

  void lose(const std::string& why) {
    sock_.close();
    lost_ = why;
  }

  [[noreturn]] void malformed(const std::string& what) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      lose("malformed reply");
    }
    throw Error(who_ + " sent a malformed reply to " + what + "; is it a kolo store?");
  }

  void expect_ok(const Reply& r, const std::string& what, const std::string& key) {
    if (r.status == store_detail::kOk) return;
    if (r.status == store_detail::kFailed) throw Error(r.body + " (at " + who_ + ")");
    malformed(what + "(" + store_detail::printable(key) + ")");
  }

  std::vector<std::string> decode_missing(const Reply& r, const std::string& what) {
    store_detail::FrameReader rd(r.body);
    const std::uint32_t n = rd.u32();
    std::vector<std::string> keys;
    for (std::uint32_t i = 0; i < n && rd.ok(); ++i) {
      keys.emplace_back(rd.str(store_detail::kMaxKeyBytes));
    }
    if (!rd.at_end()) malformed(what);
    return keys;
  }

  net::HostPort addr_;
  std::string who_;  // "store host:port", for messages
  double timeout_;
  std::mutex mu_;     // one request/response at a time on the connection
  net::Socket sock_;  // invalid once lost
  std::string lost_;  // why it was lost
};

}  // namespace kolo
