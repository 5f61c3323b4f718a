// kolo/transport/mesh/frame_codec.hpp — the mesh's TCP wire format: a pure encoder and decoder.
//
// Pure: no sockets, no system calls. The encoder says which bytes go out next (a header and a
// range of the payload) and is told how many did; the decoder is given bytes and answers with
// events (a message completed, an ABORT arrived, a frame waits for a receive not yet posted,
// more bytes needed — and where to put them). tcp_channel.hpp puts a socket under both; the
// fuzzer (tests/fuzz/fuzz_mesh_frames.cpp) and the unit tests drive them on bytes alone.
//
// The format. A message is a BEGIN frame (the total size and the sender's Signature) and DATA
// frames of at most 4 MiB. An ABORT frame (error kind, origin rank, reason) can come between
// frames: it is how one rank's error reaches the others as the same exception. Every frame is an
// 8-byte header {type, length} and a body; integers are little-endian (the host's: kolo runs on
// little-endian machines only). The decoder checks every length against the receive it belongs
// to before it trusts it: a DATA frame longer than what is left of the message, one that splits
// an element of a reducing receive, DATA before BEGIN, an unknown type, a BEGIN of the wrong size
// or an ABORT over 64 KiB is an Error naming the peer, never a hang or an allocation.
//
// Receiving. The decoder owns a 256 KiB buffer: one read brings in headers and small payloads
// together, and what it holds is parsed before anything is read again (a peer that closes right
// after its last message must not make a complete message look lost). Large payloads of plain
// receives bypass it: `space()` then points into the destination itself. A reducing receive
// folds whole elements out of the buffer into its destination (no temporary).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kolo/core/error.hpp"
#include "kolo/core/signature.hpp"
#include "kolo/transport/op_pool.hpp"

namespace kolo::detail {

enum : std::uint32_t {
  kFrameBegin = 0x4b4c0001,
  kFrameData = 0x4b4c0002,
  kFrameAbort = 0x4b4c0003
};

struct FrameHeader {
  std::uint32_t type;
  std::uint32_t len;
};
struct BeginBody {
  std::uint64_t total;
  Signature sig;
};
static_assert(sizeof(FrameHeader) == 8 && sizeof(BeginBody) == 40);

inline constexpr std::size_t kDefaultFrameBytes = std::size_t{4} << 20;  // DATA payload at most
inline constexpr std::size_t kMaxAbortBody = 65536;   // an ABORT the decoder accepts
inline constexpr std::size_t kMaxAbortReason = 4000;  // reason bytes the encoder sends
inline constexpr std::size_t kRecvBufferBytes = 256 * 1024;
inline constexpr std::size_t kDirectReadBytes = 16384;  // payloads from here on skip the buffer

// An ABORT frame's content.
using AbortFrame = RemoteAbort;

// The bytes of an ABORT frame (the reason cut to kMaxAbortReason bytes). Body: kind (int32),
// origin (int32), the call it belongs to (uint64, RemoteAbort::seq), the reason.
inline constexpr std::size_t kAbortFixedBytes = 16;
inline std::vector<unsigned char> encode_abort_frame(ErrorKind kind, int origin,
                                                     std::string_view reason,
                                                     std::uint64_t seq = 0) {
  const std::string_view body = reason.substr(0, kMaxAbortReason);
  std::vector<unsigned char> frame(sizeof(FrameHeader) + kAbortFixedBytes + body.size());
  const FrameHeader h{kFrameAbort, static_cast<std::uint32_t>(kAbortFixedBytes + body.size())};
  const auto k = static_cast<std::int32_t>(kind);
  const auto o = static_cast<std::int32_t>(origin);
  std::memcpy(frame.data(), &h, sizeof(h));
  std::memcpy(frame.data() + 8, &k, 4);
  std::memcpy(frame.data() + 12, &o, 4);
  std::memcpy(frame.data() + 16, &seq, 8);
  if (!body.empty()) std::memcpy(frame.data() + 8 + kAbortFixedBytes, body.data(), body.size());
  return frame;
}

// The frames of outgoing messages, one message at a time. Per frame: header bytes (kept here)
// and payload bytes (the caller's, never copied), sent together in one gather write.
class FrameEncoder {
 public:
  explicit FrameEncoder(std::size_t max_frame = kDefaultFrameBytes) : max_frame_(max_frame) {}

