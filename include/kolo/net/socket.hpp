// kolo/net/socket.hpp — the POSIX TCP plumbing under the store and the TCP transport.
//
// Every blocking call takes a Deadline and waits with poll(), so nothing here can hang; closed
// or reset connections become PeerLostError, passed deadlines TimeoutError, and the `who`
// argument ("rank 3", "store 127.0.0.1:29500") goes into the message so the user knows which
// connection failed.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "kolo/core/deadline.hpp"
#include "kolo/core/error.hpp"

namespace kolo::net {

inline std::string errno_text(int err) {
  return std::string(std::strerror(err));
}

// Owns one file descriptor; move-only.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) noexcept : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Socket& operator=(Socket&& o) noexcept {
    if (this != &o) {
      close();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { close(); }

  int fd() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  int release() noexcept { return std::exchange(fd_, -1); }
  void close() noexcept {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  }

 private:
  int fd_ = -1;
};

struct HostPort {
  std::string host;
  std::uint16_t port = 0;
  std::string str() const { return host + ":" + std::to_string(port); }
};

// Parses "host:port" (or "[v6]:port"); `what` names the source in the error, e.g. "KOLO_STORE".
inline HostPort parse_host_port(std::string_view s, std::string_view what) {
  auto fail = [&](const char* why) -> HostPort {
    throw ConfigError(std::string(what) + "=" + std::string(s) + " is not host:port (" + why + ")");
  };
  const auto colon = s.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return fail("missing ':'");
  std::string_view host = s.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string_view port = s.substr(colon + 1);
  unsigned value = 0;
  auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ec != std::errc() || ptr != port.data() + port.size() || port.empty()) {
    return fail("port is not a number");
  }
  if (value == 0 || value > 65535) return fail("port out of range 1..65535");
  return HostPort{std::string(host), static_cast<std::uint16_t>(value)};
}

// Is `h` usable as an address to advertise: a numeric IPv4 or IPv6 address (brackets allowed)
// or a host name of RFC 1123 labels whose last label is not all digits (getaddrinfo would read
// "1.5" as the shorthand IPv4 address 1.0.0.5, which nobody means)?
inline bool valid_host(std::string_view h) {
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (h.empty() || h.size() > 253) return false;
  const std::string s(h);
  unsigned char buf[sizeof(in6_addr)];
  if (::inet_pton(AF_INET, s.c_str(), buf) == 1 || ::inet_pton(AF_INET6, s.c_str(), buf) == 1) {
    return true;
  }
  if (h.back() == '.') h.remove_suffix(1);
  if (h.empty()) return false;
  bool last_all_digits = false;
  while (!h.empty()) {
    const auto dot = h.find('.');
    const std::string_view label = h.substr(0, dot);
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') {
      return false;
    }
    last_all_digits = true;
    for (char c : label) {
      const bool digit = c >= '0' && c <= '9';
      const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
      if (!digit && !alpha && c != '-') return false;
      last_all_digits = last_all_digits && digit;
    }
    if (dot == std::string_view::npos) break;
    h.remove_prefix(dot + 1);
    if (h.empty()) return false;  // "a..b" or a second trailing dot
  }
  return !last_all_digits;
}

inline void set_nonblocking(int fd, bool on = true) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK)) < 0) {
    throw Error("fcntl(O_NONBLOCK) failed: " + errno_text(errno));
  }
}

inline void set_cloexec(int fd) {
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
}

inline void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Resolves host (name or numeric, v4 or v6) to socket addresses; throws naming the host.
struct AddrList {
  addrinfo* head = nullptr;
  AddrList(const std::string& host, std::uint16_t port, bool passive) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    const std::string p = std::to_string(port);
    const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), p.c_str(), &hints, &head);
    if (rc != 0) {
      throw ConfigError("cannot resolve host '" + host + "': " + ::gai_strerror(rc));
    }
  }
  AddrList(const AddrList&) = delete;
  AddrList& operator=(const AddrList&) = delete;
  ~AddrList() {
    if (head) ::freeaddrinfo(head);
  }
};

// A listening TCP socket on bind_host:port (port 0 = any free port; "" or "0.0.0.0" = all IPv4).
inline Socket listen_tcp(const std::string& bind_host, std::uint16_t port, int backlog = 256) {
  const std::string host = bind_host.empty() ? std::string("0.0.0.0") : bind_host;
  AddrList addrs(host, port, true);
  int last_err = 0;
  for (addrinfo* ai = addrs.head; ai; ai = ai->ai_next) {
    Socket s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!s.valid()) {
      last_err = errno;
      continue;
    }
    int one = 1;
    ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(s.fd(), ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(s.fd(), backlog) == 0) {
      return s;
    }
    last_err = errno;
  }
  throw Error("cannot listen on " + host + ":" + std::to_string(port) + ": " +
              errno_text(last_err));
}

