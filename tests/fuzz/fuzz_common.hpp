// Helpers shared by kolo's libFuzzer targets (tests/fuzz): reading structured values out of the
// fuzzer's bytes, checks that abort (a crash libFuzzer records) instead of throwing, and raw
// socket I/O with deadlines for the harnesses that talk to a real server over TCP.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

namespace kolo_fuzz {

// A finding that is not a sanitizer report: print it and abort, so libFuzzer saves the input.
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "kolo fuzz check failed: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

#define KOLO_FUZZ_CHECK(cond, msg)                                   \
  do {                                                               \
    if (!(cond)) ::kolo_fuzz::fail(std::string(#cond ": ") + (msg)); \
  } while (0)

// Consumes the fuzzer's bytes front to back; reads past the end yield zeros.
class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : p_(data), left_(size) {}
  bool empty() const { return left_ == 0; }
  std::size_t left() const { return left_; }
  std::uint8_t u8() {
    if (left_ == 0) return 0;
    --left_;
    return *p_++;
  }
  std::uint16_t u16() { return static_cast<std::uint16_t>(u8() | (u8() << 8)); }
  std::uint32_t u32() { return static_cast<std::uint32_t>(u16()) | (std::uint32_t{u16()} << 16); }
  // Up to n bytes (fewer at the end).
  std::string_view bytes(std::size_t n) {
    n = n < left_ ? n : left_;
    const std::string_view v(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    left_ -= n;
    return v;
  }
  std::string_view rest() { return bytes(left_); }

 private:
  const std::uint8_t* p_;
  std::size_t left_;
};

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Reads until EOF (or an error such as a reset) and appends everything to `out`; false if the
// peer neither closed nor errored within `seconds` (a hang: the caller reports it).
inline bool read_until_eof(int fd, std::string& out, double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  char buf[65536];
  for (;;) {
    const ssize_t k = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (k > 0) {
      out.append(buf, static_cast<std::size_t>(k));
      continue;
    }
    if (k == 0) return true;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return true;  // reset counts as closed
    const double left = seconds - seconds_since(t0);
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(left * 1000) + 1);
  }
}

// Sends what the peer takes; false once it has closed or reset the connection.
inline bool send_some(int fd, std::string_view data, double seconds) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!data.empty()) {
    const ssize_t k = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      data.remove_prefix(static_cast<std::size_t>(k));
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const double left = seconds - seconds_since(t0);
      if (left <= 0) return false;
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, static_cast<int>(left * 1000) + 1);
      continue;
    }
    return false;
  }
  return true;
}

}  // namespace kolo_fuzz
