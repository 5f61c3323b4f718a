// kolo/transport/op_pool.hpp — the operation pool of kolo's point-to-point transports (the mesh,
// transport/mesh.hpp, and MpiTransport, transport/mpi.hpp).
//
// A posted operation lives in a slot of the pool until it completes; the caller holds a
// `{index, generation}` handle. Completing an operation bumps its slot's generation and returns
// the slot to the free list at once, so a handle never dangles, nothing has to release it, and
// `done(handle)` stays answerable forever (a newer use of the slot has another generation).
// Slots live in a deque: their addresses never change, which MPI needs while it holds pointers
// into them, and a slot keeps what it allocated (MPI's staging vectors) for its next use.
//
// The pool also counts completions, which is what `wait_any_progress` waits on ("something
// completed since this last returned": an operation may complete inside the isend/irecv call
// that posted it, and a waiter must not miss that), and keeps each peer's operations in one
// FIFO per direction: operations to one peer in one direction complete in posting order (the
// Transport contract).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "kolo/core/error.hpp"
#include "kolo/core/signature.hpp"
#include "kolo/transport/transport.hpp"

namespace kolo::detail {

enum class OpKind : std::uint8_t { send, recv, recv_reduce };

// What a transport's Request is: a slot of the pool and which use of that slot.
struct OpHandle {
  std::uint32_t index = 0;
  std::uint32_t gen = 0;
};

// The fields of every point-to-point operation, whatever moves its bytes. A transport derives
// its own operation type from this (StreamOp below, MpiOp in mpi.hpp).
struct P2POp {
  OpKind kind = OpKind::send;
  int peer = -1;
  const std::byte* src = nullptr;  // send: data; recv_reduce: local operand
  std::byte* dst = nullptr;        // recv, recv_reduce
  std::size_t bytes = 0;
  const IoPiece* pieces = nullptr;  // vectored (isendv...): the runs; then src and dst are unused
  std::size_t npieces = 0;
  Signature sig;
  ReduceSpec rs;
  std::uint32_t gen = 0;    // the pool's: bumped when the op completes
  std::uint32_t index = 0;  // the pool's: position in the pool
};

// An operation moved in pieces (shared-memory slots, TCP frames): how much has moved, and whether
// its first piece (the one that carries the Signature and the total size) has.
//
// The bytes at `done` are reached through run() and consumed with advance(), which also keeps a
// vectored operation's cursor (its current piece and the offset in it) in step with `done`.
struct StreamOp : P2POp {
  std::size_t done = 0;
  bool begun = false;
  std::size_t piece = 0;     // vectored: the piece holding byte `done`
  std::size_t piece_at = 0;  // vectored: and its offset in that piece

  // The contiguous memory at byte `done`, at most `max` bytes of it (a null side stays null).
  struct Run {
    std::byte* dst;
    const std::byte* src;
    std::size_t n;
  };
  Run run(std::size_t max) const {
    if (pieces == nullptr) return {at(dst, done), at(src, done), max};
    const IoPiece& p = pieces[piece];
    return {at(p.dst, piece_at), at(p.src, piece_at), std::min(max, p.bytes - piece_at)};
  }
  // `n` bytes at `done` have moved.
  void advance(std::size_t n) {
    done += n;
    if (pieces == nullptr) return;
    piece_at += n;
    settle();
  }
  // Calls f(dst, src, n) for the contiguous runs of the next `n` bytes (n <= bytes - done) and
  // advances past them.
  template <class F>
  void consume(std::size_t n, F&& f) {
    while (n > 0) {
      const Run r = run(n);
      f(r.dst, r.src, r.n);
      advance(r.n);
      n -= r.n;
    }
  }
  // Calls f(src, n) for at most `cap` contiguous runs of the send data from `done` on, `max`
  // bytes at most, without moving (a socket takes them in one call and says how many it took).
  template <class F>
  void peek_sends(std::size_t max, std::size_t cap, F&& f) const {
    peek(src, &IoPiece::src, max, cap, f);
  }
  // The same for where a vectored receive's next bytes land: f(dst, n).
  template <class F>
  void peek_dsts(std::size_t max, std::size_t cap, F&& f) const {
    peek(dst, &IoPiece::dst, max, cap, f);
  }
  // Starts a vectored operation on `pieces[0..count)`, which must add up to `bytes`.
  void set_pieces(const IoPiece* v, std::size_t count) {
    pieces = v;
    npieces = count;
    piece = 0;
    piece_at = 0;
    settle();
  }

