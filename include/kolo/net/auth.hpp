// kolo/net/auth.hpp — mutual HMAC-SHA256 challenge-response on every TCP connection.
//
// Before any data, both ends prove they know the job's KOLO_SECRET without sending it:
//   server -> client : magic(8) | nonce_s(32)
//   client -> server : magic(8) | nonce_c(32) | hello(16) | HMAC(secret, "kolo-c" nonce_s nonce_c
//   hello) server -> client : HMAC(secret, "kolo-s" nonce_c nonce_s hello)
// `hello` carries what the client wants (purpose: store or data) and who it is (rank), bound
// into the MAC so a stranger cannot replay or splice it. Fresh random nonces on both sides make
// each proof single-use. A wrong proof, wrong magic, or a silent/garbage client is refused and the
// socket closed; the server never answers a client that failed, so a scanner learns nothing.
// HMAC and the nonces come from OpenSSL's libcrypto (a real, reviewed implementation).
//
// The job is bound into the key (job_key): a connection of another job that happens to share
// KOLO_SECRET fails the MAC. AcceptGate caps the handshakes a listener runs at once, so a flood
// of strangers cannot exhaust the process's descriptors.
#pragma once

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <sys/socket.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>

#include "kolo/core/deadline.hpp"
#include "kolo/core/error.hpp"
#include "kolo/net/socket.hpp"

namespace kolo::net {

class AuthError : public Error {
 public:
  explicit AuthError(const std::string& what) : Error(what, ErrorKind::generic) {}
};

// The server closed the connection before sending its challenge: it is at its cap of handshakes
// in progress (a flood); connect_authenticated tries again.
class ServerBusyError : public PeerLostError {
 public:
  explicit ServerBusyError(const std::string& what) : PeerLostError(what) {}
};

inline constexpr char kAuthMagic[8] = {'K', 'O', 'L', 'O', 'A', 'U', '1', '\0'};
inline constexpr std::size_t kNonceSize = 32;
inline constexpr std::size_t kMacSize = 32;
inline constexpr std::size_t kChallengeSize = 8 + kNonceSize;
inline constexpr std::size_t kResponseSize = 8 + kNonceSize + 16 + kMacSize;

// What a client says about itself, authenticated by the MAC.
struct Hello {
  std::uint32_t purpose = 0;  // see Purpose
  std::int32_t rank = -1;     // the client's rank, -1 for tools and launchers
  std::uint64_t job = 0;      // reserved: per-job tag (generation), 0 today
};

enum Purpose : std::uint32_t { kPurposeStore = 1, kPurposeData = 2 };

namespace detail {

inline void random_bytes(unsigned char* out, std::size_t n) {
  if (RAND_bytes(out, static_cast<int>(n)) != 1) throw Error("RAND_bytes failed");
}

inline std::array<unsigned char, kMacSize> hmac(std::string_view secret, std::string_view label,
                                                const unsigned char* n1, const unsigned char* n2,
                                                const unsigned char* hello16) {
  unsigned char msg[6 + 2 * kNonceSize + 16];
  std::memcpy(msg, label.data(), 6);
  std::memcpy(msg + 6, n1, kNonceSize);
  std::memcpy(msg + 6 + kNonceSize, n2, kNonceSize);
  std::memcpy(msg + 6 + 2 * kNonceSize, hello16, 16);
  std::array<unsigned char, kMacSize> out{};
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), msg, sizeof(msg),
            out.data(), &len) ||
      len != kMacSize) {
    throw Error("HMAC-SHA256 failed");
  }
  return out;
}

inline void encode_hello(const Hello& h, unsigned char* out16) {
  std::memcpy(out16, &h.purpose, 4);
  std::memcpy(out16 + 4, &h.rank, 4);
  std::memcpy(out16 + 8, &h.job, 8);
}

inline Hello decode_hello(const unsigned char* in16) {
  Hello h;
  std::memcpy(&h.purpose, in16, 4);
  std::memcpy(&h.rank, in16 + 4, 4);
  std::memcpy(&h.job, in16 + 8, 8);
  return h;
}

}  // namespace detail

// Server side, incremental: construct on accept (sends the challenge), call on_readable() when
// poll says the fd is readable until it returns true (authenticated; hello() is valid). Throws
// AuthError on a bad proof, bad magic, or EOF. Lets a listener serve many handshakes at once
// so a silent stranger cannot stall the others.
class ServerHandshake {
 public:
  ServerHandshake(int fd, std::string secret) : fd_(fd), secret_(std::move(secret)) {
    detail::random_bytes(nonce_s_.data(), kNonceSize);
    unsigned char challenge[kChallengeSize];
    std::memcpy(challenge, kAuthMagic, 8);
    std::memcpy(challenge + 8, nonce_s_.data(), kNonceSize);
    // A fresh socket's send buffer always has room for 40 bytes.
    const ssize_t k = ::send(fd_, challenge, sizeof(challenge), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k != static_cast<ssize_t>(sizeof(challenge))) throw AuthError("cannot send challenge");
  }