  // Starts a message of `total` bytes: BEGIN, with the first DATA header behind it when the
  // message has any payload, so that both go out with the first payload bytes.
  void start(std::uint64_t total, const Signature& sig) {
    const FrameHeader h{kFrameBegin, sizeof(BeginBody)};
    const BeginBody b{total, sig};
    std::memcpy(hdr_, &h, sizeof(h));
    std::memcpy(hdr_ + sizeof(h), &b, sizeof(b));
    hdr_len_ = sizeof(h) + sizeof(b);
    hdr_off_ = 0;
    frame_left_ = 0;
    if (total > 0) {
      const std::size_t n = std::min<std::uint64_t>(max_frame_, total);
      const FrameHeader d{kFrameData, static_cast<std::uint32_t>(n)};
      std::memcpy(hdr_ + hdr_len_, &d, sizeof(d));
      hdr_len_ += sizeof(d);
      frame_left_ = n;
    }
  }

  // True when the current frame has gone out whole, header and payload.
  bool frame_sent() const { return hdr_off_ == hdr_len_ && frame_left_ == 0; }

  // After frame_sent(), with `left` > 0 payload bytes of the message still to go: the next DATA.
  void next_data(std::size_t left) {
    const std::size_t n = std::min(max_frame_, left);
    const FrameHeader h{kFrameData, static_cast<std::uint32_t>(n)};
    std::memcpy(hdr_, &h, sizeof(h));
    hdr_len_ = sizeof(h);
    hdr_off_ = 0;
    frame_left_ = n;
  }

  // What goes out next: the rest of the header, then this many payload bytes (from the message's
  // first unsent byte).
  std::span<const unsigned char> header_left() const {
    return {hdr_ + hdr_off_, hdr_len_ - hdr_off_};
  }
  std::size_t payload_left() const { return frame_left_; }

  // `k` bytes of header_left() + payload went out; returns how many of them were payload.
  std::size_t sent(std::size_t k) {
    const std::size_t h = std::min(k, hdr_len_ - hdr_off_);
    hdr_off_ += h;
    frame_left_ -= k - h;
    return k - h;
  }

 private:
  std::size_t max_frame_;
  unsigned char hdr_[2 * sizeof(FrameHeader) + sizeof(BeginBody)] = {};
  std::size_t hdr_len_ = 0, hdr_off_ = 0, frame_left_ = 0;
};

// The frames of incoming messages, delivered into the receives posted for them (StreamOp: the
// receive at the head of the peer's queue; it completes when done == bytes).
class FrameDecoder {
 public:
  // What parse() stopped at.
  enum class Step {
    need_bytes,    // nothing more to parse: feed bytes into space()
    message_done,  // the receive given to parse() is complete
    unposted,      // a BEGIN or DATA frame heads the buffer, and no receive is posted for it
    abort,         // an ABORT frame arrived: abort() holds it
  };
  // What run() stopped at.
  enum class Stop {
    again,     // the source has nothing now, or no receive is left: call again later
    unposted,  // as Step::unposted (bytes wait in the buffer until a receive is posted)
    closed,    // the source ended (EOF or reset) with bytes still needed
    abort,     // as Step::abort
  };
  // What a byte source answered: n > 0 bytes, or none (would block; eof: never any more).
  struct ReadResult {
    std::size_t n = 0;
    bool eof = false;
  };

  // run()'s default: no vectored reads (every byte goes through read()).
  struct NoPieceReads {};
  static constexpr std::size_t kPieceReads = 32;  // runs per vectored read, at most

  FrameDecoder() = default;
  // Frames from rank `peer` to rank `self` (the ranks only name the sides in errors).
  FrameDecoder(int peer, int self, std::size_t buffer_bytes = kRecvBufferBytes)
      : peer_(peer), self_(self), rx_(buffer_bytes) {}