 private:
  // peek_sends / peek_dsts: `whole` is the contiguous operation's pointer, `side` the pieces'.
  template <class P, class F>
  void peek(P* whole, P* IoPiece::*side, std::size_t max, std::size_t cap, F& f) const {
    if (pieces == nullptr) {
      if (max > 0 && cap > 0) f(whole + done, max);
      return;
    }
    for (std::size_t k = piece, off = piece_at; k < npieces && max > 0 && cap > 0; ++k, off = 0) {
      const std::size_t n = std::min(max, pieces[k].bytes - off);
      if (n == 0) continue;
      f(pieces[k].*side + off, n);
      max -= n;
      --cap;
    }
  }
  template <class P>
  static P* at(P* p, std::size_t off) {
    return p == nullptr ? nullptr : p + off;
  }
  // The cursor never rests at the end of a piece while another follows (empty ones skipped).
  void settle() {
    while (piece + 1 < npieces && piece_at >= pieces[piece].bytes) {
      piece_at -= pieces[piece].bytes;
      ++piece;
    }
  }
};

// One peer's operations in one direction, oldest first (slot indices).
using OpQueue = std::deque<std::uint32_t>;

template <class Op>
class OpPool {
 public:
  // Takes a free slot (a new one when none is free), sets the common fields and appends it to
  // `q`. The fields of the derived type are left as the slot's last use left them: the caller
  // resets what it needs (keeping buffers' capacity, for instance).
  Op& post(OpQueue& q, OpKind kind, int peer, std::size_t bytes, const Signature& sig) {
    std::uint32_t idx;
    if (!free_.empty()) {
      idx = free_.back();
      free_.pop_back();
    } else {
      idx = static_cast<std::uint32_t>(ops_.size());
      ops_.emplace_back();
    }
    Op& op = ops_[idx];
    op.kind = kind;
    op.peer = peer;
    op.src = nullptr;
    op.dst = nullptr;
    op.pieces = nullptr;
    op.npieces = 0;
    op.bytes = bytes;
    op.sig = sig;
    op.rs = {};
    op.index = idx;
    q.push_back(idx);
    ++pending_;
    return op;
  }

  // The handle of op's current use.
  static OpHandle handle(const Op& op) { return {op.index, op.gen}; }

  // True once the use `r` names has completed.
  bool done(OpHandle r) const { return ops_[r.index].gen != r.gen; }

  Op& operator[](std::uint32_t index) { return ops_[index]; }
  const Op& operator[](std::uint32_t index) const { return ops_[index]; }

  // Completes the oldest operation of q: its handles read as done from now on, its slot is free.
  void complete_front(OpQueue& q) {
    const std::uint32_t idx = q.front();
    q.pop_front();
    ++ops_[idx].gen;
    free_.push_back(idx);
    --pending_;
    ++completions_;
  }

  // Operations posted and not completed.
  std::size_t pending() const { return pending_; }
  // Operations completed so far (only ever grows).
  std::uint64_t completions() const { return completions_; }
  // wait_any_progress's question: has anything completed since mark_seen()?
  bool completed_since_seen() const { return completions_ != seen_completions_; }
  void mark_seen() { seen_completions_ = completions_; }

  // Every slot, in use or free (MPI cancels what is still posted when it closes).
  auto begin() { return ops_.begin(); }
  auto end() { return ops_.end(); }
  // Hands over the slots themselves, for state that must outlive the transport (MPI requests
  // still pointing into them); the pool must not be used afterwards.
  std::deque<Op> take_slots() && { return std::move(ops_); }

 private:
  std::deque<Op> ops_;
  std::vector<std::uint32_t> free_;
  std::size_t pending_ = 0;
  std::uint64_t completions_ = 0;
  std::uint64_t seen_completions_ = 0;
};

// The checks and messages every point-to-point transport shares.

// An error another rank reported (an ABORT frame, a shared-memory abort record).
struct RemoteAbort {
  ErrorKind kind = ErrorKind::generic;
  int origin = -1;     // the rank where the error happened
  std::string reason;  // its what(), as it came off the wire
  // The collective call it belongs to (Signature::seq of the call that failed at the origin);
  // 0: no call in particular, fail whatever runs now. A rank still inside an earlier call
  // finishes that call first (MeshTransport::begin_call).
  std::uint64_t seq = 0;

  // The text this rank throws: the reason, with control bytes shown as '?' (it comes off the
  // wire: a NUL would cut what() short, losing the tag, and control bytes would garble logs),
  // tagged "[reported by rank R]" unless a forwarding rank tagged it already.
  std::string message() const {
    std::string msg = reason;
    for (char& c : msg) {
      const auto u = static_cast<unsigned char>(c);
      if ((u < 0x20 && c != '\n' && c != '\t') || u == 0x7f) c = '?';
    }
    if (msg.find("[reported by rank") == std::string::npos) {
      msg += " [reported by rank " + std::to_string(origin) + "]";
    }
    return msg;
  }
};

inline void check_peer(int peer, int rank, int size) {
  if (peer < 0 || peer >= size || peer == rank) {
    throw Error("invalid peer rank " + std::to_string(peer) + " (this is rank " +
                std::to_string(rank) + " of " + std::to_string(size) + ")");
  }
}

// A message's header (the sender's Signature and size) disagrees with the receive posted for it.
[[noreturn]] inline void throw_mismatch(int from, int me, const Signature& theirs,
                                        std::uint64_t their_bytes, const P2POp& op) {
  if (theirs == op.sig) {
    throw MismatchError("message size mismatch in " + op.sig.describe() + ": rank " +
                        std::to_string(from) + " sent " + std::to_string(their_bytes) +
                        " bytes, rank " + std::to_string(me) + " expected " +
                        std::to_string(op.bytes));
  }
  throw MismatchError("collective mismatch: rank " + std::to_string(from) + " called " +
                      theirs.describe() + " but rank " + std::to_string(me) + " called " +
                      op.sig.describe());
}

}  // namespace kolo::detail
