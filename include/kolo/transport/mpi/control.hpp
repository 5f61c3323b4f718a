// kolo/transport/mpi/control.hpp — MpiTransport's control channel and errors: abort() sending the
// error to every rank, goodbye notices on close, the held errors of later calls, departed peers
// turned into PeerLostError, draining on close, and the timeout text. Definitions of members
// declared in mpi/transport.hpp (which includes this file at its end).
#pragma once

#include <chrono>
#include <cstring>
#include <memory>
#include <string>

#include "kolo/transport/mpi/transport.hpp"

namespace kolo {

inline void MpiTransport::begin_call(std::uint64_t seq) {
  call_seq_ = seq;
  if (!aborted_ && held_seq_ != 0 && held_seq_ <= seq) {
    abort_origin_ = held_origin_;
    abort_seq_ = held_seq_;
    held_seq_ = 0;
    try {
      throw_error(held_kind_, held_what_);
    } catch (const Error& e) {
      abort(e);
    }
  }
}

inline void MpiTransport::abort(const Error& err) {
  if (aborted_) return;
  aborted_ = true;
  error_kind_ = err.kind();
  error_what_ = err.what();
  if (closed_ || detail::mpi::finalized()) return;
  detail::mpi::ControlMessage m;
  m.type = detail::mpi::kControlAbort;
  m.token = token_;
  m.kind = static_cast<std::int32_t>(err.kind());
  m.origin = abort_origin_ >= 0 ? abort_origin_ : rank_;
  m.seq = abort_origin_ >= 0 ? abort_seq_ : call_seq_;
  const std::string reason = err.what();
  const std::size_t n = std::min(reason.size(), sizeof(m.reason) - 1);
  std::memcpy(m.reason, reason.data(), n);
  send_control(m, detail::mpi::kControlHeaderBytes + n + 1);
  // No waiting: MPI only ever holds kolo's own buffers (wire, staging), which close() buries
  // if a request is still pending then. Waiting here would only delay the error (sends to
  // ranks that stopped receiving never complete; MPI cannot cancel them).
  cancel_and_drain(Deadline::after(0));
}

inline void MpiTransport::close() noexcept {
  if (closed_) return;
  closed_ = true;
  if (comm_ == MPI_COMM_NULL || detail::mpi::finalized()) return;
  try {
    if (!aborted_) {
      for (int p = 0; p < size_; ++p) {
        const Peer& peer = peers_[static_cast<std::size_t>(p)];
        if (p == rank_ || peer.gone) continue;
        detail::mpi::ControlMessage m;
        m.type = detail::mpi::kControlGoodbye;
        m.token = token_;
        m.origin = rank_;
        m.sent_to_you = peer.sent;
        m.received_from_you = peer.received;
        m.collectives_done = native_done_;
        send_control_to(p, m, detail::mpi::kControlHeaderBytes);
      }
    }
    if (!cancel_and_drain(Deadline::after(0.02))) {
      // Something is still posted (a send nobody will receive, a receive matched but never
      // completed): what it points into must outlive this object.
      auto rest = std::make_shared<detail::mpi::Leftovers>();
      rest->ops = std::move(pool_).take_slots();
      rest->control_in = std::move(control_in_);
      rest->control_out = std::move(control_out_);
      detail::mpi::bury(std::move(rest));
    }
  } catch (...) {  // best effort: closing must not throw
  }
  // Retired, not freed: Open MPI hands a freed context id to the next new communicator, and a
  // goodbye or abort notice still in flight to a peer that has already freed its duplicate
  // would be delivered into that new communicator, where it takes a slot of ob1's per-peer
  // message sequence and stalls or mis-pairs the new communicator's own traffic (seen in the
  // tests). A handle per transport stays allocated until MPI_Finalize, which releases it.
  comm_ = MPI_COMM_NULL;
}

inline void MpiTransport::post_control_recv() {
  detail::mpi::check(MPI_Irecv(control_in_.get(), sizeof(*control_in_), MPI_BYTE, MPI_ANY_SOURCE,
                               tag_control(), comm_, &control_req_),
                     "MPI_Irecv (control)");
}

inline void MpiTransport::send_control(const detail::mpi::ControlMessage& m, std::size_t bytes) {
  for (int p = 0; p < size_; ++p) {
    if (p != rank_ && !peers_[static_cast<std::size_t>(p)].gone) send_control_to(p, m, bytes);
  }
}

inline void MpiTransport::send_control_to(int p, const detail::mpi::ControlMessage& m,
                                          std::size_t bytes) {
  // Kept until the send completes (drained on close); eager-sized, so it completes at once.
  control_out_.push_back(std::make_unique<detail::mpi::ControlMessage>(m));
  control_reqs_.push_back(MPI_REQUEST_NULL);
  if (MPI_Isend(control_out_.back().get(), static_cast<int>(bytes), MPI_BYTE, p, tag_control(),
                comm_, &control_reqs_.back()) != MPI_SUCCESS) {
    control_reqs_.back() = MPI_REQUEST_NULL;  // best effort: that peer will time out instead
  }
}

inline void MpiTransport::poll_control() {
  while (control_req_ != MPI_REQUEST_NULL) {
    int flag = 0;
    MPI_Status st;
    detail::mpi::check(MPI_Test(&control_req_, &flag, &st), "MPI_Test (control)");
    if (!flag) return;
    const detail::mpi::ControlMessage m = *control_in_;
    const int from = st.MPI_SOURCE;
    post_control_recv();
    if (m.magic != detail::mpi::kControlMagic || m.token != token_) continue;  // stale
    if (m.type == detail::mpi::kControlAbort) {
      std::string msg(m.reason, strnlen(m.reason, sizeof(m.reason)));
      if (msg.find("[reported by rank") == std::string::npos) {
        msg += " [reported by rank " + std::to_string(m.origin) + "]";
      }
      if (m.seq != 0 && m.seq > call_seq_) {  // a later call's: hold it (the earliest one)
        if (held_seq_ == 0 || m.seq < held_seq_) {
          held_seq_ = m.seq;
          held_kind_ = static_cast<ErrorKind>(m.kind);
          held_origin_ = m.origin;
          held_what_ = std::move(msg);
        }
        continue;
      }
      abort_origin_ = m.origin;
      abort_seq_ = m.seq;
      throw_error(static_cast<ErrorKind>(m.kind), msg);
    }
    if (m.type == detail::mpi::kControlGoodbye && from >= 0 && from < size_) {
      Peer& peer = peers_[static_cast<std::size_t>(from)];
      peer.gone = true;
      peer.bye_sent_to_me = m.sent_to_you;
      peer.bye_received_from_me = m.received_from_you;
      peer.bye_collectives = m.collectives_done;
      peer.gone_at = Clock::now();
      any_gone_ = true;
    }
  }
}

inline void MpiTransport::check_gone() {
  const auto grace = std::chrono::milliseconds(100);
  for (int p = 0; p < size_; ++p) {
    const Peer& peer = peers_[static_cast<std::size_t>(p)];
    if (!peer.gone || Clock::now() - peer.gone_at < grace) continue;
    if (!peer.recvq.empty() && peer.received >= peer.bye_sent_to_me) {
      peer_left(p, pool_[peer.recvq.front()].sig,
                "without sending all that rank " + std::to_string(rank_) + " waits for");
    }
    if (!peer.sendq.empty() && peer.sent - peer.sendq.size() + 1 > peer.bye_received_from_me) {
      peer_left(p, pool_[peer.sendq.front()].sig,
                "without receiving all that rank " + std::to_string(rank_) + " sends it");
    }
  }
}

inline void MpiTransport::check_gone_native(const AlgoOptions& o) {
  if (!any_gone_) return;
  for (int p = 0; p < size_; ++p) {
    const Peer& peer = peers_[static_cast<std::size_t>(p)];
    if (peer.gone && peer.bye_collectives < native_started_)
      peer_left(p, o.sig, "without taking part in it");
  }
}

inline void MpiTransport::peer_left(int p, const Signature& sig, const std::string& what) {
  throw PeerLostError("rank " + std::to_string(p) + " left during " + sig.describe() + " " + what +
                      " (its MpiTransport was destroyed or its process exited); "
                      "detected by rank " +
                      std::to_string(rank_));
}

inline bool MpiTransport::cancel_and_drain(const Deadline& dl) {
  auto each_request = [&](auto&& f) {
    for (auto& op : pool_) {
      f(op.head, op.kind != detail::OpKind::send);
      for (auto& r : op.data) f(r, op.kind != detail::OpKind::send);
    }
    f(control_req_, true);
    for (auto& r : control_reqs_) f(r, false);
  };
  each_request([](MPI_Request& r, bool is_recv) {
    if (r != MPI_REQUEST_NULL && is_recv) MPI_Cancel(&r);
  });
  for (;;) {
    bool left = false;
    each_request([&](MPI_Request& r, bool) {
      if (r == MPI_REQUEST_NULL) return;
      int flag = 0;
      if (MPI_Test(&r, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        r = MPI_REQUEST_NULL;  // failed: nothing more will happen to it
      } else if (!flag) {
        left = true;
      }
    });
    if (!left) return true;
    if (dl.expired()) return false;  // tested once at least
    timespec ts{0, 100000};
    ::nanosleep(&ts, nullptr);
  }
}

inline std::string MpiTransport::timeout_message() const {
  std::string waiting, what;
  for (int p = 0; p < size_; ++p) {
    const Peer& peer = peers_[static_cast<std::size_t>(p)];
    if (peer.sendq.empty() && peer.recvq.empty()) continue;
    if (what.empty()) {
      what = pool_[peer.recvq.empty() ? peer.sendq.front() : peer.recvq.front()].sig.describe();
    }
    waiting += (waiting.empty() ? "rank " : ", rank ") + std::to_string(p);
  }
  return "rank " + std::to_string(rank_) + " timed out in " + (what.empty() ? "a wait" : what) +
         " after " + seconds_text() + " s waiting for " + (waiting.empty() ? "nothing" : waiting) +
         " (MPI transport; raise KOLO_TIMEOUT_SECONDS if the job is just slow)";
}

static_assert(check_transport<MpiTransport>());

}  // namespace kolo
