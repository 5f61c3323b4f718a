// The mesh's pure parts, in process: the TCP frame codec (transport/mesh/frame_codec.hpp) and
// the operation pool (transport/op_pool.hpp). The codec has no sockets, so these tests feed it
// bytes and check what it delivers, byte for byte, and the errors it raises, word for word; the
// socket under it is covered by the multi-process suites (mp/, faults/), and the codec is also
// fuzzed (tests/fuzz/fuzz_mesh_frames.cpp).
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kolo/core/error.hpp"
#include "kolo/core/reduce.hpp"
#include "kolo/transport/mesh/frame_codec.hpp"
#include "kolo/transport/op_pool.hpp"

namespace {

using kolo::detail::FrameDecoder;
using kolo::detail::FrameEncoder;
using kolo::detail::OpKind;
using kolo::detail::StreamOp;

kolo::Signature sig_of(std::uint64_t seq, std::size_t count, kolo::DataType d) {
  kolo::Signature s;
  s.collective = kolo::Collective::allreduce;
  s.dtype = d;
  s.op = kolo::ReduceOp::sum;
  s.count = count;
  s.seq = seq;
  return s;
}

StreamOp recv_op(void* dst, std::size_t bytes, const kolo::Signature& sig) {
  StreamOp op;
  op.kind = OpKind::recv;
  op.peer = 1;
  op.dst = static_cast<std::byte*>(dst);
  op.bytes = bytes;
  op.sig = sig;
  return op;
}

// The wire bytes of one message, as the encoder frames it (the socket taking everything).
std::string encode(const void* src, std::size_t bytes, const kolo::Signature& sig,
                   std::size_t max_frame) {
  FrameEncoder enc(max_frame);
  std::string wire;
  std::size_t done = 0;
  enc.start(bytes, sig);
  for (;;) {
    if (enc.frame_sent()) {
      if (done == bytes) break;
      enc.next_data(bytes - done);
    }
    const auto hdr = enc.header_left();
    wire.append(reinterpret_cast<const char*>(hdr.data()), hdr.size());
    wire.append(static_cast<const char*>(src) + done, enc.payload_left());
    done += enc.sent(hdr.size() + enc.payload_left());
  }
  return wire;
}

std::string header(std::uint32_t type, std::uint32_t len) {
  const kolo::detail::FrameHeader h{type, len};
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
}

std::string begin(std::uint64_t total, const kolo::Signature& sig) {
  const kolo::detail::BeginBody b{total, sig};
  return header(kolo::detail::kFrameBegin, sizeof(b)) +
         std::string(reinterpret_cast<const char*>(&b), sizeof(b));
}

// Runs the decoder over `wire` for the receives in `ops` (in order), `piece` bytes per read at
// most, EOF at the end. Returns the stop and how many receives completed.
struct Fed {
  FrameDecoder::Stop stop;
  std::size_t completed;
};
Fed feed(FrameDecoder& dec, const std::string& wire, std::vector<StreamOp>& ops,
         std::size_t piece = ~std::size_t{0}) {
  std::size_t off = 0, head = 0;
  for (;;) {
    const auto stop = dec.run(
        [&](std::byte* p, std::size_t n) -> FrameDecoder::ReadResult {
          if (off == wire.size()) return {0, true};
          const std::size_t k = std::min({n, wire.size() - off, piece});
          std::memcpy(p, wire.data() + off, k);
          off += k;
          return {k, false};
        },
        [&]() -> StreamOp* { return head < ops.size() ? &ops[head] : nullptr; }, [&] { ++head; });
    if (stop != FrameDecoder::Stop::again) return {stop, head};
  }
}

}  // namespace

TEST_CASE("frame codec: a message framed by the encoder decodes to the same bytes") {
  std::vector<std::uint8_t> src(1000);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::uint8_t>(i * 7 + 3);
  const auto sig = sig_of(5, 1000, kolo::DataType::uint8);
  const std::string wire = encode(src.data(), src.size(), sig, 64);
  // BEGIN (8 + 40), then 16 DATA frames (15 of 64 bytes, one of 40), each with an 8-byte header.
  CHECK(wire.size() == 48 + 16 * 8 + 1000);
  for (std::size_t piece : {std::size_t{1}, std::size_t{7}, std::size_t{100000}}) {
    CAPTURE(piece);
    std::vector<std::uint8_t> dst(1000, 0xee);
    std::vector<StreamOp> ops{recv_op(dst.data(), dst.size(), sig)};
    FrameDecoder dec(1, 0);
    const Fed f = feed(dec, wire, ops, piece);
    CHECK(f.completed == 1);
    CHECK(f.stop == FrameDecoder::Stop::closed);  // EOF after the message, with none posted
    CHECK(dst == src);
  }
}

