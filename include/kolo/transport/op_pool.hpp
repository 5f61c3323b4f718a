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
  Signature sig;
  ReduceSpec rs;
  std::uint32_t gen = 0;    // the pool's: bumped when the op completes
  std::uint32_t index = 0;  // the pool's: position in the pool
};

// An operation moved in pieces (shared-memory slots, TCP frames): how much has moved, and whether
// its first piece (the one that carries the Signature and the total size) has.
struct StreamOp : P2POp {
  std::size_t done = 0;
  bool begun = false;
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