  int fd() const { return fd_; }
  const Hello& hello() const { return hello_; }

  bool on_readable() {
    while (got_ < kResponseSize) {
      const ssize_t k = ::recv(fd_, buf_.data() + got_, kResponseSize - got_, MSG_DONTWAIT);
      if (k > 0) {
        got_ += static_cast<std::size_t>(k);
        continue;
      }
      if (k == 0) throw AuthError("client closed the connection during authentication");
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
      throw AuthError("receive failed during authentication: " + errno_text(errno));
    }
    if (std::memcmp(buf_.data(), kAuthMagic, 8) != 0) {
      throw AuthError("client did not speak the kolo authentication protocol");
    }
    const unsigned char* nonce_c = buf_.data() + 8;
    const unsigned char* hello16 = nonce_c + kNonceSize;
    const unsigned char* mac = hello16 + 16;
    const auto expect = detail::hmac(secret_, "kolo-c", nonce_s_.data(), nonce_c, hello16);
    if (CRYPTO_memcmp(expect.data(), mac, kMacSize) != 0) {
      throw AuthError("client failed to prove the job secret (wrong or missing KOLO_SECRET)");
    }
    hello_ = detail::decode_hello(hello16);
    const auto proof = detail::hmac(secret_, "kolo-s", nonce_c, nonce_s_.data(), hello16);
    const ssize_t k =
        ::send(fd_, proof.data(), proof.size(), MSG_NOSIGNAL | MSG_DONTWAIT);  // fits: 32 bytes
    if (k != static_cast<ssize_t>(proof.size())) throw AuthError("cannot send server proof");
    return true;
  }

 private:
  int fd_;
  std::string secret_;
  std::array<unsigned char, kNonceSize> nonce_s_{};
  std::array<unsigned char, kResponseSize> buf_{};
  std::size_t got_ = 0;
  Hello hello_{};
};

// Server side, blocking: for code that serves one connection per thread (the store).
inline Hello authenticate_server(int fd, std::string_view secret, const Deadline& dl) {
  ServerHandshake hs(fd, std::string(secret));
  for (;;) {
    if (hs.on_readable()) return hs.hello();
    if (poll_one(fd, POLLIN, dl) == 0) {
      throw AuthError("client did not authenticate before the deadline");
    }
  }
}

// Client side: proves the secret and checks the server's proof. `who` names the server.
inline void authenticate_client(int fd, std::string_view secret, const Hello& hello,
                                const Deadline& dl, std::string_view who) {
  unsigned char challenge[kChallengeSize];
  try {
    recv_all(fd, challenge, sizeof(challenge), dl, who);
  } catch (const PeerLostError& e) {
    throw ServerBusyError(std::string(who) +
                          " closed the connection before its challenge (busy "
                          "with other handshakes?): " +
                          e.what());
  }
  if (std::memcmp(challenge, kAuthMagic, 8) != 0) {
    throw AuthError(std::string(who) + " is not a kolo endpoint (bad authentication magic)");
  }
  unsigned char response[kResponseSize];
  std::memcpy(response, kAuthMagic, 8);
  unsigned char* nonce_c = response + 8;
  detail::random_bytes(nonce_c, kNonceSize);
  unsigned char* hello16 = nonce_c + kNonceSize;
  detail::encode_hello(hello, hello16);
  const auto mac = detail::hmac(secret, "kolo-c", challenge + 8, nonce_c, hello16);
  std::memcpy(hello16 + 16, mac.data(), kMacSize);
  send_all(fd, response, sizeof(response), dl, who);
  unsigned char proof[kMacSize];
  try {
    recv_all(fd, proof, sizeof(proof), dl, who);
  } catch (const PeerLostError&) {
    throw AuthError(std::string(who) +
                    " refused our authentication: KOLO_SECRET differs from the job's");
  }
  const auto expect = detail::hmac(secret, "kolo-s", nonce_c, challenge + 8, hello16);
  if (CRYPTO_memcmp(expect.data(), proof, kMacSize) != 0) {
    throw AuthError(std::string(who) + " failed to prove the job secret (not part of this job)");
  }
}

namespace detail {
// Lower-case hex of n bytes (job keys and launcher secrets).
inline std::string to_hex(const unsigned char* p, std::size_t n) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string s;
  s.reserve(2 * n);
  for (std::size_t i = 0; i < n; ++i) {
    s.push_back(hex[p[i] >> 4]);
    s.push_back(hex[p[i] & 15]);
  }
  return s;
}
}  // namespace detail