  // Parses buffered bytes into `op` (nullptr: no receive is posted; only an ABORT can be
  // parsed then). Throws Error for a malformed frame and MismatchError for a BEGIN that differs
  // from op.
  Step parse(StreamOp* op) {
    for (;;) {
      const std::size_t avail = end_ - beg_;
      const std::byte* buf = rx_.data() + beg_;
      if (type_ == 0) {  // frame header
        if (avail < sizeof(FrameHeader)) return Step::need_bytes;
        FrameHeader h;
        std::memcpy(&h, buf, sizeof(h));
        if (h.type != kFrameAbort && op == nullptr) return Step::unposted;
        beg_ += sizeof(h);
        type_ = h.type;
        left_ = h.len;
        check_header(h, op);
        continue;
      }
      if (type_ == kFrameAbort) {
        const std::size_t n = std::min(avail, left_);
        abort_body_.append(reinterpret_cast<const char*>(buf), n);
        beg_ += n;
        left_ -= n;
        if (left_ > 0) return Step::need_bytes;
        abort_ = decode_abort(abort_body_.data(), abort_body_.size());
        type_ = 0;
        return Step::abort;
      }
      if (op == nullptr) protocol_error("a frame continued with no receive posted");
      if (type_ == kFrameBegin) {
        if (avail < sizeof(BeginBody)) return Step::need_bytes;
        BeginBody b;
        std::memcpy(&b, buf, sizeof(b));
        beg_ += sizeof(b);
        type_ = 0;
        if (b.sig != op->sig || b.total != op->bytes) {
          throw_mismatch(peer_, self_, b.sig, b.total, *op);
        }
        op->begun = true;
        if (op->bytes == 0) return Step::message_done;
        continue;
      }
      // DATA payload for op.
      if (left_ == 0) {  // a frame fully read (straight into the destination, or empty)
        type_ = 0;
        if (op->done == op->bytes) return Step::message_done;
        continue;
      }
      if (avail == 0) return Step::need_bytes;
      const bool reduce = op->kind == OpKind::recv_reduce;
      std::size_t n = std::min(avail, std::min(left_, op->bytes - op->done));
      if (reduce) n = n / op->rs.elem_size * op->rs.elem_size;  // whole elements only
      if (n == 0) return Step::need_bytes;  // a partial element: the rest must come first
      if (op->pieces != nullptr) {
        const std::byte* from = buf;
        op->consume(n, [&](std::byte* dst, const std::byte* local, std::size_t k) {
          if (reduce) {
            op->rs.fn(dst, local, from, k / op->rs.elem_size);
          } else {
            std::memcpy(dst, from, k);
          }
          from += k;
        });
      } else {
        if (reduce) {
          op->rs.fn(op->dst + op->done, op->src + op->done, buf, n / op->rs.elem_size);
        } else {
          std::memcpy(op->dst + op->done, buf, n);
        }
        op->done += n;
      }
      beg_ += n;
      left_ -= n;
      if (left_ == 0) type_ = 0;
      if (op->done == op->bytes && type_ == 0) return Step::message_done;
    }
  }

  // Where the bytes parse() needs go: into op's destination when the buffer is empty and a
  // large payload of a plain receive is due, else into the buffer's free tail (compacted first
  // when the tail is used up). Never empty after parse() said need_bytes.
  std::span<std::byte> space(StreamOp* op) {
    direct_ = type_ == kFrameData && op != nullptr && beg_ == end_ && left_ >= kDirectReadBytes &&
              op->kind != OpKind::recv_reduce;
    if (direct_) {
      // A vectored receive reads straight into its current piece when that is large enough.
      const StreamOp::Run r = op->run(left_);
      if (r.n >= kDirectReadBytes) return {r.dst, r.n};
      direct_ = false;
    }
    return buffer_space();
  }

  // `n` bytes were written at the start of the last space(op).
  void received(StreamOp* op, std::size_t n) {
    if (direct_) {
      op->advance(n);
      left_ -= n;
    } else {
      end_ += n;
    }
  }

  // The buffer's free tail, compacted first when the tail is used up.
  std::span<std::byte> buffer_space() {
    if (beg_ == end_) beg_ = end_ = 0;
    if (end_ == rx_.size() && beg_ > 0) {  // keep the unparsed tail, at the front
      std::memmove(rx_.data(), rx_.data() + beg_, end_ - beg_);
      end_ -= beg_;
      beg_ = 0;
    }
    return {rx_.data() + end_, rx_.size() - end_};
  }
  void buffered(std::size_t n) { end_ += n; }

