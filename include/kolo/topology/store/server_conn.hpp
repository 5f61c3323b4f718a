// kolo/topology/store/server_conn.hpp — the store server's connections: accepting within the
// handshake cap (evicting the oldest stranger or refusing the newcomer), advancing handshakes,
// non-blocking reads and writes within their per-turn budget and high-water marks, and cutting a
// connection's input into request frames (store/protocol.hpp) for StoreServer::handle. Definitions
// of members declared in store/server.hpp (which includes this file at its end).
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

#include "kolo/topology/store/server.hpp"

namespace kolo {

inline void StoreServer::accept_new() {
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

inline bool StoreServer::make_room() {
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

inline StoreServer::Evict StoreServer::evict_oldest_handshake() {
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

inline void StoreServer::on_events(Id id, short revents) {
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

inline void StoreServer::advance_handshake(Conn& c) {
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

inline bool StoreServer::read_input(Conn& c) {
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

inline bool StoreServer::flush(Conn& c) {
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

inline void StoreServer::process_input(Conn& c) {
  while (!c.dead && !c.pending && c.unsent() < store_detail::kOutputHighWater && c.unread() >= 4) {
    const std::string_view buffered(c.in.data() + c.in_off, c.unread());
    const store_detail::FrameHead head = store_detail::peek_frame(buffered);
    const std::uint32_t len = head.len;
    if (head.state == store_detail::FrameState::bad_length) {
      drop(c, "frame length " + std::to_string(len) + " is outside 1.." +
                  std::to_string(store_detail::kMaxFrameBytes));
      return;
    }
    if (head.state == store_detail::FrameState::incomplete) {
      c.in.reserve(c.in_off + 4 + len);  // one allocation for a large value
      break;
    }
    const std::string_view body = buffered.substr(4, len);
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

}  // namespace kolo