TEST_CASE("frame codec: an empty message is a BEGIN alone and completes its receive") {
  const auto sig = sig_of(1, 0, kolo::DataType::float32);
  const std::string wire = encode(nullptr, 0, sig, 64);
  CHECK(wire.size() == 48);
  std::vector<StreamOp> ops{recv_op(nullptr, 0, sig)};
  FrameDecoder dec(1, 0);
  CHECK(feed(dec, wire, ops).completed == 1);
}

TEST_CASE("frame codec: a reducing receive folds whole elements, across frame and read edges") {
  // 1000 int32 elements in frames of 12 bytes (3 elements), read 5 bytes at a time: every
  // element is split by some read, none by a frame.
  std::vector<std::int32_t> incoming(1000), local(1000), dst(1000, 0);
  for (int i = 0; i < 1000; ++i) {
    incoming[static_cast<std::size_t>(i)] = i * 3 - 700;
    local[static_cast<std::size_t>(i)] = 100000 - i;
  }
  const auto sig = sig_of(2, 1000, kolo::DataType::int32);
  const std::string wire = encode(incoming.data(), 4000, sig, 12);
  StreamOp op = recv_op(dst.data(), 4000, sig);
  op.kind = OpKind::recv_reduce;
  op.src = reinterpret_cast<const std::byte*>(local.data());
  op.rs = {kolo::reduce_function(kolo::DataType::int32, kolo::ReduceOp::sum), 4};
  std::vector<StreamOp> ops{op};
  FrameDecoder dec(1, 0);
  CHECK(feed(dec, wire, ops, 5).completed == 1);
  for (int i = 0; i < 1000; ++i) {
    CHECK(dst[static_cast<std::size_t>(i)] == 100000 - i + i * 3 - 700);
  }
}

TEST_CASE("frame codec: a large payload of a plain receive is read straight into it") {
  std::vector<std::uint8_t> src(100000, 0x5a), dst(100000, 0);
  const auto sig = sig_of(3, src.size(), kolo::DataType::uint8);
  const std::string wire = encode(src.data(), src.size(), sig, kolo::detail::kDefaultFrameBytes);
  StreamOp op = recv_op(dst.data(), dst.size(), sig);
  FrameDecoder dec(1, 0);
  // BEGIN and the DATA header alone: the decoder then asks for the payload in dst itself.
  dec.buffered(0);
  auto room = dec.buffer_space();
  std::memcpy(room.data(), wire.data(), 56);
  dec.buffered(56);
  CHECK(dec.parse(&op) == FrameDecoder::Step::need_bytes);
  room = dec.space(&op);
  CHECK(static_cast<void*>(room.data()) == static_cast<void*>(dst.data()));
  CHECK(room.size() == dst.size());
  std::memcpy(room.data(), wire.data() + 56, room.size());
  dec.received(&op, room.size());
  CHECK(dec.parse(&op) == FrameDecoder::Step::message_done);
  CHECK(dst == src);
}

TEST_CASE("frame codec: a complete message ahead of EOF is not a lost peer") {
  // The case a fuzz run found (corpus regress-partial-element-eof): a reducing receive larger
  // than the 256 KiB buffer, in frames that leave a partial element at the end of a full buffer,
  // from a peer that closes right after its last byte. Everything is readable at once.
  const std::size_t n = 33101;  // int64: 264,808 bytes
  std::vector<std::int64_t> incoming(n), local(n, 1), dst(n, 0);
  for (std::size_t i = 0; i < n; ++i) incoming[i] = static_cast<std::int64_t>(i);
  const auto sig = sig_of(2, n, kolo::DataType::int64);
  const std::string wire = encode(incoming.data(), n * 8, sig, 76 * 8);
  StreamOp op = recv_op(dst.data(), n * 8, sig);
  op.kind = OpKind::recv_reduce;
  op.src = reinterpret_cast<const std::byte*>(local.data());
  op.rs = {kolo::reduce_function(kolo::DataType::int64, kolo::ReduceOp::min), 8};
  std::vector<StreamOp> ops{op};
  FrameDecoder dec(1, 0);
  const Fed f = feed(dec, wire, ops);
  CHECK(f.completed == 1);
  for (std::size_t i = 0; i < n; ++i) CHECK(dst[i] == std::min<std::int64_t>(1, incoming[i]));
}

