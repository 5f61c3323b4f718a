// kolo/transport/mesh.hpp — the point-to-point engine behind ShmTransport, TcpTransport and
// RoutedTransport.
//
// One engine, three route policies. Each peer is reached either through shared memory (ranks
// with the same host key) or through an authenticated TCP connection, and one progress loop
// serves both, so a rank in a routed job can wait on a local slot and a remote socket at once
// without a helper thread. Why not two transports composed: the routed case would need two
// waits (futex and poll) and one of them would always be late. Here the shared-memory doorbell
// is a FIFO, so a single poll() sleeps on sockets, doorbell and peer process handles together.
//
// The engine is split by concern, one file each (docs/architecture.md, "The mesh, file by file"):
//   transport/op_pool.hpp         posted operations, their handles and per-peer FIFOs (shared
//                                 with MpiTransport)
//   transport/mesh/connect.hpp    routes, and the set-up of every connection (segments,
//                                 doorbells, pidfds, TCP acceptor and HMAC handshake)
//   transport/mesh/shm_channel.hpp  segment layout and the SPSC slot ring of one local peer
//   transport/mesh/doorbell.hpp   how a sleeping rank is woken by a local peer
//   transport/mesh/frame_codec.hpp  the TCP wire format: a pure encoder/decoder (fuzzed on bytes)
//   transport/mesh/tcp_channel.hpp  the socket calls under the codec, one peer
//   transport/mesh/poll_loop.hpp  spinning, then one poll() on everything
//   transport/pool_completion.hpp  the completion calls (test, wait...), shared with MPI
// This file is what remains: posting, progress over every peer's route, and errors — a failure
// anywhere aborts the transport and reaches every peer (the shared-memory peers through their
// control block, the TCP peers as an ABORT frame) as the same exception.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kolo/core/compiled_core.hpp"
#include "kolo/core/deadline.hpp"
#include "kolo/core/env.hpp"
#include "kolo/core/error.hpp"
#include "kolo/core/signature.hpp"
#include "kolo/topology/bootstrap.hpp"
#include "kolo/transport/mesh/frame_codec.hpp"
#include "kolo/transport/mesh/poll_loop.hpp"
#include "kolo/transport/mesh/shm_channel.hpp"
#include "kolo/transport/mesh/tcp_channel.hpp"
#include "kolo/transport/op_pool.hpp"
#include "kolo/transport/pool_completion.hpp"
#include "kolo/transport/route.hpp"
#include "kolo/transport/transport.hpp"
#include "kolo/transport/transport_config.hpp"

namespace kolo {

struct MeshOptions {
  std::size_t shm_slot_bytes = 256 * 1024;  // S: one copy unit; large enough for memcpy speed
  std::size_t shm_slots = 8;                // K: slots per channel (pipelining depth)
  double spin_us = -1;                      // >= 0: a fixed spin budget (KOLO_SPIN_US)
  double spin_min_us = -1;                  // < 0: decided from ranks per core
  double spin_max_us = 1000;                // the adaptive budget's cap and start
  int yield_every = 0;                      // 0: decided from ranks per core
  bool spread = true;                       // move off a core shared with a local peer
  std::size_t tcp_frame_bytes = 4 << 20;

  static MeshOptions from_env(const EnvLookup& env = process_env()) {
    MeshOptions o;
    if (auto v = config::get_int(env, config::vars::shm_slot_bytes)) {
      o.shm_slot_bytes = static_cast<std::size_t>(*v) & ~std::size_t{63};
    }
    if (auto v = config::get_int(env, config::vars::shm_slots))
      o.shm_slots = static_cast<std::size_t>(*v);
    if (auto v = config::get_real(env, config::vars::spin_us)) o.spin_us = *v;
    if (auto v = config::get_real(env, config::vars::spin_min_us)) o.spin_min_us = *v;
    if (auto v = config::get_real(env, config::vars::spin_max_us)) o.spin_max_us = *v;
    if (auto v = config::get_flag(env, config::vars::wait_spread)) o.spread = *v;
    if (auto v = config::get_int(env, config::vars::yield_every)) {
      o.yield_every = static_cast<int>(*v);
    }
    return o;
  }
};

class MeshTransport : public detail::PoolCompletion<MeshTransport> {
 public:
  using Request = detail::OpHandle;

