// libFuzzer target: the rendezvous store's server (topology/store.hpp), through real sockets.
//
// Each input gets a fresh StoreServer on a loopback port. The first byte chooses how the bytes
// that follow reach it:
//   bit 0 clear  an authenticated client (the real HMAC handshake with the job secret) sends
//                the rest as requests: the request parser, SET/GET/ADD/WAIT/ERASE/CAS, parked
//                waiters, reply framing;
//   bit 0 set    a stranger sends the rest instead of a handshake response (the incremental
//                ServerHandshake parser);
//   bit 1        the rest is split in two (a 16-bit length first) and sent over two
//                connections, so one client's SET can wake the other's parked GET/WAIT;
//   bit 2        the authenticated client says it wants the data plane, not the store.
// The client then half-closes and reads until the server closes. Checks, beyond the sanitizers:
// the server closes every connection in bounded time (no hang), replies are well-formed frames
// (length in range, a known status), nothing but the challenge ever reaches a stranger or a
// client that authenticated for the wrong purpose, and afterwards a well-behaved client still
// gets served (the job is unaffected).
#include <sys/socket.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <kolo/net/auth.hpp>
#include <kolo/net/socket.hpp>
#include <kolo/topology/store.hpp>

#include "fuzz_common.hpp"

namespace {

const std::string kSecret = "kolo-fuzz-store-secret-0123456789";
constexpr double kSeconds = 8.0;  // far above what any input needs; below libFuzzer's -timeout

kolo::net::Socket connect_to(std::uint16_t port) {
  return kolo::net::connect_tcp("127.0.0.1", port, kolo::Deadline::after(kSeconds), "fuzz store");
}

// Checks that `replies` is a sequence of whole, well-formed reply frames.
void check_replies(std::string_view replies) {
  namespace sd = kolo::store_detail;
  while (!replies.empty()) {
    KOLO_FUZZ_CHECK(replies.size() >= 5, "a truncated reply header");
    const std::uint32_t len = sd::load_u32(replies.data());
    KOLO_FUZZ_CHECK(len >= 1 && len <= sd::kMaxFrameBytes, "reply length out of range");
    KOLO_FUZZ_CHECK(replies.size() >= 4 + std::size_t{len}, "a truncated reply");
    const auto status = static_cast<std::uint8_t>(replies[4]);
    KOLO_FUZZ_CHECK(status == sd::kOk || status == sd::kMissing || status == sd::kFailed,
                    "unknown reply status " + std::to_string(status));
    if (status == sd::kMissing) {
      sd::FrameReader r(replies.substr(5, len - 1));
      const std::uint32_t n = r.u32();
      for (std::uint32_t i = 0; i < n && r.ok(); ++i) (void)r.str(sd::kMaxKeyBytes);
      KOLO_FUZZ_CHECK(r.at_end(), "a malformed MISSING reply");
    }
    replies.remove_prefix(4 + std::size_t{len});
  }
}

struct Client {
  kolo::net::Socket sock;
  std::string stream;
  std::string got;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  kolo_fuzz::Input in(data, size);
  const std::uint8_t mode = in.u8();
  const bool stranger = (mode & 1) != 0;
  const bool two = (mode & 2) != 0;
  const bool wrong_purpose = (mode & 4) != 0;

  kolo::StoreServer::Options opts;
  opts.auth_timeout_seconds = kSeconds;
  auto server =
      std::make_unique<kolo::StoreServer>(kolo::net::listen_tcp("127.0.0.1", 0), kSecret, opts);
  const std::uint16_t port = server->port();

  Client clients[2];
  const int n = two ? 2 : 1;
  if (two) {
    const std::size_t first = in.u16();
    clients[0].stream = std::string(in.bytes(first));
    clients[1].stream = std::string(in.rest());
  } else {
    clients[0].stream = std::string(in.rest());
  }

  // Connect (and authenticate, or read the challenge as a stranger) first, then send.
  for (int i = 0; i < n; ++i) {
    Client& c = clients[i];
    c.sock = connect_to(port);
    const kolo::Deadline dl = kolo::Deadline::after(kSeconds);
    if (stranger) {
      char challenge[kolo::net::kChallengeSize];
      kolo::net::recv_all(c.sock.fd(), challenge, sizeof(challenge), dl, "fuzz store");
      KOLO_FUZZ_CHECK(std::memcmp(challenge, kolo::net::kAuthMagic, 8) == 0, "bad challenge");
    } else {
      const kolo::net::Hello hello{
          wrong_purpose ? kolo::net::kPurposeData : kolo::net::kPurposeStore, i, 0};
      kolo::net::authenticate_client(c.sock.fd(), kSecret, hello, dl, "fuzz store");
    }
  }
  // Everything is sent before either client half-closes, so one client's SET can still wake
  // the other's parked GET. The server may close mid-stream (a malformed request): fine.
  for (int i = 0; i < n; ++i) {
    (void)kolo_fuzz::send_some(clients[i].sock.fd(), clients[i].stream, kSeconds);
  }
  for (int i = 0; i < n; ++i) ::shutdown(clients[i].sock.fd(), SHUT_WR);
  for (int i = 0; i < n; ++i) {
    Client& c = clients[i];
    KOLO_FUZZ_CHECK(kolo_fuzz::read_until_eof(c.sock.fd(), c.got, kSeconds),
                    "the store did not close a connection whose client had finished");
    if (stranger || wrong_purpose) {
      KOLO_FUZZ_CHECK(c.got.empty(), "the store answered a client it must not serve (" +
                                         std::to_string(c.got.size()) + " bytes)");
    } else {
      check_replies(c.got);
    }
    c.sock.close();
  }

  // The job is unaffected: a well-behaved client is served as usual.
  {
    kolo::StoreClient ok(kolo::net::HostPort{"127.0.0.1", port}, kSecret, 0, kSeconds);
    ok.set("fuzz/health", "ok");
    KOLO_FUZZ_CHECK(ok.get("fuzz/health") == "ok", "the store lost a value after the input");
  }
  server->stop();
  return 0;
}