TEST_CASE("frame codec: a frame for a receive not yet posted waits in the buffer") {
  std::vector<std::uint8_t> src(10, 9), dst(10, 0);
  const auto sig = sig_of(4, 10, kolo::DataType::uint8);
  const std::string wire = encode(src.data(), 10, sig, 64);
  std::vector<StreamOp> none;
  FrameDecoder dec(1, 0);
  std::size_t off = 0;
  auto read = [&](std::byte* p, std::size_t n) -> FrameDecoder::ReadResult {
    if (off == wire.size()) return {0, false};  // nothing more now, the peer still open
    const std::size_t k = std::min(n, wire.size() - off);
    std::memcpy(p, wire.data() + off, k);
    off += k;
    return {k, false};
  };
  StreamOp* head = nullptr;
  bool completed = false;
  CHECK(dec.run(
            read, [&] { return head; }, [&] { completed = true; }) == FrameDecoder::Stop::unposted);
  StreamOp op = recv_op(dst.data(), 10, sig);
  head = &op;
  CHECK(dec.run(
            read, [&] { return completed ? nullptr : head; }, [&] { completed = true; }) ==
        FrameDecoder::Stop::again);
  CHECK(completed);
  CHECK(dst == src);
}

TEST_CASE("frame codec: an ABORT round trip keeps kind, origin, call and reason") {
  const std::string reason("a\0b\x01 and more", 13);
  const auto frame =
      kolo::detail::encode_abort_frame(kolo::ErrorKind::mismatch, 3, reason, 0x1234567890ULL);
  CHECK(frame.size() == 8 + 16 + reason.size());
  // Between messages, with no receive posted: an ABORT is parsed all the same.
  FrameDecoder dec(1, 0);
  std::vector<StreamOp> none;
  const Fed f = feed(dec, std::string(frame.begin(), frame.end()), none, 3);
  REQUIRE(f.stop == FrameDecoder::Stop::abort);
  CHECK(dec.abort().kind == kolo::ErrorKind::mismatch);
  CHECK(dec.abort().origin == 3);
  CHECK(dec.abort().reason == reason);
  CHECK(dec.abort().seq == 0x1234567890ULL);  // the call it belongs to (0: none in particular)
  // What the receiving rank throws: control bytes shown as '?', and the origin tagged.
  CHECK(dec.abort().message() == "a?b? and more [reported by rank 3]");
  // The encoder cuts long reasons; a forwarded (already tagged) reason is not tagged twice.
  const auto big =
      kolo::detail::encode_abort_frame(kolo::ErrorKind::timeout, 0, std::string(10000, 'x'));
  CHECK(big.size() == 24 + kolo::detail::kMaxAbortReason);
  const kolo::detail::RemoteAbort fwd{kolo::ErrorKind::timeout, 2, "late [reported by rank 0]"};
  CHECK(fwd.message() == "late [reported by rank 0]");
}

TEST_CASE("frame codec: an ABORT queued at a frame boundary can be peeked after a failed send") {
  const auto frame = kolo::detail::encode_abort_frame(kolo::ErrorKind::peer_lost, 5, "gone", 9);
  FrameDecoder dec(1, 0);
  CHECK(!dec.queued_abort());
  auto room = dec.buffer_space();
  std::memcpy(room.data(), frame.data(), frame.size() - 1);
  dec.buffered(frame.size() - 1);
  CHECK(!dec.queued_abort());  // not whole yet
  room = dec.buffer_space();
  std::memcpy(room.data(), frame.data() + frame.size() - 1, 1);
  dec.buffered(1);
  const auto a = dec.queued_abort();
  REQUIRE(a);
  CHECK(a->kind == kolo::ErrorKind::peer_lost);
  CHECK(a->origin == 5);
  CHECK(a->reason == "gone");
  CHECK(a->seq == 9);
}

