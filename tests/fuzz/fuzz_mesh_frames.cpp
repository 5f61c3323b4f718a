// libFuzzer target: the TCP wire-frame parser of MeshTransport (transport/mesh.hpp: tcp_recv,
// tcp_fill, BEGIN/DATA/ABORT frames), driven through a real, authenticated connection.
//
// Each input builds a fresh two-rank TCP job: rank 0 is a real MeshTransport (Bootstrap, store,
// acceptor thread, HMAC handshake — the production setup path, unchanged); rank 1 is this
// harness, which joins the rendezvous by hand (it writes rank 1's store keys and completes the
// handshake as rank 1), so afterwards it owns the peer end of rank 0's data socket and can send
// it any bytes at all. Rank 0 posts receives (plain and reducing, any dtype and op) and sends,
// then waits for them; the harness streams the input's bytes, half-closes, and keeps draining
// what rank 0 sends (ABORT frames included).
//
// Input: a header, then a stream program.
//   header    n = 1 + (u8 % 4) operations, each: kind:u8 (bits 0-1: recv, recv_reduce, send;
//             bits 2-4: dtype; bits 5-7: reduce op), count:u16 (elements)
//   program   a sequence of commands, each starting with a control byte c:
//     c < 0x80          c+1 raw bytes follow, sent as they are (anything at all)
//     0x80 | f<<2 | i   a BEGIN frame for operation i (f bit 0: wrong sequence number in the
//                       signature, bit 1: total bytes + 1)
//     0x90 | f<<2 | i   a DATA frame for operation i: len:u16 bytes of payload (f bit 0: all
//                       that is left of the message instead; bit 1: the header claims extra:u8
//                       more bytes than follow)
//     0xA0 | kind       an ABORT frame: origin:u8, n:u8, n bytes of reason
//     0xC0 | i          operation i's whole message as a correct sender sends it: BEGIN, then
//                       DATA frames of chunk:u16 elements
//   other control bytes are ignored.
// Checks, beyond ASan/UBSan: every wait ends (the peer always closes, so no receive may hang or
// spin; a TimeoutError counts as a hang unless it is one forwarded from rank 1 by an ABORT
// frame, raised well before the deadline), errors are kolo::Error, and when the program is only
// correct messages (0xC0) for the posted receives in order, every receive completes with exactly
// the bytes sent (plain) or local (op) sent (reducing).
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <kolo/core/reduce.hpp>
#include <kolo/net/auth.hpp>
#include <kolo/topology/bootstrap.hpp>
#include <kolo/topology/store.hpp>
#include <kolo/transport/mesh.hpp>

#include "fuzz_common.hpp"