  // Parses and reads until nothing more can happen now: `read(p, n)` is the byte source
  // (ReadResult), `head()` the receive at the head of the queue (nullptr: none), `complete()`
  // retires it. After a completion with no receive left it returns (the bytes behind may be for
  // receives not yet posted).
  //
  // `read_pieces(runs, count)`, when given, reads into several runs at once (readv): a large
  // payload of a vectored receive then lands in its pieces directly, as a contiguous one does.
  template <class Read, class Head, class Complete, class ReadPieces = NoPieceReads>
  Stop run(Read&& read, Head&& head, Complete&& complete, ReadPieces&& read_pieces = {}) {
    for (;;) {
      StreamOp* op = head();
      switch (parse(op)) {
        case Step::message_done:
          complete();
          if (head() == nullptr) return Stop::again;
          continue;
        case Step::unposted:
          return Stop::unposted;
        case Step::abort:
          return Stop::abort;
        case Step::need_bytes:
          break;
      }
      if constexpr (!std::is_same_v<std::remove_cvref_t<ReadPieces>, NoPieceReads>) {
        if (type_ == kFrameData && op != nullptr && op->pieces != nullptr && beg_ == end_ &&
            left_ >= kDirectReadBytes && op->kind == OpKind::recv) {
          std::span<std::byte> runs[kPieceReads];
          std::size_t cnt = 0;
          op->peek_dsts(left_, kPieceReads, [&](std::byte* p, std::size_t n) {
            runs[cnt++] = {p, n};
          });
          const ReadResult r = read_pieces(runs, cnt);
          if (r.n == 0) return r.eof ? Stop::closed : Stop::again;
          op->advance(r.n);
          left_ -= r.n;
          continue;
        }
      }
      const std::span<std::byte> room = space(op);
      if (room.empty()) protocol_error("no room left to receive into");  // parse() prevents it
      const ReadResult r = read(room.data(), room.size());
      if (r.n == 0) return r.eof ? Stop::closed : Stop::again;
      received(op, r.n);
    }
  }

  // The ABORT that parse() or run() stopped at.
  const AbortFrame& abort() const { return abort_; }

  // A whole ABORT frame at the front of the buffer, at a frame boundary, if there is one: what a
  // peer that closed on us after failing said first.
  std::optional<AbortFrame> queued_abort() const {
    const std::size_t avail = end_ - beg_;
    if (type_ != 0 || avail < sizeof(FrameHeader)) return std::nullopt;
    FrameHeader h;
    std::memcpy(&h, rx_.data() + beg_, sizeof(h));
    if (h.type != kFrameAbort || h.len < kAbortFixedBytes || avail < sizeof(h) + h.len)
      return std::nullopt;
    return decode_abort(reinterpret_cast<const char*>(rx_.data() + beg_ + sizeof(h)), h.len);
  }

  // Between frames (no frame partly parsed).
  bool at_frame_boundary() const { return type_ == 0; }

 private:
  [[noreturn]] void protocol_error(const std::string& what) const {
    throw Error("TCP protocol error from rank " + std::to_string(peer_) + " (" + what + ")");
  }

  void check_header(const FrameHeader& h, const StreamOp* op) {
    if (h.type == kFrameAbort) {
      if (h.len > kMaxAbortBody)
        throw Error("TCP protocol error from rank " + std::to_string(peer_));
      abort_body_.clear();
    } else if (h.type == kFrameBegin) {
      if (h.len != sizeof(BeginBody)) protocol_error("bad BEGIN");
    } else if (h.type == kFrameData) {
      if (!op->begun) protocol_error("DATA before BEGIN");
      // A frame longer than what is left of the message would never let the receive complete
      // (and, with more bytes queued behind it, spin on a full buffer).
      if (h.len > op->bytes - op->done) {
        protocol_error("DATA frame of " + std::to_string(h.len) + " bytes, " +
                       std::to_string(op->bytes - op->done) + " left in the message");
      }
      // A reducing receive folds whole elements: a frame that ends inside one leaves a fragment
      // no later frame can complete, and the parser would spin on it.
      if (op->kind == OpKind::recv_reduce && h.len % op->rs.elem_size != 0) {
        protocol_error("DATA frame of " + std::to_string(h.len) + " bytes splits a " +
                       std::to_string(op->rs.elem_size) + "-byte element");
      }
    } else {
      protocol_error("bad frame type");
    }
  }

  AbortFrame decode_abort(const char* body, std::size_t n) const {
    AbortFrame a;
    std::int32_t kind = 1, origin = peer_;
    if (n >= kAbortFixedBytes) {
      std::memcpy(&kind, body, 4);
      std::memcpy(&origin, body + 4, 4);
      std::memcpy(&a.seq, body + 8, 8);
      a.reason.assign(body + kAbortFixedBytes, n - kAbortFixedBytes);
    }
    a.kind = static_cast<ErrorKind>(kind);
    a.origin = origin;
    return a;
  }

  int peer_ = -1;
  int self_ = -1;
  std::vector<std::byte> rx_;
  std::size_t beg_ = 0, end_ = 0;  // unparsed bytes: rx_[beg_, end_)
  std::uint32_t type_ = 0;         // frame being parsed (0: expecting a header)
  std::size_t left_ = 0;           // bytes left in the current frame's body
  bool direct_ = false;            // the last space() was op's destination
  std::string abort_body_;
  AbortFrame abort_;
};

}  // namespace kolo::detail