  MeshTransport(Bootstrap& boot, RouteMode mode, MeshOptions opts = MeshOptions::from_env())
      : rank_(boot.rank()),
        size_(boot.size()),
        mode_(mode),
        opts_(opts),
        timeout_(boot.topology().timeout_seconds),
        host_keys_(boot.host_keys()),
        peers_(static_cast<std::size_t>(boot.size())) {
    setup(boot);
  }

  // The factory (transport.hpp, Connectable): the route policy (KOLO_TRANSPORT) and the mesh's
  // variables, read before the rendezvous, then the connections.
  struct Options {
    RouteMode mode = RouteMode::routed;
    MeshOptions mesh;
    static Options from_env(const EnvLookup& env) {
      return {route_mode_from_env(env), MeshOptions::from_env(env)};
    }
  };
  static std::unique_ptr<MeshTransport> connect(Bootstrap& boot, const Options& o) {
    return std::make_unique<MeshTransport>(boot, o.mode, o.mesh);
  }

  MeshTransport(const MeshTransport&) = delete;
  MeshTransport& operator=(const MeshTransport&) = delete;

  // The connections close with their channels.
  ~MeshTransport() {
    if (aborted_) drain_tcp_before_close();
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  double timeout_seconds() const { return timeout_; }
  RouteMode mode() const { return mode_; }
  Route route(int peer) const { return peers_[static_cast<std::size_t>(peer)].route; }
  // How rank a reaches rank b, the same answer on every rank (from the host keys and the policy).
  Route route_between(int a, int b) const {
    if (a == b) return Route::self;
    if (mode_ == RouteMode::tcp_only) return Route::tcp;
    if (host_keys_[static_cast<std::size_t>(a)] == host_keys_[static_cast<std::size_t>(b)]) {
      return Route::shm;
    }
    return mode_ == RouteMode::routed ? Route::tcp : Route::shm;
  }
  int local_peer_count() const { return static_cast<int>(local_ranks_); }

  // ---------------- posting ----------------

  Request isend(int peer, const void* src, std::size_t bytes, const Signature& sig) {
    auto& op = post(peer, detail::OpKind::send, sig, bytes);
    op.src = static_cast<const std::byte*>(src);
    return finish_post(op);
  }

  Request irecv(int peer, void* dst, std::size_t bytes, const Signature& sig) {
    auto& op = post(peer, detail::OpKind::recv, sig, bytes);
    op.dst = static_cast<std::byte*>(dst);
    return finish_post(op);
  }

  Request irecv_reduce(int peer, void* dst, const void* local, std::size_t bytes,
                       const ReduceSpec& rs, const Signature& sig) {
    auto& op = post(peer, detail::OpKind::recv_reduce, sig, bytes);
    op.dst = static_cast<std::byte*>(dst);
    op.src = static_cast<const std::byte*>(local);
    op.rs = rs;
    if (bytes % rs.elem_size != 0) {
      throw Error("irecv_reduce: byte count " + std::to_string(bytes) +
                  " is not a multiple of the element size");
    }
    return finish_post(op);
  }

  // Vectored (VectoredP2P): the same messages, their bytes in `pieces` (see IoPiece).
  Request isendv(int peer, const IoPiece* pieces, std::size_t count, std::size_t bytes,
                 const Signature& sig) {
    auto& op = post(peer, detail::OpKind::send, sig, bytes);
    set_pieces(op, pieces, count, 1, "isendv");
    return finish_post(op);
  }

  Request irecvv(int peer, const IoPiece* pieces, std::size_t count, std::size_t bytes,
                 const Signature& sig) {
    auto& op = post(peer, detail::OpKind::recv, sig, bytes);
    set_pieces(op, pieces, count, 1, "irecvv");
    return finish_post(op);
  }

  Request irecv_reducev(int peer, const IoPiece* pieces, std::size_t count, std::size_t bytes,
                        const ReduceSpec& rs, const Signature& sig) {
    auto& op = post(peer, detail::OpKind::recv_reduce, sig, bytes);
    op.rs = rs;
    set_pieces(op, pieces, count, rs.elem_size, "irecv_reducev");
    return finish_post(op);
  }

  // ---------------- completion ----------------

  // done, test, wait, wait_all, wait_any_progress: detail::PoolCompletion (pool_completion.hpp).

  // ---------------- errors ----------------

  [[noreturn]] void rethrow() const { throw_error(error_kind_, error_what_); }

  // Records err as this transport's fatal error and tells every peer (best effort, bounded).
  // The error belongs to the call this rank is in (begin_call), or, forwarded, to the call of
  // the rank where it happened: the peers still inside an earlier call finish that one first.
  void abort(const Error& err) {
    if (aborted_) return;
    aborted_ = true;
    error_kind_ = err.kind();
    error_what_ = err.what();
    const int origin = abort_origin_ >= 0 ? abort_origin_ : rank_;
    const std::uint64_t seq = abort_origin_ >= 0 ? abort_seq_ : call_seq_;
    const std::string reason = err.what();
    for (Peer& peer : peers_) {
      if (peer.route == Route::shm) {
        peer.shm.post_abort(err.kind(), origin, reason, seq);
      } else if (peer.route == Route::tcp && peer.tcp.valid() && !peer.tcp.closed()) {
        const detail::StreamOp* in_flight =
            peer.sendq.empty() ? nullptr : &pool_[peer.sendq.front()];
        peer.tcp.send_abort(in_flight, err.kind(), origin, reason, seq);
      }
    }
  }

  // The ordering of errors (transport.hpp, OrderedErrors): the communicator numbers its
  // collective calls (Signature::seq) and says when this rank begins call `seq`. A peer's error
  // that belongs to a later call than the one this rank is in is held, not thrown: this rank
  // finishes its call (the failing rank completed it, so everything this rank needs of it has
  // been sent), and the held error becomes this transport's error when this rank begins that
  // later call, so the call that caused an error is the one that fails on every rank. After
  // begin_call, aborted() says whether the call may run.
  void begin_call(std::uint64_t seq) {
    call_seq_ = seq;
    if (!aborted_ && held_ && held_->seq <= seq) {
      const detail::RemoteAbort a = *held_;
      held_.reset();
      try {
        throw_remote(a);
      } catch (const Error& e) {
        abort(e);
      }
    }
  }

  bool aborted() const { return aborted_; }

  // The one thread-safe call: asks whatever runs on this transport in another thread (a
  // collective, a wait on a request) to fail with an Error carrying `why`, at its next look at
  // the transport (at once under shared memory, whose bell it rings; within 200 ms over TCP).
  // The failure then aborts the transport as any error does, so the peers fail too. For layers
  // that must stop a running operation from outside (kolo_torch's ProcessGroup abort()).
  void interrupt(const std::string& why) { interrupt(ErrorKind::generic, why); }
  // The same, failing with an error of `kind` (ErrorKind::revoked: Communicator::revoke's).
  void interrupt(ErrorKind kind, const std::string& why) {
    int expect = 0;
    if (interrupt_state_.compare_exchange_strong(expect, 1, std::memory_order_acq_rel)) {
      interrupt_kind_ = kind;
      interrupt_why_ = why;
      interrupt_state_.store(2, std::memory_order_release);
    }
    if (own_.valid()) own_.doorbell().ring_self();
  }

  // Revokes the transport (Communicator::revoke, shrink): records a RevokedError carrying `why`
  // and tells every peer at once, with no call number, so a peer fails whatever call it is in
  // (or its next one) instead of finishing an earlier call first. Already aborted: nothing — the
  // peers have been told the real cause (a PeerLostError stays what every rank rethrows).
  void revoke(const std::string& why) {
    if (aborted_) return;
    abort_origin_ = rank_;
    abort_seq_ = 0;
    abort(RevokedError("communicator revoked by rank " + std::to_string(rank_) +
                       (why.empty() ? std::string() : ": " + why)));
  }

  // This rank's failure detector, now (no waiting): the peers whose process is gone — a local
  // peer whose process exited (its pidfd readable, or no such process); a TCP peer whose stream
  // ended without an ABORT frame while an operation needed it, or, with this rank's host key,
  // whose process does not exist. A TCP peer on another host that died while nobody talked to
  // it is not seen here: shrink's agreement excludes it at its deadline.
  std::vector<int> lost_peers() {
    std::vector<int> lost;
    for (int p = 0; p < size_; ++p) {
      Peer& peer = peers_[static_cast<std::size_t>(p)];
      bool gone = false;
      if (peer.route == Route::shm) {
        if (!peer.shm.dead() && peer.shm.pidfd() >= 0) {
          pollfd f{peer.shm.pidfd(), POLLIN, 0};
          if (::poll(&f, 1, 0) > 0 && (f.revents & (POLLIN | POLLHUP | POLLERR))) {
            peer.shm.mark_dead();
          }
        } else if (!peer.shm.dead() && peer.pid > 0 && ::kill(peer.pid, 0) != 0 && errno == ESRCH) {
          peer.shm.mark_dead();
        }
        gone = peer.shm.dead();
      } else if (peer.route == Route::tcp) {
        // A closed connection alone says nothing: a failing peer sends its ABORT frame and
        // shuts its side down, alive. Gone: its stream ended with no ABORT while this rank still
        // needed it (peer_died), or, on this host, its process does not exist.
        gone = peer.died || (host_keys_[static_cast<std::size_t>(p)] ==
                                 host_keys_[static_cast<std::size_t>(rank_)] &&
                             peer.pid > 0 && ::kill(peer.pid, 0) != 0 && errno == ESRCH);
      }
      if (gone) lost.push_back(p);
    }
    return lost;
  }

  // Non-blocking: makes progress and throws this transport's error if it has been aborted
  // here or by a peer, or a peer has gone. For callers that wait on something else (a CUDA
  // stream, an NCCL kernel) and must still notice a failing job.
  void poll() {
    if (aborted_) rethrow();
    progress();
    if (aborted_) rethrow();
  }

 private:
  friend class detail::PoolCompletion<MeshTransport>;  // reaches pool_, progress() and block()
  friend class detail::PollLoop;  // the waiting calls progress() and the hooks below

  // One peer: how it is reached (set-up's PeerLink) and its operations, oldest first.
  struct Peer {
    Route route = Route::self;
    int pid = 0;
    detail::ShmChannel shm;
    detail::TcpChannel tcp;
    detail::OpQueue sendq, recvq;
    bool died = false;  // peer_died(): its channel ended with no ABORT (lost_peers)
  };

  // ---------------- setup ----------------

  void setup(Bootstrap& boot);

  // After an abort, let each TCP peer read our ABORT before our close can reset the connection
  // (detail::drain_before_close), in the background (detail::BackgroundDrains): the sockets are
  // duplicated, so closing ours here does not close the connection, and the error that led here
  // is not delayed by the drain's second.
  void drain_tcp_before_close() noexcept;

  // ---------------- op bookkeeping ----------------

  detail::StreamOp& post(int peer, detail::OpKind kind, const Signature& sig, std::size_t bytes) {
    if (aborted_) rethrow();
    detail::check_peer(peer, rank_, size_);
    Peer& p = peers_[static_cast<std::size_t>(peer)];
    detail::StreamOp& op =
        pool_.post(kind == detail::OpKind::send ? p.sendq : p.recvq, kind, peer, bytes, sig);
    op.done = 0;
    op.begun = false;
    return op;
  }

  // Checks that the pieces add up to the message and hold whole elements (a reduce never splits
  // one). On an error the operation is still queued: it fails the transport, as any error does.
  void set_pieces(detail::StreamOp& op, const IoPiece* pieces, std::size_t count, std::size_t elem,
                  const char* call) {
    std::size_t sum = 0;
    bool whole = true;
    for (std::size_t i = 0; i < count; ++i) {
      sum += pieces[i].bytes;
      whole = whole && pieces[i].bytes % elem == 0;
    }
    if (sum != op.bytes || !whole) {
      fail(Error(std::string(call) + ": the pieces hold " + std::to_string(sum) +
                 " bytes for a message of " + std::to_string(op.bytes) +
                 (whole ? "" : ", and a piece splits an element")));
    }
    if (count > 0) op.set_pieces(pieces, count);
  }

  Request finish_post(detail::StreamOp& op) {
    const Request r = pool_.handle(op);
    // Start eagerly: small messages usually complete here without ever blocking.
    try {
      progress_peer(op.peer, false);
    } catch (const Error& e) {
      fail(e);
    }
    return r;
  }

  void complete(Peer& peer, bool send) { pool_.complete_front(send ? peer.sendq : peer.recvq); }

  [[noreturn]] void fail(const Error& e) {
    abort(e);
    rethrow();
  }

  // ---------------- progress ----------------
  //
  // The spin loop calls progress() back to back, and how fast one pass goes decides how often a
  // spinning rank yields (every 1024 passes): a few extra calls per pass measurably delayed
  // small messages on a crowded machine. So the call structure is pinned to what the compiler
  // chose before the split: progress() one call, each peer's step inlined into it, the shared-
  // memory step one call per direction with the channel's ring walk inlined into it.

  [[gnu::noinline]] void progress() {
    try {
      check_abort_flag();
      // A TCP peer with no receive posted is read only every kIdleTcpEvery-th pass, or at once
      // after poll() found its socket readable: what can arrive there (an ABORT frame, the end
      // of the stream, data for a receive not posted yet) is not urgent, and a read is a system
      // call, 20-50 times a check of a shared-memory flag. Reading idle sockets every pass made
      // a routed rank that waits on a local peer spend most of its spin in recv() returning
      // EAGAIN.
      const bool idle_tcp = (++passes_ % kIdleTcpEvery) == 0 || tcp_readable_;
      tcp_readable_ = false;
      for (int p = 0; p < size_; ++p) progress_peer(p, idle_tcp);
    } catch (const Error& e) {
      fail(e);
    }
  }

  void check_abort_flag() {
    if (interrupt_state_.load(std::memory_order_acquire) == 2) {
      throw_error(interrupt_kind_, interrupt_why_);
    }
    if (own_.abort_posted() && own_.abort_serial() != seen_abort_serial_) {
      const std::uint32_t serial = own_.abort_serial();
      if (const auto a = own_.abort_record()) {  // else torn by a peer rewriting it: next pass
        seen_abort_serial_ = serial;
        remote_abort(*a);
      }
    }
  }

  // Another rank's error: thrown now if it belongs to the call this rank is in (or an earlier
  // one, or none in particular), held until begin_call reaches its call otherwise.
  void remote_abort(const detail::RemoteAbort& a) {
    if (a.seq == 0 || a.seq <= call_seq_) throw_remote(a);
    if (!held_ || a.seq < held_->seq) held_ = a;  // the earliest call's error is the one named
  }

  // Another rank's error, thrown here as the same exception class (and forwarded by abort()
  // with its origin and call kept).
  [[noreturn]] void throw_remote(const detail::RemoteAbort& a) {
    abort_origin_ = a.origin;
    abort_seq_ = a.seq;
    throw_error(a.kind, a.message());
  }

  [[gnu::always_inline]] void progress_peer(int p, bool idle_tcp) {
    Peer& peer = peers_[static_cast<std::size_t>(p)];
    if (peer.route == Route::shm) {
      if (!peer.sendq.empty()) shm_send(peer);
      if (!peer.recvq.empty()) shm_recv(peer);
    } else if (peer.route == Route::tcp) {
      if (!peer.sendq.empty()) tcp_send(peer, p);
      if (idle_tcp || !peer.recvq.empty()) tcp_recv(peer, p);
    }
  }

  std::string peer_desc(int p) const {
    return "rank " + std::to_string(p) + " (" +
           route_name(peers_[static_cast<std::size_t>(p)].route) + ")";
  }

  [[noreturn]] void peer_died(int p, const detail::StreamOp& op) {
    peers_[static_cast<std::size_t>(p)].died = true;
    throw PeerLostError("rank " + std::to_string(p) + " (pid " +
                        std::to_string(peers_[static_cast<std::size_t>(p)].pid) +
                        ") exited or was killed during " + op.sig.describe() +
                        "; its channel is closed (detected by rank " + std::to_string(rank_) + ")");
  }

  // ---- shared memory ----

  [[gnu::noinline]] void shm_send(Peer& peer) {
    bool published = false;
    while (!peer.sendq.empty()) {
      detail::StreamOp& op = pool_[peer.sendq.front()];
      if (peer.shm.dead()) peer_died(op.peer, op);
      if (!peer.shm.push(op, published)) break;  // ring full: wait
      complete(peer, true);
    }
    if (published) peer.shm.ring();
  }

  [[gnu::noinline]] void shm_recv(Peer& peer) {
    bool freed = false;
    while (!peer.recvq.empty()) {
      detail::StreamOp& op = pool_[peer.recvq.front()];
      if (!peer.shm.pull(op, freed, rank_)) {  // ring empty: more to come, unless the peer died
        if (peer.shm.dead()) peer_died(op.peer, op);
        break;
      }
      complete(peer, false);
    }
    if (freed) peer.shm.ring();
  }

  // ---- TCP ----

  void tcp_send(Peer& peer, int p) {
    while (!peer.sendq.empty()) {
      detail::StreamOp& op = pool_[peer.sendq.front()];
      if (peer.tcp.closed()) peer_died(p, op);
      switch (peer.tcp.push(op)) {
        case detail::TcpChannel::Sent::blocked:
          return;
        case detail::TcpChannel::Sent::lost:
          // The peer closed its socket. One that fails sends an ABORT frame first and then
          // exits, so if we merely lost the race to read it, the frame is queued on our side:
          // throw that (the real error, e.g. a MismatchError, on this rank as on the others)
          // rather than report a lost connection here.
          if (const auto a = peer.tcp.queued_abort()) throw_remote(*a);
          peer.tcp.mark_closed();
          peer.died = true;
          throw PeerLostError("connection to rank " + std::to_string(p) + " lost during " +
                              op.sig.describe() + ": " + net::errno_text(peer.tcp.error()) +
                              "; detected by rank " + std::to_string(rank_));
        case detail::TcpChannel::Sent::complete:
          complete(peer, true);
          break;
      }
    }
  }

  void tcp_recv(Peer& peer, int p) {
    if (!peer.recvq.empty()) peer.tcp.receive_posted();
    if (peer.tcp.data_waiting()) return;  // a frame waits for a receive not yet posted
    using Stop = detail::FrameDecoder::Stop;
    const Stop stop = peer.tcp.pull(
        [&]() -> detail::StreamOp* {
          return peer.recvq.empty() ? nullptr : &pool_[peer.recvq.front()];
        },
        [&] { complete(peer, false); });
    if (stop == Stop::closed) {
      tcp_closed(peer, p);  // EOF or reset: an error only if an operation still needs this peer
    } else if (stop == Stop::abort) {
      remote_abort(peer.tcp.abort_received());  // the stream's data before it was all read
    }
  }

  void tcp_closed(Peer& peer, int p) {
    if (!peer.recvq.empty()) peer_died(p, pool_[peer.recvq.front()]);
    if (!peer.sendq.empty()) peer_died(p, pool_[peer.sendq.front()]);
  }

  // ---------------- blocking (detail::PollLoop and its hooks) ----------------

  void block(const Deadline& dl) {
    if (aborted_) rethrow();
    loop_.block(*this, dl);
  }

  std::uint64_t completions() const { return pool_.completions(); }
  std::size_t pending() const { return pool_.pending(); }
  detail::Doorbell* doorbell() { return own_.valid() ? &own_.doorbell() : nullptr; }

  // The CPU this rank spins on, published for its local peers; whether a lower-ranked one spins
  // there too (of two ranks on one core the higher one moves: both moving would swap cores).
  void note_cpu(int cpu) {
    if (own_.valid()) own_.note_cpu(cpu);
  }
  bool lower_peer_on_cpu(int cpu) const {
    for (int p = 0; p < rank_; ++p) {
      const Peer& peer = peers_[static_cast<std::size_t>(p)];
      if (peer.route == Route::shm && !peer.shm.dead() && peer.shm.peer_cpu() == cpu) return true;
    }
    return false;
  }

  // Live local peers' pidfds (readable when the peer exits), and the TCP sockets: readable
  // unless a frame already waits for a receive not yet posted, writable when a send stalled.
  void watch(std::vector<pollfd>& fds) const {
    for (const Peer& peer : peers_) {
      if (peer.route == Route::shm && peer.shm.pidfd() >= 0 && !peer.shm.dead()) {
        fds.push_back({peer.shm.pidfd(), POLLIN, 0});
      } else if (peer.route == Route::tcp && peer.tcp.valid() && !peer.tcp.closed()) {
        short ev = 0;
        if (!peer.recvq.empty() || !peer.tcp.data_waiting()) ev |= POLLIN;
        if (peer.tcp.want_out()) ev |= POLLOUT;
        if (ev) fds.push_back({peer.tcp.fd(), ev, 0});
      }
    }
  }

  // A readable pidfd: that peer has exited. Only operations that cannot complete from what it
  // left in the slots fail (shm_send / shm_recv re-check against the ring). A readable socket:
  // the next progress() reads the idle ones too.
  void woken(const std::vector<pollfd>& fds) {
    for (const pollfd& f : fds) {
      if (!(f.revents & POLLIN)) continue;
      tcp_readable_ = true;  // (or a pidfd: one extra read of the idle sockets, harmless)
      for (Peer& peer : peers_) {
        if (peer.shm.pidfd() == f.fd && !peer.shm.dead()) peer.shm.mark_dead();
      }
    }
  }

  // ---------------- who never came (the timeout's diagnosis) ----------------
  //
  // A rank that has waited in one operation for a while (min(1 s, timeout / 4)) says so once,
  // in the rendezvous store: "progress/<rank>" = that operation's description. A rank that times
  // out reads every peer's entry: the peers whose entry is not the operation it waits in never
  // reached it (they skipped the call, or are busy elsewhere: compute, I/O, a deadlock of the
  // program). It names them in its TimeoutError, and its abort carries that text to every rank,
  // so all ranks report the same culprit. Best effort: a store that fails is ignored, and the
  // diagnosis is left out rather than guessed.

  const Signature* waiting_sig() const {
    for (const Peer& peer : peers_) {
      if (!peer.recvq.empty()) return &pool_[peer.recvq.front()].sig;
      if (!peer.sendq.empty()) return &pool_[peer.sendq.front()].sig;
    }
    return nullptr;
  }

  // A store entry: "<collective>:<seq>:<description>" (the prefix finds the same call).
  static std::string progress_entry(const Signature& s) {
    return std::to_string(static_cast<int>(s.collective)) + ":" + std::to_string(s.seq) + ":" +
           s.describe();
  }
  static std::string entry_words(const std::string& e) {
    const auto a = e.find(':');
    const auto b = a == std::string::npos ? a : e.find(':', a + 1);
    return b == std::string::npos ? e : e.substr(b + 1);
  }

  void still_waiting();

  // Throws (through fail) a MismatchError when a peer's entry is this call with other arguments.
  void check_peer_calls(const Signature& s);

  // "; rank 2 never reached it (...)" or "" when every peer is in it or nothing is known.
  std::string missing_ranks() const;

  [[noreturn]] void timed_out() {
    if (const Signature* s = waiting_sig()) check_peer_calls(*s);  // a mismatch, if it is one
    try {
      throw TimeoutError(timeout_message());
    } catch (const Error& e) {
      fail(e);
    }
  }

  std::string timeout_message() const;

  // progress(): passes so far, and whether poll() saw a readable descriptor since the last one.
  static constexpr unsigned kIdleTcpEvery = 32;
  unsigned passes_ = 0;
  bool tcp_readable_ = false;

  int rank_;
  int size_;
  RouteMode mode_;
  MeshOptions opts_;
  double timeout_;
  std::vector<std::string> host_keys_;  // every rank's, for route_between
  detail::PollLoop loop_;
  // the timeout's diagnosis (still_waiting, missing_ranks)
  std::shared_ptr<KvStore> store_;
  std::string progress_key_;
  bool watching_ = false;
  bool watch_posted_ = false;
  Signature watch_sig_{};
  std::chrono::steady_clock::time_point watch_since_{};
  std::chrono::steady_clock::time_point last_check_{};
  std::vector<Peer> peers_;
  detail::OpPool<detail::StreamOp> pool_;
  detail::ShmSegment own_;       // valid when some peer is local
  std::size_t local_ranks_ = 0;  // ranks sharing memory with this one, itself included
  // errors
  bool aborted_ = false;
  ErrorKind error_kind_ = ErrorKind::generic;
  std::string error_what_;
  int abort_origin_ = -1;
  std::uint64_t abort_seq_ = 0;              // the call of a forwarded error (with abort_origin_)
  std::uint64_t call_seq_ = 0;               // the collective call this rank is in (begin_call)
  std::optional<detail::RemoteAbort> held_;  // a peer's error of a later call (remote_abort)
  std::uint32_t seen_abort_serial_ = 0;      // the abort record's write last read
  // interrupt(): 0 none, 1 being set, 2 set (interrupt_why_ written before)
  std::atomic<int> interrupt_state_{0};
  ErrorKind interrupt_kind_ = ErrorKind::generic;
  std::string interrupt_why_;
};

static_assert(check_transport<MeshTransport>());

}  // namespace kolo

// Header-only: the cold definitions (setup, the timeout's diagnosis), inline (compiled core: in
// the library, src/lib/core_impl.cpp).
#if !KOLO_USE_COMPILED_CORE
#include "kolo/transport/detail/mesh_impl.hpp"
#endif