inline std::uint16_t local_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return 0;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return 0;
}

// The numeric address of this end of a connected socket: the interface that reaches the peer,
// which is the address other ranks can use to reach us (how Gloo and torch pick an address).
inline std::string local_ip(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "127.0.0.1";
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr, buf, sizeof(buf));
  } else if (ss.ss_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr, buf, sizeof(buf));
  }
  return buf[0] ? std::string(buf) : std::string("127.0.0.1");
}

// The local address this host would use to reach host:port (a connected UDP socket sends
// nothing; the kernel just picks the route). Loopback when the route cannot be determined.
inline std::string route_ip_to(const std::string& host, std::uint16_t port) {
  try {
    AddrList addrs(host, port, false);
    for (addrinfo* ai = addrs.head; ai; ai = ai->ai_next) {
      Socket s(::socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
      if (s.valid() && ::connect(s.fd(), ai->ai_addr, ai->ai_addrlen) == 0) return local_ip(s.fd());
    }
  } catch (const Error&) {
  }
  return "127.0.0.1";
}

// Waits for `events` on fd until the deadline; returns revents (0 on timeout). EINTR retried.
inline short poll_one(int fd, short events, const Deadline& dl, int cap_ms = 1 << 30) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, dl.remaining_ms(cap_ms));
    if (rc > 0) return p.revents;
    if (rc == 0) return 0;
    if (errno != EINTR) throw Error("poll failed: " + errno_text(errno));
  }
}

// Connects, retrying refused/unreachable attempts with backoff until the deadline (the peer may
// not be listening yet). The returned socket is blocking, TCP_NODELAY, close-on-exec.
inline Socket connect_tcp(const std::string& host, std::uint16_t port, const Deadline& dl,
                          std::string_view who) {
  int backoff_ms = 5;
  std::string last = "no address";
  for (;;) {
    AddrList addrs(host, port, false);
    for (addrinfo* ai = addrs.head; ai; ai = ai->ai_next) {
      Socket s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
      if (!s.valid()) continue;
      set_nonblocking(s.fd(), true);
      int rc = ::connect(s.fd(), ai->ai_addr, ai->ai_addrlen);
      if (rc != 0 && errno == EINPROGRESS) {
        const short ev = poll_one(s.fd(), POLLOUT, dl);
        if (ev == 0) break;  // deadline: fall through to the timeout below
        int err = 0;
        socklen_t len = sizeof(err);
        ::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      }
      if (rc == 0) {
        set_nonblocking(s.fd(), false);
        set_nodelay(s.fd());
        return s;
      }
      last = errno_text(errno);
    }
    if (dl.expired()) {
      throw TimeoutError("cannot connect to " + std::string(who) + " at " + host + ":" +
                         std::to_string(port) + " before the deadline (last error: " + last + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(backoff_ms, dl.remaining_ms())));
    backoff_ms = std::min(backoff_ms * 2, 200);
  }
}

// Accepts one connection before the deadline, or returns an invalid Socket on timeout.
inline Socket accept_one(int listen_fd, const Deadline& dl) {
  for (;;) {
    const short ev = poll_one(listen_fd, POLLIN, dl);
    if (ev == 0) return Socket();
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) {
      set_nodelay(fd);
      return Socket(fd);
    }
    if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
      throw Error("accept failed: " + errno_text(errno));
    }
  }
}

// Sends exactly n bytes (blocking or non-blocking fd) before the deadline.
inline void send_all(int fd, const void* data, std::size_t n, const Deadline& dl,
                     std::string_view who) {
  auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= static_cast<std::size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const short ev = poll_one(fd, POLLOUT, dl);
      if (ev == 0) throw TimeoutError("timed out sending to " + std::string(who));
      continue;
    }
    throw PeerLostError("connection to " + std::string(who) +
                        " lost while sending: " + errno_text(errno));
  }
}

// Receives exactly n bytes before the deadline; EOF is PeerLostError.
inline void recv_all(int fd, void* data, std::size_t n, const Deadline& dl, std::string_view who) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= static_cast<std::size_t>(k);
      continue;
    }
    if (k == 0) throw PeerLostError("connection to " + std::string(who) + " closed by the peer");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      const short ev = poll_one(fd, POLLIN, dl);
      if (ev == 0) throw TimeoutError("timed out receiving from " + std::string(who));
      continue;
    }
    throw PeerLostError("connection to " + std::string(who) +
                        " lost while receiving: " + errno_text(errno));
  }
}

}  // namespace kolo::net