// The key every handshake of one job uses: HMAC-SHA256(secret, "kolo-job:" job), hex. A client
// of another job (another store, another communicator) that shares the secret fails the MAC and
// is refused like a stranger. An empty job leaves the secret as it is (tools that know only the
// secret, a store without a job id).
inline std::string job_key(std::string_view secret, std::string_view job) {
  if (job.empty()) return std::string(secret);
  const std::string msg = "kolo-job:" + std::string(job);
  unsigned char out[kMacSize];
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
            reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &len) ||
      len != kMacSize) {
    throw Error("HMAC-SHA256 failed");
  }
  return detail::to_hex(out, sizeof(out));
}

// At most this many unauthenticated handshakes in progress per listener (the store, a rank's
// data listener during setup). A real client finishes its handshake within a round trip.
inline constexpr std::size_t kMaxPendingHandshakes = 64;
// A handshake in progress this long may be closed to make room for a new connection.
inline constexpr double kEvictableAfterSeconds = 0.5;

// Accepting for a listener that runs handshakes concurrently (non-blocking listener):
//   - accept() takes one connection (CLOEXEC, non-blocking), or returns -1 when none waits or
//     descriptors ran out; then the gate pauses 100 ms, events() is 0 meanwhile so the caller
//     does not spin on a listener that stays readable;
//   - admit(pending, oldest) says what to do with it once `pending` handshakes are in progress,
//     the oldest since `oldest`: below the cap start it; at the cap close the oldest one if it
//     has had kEvictableAfterSeconds (a silent stranger: a real client answers in a round trip)
//     and start the new one, else close the new one at once, before its challenge — the client
//     sees the server busy and retries (connect_authenticated). Strangers never hold more than
//     the cap in descriptors, and a burst of them is pushed out within half a second.
class AcceptGate {
 public:
  using Clock = std::chrono::steady_clock;
  enum class Admit { start, evict_oldest, refuse };

  explicit AcceptGate(std::size_t cap = kMaxPendingHandshakes) : cap_(cap < 1 ? 1 : cap) {}

  bool paused() const { return Clock::now() < paused_until_; }
  short events() const { return paused() ? 0 : POLLIN; }

  Admit admit(std::size_t pending, Clock::time_point oldest) {
    if (pending < cap_) return Admit::start;
    if (Clock::now() - oldest >= std::chrono::duration<double>(kEvictableAfterSeconds)) {
      ++evicted_;
      return Admit::evict_oldest;
    }
    ++refused_;
    return Admit::refuse;
  }
  // Out of descriptors (accept() just paused) with handshakes in progress, the oldest since
  // `oldest`: true if that one may be closed to free a descriptor (it has had
  // kEvictableAfterSeconds); the pause is lifted then.
  bool reclaim(std::size_t pending, Clock::time_point oldest) {
    if (!paused() || pending == 0 ||
        Clock::now() - oldest < std::chrono::duration<double>(kEvictableAfterSeconds)) {
      return false;
    }
    paused_until_ = {};
    ++evicted_;
    return true;
  }
  std::uint64_t evicted() const { return evicted_; }
  std::uint64_t refused() const { return refused_; }

  int accept(int lfd, sockaddr_storage* ss = nullptr) {
    if (paused()) return -1;
    for (;;) {
      socklen_t len = sizeof(sockaddr_storage);
      const int fd = ::accept4(lfd, reinterpret_cast<sockaddr*>(ss), ss ? &len : nullptr,
                               SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd >= 0) return fd;
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        // Out of descriptors or memory: the listener stays readable; existing clients go on.
        last_errno_ = errno;
        paused_until_ = Clock::now() + std::chrono::milliseconds(100);
      }
      return -1;
    }
  }
  int last_errno() const { return last_errno_; }

 private:
  std::size_t cap_;
  std::uint64_t evicted_ = 0;
  std::uint64_t refused_ = 0;
  int last_errno_ = 0;
  Clock::time_point paused_until_{};
};

// Connects to host:port and authenticates as `hello`, retrying (with a short back-off) while the
// server closes new connections before its challenge (busy: at its handshake cap), until `dl`.
inline Socket connect_authenticated(const std::string& host, std::uint16_t port,
                                    std::string_view secret, const Hello& hello, const Deadline& dl,
                                    std::string_view who) {
  int backoff_ms = 10;
  for (;;) {
    Socket s = connect_tcp(host, port, dl, who);
    try {
      authenticate_client(s.fd(), secret, hello, dl, who);
      return s;
    } catch (const ServerBusyError&) {
      if (dl.expired()) throw;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(backoff_ms, dl.remaining_ms())));
    backoff_ms = std::min(backoff_ms * 2, 200);
  }
}

// A fresh random secret (hex), for launchers.
inline std::string generate_secret() {
  unsigned char raw[32];
  detail::random_bytes(raw, sizeof(raw));
  return detail::to_hex(raw, sizeof(raw));
}

}  // namespace kolo::net
