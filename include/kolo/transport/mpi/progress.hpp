// kolo/transport/mpi/progress.hpp — how MpiTransport moves its messages: posting an operation
// (header message with the payload inline when small, else data messages from or into kolo-owned
// staging), progress in posting order per peer (testing only each queue's head), checking each
// received header against the receive's signature and size, delivering (copy or reduce) into the
// caller's buffer, and blocking with the backoff until something completes or the deadline passes.
// Definitions of members declared in mpi/transport.hpp (which includes this file at its end).
#pragma once

#include <cstddef>
#include <cstring>
#include <string>

#include "kolo/transport/mpi/transport.hpp"

namespace kolo {

inline detail::mpi::MpiOp& MpiTransport::post(int peer, detail::OpKind kind, const Signature& sig,
                                              std::size_t bytes) {
  if (aborted_) rethrow();
  if (closed_) throw Error("MpiTransport used after it was closed (MPI_Finalize)");
  detail::check_peer(peer, rank_, size_);
  auto& p = peers_[static_cast<std::size_t>(peer)];
  detail::mpi::MpiOp& op =
      pool_.post(kind == detail::OpKind::send ? p.sendq : p.recvq, kind, peer, bytes, sig);
  // Reset, keeping the buffers' capacity: no allocation per message once warm.
  op.header_done = false;
  op.inline_payload = false;
  op.head = MPI_REQUEST_NULL;
  op.data.clear();
  op.data_done = 0;
  return op;
}

inline MpiTransport::Request MpiTransport::post_recv(detail::mpi::MpiOp& op) {
  // Room for any inline message, whatever size the sender believes in: a disagreeing sender
  // is then received and named rather than truncated.
  op.wire.resize(sizeof(detail::mpi::WireHeader) + inline_bytes_);
  try {
    mpi_call(MPI_Irecv(op.wire.data(), static_cast<int>(op.wire.size()), MPI_BYTE, op.peer,
                       tag_header(), comm_, &op.head),
             "MPI_Irecv", op);
    if (op.bytes > inline_bytes_) {
      // Into kolo's buffer, then copied or folded into the destination at completion: MPI
      // never holds a pointer into the caller's memory past the call that owns it.
      op.staging.resize(op.bytes);
      std::byte* target = op.staging.data();
      for (std::size_t off = 0; off < op.bytes; off += detail::mpi::kMaxMessage) {
        const std::size_t n = std::min(detail::mpi::kMaxMessage, op.bytes - off);
        op.data.push_back(MPI_REQUEST_NULL);
        mpi_call(MPI_Irecv(target + off, static_cast<int>(n), MPI_BYTE, op.peer, tag_data(), comm_,
                           &op.data.back()),
                 "MPI_Irecv", op);
      }
    }
  } catch (const Error& e) {
    fail(e);
  }
  return pool_.handle(op);
}

inline bool MpiTransport::test_request(MPI_Request& r, const detail::mpi::MpiOp& op,
                                       MPI_Status* st) {
  if (r == MPI_REQUEST_NULL) return true;
  int flag = 0;
  MPI_Status local;
  mpi_call(MPI_Test(&r, &flag, st ? st : &local), "MPI_Test", op);
  return flag != 0;
}

inline void MpiTransport::progress() {
  try {
    poll_control();
    for (int p = 0; p < size_; ++p) {
      Peer& peer = peers_[static_cast<std::size_t>(p)];
      if (!peer.sendq.empty()) progress_sends(peer);
      if (!peer.recvq.empty()) progress_recvs(peer, p);
    }
    if (any_gone_) check_gone();
  } catch (const Error& e) {
    fail(e);
  }
}

inline void MpiTransport::progress_sends(Peer& peer) {
  while (!peer.sendq.empty()) {
    detail::mpi::MpiOp& op = pool_[peer.sendq.front()];
    if (!test_request(op.head, op)) return;
    for (; op.data_done < op.data.size(); ++op.data_done) {
      if (!test_request(op.data[op.data_done], op)) return;
    }
    complete(peer.sendq);
  }
}

inline void MpiTransport::progress_recvs(Peer& peer, int p) {
  while (!peer.recvq.empty()) {
    detail::mpi::MpiOp& op = pool_[peer.recvq.front()];
    if (!op.header_done) {
      MPI_Status st;
      if (!test_request(op.head, op, &st)) return;
      int got = 0;
      MPI_Get_count(&st, MPI_BYTE, &got);
      check_header(op, p, static_cast<std::size_t>(got));
      op.header_done = true;
      if (op.inline_payload && op.bytes > 0) {
        deliver(op, op.wire.data() + sizeof(detail::mpi::WireHeader));
      }
    }
    for (; op.data_done < op.data.size(); ++op.data_done) {
      if (!test_request(op.data[op.data_done], op)) return;
    }
    if (!op.inline_payload && op.bytes > 0) deliver(op, op.staging.data());
    ++peer.received;
    complete(peer.recvq);
  }
}

inline void MpiTransport::deliver(detail::mpi::MpiOp& op, const std::byte* incoming) {
  if (op.kind == detail::OpKind::recv) {
    std::memcpy(op.dst, incoming, op.bytes);
  } else {
    op.rs.fn(op.dst, op.src, incoming, op.bytes / op.rs.elem_size);
  }
}

inline void MpiTransport::check_header(detail::mpi::MpiOp& op, int p, std::size_t got) {
  detail::mpi::WireHeader h{};
  if (got >= sizeof(h)) std::memcpy(&h, op.wire.data(), sizeof(h));
  if (got < sizeof(h) || h.magic != detail::mpi::kHeaderMagic) {
    throw Error("MPI transport protocol error: rank " + std::to_string(p) + " sent " +
                std::to_string(got) + " bytes that are not a kolo message header, during " +
                op.sig.describe() + " on rank " + std::to_string(rank_));
  }
  if (h.sig != op.sig || h.bytes != op.bytes) detail::throw_mismatch(p, rank_, h.sig, h.bytes, op);
  op.inline_payload = h.inline_payload != 0;
  if (op.inline_payload != (op.bytes <= inline_bytes_) ||
      (op.inline_payload && got != sizeof(h) + op.bytes)) {
    throw Error("MPI transport protocol error: rank " + std::to_string(p) +
                " framed its message differently (KOLO_MPI_INLINE_BYTES differs?) in " +
                op.sig.describe());
  }
}

inline void MpiTransport::block(const Deadline& dl) {
  if (aborted_) rethrow();
  const std::uint64_t before = pool_.completions();
  progress();
  if (pool_.completions() != before || pool_.pending() == 0) return;
  detail::mpi::Backoff backoff(spin_us_);
  for (;;) {
    if (dl.expired()) fail(TimeoutError(timeout_message()));
    backoff.pause();
    progress();
    if (pool_.completions() != before) return;
  }
}

}  // namespace kolo
