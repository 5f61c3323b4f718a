// libFuzzer target: the mesh's TCP wire format (transport/mesh/frame_codec.hpp), on bytes alone.
//
// The codec is pure (no sockets), so no job is needed: the fuzzer plays the peer, and the very
// receive loop the transport runs over its socket (FrameDecoder::run) runs here over a byte
// source that hands out the input's stream under several delivery schedules — everything at once
// (a peer that sent it all before we read: full buffers, compaction, partial elements at the end
// of a full buffer), and small, irregular pieces with "would block" between them (the re-entry
// after EAGAIN) into a receive buffer of 40 bytes to 256 KiB. End of stream is EOF: the peer
// always closes.
//
// Input: a header, then a stream program (unchanged from the two-rank harness this replaces, so
// the corpus in tests/fuzz/corpus/mesh_frames keeps its meaning).
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
// The receives (recv, recv_reduce) are posted in order and fed the stream; the sends are
// encoded by FrameEncoder (frame size and write sizes drawn from a hash of the input) and decoded
// back, and once more cut off mid-message by an ABORT the way a failing rank sends one.
// Checks, beyond ASan/UBSan:
//   - the loop always ends (the stream is finite and ends in EOF; a loop that neither consumes,
//     completes nor stops is reported), and errors are kolo::Error;
//   - every delivery schedule gives the same outcome (receives completed, bytes delivered, the
//     error's text, or the ABORT): how the bytes are cut, and the buffer's size, must not matter;
//   - when the program is only correct messages (0xC0) for the posted receives in order, every
//     receive completes with exactly the bytes sent (plain) or local (op) sent (reducing);
//   - an ABORT yields a message that keeps its "[reported by rank R]" tag and shows no control
//     bytes (a NUL in the reason once cut what() short);
//   - encoded messages decode to exactly what was sent; an ABORT sent mid-message after the
//     frame in flight is finished arrives as an ABORT, never as a protocol error.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <kolo/core/reduce.hpp>
#include <kolo/transport/mesh/frame_codec.hpp>

#include "fuzz_common.hpp"

namespace {

constexpr std::size_t kMaxStream = std::size_t{8} << 20;  // stream bytes at most
constexpr int kPeer = 1, kSelf = 0;  // the decoder receives from rank 1 as rank 0

using kolo::detail::FrameDecoder;
using kolo::detail::FrameEncoder;
using kolo::detail::StreamOp;

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
  std::size_t generated = 0;       // DATA payload bytes the program has emitted so far
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

// A small deterministic generator, seeded from the input: the delivery schedules and frame
// sizes must be the same every time an input runs.
struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  std::size_t pick(std::initializer_list<std::size_t> xs) { return xs.begin()[next() % xs.size()]; }
};