namespace {

const std::string kSecret = "kolo-fuzz-mesh-secret-0123456789";
constexpr double kSeconds = 8.0;                          // no input should come near this
constexpr std::size_t kMaxStream = std::size_t{8} << 20;  // bytes the harness sends at most

// The rendezvous store of one input's job: a fresh one per input, so that an input allocates
// nothing it does not free (libFuzzer's leak check) and never sees another input's keys.
struct Rendezvous {
  std::unique_ptr<kolo::StoreServer> server;
  std::unique_ptr<kolo::StoreClient> as_rank1;  // the fake rank 1's store connection
  std::uint16_t port = 0;
  Rendezvous() {
    server = std::make_unique<kolo::StoreServer>(kolo::net::listen_tcp("127.0.0.1", 0), kSecret);
    port = server->port();
    as_rank1 = std::make_unique<kolo::StoreClient>(kolo::net::HostPort{"127.0.0.1", port}, kSecret,
                                                   1, kSeconds);
  }
};

// Bootstrap names its store keys "kolo/<n>/" with a process-wide counter of Bootstraps; this
// harness creates them one at a time, so it knows the next n (and checks it).
int g_next_bootstrap = 0;

enum class Kind { recv, recv_reduce, send };

struct OpSpec {
  Kind kind = Kind::recv;
  kolo::DataType dtype = kolo::DataType::uint8;
  kolo::ReduceOp op = kolo::ReduceOp::sum;
  std::size_t count = 0;
  std::size_t bytes = 0;
  kolo::Signature sig;
  std::vector<std::byte> payload;  // what a correct sender sends (recv kinds) or what we send
  std::vector<std::byte> local;    // recv_reduce's local operand
  std::vector<std::byte> dst;
  std::size_t generated = 0;  // DATA payload bytes the program has emitted so far
};

// Bytes in 0..6 only: as floats of any width these are small positive numbers (never NaN), so a
// reduction's result is reproducible bit for bit. Byte j of pattern `salt` is (5j + salt) % 7,
// which has period 7: fills copy whole runs from one table instead of computing each byte.
struct Pattern {
  static constexpr std::size_t kRun = 4096;
  std::byte table[kRun + 7];
  Pattern() {
    for (std::size_t k = 0; k < sizeof(table); ++k) table[k] = static_cast<std::byte>(k * 5 % 7);
  }
  // Bytes [from, from + n) of pattern `salt` into dst.
  void copy(std::byte* dst, std::size_t from, std::size_t n, unsigned salt) const {
    // (5j + salt) % 7 == 5(j + 3 salt) % 7, since 5 * 3 = 15 = 1 (mod 7).
    std::size_t j = from;
    while (n > 0) {
      const std::size_t m = std::min(n, kRun);
      std::memcpy(dst, table + (j + 3 * std::size_t{salt}) % 7, m);
      dst += m;
      j += m;
      n -= m;
    }
  }
};
const Pattern kPattern;

void put(std::string& out, const void* p, std::size_t n) {
  out.append(static_cast<const char*>(p), n);
}

void put_header(std::string& out, std::uint32_t type, std::uint32_t len) {
  const kolo::detail::FrameHeader h{type, len};
  put(out, &h, sizeof(h));
}

void put_begin(std::string& out, const OpSpec& op, bool bad_seq, bool bad_total) {
  kolo::detail::BeginBody b{};
  b.total = op.bytes + (bad_total ? 1 : 0);
  b.sig = op.sig;
  if (bad_seq) ++b.sig.seq;
  put_header(out, kolo::detail::kFrameBegin, sizeof(b));
  put(out, &b, sizeof(b));
}

// Payload bytes [from, from + n) of op's message (pattern 3 beyond its end, for overruns).
void put_payload(std::string& out, const OpSpec& op, std::size_t from, std::size_t n) {
  const std::size_t old = out.size();
  out.resize(old + n);
  auto* dst = reinterpret_cast<std::byte*>(out.data() + old);
  const std::size_t inside = from < op.payload.size() ? std::min(n, op.payload.size() - from) : 0;
  if (inside > 0) std::memcpy(dst, op.payload.data() + from, inside);
  kPattern.copy(dst + inside, from + inside, n - inside, 3);
}

// What the pump did, for the report when a receive hangs.
struct PumpState {
  std::atomic<std::size_t> sent{0}, received{0};
  std::atomic<bool> half_closed{false};
  std::atomic<int> ended{0};  // 0 running, 1 stop, 2 EOF/reset while reading, 3 send error
  std::string describe(std::size_t stream_bytes) const {
    return "rank 1 sent " + std::to_string(sent.load()) + " of " + std::to_string(stream_bytes) +
           " bytes, received " + std::to_string(received.load()) + ", half-closed " +
           (half_closed.load() ? "yes" : "no") + ", ended " + std::to_string(ended.load());
  }
};

// Plays rank 1 on fd: writes `stream`, reads (and discards) what rank 0 sends, and half-closes
// once both the stream is out and rank 0's messages (`expect` bytes) are in — a real peer would
// read its messages before it closed. Returns at EOF or a reset from rank 0, or on `stop`.
void pump(int fd, const std::string& stream, std::size_t expect, const std::atomic<bool>& stop,
          PumpState& st) {
  std::size_t off = 0, got = 0;
  char sink[65536];
  while (!stop.load()) {
    if (off == stream.size() && got >= expect && !st.half_closed.load()) {
      ::shutdown(fd, SHUT_WR);
      st.half_closed.store(true);
    }
    const short want_out = off < stream.size() ? POLLOUT : 0;
    pollfd p{fd, static_cast<short>(POLLIN | want_out), 0};
    if (::poll(&p, 1, 10) <= 0) continue;
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      const ssize_t k = ::recv(fd, sink, sizeof(sink), MSG_DONTWAIT);
      if (k > 0) st.received.store(got += static_cast<std::size_t>(k));
      if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) {
        // Rank 0 closed (after an ABORT): a real rank 1 would fail and close too, and rank 0
        // waits a moment for that before it closes its end.
        ::shutdown(fd, SHUT_WR);
        st.half_closed.store(true);
        st.ended.store(2);
        return;
      }
    }
    if ((p.revents & POLLOUT) && off < stream.size()) {
      const ssize_t k =
          ::send(fd, stream.data() + off, stream.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k > 0) st.sent.store(off += static_cast<std::size_t>(k));
      if (k < 0 && errno != EAGAIN && errno != EINTR) {  // reset by rank 0
        st.ended.store(3);
        return;
      }
    }
  }
  st.ended.store(1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  kolo_fuzz::Input in(data, size);

  // ---- the operations rank 0 posts ----
  const int nops = 1 + in.u8() % 4;
  std::vector<OpSpec> ops(static_cast<std::size_t>(nops));
  for (int i = 0; i < nops; ++i) {
    OpSpec& op = ops[static_cast<std::size_t>(i)];
    const std::uint8_t k = in.u8();
    op.kind = k % 4 == 1 ? Kind::recv_reduce : k % 4 == 2 ? Kind::send : Kind::recv;
    op.dtype = kolo::all_dtypes[(k >> 2) % 8];
    op.op = kolo::all_reduce_ops[(k >> 5) % 5];
    op.count = in.u16();
    if (op.kind == Kind::send) op.count %= 8192;  // what we send, rank 1 (the pump) drains
    op.bytes = op.count * kolo::dtype_size(op.dtype);
    op.sig.collective = kolo::Collective::allreduce;
    op.sig.dtype = op.dtype;
    op.sig.op = op.op;
    op.sig.count = op.count;
    op.sig.seq = static_cast<std::uint64_t>(i + 1);
    op.payload.resize(op.bytes);
    op.local.resize(op.kind == Kind::recv_reduce ? op.bytes : 0);
    op.dst.resize(op.kind == Kind::send ? 0 : op.bytes);
    kPattern.copy(op.payload.data(), 0, op.bytes, static_cast<unsigned>(i));
    kPattern.copy(op.local.data(), 0, op.local.size(), 5);
  }

  // ---- the byte stream rank 1 sends ----
  std::string stream;
  bool pure = true;  // only correct messages, for the posted receives, in order
  std::size_t next_recv = 0;
  auto next_recv_index = [&]() -> std::size_t {
    while (next_recv < ops.size() && ops[next_recv].kind == Kind::send) ++next_recv;
    return next_recv;
  };
  while (!in.empty() && stream.size() < kMaxStream) {
    const std::uint8_t c = in.u8();
    OpSpec& op = ops[(c & 3u) % ops.size()];
    const unsigned f = (c >> 2) & 3u;
    if (c < 0x80) {
      pure = false;
      const auto raw = in.bytes(std::size_t{c} + 1);
      stream.append(raw.data(), raw.size());
    } else if ((c & 0xF0) == 0x80) {
      pure = false;
      put_begin(stream, op, f & 1, f & 2);
    } else if ((c & 0xF0) == 0x90) {
      pure = false;
      std::size_t len = in.u16();
      if (f & 1) len = op.bytes > op.generated ? op.bytes - op.generated : 0;
      const std::size_t extra = (f & 2) ? std::size_t{in.u8()} + 1 : 0;
      put_header(stream, kolo::detail::kFrameData, static_cast<std::uint32_t>(len + extra));
      put_payload(stream, op, op.generated, len);
      op.generated += len;
    } else if ((c & 0xF0) == 0xA0) {
      pure = false;
      const std::int32_t kind = c & 7;
      const std::int32_t origin = in.u8();
      const auto reason = in.bytes(in.u8());
      put_header(stream, kolo::detail::kFrameAbort, static_cast<std::uint32_t>(8 + reason.size()));
      put(stream, &kind, 4);
      put(stream, &origin, 4);
      stream.append(reason.data(), reason.size());
    } else if ((c & 0xF0) == 0xC0) {
      const std::size_t chunk_elems = std::max<std::size_t>(1, in.u16());
      const std::size_t index = static_cast<std::size_t>(&op - ops.data());
      if (op.kind == Kind::send || index != next_recv_index()) pure = false;
      if (op.kind != Kind::send && index == next_recv_index()) ++next_recv;
      put_begin(stream, op, false, false);
      const std::size_t chunk = chunk_elems * kolo::dtype_size(op.dtype);
      for (std::size_t off = 0; off < op.bytes; off += chunk) {
        const std::size_t n = std::min(chunk, op.bytes - off);
        put_header(stream, kolo::detail::kFrameData, static_cast<std::uint32_t>(n));
        put_payload(stream, op, off, n);
      }
      op.generated = op.bytes;
    }
  }
  if (next_recv_index() != ops.size()) pure = false;  // some receive gets no correct message

  // ---- the job: rank 1's store keys first, then rank 0 and the handshake at once ----
  Rendezvous rv;
  const std::string prefix = "kolo/" + std::to_string(g_next_bootstrap++) + "/";
  rv.as_rank1->set(prefix + "hostkey/1", "fuzz-host-of-rank-1");
  rv.as_rank1->set(prefix + "mesh/1", std::to_string(::getpid()) + "|127.0.0.1:9");
  rv.as_rank1->add(prefix + "shm-created/count", 1);
  rv.as_rank1->add(prefix + "mesh-ready/count", 1);

  kolo::net::Socket listener = kolo::net::listen_tcp("127.0.0.1", 0);
  const std::uint16_t data_port = kolo::net::local_port(listener.fd());
  kolo::Topology topo;
  topo.rank = 0;
  topo.size = 2;
  topo.store = kolo::net::HostPort{"127.0.0.1", rv.port};
  topo.secret = kSecret;
  topo.timeout_seconds = kSeconds;
  topo.host_key = "fuzz-host-of-rank-0";
  topo.advertise_ip = "127.0.0.1";
  topo.listen_fd = listener.release();  // the transport takes it over and closes it

  kolo::net::Socket peer;
  std::string peer_error;
  std::thread join_as_rank1([&] {
    try {
      const kolo::Deadline dl = kolo::Deadline::after(kSeconds);
      peer = kolo::net::connect_tcp("127.0.0.1", data_port, dl, "rank 0");
      kolo::net::authenticate_client(peer.fd(), kSecret,
                                     kolo::net::Hello{kolo::net::kPurposeData, 1, 0}, dl, "rank 0");
    } catch (const std::exception& e) {
      peer_error = e.what();
    }
  });
  std::unique_ptr<kolo::Bootstrap> boot;
  std::unique_ptr<kolo::MeshTransport> t;
  std::string setup_error;
  try {
    boot = std::make_unique<kolo::Bootstrap>(topo);
    KOLO_FUZZ_CHECK(boot->prefix() == prefix,
                    "Bootstrap key prefix " + boot->prefix() + " is not the expected " + prefix);
    kolo::MeshOptions mo;
    mo.spin_us = 0;  // the harness runs beside the transport on a shared machine
    t = std::make_unique<kolo::MeshTransport>(*boot, kolo::RouteMode::tcp_only, mo);
  } catch (const std::exception& e) {
    setup_error = e.what();
  }
  join_as_rank1.join();
  KOLO_FUZZ_CHECK(setup_error.empty() && peer_error.empty(),
                  "harness setup failed: " + setup_error + " / " + peer_error);
  kolo::net::set_nonblocking(peer.fd(), true);

  // What rank 0's sends put on the wire: BEGIN (header + body), then one DATA frame (< 4 MiB).
  std::size_t expect = 0;
  for (const OpSpec& op : ops) {
    if (op.kind != Kind::send) continue;
    expect += sizeof(kolo::detail::FrameHeader) + sizeof(kolo::detail::BeginBody);
    if (op.bytes > 0) expect += sizeof(kolo::detail::FrameHeader) + op.bytes;
  }
  std::atomic<bool> stop{false};
  PumpState pumped;
  std::thread pumping([&] { pump(peer.fd(), stream, expect, stop, pumped); });

  // ---- rank 0: post everything, then wait in order ----
  bool all_ok = true;
  std::string wait_error;
  const auto waits_began = std::chrono::steady_clock::now();
  try {
    std::vector<kolo::MeshTransport::Request> reqs;
    for (OpSpec& op : ops) {
      if (op.kind == Kind::send) {
        reqs.push_back(t->isend(1, op.payload.data(), op.bytes, op.sig));
      } else if (op.kind == Kind::recv) {
        reqs.push_back(t->irecv(1, op.dst.data(), op.bytes, op.sig));
      } else {
        const kolo::ReduceSpec rs{kolo::reduce_function(op.dtype, op.op),
                                  kolo::dtype_size(op.dtype)};
        reqs.push_back(t->irecv_reduce(1, op.dst.data(), op.local.data(), op.bytes, rs, op.sig));
      }
    }
    for (const auto& r : reqs) t->wait(r, kolo::Deadline::after(kSeconds));
  } catch (const kolo::TimeoutError& e) {
    // The peer always finishes and closes, so a wait that runs out means the parser is stuck.
    // But an ABORT frame of kind 2 (timeout) in the stream is rank 1 reporting a timeout of its
    // own: rank 0 rightly raises it at once as a TimeoutError tagged "[reported by rank R]".
    const std::string what = e.what();
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - waits_began).count();
    const bool forwarded = what.find("[reported by rank") != std::string::npos;
    if (!forwarded || waited >= 0.9 * kSeconds) {
      kolo_fuzz::fail("a receive hung although the peer closed: " + what + " (after " +
                      std::to_string(waited) + " s); " + pumped.describe(stream.size()));
    }
    all_ok = false;
    wait_error = e.what();
  } catch (const kolo::Error& e) {
    all_ok = false;  // malformed input must end as a kolo::Error: expected
    wait_error = e.what();
  }

  if (pure) {
    KOLO_FUZZ_CHECK(all_ok, "correct messages failed to arrive: " + wait_error);
    for (const OpSpec& op : ops) {
      if (op.kind == Kind::send) continue;
      std::vector<std::byte> expect = op.payload;
      if (op.kind == Kind::recv_reduce) {
        kolo::reduce_function(op.dtype, op.op)(expect.data(), op.local.data(), op.payload.data(),
                                               op.count);
      }
      KOLO_FUZZ_CHECK(op.dst == expect, "a correct message arrived with the wrong bytes");
    }
  }

  t.reset();  // closes rank 0's socket (after an abort, once rank 1 has closed too)
  stop.store(true);
  pumping.join();
  boot.reset();
  return 0;
}