TEST_CASE("frame codec: malformed frames are errors that name the peer") {
  const auto sig = sig_of(7, 16, kolo::DataType::float32);
  std::vector<float> dst(16);
  auto error_of = [&](const std::string& wire, OpKind kind = OpKind::recv) {
    StreamOp op = recv_op(dst.data(), 64, sig);
    op.kind = kind;
    op.src = reinterpret_cast<const std::byte*>(dst.data());
    op.rs = {kolo::reduce_function(kolo::DataType::float32, kolo::ReduceOp::sum), 4};
    std::vector<StreamOp> ops{op};
    FrameDecoder dec(4, 0);
    try {
      feed(dec, wire, ops);
    } catch (const kolo::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(error_of(header(kolo::detail::kFrameData, 64) + std::string(64, 'x')) ==
        "TCP protocol error from rank 4 (DATA before BEGIN)");
  CHECK(error_of(begin(64, sig) + header(kolo::detail::kFrameData, 65)) ==
        "TCP protocol error from rank 4 (DATA frame of 65 bytes, 64 left in the message)");
  CHECK(error_of(begin(64, sig) + header(kolo::detail::kFrameData, 6), OpKind::recv_reduce) ==
        "TCP protocol error from rank 4 (DATA frame of 6 bytes splits a 4-byte element)");
  CHECK(error_of(header(0x4b4c0009, 0)) == "TCP protocol error from rank 4 (bad frame type)");
  CHECK(error_of(header(kolo::detail::kFrameBegin, 39)) ==
        "TCP protocol error from rank 4 (bad BEGIN)");
  CHECK(error_of(header(kolo::detail::kFrameAbort, 65537)) == "TCP protocol error from rank 4");
  auto other = sig;
  other.seq = 8;
  CHECK(error_of(begin(64, other)) == "collective mismatch: rank 4 called " + other.describe() +
                                          " but rank 0 called " + sig.describe());
  CHECK(error_of(begin(60, sig)) == "message size mismatch in " + sig.describe() +
                                        ": rank 4 sent 60 bytes, rank 0 expected 64");
}

TEST_CASE("op pool: handles stay answerable, slots are reused, completions are counted") {
  kolo::detail::OpPool<StreamOp> pool;
  kolo::detail::OpQueue q;
  const auto sig = sig_of(1, 0, kolo::DataType::uint8);
  StreamOp& a = pool.post(q, OpKind::send, 1, 10, sig);
  const auto ha = pool.handle(a);
  StreamOp& b = pool.post(q, OpKind::recv, 2, 20, sig);
  const auto hb = pool.handle(b);
  CHECK(ha.index != hb.index);
  CHECK(pool.pending() == 2);
  CHECK(!pool.done(ha));
  CHECK(!pool.completed_since_seen());
  pool.complete_front(q);  // FIFO: a first
  CHECK(pool.done(ha));
  CHECK(!pool.done(hb));
  CHECK(pool.completed_since_seen());
  pool.mark_seen();
  CHECK(!pool.completed_since_seen());
  // The freed slot is reused for the next post, with a new generation: the old handle stays done.
  StreamOp& c = pool.post(q, OpKind::recv_reduce, 3, 30, sig);
  const auto hc = pool.handle(c);
  CHECK(hc.index == ha.index);
  CHECK(hc.gen != ha.gen);
  CHECK(pool.done(ha));
  CHECK(!pool.done(hc));
  CHECK(c.peer == 3);
  CHECK(c.bytes == 30);
  CHECK(c.kind == OpKind::recv_reduce);
  CHECK(q.front() == hb.index);
  pool.complete_front(q);
  pool.complete_front(q);
  CHECK(pool.done(hb));
  CHECK(pool.done(hc));
  CHECK(pool.pending() == 0);
  CHECK(pool.completions() == 3);
}

TEST_CASE("op pool: a peer outside the job or the rank itself is refused") {
  CHECK_THROWS_WITH_AS(kolo::detail::check_peer(4, 1, 4),
                       "invalid peer rank 4 (this is rank 1 of 4)", kolo::Error);
  CHECK_THROWS_WITH_AS(kolo::detail::check_peer(1, 1, 4),
                       "invalid peer rank 1 (this is rank 1 of 4)", kolo::Error);
  CHECK_NOTHROW(kolo::detail::check_peer(0, 1, 4));
}