std::uint64_t fnv1a(const std::uint8_t* data, std::size_t size) {
  std::uint64_t h = 1469598103934665603ull;
  for (std::size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 1099511628211ull;
  return h | 1;  // xorshift needs a non-zero state
}

// How the stream's bytes reach the decoder.
struct Schedule {
  bool all_at_once = true;  // otherwise: pieces of irregular sizes, "would block" between them
  std::uint64_t seed = 1;
  std::size_t buffer_bytes = kolo::detail::kRecvBufferBytes;  // the decoder's receive buffer
};

// A receive posted by rank 0.
struct Posted {
  const OpSpec* spec;
  StreamOp op;
  std::vector<std::byte> dst;
};

// What one run over the stream ended with.
struct Outcome {
  std::size_t completed = 0;  // receives completed, in order
  std::vector<std::vector<std::byte>> delivered;
  std::string end;  // "error: <what>", "abort: <message>", "closed", "unposted"
};

std::vector<Posted> post_receives(const std::vector<OpSpec>& ops) {
  std::vector<Posted> posted;
  for (const OpSpec& s : ops) {
    if (s.kind == Kind::send) continue;
    Posted p{&s, {}, std::vector<std::byte>(s.bytes)};
    p.op.kind =
        s.kind == Kind::recv ? kolo::detail::OpKind::recv : kolo::detail::OpKind::recv_reduce;
    p.op.peer = kPeer;
    p.op.bytes = s.bytes;
    p.op.sig = s.sig;
    p.op.dst = p.dst.data();
    if (s.kind == Kind::recv_reduce) {
      p.op.src = s.local.data();
      p.op.rs = {kolo::reduce_function(s.dtype, s.op), kolo::dtype_size(s.dtype)};
    }
    posted.push_back(std::move(p));
  }
  return posted;
}

void check_abort(const kolo::detail::AbortFrame& a) {
  const std::string msg = a.message();
  KOLO_FUZZ_CHECK(msg.find("[reported by rank") != std::string::npos,
                  "a forwarded error lost its tag: " + msg);
  for (char c : msg) {
    const auto u = static_cast<unsigned char>(c);
    KOLO_FUZZ_CHECK(!((u < 0x20 && c != '\n' && c != '\t') || u == 0x7f),
                    "a control byte survived in a forwarded error");
  }
}

// Feeds `stream` to the receives of `ops` under `sched`, as the transport's receive loop does.
Outcome receive(const std::vector<OpSpec>& ops, const std::string& stream, const Schedule& sched) {
  std::vector<Posted> posted = post_receives(ops);
  FrameDecoder dec(kPeer, kSelf, sched.buffer_bytes);
  std::size_t head = 0, off = 0;
  Rng rng{sched.seed};
  bool blocked_last = false;
  auto read = [&](std::byte* p, std::size_t n) -> FrameDecoder::ReadResult {
    KOLO_FUZZ_CHECK(n > 0, "the decoder asked for zero bytes");
    if (off == stream.size()) return {0, true};  // the peer closed after its last byte
    std::size_t k = std::min(n, stream.size() - off);
    if (!sched.all_at_once) {
      if (!blocked_last && rng.next() % 2 == 0) {  // EAGAIN: the rest is still on the wire
        blocked_last = true;
        return {0, false};
      }
      blocked_last = false;
      k = std::min(k, rng.pick({1, 2, 3, 7, 8, 13, 64, 1000, 4096, 16385, 65536, 1 << 20}));
    }
    std::memcpy(p, stream.data() + off, k);
    off += k;
    return {k, false};
  };
  auto head_op = [&]() -> StreamOp* { return head < posted.size() ? &posted[head].op : nullptr; };
  auto complete = [&] {
    KOLO_FUZZ_CHECK(head < posted.size(), "a completion with no receive posted");
    StreamOp& op = posted[head].op;
    KOLO_FUZZ_CHECK(op.begun && op.done == op.bytes, "a receive completed before all its bytes");
    ++head;
  };

  Outcome out;
  // Every call either consumes bytes, completes a receive or ends: bounded by what there is.
  const std::size_t max_calls = 2 * stream.size() + 2 * posted.size() + 16;
  try {
    for (std::size_t calls = 0;; ++calls) {
      KOLO_FUZZ_CHECK(calls <= max_calls, "the receive loop does not progress (" +
                                              std::to_string(off) + " of " +
                                              std::to_string(stream.size()) + " bytes read)");
      const auto stop = dec.run(read, head_op, complete);
      if (stop == FrameDecoder::Stop::again) continue;  // poll() would say "readable" again
      if (stop == FrameDecoder::Stop::abort) {
        check_abort(dec.abort());
        out.end = "abort: " + dec.abort().message();
      } else {
        out.end = stop == FrameDecoder::Stop::closed ? "closed" : "unposted";
      }
      break;
    }
  } catch (const kolo::Error& e) {
    out.end = std::string("error: ") + e.what();
  }
  out.completed = head;
  for (std::size_t i = 0; i < head; ++i) out.delivered.push_back(std::move(posted[i].dst));
  return out;
}

// Encodes send `s` in frames of at most `max_frame` bytes, the socket taking what `rng` says per
// write; with `cut`, stops after that many wire bytes and sends an ABORT as a failing rank does
// (finishing the frame in flight first). Returns the wire bytes.
std::string encode(const OpSpec& s, std::size_t max_frame, Rng& rng, std::size_t cut, bool abort) {
  FrameEncoder enc(max_frame);
  StreamOp op;
  op.kind = kolo::detail::OpKind::send;
  op.peer = kSelf;
  op.bytes = s.bytes;
  op.sig = s.sig;
  op.src = s.payload.data();
  std::string wire;
  enc.start(op.bytes, op.sig);
  op.begun = true;
  for (;;) {
    if (enc.frame_sent()) {
      if (op.done == op.bytes) break;
      enc.next_data(op.bytes - op.done);
    }
    if (abort && wire.size() >= cut) break;
    const auto hdr = enc.header_left();
    const std::size_t room = rng.pick({1, 5, 8, 48, 100, 4096, 1 << 20});
    std::size_t k = 0;
    const std::size_t h = std::min(room, hdr.size());
    put(wire, hdr.data(), h);
    k += h;
    const std::size_t p = std::min(room - h, enc.payload_left());
    put(wire, op.src + op.done, p);
    k += p;
    op.done += enc.sent(k);
  }
  if (abort) {  // what TcpChannel::send_abort does
    if (!enc.frame_sent()) {
      const auto hdr = enc.header_left();
      put(wire, hdr.data(), hdr.size());
      const std::size_t p = enc.payload_left();
      put(wire, op.src + op.done, p);
      enc.sent(hdr.size() + p);
    }
    const auto frame =
        kolo::detail::encode_abort_frame(kolo::ErrorKind::mismatch, 7, std::string("why\0not", 7));
    put(wire, frame.data(), frame.size());
  }
  return wire;
}

// A receive buffer from the smallest that works (a BEGIN body must fit) to the transport's.
std::size_t small_buffer(Rng& rng) {
  return rng.pick({sizeof(kolo::detail::BeginBody), 64, 4096, kolo::detail::kRecvBufferBytes});
}

void round_trip(const OpSpec& s, Rng& rng) {
  // Frames down to a byte, but at most ~64 of them: enough for every frame boundary case, cheap.
  const std::size_t max_frame =
      std::max(rng.pick({1, 8, 1000, 65536, kolo::detail::kDefaultFrameBytes}), s.bytes / 64);
  const std::size_t max_frame_el =
      std::max<std::size_t>(1, max_frame / kolo::dtype_size(s.dtype)) * kolo::dtype_size(s.dtype);
  OpSpec as_recv = s;
  as_recv.kind = rng.next() % 2 ? Kind::recv : Kind::recv_reduce;
  as_recv.local.assign(s.bytes, std::byte{0});
  kPattern.copy(as_recv.local.data(), 0, s.bytes, 6);
  // A reducing receive rejects frames that split an element: the sender frames whole ones.
  const std::size_t frame = as_recv.kind == Kind::recv_reduce ? max_frame_el : max_frame;
  const std::vector<OpSpec> one{as_recv};
  const Schedule sched{rng.next() % 2 == 0, rng.next(), small_buffer(rng)};

  const Outcome ok = receive(one, encode(s, frame, rng, 0, false), sched);
  KOLO_FUZZ_CHECK(ok.completed == 1, "an encoded message did not decode: " + ok.end);
  std::vector<std::byte> expect = s.payload;
  if (as_recv.kind == Kind::recv_reduce) {
    kolo::reduce_function(s.dtype, s.op)(expect.data(), as_recv.local.data(), s.payload.data(),
                                         s.count);
  }
  KOLO_FUZZ_CHECK(ok.delivered[0] == expect, "an encoded message decoded to other bytes");

  const std::size_t cut = rng.next() % (s.bytes + 64);
  const Outcome cut_off = receive(one, encode(s, frame, rng, cut, true), sched);
  KOLO_FUZZ_CHECK(cut_off.end.rfind("abort: ", 0) == 0,
                  "an ABORT after the frame in flight did not arrive as one: " + cut_off.end);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  kolo_fuzz::Input in(data, size);
  Rng rng{fnv1a(data, size)};

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
    if (op.kind == Kind::send) op.count %= 8192;
    op.bytes = op.count * kolo::dtype_size(op.dtype);
    op.sig.collective = kolo::Collective::allreduce;
    op.sig.dtype = op.dtype;
    op.sig.op = op.op;
    op.sig.count = op.count;
    op.sig.seq = static_cast<std::uint64_t>(i + 1);
    op.payload.resize(op.bytes);
    op.local.resize(op.kind == Kind::recv_reduce ? op.bytes : 0);
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

  // ---- rank 0 receives the stream, cut in two different ways ----
  const Outcome whole = receive(ops, stream, Schedule{true, 1});
  const Outcome pieces = receive(ops, stream, Schedule{false, rng.next(), small_buffer(rng)});
  KOLO_FUZZ_CHECK(whole.completed == pieces.completed && whole.delivered == pieces.delivered &&
                      whole.end == pieces.end,
                  "the outcome depends on how the bytes arrive: " +
                      std::to_string(whole.completed) + " receives, '" + whole.end + "' vs " +
                      std::to_string(pieces.completed) + ", '" + pieces.end + "'");

  if (pure) {
    std::size_t receives = 0;
    for (const OpSpec& op : ops) receives += op.kind != Kind::send;
    KOLO_FUZZ_CHECK(whole.completed == receives, "correct messages failed to arrive: " + whole.end);
    std::size_t r = 0;
    for (const OpSpec& op : ops) {
      if (op.kind == Kind::send) continue;
      std::vector<std::byte> expect = op.payload;
      if (op.kind == Kind::recv_reduce) {
        kolo::reduce_function(op.dtype, op.op)(expect.data(), op.local.data(), op.payload.data(),
                                               op.count);
      }
      KOLO_FUZZ_CHECK(whole.delivered[r++] == expect,
                      "a correct message arrived with the wrong bytes");
    }
  }

  // ---- rank 0's sends: encoded, decoded back ----
  for (const OpSpec& op : ops) {
    if (op.kind == Kind::send) round_trip(op, rng);
  }
  return 0;
}
