// A peer that knows the job secret but breaks the TCP framing of the mesh (mesh.hpp): a DATA
// frame longer than the message it belongs to, a length field claiming 4 GiB, an oversized
// ABORT, an unknown frame type, a malformed BEGIN, a frame cut off by a hang-up. The receiving
// rank must fail that receive with a clear error within the deadline — never hang, never spin,
// never allocate what a length field claims.
//
// Rank 0 is a real MeshTransport (tcp_only) in this process; rank 1 is a forked child that does
// what MeshTransport's setup does (store rendezvous, connect, authenticate) by hand and then
// writes the hostile bytes. Forked before any thread exists, so the child is an ordinary
// single-threaded process; the store starts in the parent after the fork.
#include "harness.hpp"
#include "kolo/topology/bootstrap.hpp"
#include "kolo/topology/store.hpp"
#include "kolo/topology/topology.hpp"
#include "kolo/transport/mesh.hpp"
#include "kolo/transport/mesh/frame_codec.hpp"

using namespace kolo_faults;

namespace {

using kolo::net::Socket;

std::string frame_header(std::uint32_t type, std::uint32_t len) {
  std::string s(sizeof(kolo::detail::FrameHeader), '\0');
  const kolo::detail::FrameHeader h{type, len};
  std::memcpy(s.data(), &h, sizeof(h));
  return s;
}

std::string begin_frame(std::uint64_t total, const kolo::Signature& sig) {
  kolo::detail::BeginBody b{total, sig};
  std::string s = frame_header(kolo::detail::kFrameBegin, sizeof(b));
  s.append(reinterpret_cast<const char*>(&b), sizeof(b));
  return s;
}

kolo::Topology topology(int rank, std::uint16_t store_port, const std::string& secret) {
  kolo::Topology t;
  t.rank = rank;
  t.size = 2;
  t.store = kolo::net::HostPort{"127.0.0.1", store_port};
  t.secret = secret;
  t.timeout_seconds = 10;
  t.host_key = "host-" + std::to_string(rank);
  return t;
}

// The child: rank 1 by hand, then `bytes` on the data connection, then (unless `hang_up`) it
// keeps the connection open until the parent is done (stdin closes).
[[noreturn]] void fake_rank1(std::uint16_t store_port, const std::string& secret,
                             const std::string& bytes, bool hang_up) {
  try {
    kolo::Bootstrap boot(topology(1, store_port, secret));
    const auto infos = boot.allgather("mesh", std::to_string(::getpid()) + "|-");
    boot.barrier("shm-created");
    const std::string& info = infos[0];
    const auto hp = kolo::net::parse_host_port(info.substr(info.find('|') + 1), "rank 0");
    const auto dl = kolo::Deadline::after(10);
    Socket s = kolo::net::connect_tcp(hp.host, hp.port, dl, "rank 0");
    // Data connections prove the secret bound to the communicator's job token.
    kolo::net::authenticate_client(s.fd(), kolo::net::job_key(secret, boot.job_token()),
                                   {kolo::net::kPurposeData, 1, 0}, dl, "rank 0");
    boot.barrier("mesh-ready");
    try {
      kolo::net::send_all(s.fd(), bytes.data(), bytes.size(), kolo::Deadline::after(10), "rank 0");
    } catch (const kolo::Error&) {
      // rank 0 refused the rest: what it should do
    }
    if (!hang_up) {
      char c;
      [[maybe_unused]] const ssize_t k = ::read(0, &c, 1);  // until the parent closes our stdin
    }
    ::_exit(0);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fake rank 1: %s\n", e.what());
    ::_exit(1);
  }
}

struct Outcome {
  std::string kind;  // error kind name, or "none"
  std::string what;
  double seconds = 0;
};

// Rank 0 posts a receive of `bytes` from rank 1 and waits for it; the child sends `hostile`.
Outcome receive_from_hostile_peer(const std::string& hostile, bool hang_up, std::size_t bytes) {
  const std::string secret = kolo::net::generate_secret();
  Socket listener = kolo::net::listen_tcp("127.0.0.1", 0);
  const std::uint16_t port = kolo::net::local_port(listener.fd());
  int to_child[2];
  REQUIRE(::pipe(to_child) == 0);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::close(to_child[1]);
    ::dup2(to_child[0], 0);
    listener.close();
    fake_rank1(port, secret, hostile, hang_up);
  }
  ::close(to_child[0]);
  Outcome out;
  {
    kolo::StoreServer store(std::move(listener), secret);
    kolo::Bootstrap boot(topology(0, port, secret));
    kolo::MeshTransport t(boot, kolo::RouteMode::tcp_only, kolo::MeshOptions{});
    std::vector<std::byte> buf(bytes);
    const auto start = WallClock::now();
    try {
      const auto req = t.irecv(1, buf.data(), buf.size(), kolo::Signature{});
      t.wait(req, kolo::Deadline::after(5));
      out.kind = "none";
    } catch (const kolo::Error& e) {
      out.kind = kolo::error_kind_name(e.kind());
      out.what = e.what();
    }
    out.seconds = seconds_between(start, WallClock::now());
    // Let the child go before the transport is destroyed: after an error it drains its sockets
    // until the peer closes (for up to a second).
    ::close(to_child[1]);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK_MESSAGE((WIFEXITED(status) && WEXITSTATUS(status) == 0), "the fake rank 1 failed");
  return out;
}

}  // namespace

TEST_CASE("hostile frames from an authenticated peer fail the receive, in time") {
  const kolo::Signature sig{};
  const std::string mib = random_bytes(1 << 20);
  struct Case {
    const char* name;
    std::string bytes;
    bool hang_up;
    const char* kind;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {"DATA frame longer than the message",
       begin_frame(1000, sig) + frame_header(kolo::detail::kFrameData, 1 << 20) + mib, false,
       "Error", "DATA frame of 1048576 bytes, 1000 left"},
      {"DATA frame claiming 4 GiB",
       begin_frame(1000, sig) + frame_header(kolo::detail::kFrameData, 0xffffffffu) + mib, false,
       "Error", "protocol error from rank 1"},
      {"ABORT frame claiming 4 GiB", frame_header(kolo::detail::kFrameAbort, 0xffffffffu) + mib,
       false, "Error", "protocol error from rank 1"},
      {"unknown frame type", frame_header(0x12345678u, 16) + mib, false, "Error", "bad frame type"},
      {"BEGIN of the wrong size", frame_header(kolo::detail::kFrameBegin, 1 << 20) + mib, false,
       "Error", "bad BEGIN"},
      {"DATA before BEGIN", frame_header(kolo::detail::kFrameData, 1000) + mib, false, "Error",
       "DATA before BEGIN"},
      {"frame cut short by a hang-up",
       begin_frame(1000, sig) + frame_header(kolo::detail::kFrameData, 1000) + "0123456789", true,
       "PeerLostError", "rank 1"},
      {"garbage where a frame header belongs", random_bytes(4096), false, "Error",
       "protocol error from rank 1"},
  };
  const long rss_before = rss_kib(::getpid());
  for (const auto& c : cases) {
    CAPTURE(c.name);
    const Outcome o = receive_from_hostile_peer(c.bytes, c.hang_up, 1000);
    INFO(o.kind << ": " << o.what);
    CHECK(o.kind == c.kind);
    CHECK(contains(o.what, c.needle));
    CHECK(o.seconds < 5);  // an error at once, not the deadline
  }
  const long rss_after = rss_kib(::getpid());
  MESSAGE("driver RSS " << rss_before << " KiB before, " << rss_after << " KiB after");
  CHECK(rss_after - rss_before < 64 * 1024);
}
