// kolo/transport/mpi/transport.hpp — MpiTransport: kolo's Transport concept over MPI point-to-point
// messages (MPI_Isend / MPI_Irecv / MPI_Test on a duplicate of the caller's communicator):
// construction, agreed options and topology, the posting API (the completion calls are shared
// with the mesh: transport/pool_completion.hpp), its state. How messages are posted and
// progressed is defined in mpi/progress.hpp, its control channel (abort, goodbye, departed peers,
// error texts) in mpi/control.hpp, both included at the end; the native collectives are in
// mpi/native.hpp. Design: transport/mpi.hpp.
#pragma once

#include <time.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "kolo/algorithm/options.hpp"
#include "kolo/core/config.hpp"
#include "kolo/core/deadline.hpp"
#include "kolo/core/dtype.hpp"
#include "kolo/core/env.hpp"
#include "kolo/core/error.hpp"
#include "kolo/core/reduce.hpp"
#include "kolo/core/signature.hpp"
#include "kolo/topology/topology.hpp"
#include "kolo/transport/mpi/runtime.hpp"
#include "kolo/transport/mpi/wire.hpp"
#include "kolo/transport/op_pool.hpp"
#include "kolo/transport/pool_completion.hpp"

namespace kolo {

class MpiTransport : public detail::PoolCompletion<MpiTransport> {
 public:
  using Request = detail::OpHandle;

  // Collective over `comm` (an intracommunicator: MPI_COMM_WORLD or one of the application's).
  explicit MpiTransport(MPI_Comm comm = MPI_COMM_WORLD, MpiOptions opts = MpiOptions::from_env())
      : opts_(opts) {
    thread_level_ = detail::mpi::ensure_initialized();
    if (comm == MPI_COMM_NULL) throw ConfigError("MpiTransport: MPI_COMM_NULL is no communicator");
    int inter = 0;
    MPI_Comm_test_inter(comm, &inter);
    if (inter) throw ConfigError("MpiTransport: intercommunicators are not supported");
    // Non-blocking dup with a deadline: a rank that never builds its transport becomes a
    // TimeoutError here instead of a hang. Once it completes every rank is present, so the
    // blocking calls that follow (bcast, splits) cannot wait for a missing one. After such a
    // TimeoutError the parent communicator is unusable for collectives: the abandoned
    // MPI_Comm_idup cannot be cancelled and would pair with the next collective on it.
    MPI_Request r = MPI_REQUEST_NULL;
    detail::mpi::check(MPI_Comm_idup(comm, &comm_, &r), "MPI_Comm_idup");
    const Deadline dl = Deadline::after(opts_.timeout_seconds);
    detail::mpi::Backoff backoff(opts_.spin_us < 0 ? 2.0 : opts_.spin_us);
    for (;;) {
      int flag = 0;
      detail::mpi::check(MPI_Test(&r, &flag, MPI_STATUS_IGNORE), "MPI_Comm_idup");
      if (flag) break;
      if (dl.expired()) {
        throw TimeoutError(
            "MpiTransport: not every rank of the communicator built its transport "
            "within " +
            seconds_text() +
            " s (MPI_Comm_idup did not complete; "
            "raise KOLO_TIMEOUT_SECONDS if the job is just slow)");
      }
      backoff.pause();
    }
    setup();  // on failure the duplicate is left to MPI_Finalize, as on close()
    detail::mpi::Runtime& rt = detail::mpi::runtime();
    std::lock_guard<std::mutex> lk(rt.mu);
    rt.live.push_back({this, &MpiTransport::close_hook});
  }

  MpiTransport(const MpiTransport&) = delete;
  MpiTransport& operator=(const MpiTransport&) = delete;

  ~MpiTransport() {
    {
      detail::mpi::Runtime& rt = detail::mpi::runtime();
      std::lock_guard<std::mutex> lk(rt.mu);
      std::erase_if(rt.live, [this](const auto& h) { return h.self == this; });
    }
    close();
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  double timeout_seconds() const { return opts_.timeout_seconds; }
  const Topology& topology() const { return topo_; }
  // The duplicate kolo communicates on (MPI_COMM_NULL once closed).
  MPI_Comm comm() const { return comm_; }
  // MPI's thread level (MPI_Query_thread) when this transport was built.
  int thread_level() const { return thread_level_; }
  // The options in force: rank 0's for the ones that must agree.
  const MpiOptions& options() const { return opts_; }
  // True when kolo called MPI_Init_thread (and will finalize at a successful exit).
  static bool kolo_initialized_mpi() { return detail::mpi::runtime().kolo_initialized; }

  // ---------------- posting ----------------

  Request isend(int peer, const void* src, std::size_t bytes, const Signature& sig) {
    auto& op = post(peer, detail::OpKind::send, sig, bytes);
    op.src = static_cast<const std::byte*>(src);
    const bool inl = bytes <= inline_bytes_;
    const detail::mpi::WireHeader h{detail::mpi::kHeaderMagic, inl ? 1u : 0u, bytes, sig};
    op.wire.resize(sizeof(h) + (inl ? bytes : 0));
    std::memcpy(op.wire.data(), &h, sizeof(h));
    if (inl && bytes > 0) std::memcpy(op.wire.data() + sizeof(h), src, bytes);
    try {
      mpi_call(MPI_Isend(op.wire.data(), static_cast<int>(op.wire.size()), MPI_BYTE, peer,
                         tag_header(), comm_, &op.head),
               "MPI_Isend", op);
      if (!inl) {
        // From a copy kolo owns, never from the caller's buffer: after an abort the caller frees
        // it, and a rendezvous the receiver matched just before would then read freed memory
        // (under Open MPI's vader the failed single-copy get is retried forever and wedges all
        // later large messages between the two processes).
        op.staging.resize(bytes);
        std::memcpy(op.staging.data(), src, bytes);
        for (std::size_t off = 0; off < bytes; off += detail::mpi::kMaxMessage) {
          const std::size_t n = std::min(detail::mpi::kMaxMessage, bytes - off);
          op.data.push_back(MPI_REQUEST_NULL);
          mpi_call(MPI_Isend(op.staging.data() + off, static_cast<int>(n), MPI_BYTE, peer,
                             tag_data(), comm_, &op.data.back()),
                   "MPI_Isend", op);
        }
      }
    } catch (const Error& e) {
      fail(e);
    }
    ++peers_[static_cast<std::size_t>(peer)].sent;
    return pool_.handle(op);
  }

  Request irecv(int peer, void* dst, std::size_t bytes, const Signature& sig) {
    auto& op = post(peer, detail::OpKind::recv, sig, bytes);
    op.dst = static_cast<std::byte*>(dst);
    return post_recv(op);
  }

  Request irecv_reduce(int peer, void* dst, const void* local, std::size_t bytes,
                       const ReduceSpec& rs, const Signature& sig) {
    if (rs.fn == nullptr || rs.elem_size == 0 || bytes % rs.elem_size != 0) {
      throw Error("irecv_reduce: byte count " + std::to_string(bytes) +
                  " is not a multiple of the element size, or no reduce function");
    }
    auto& op = post(peer, detail::OpKind::recv_reduce, sig, bytes);
    op.dst = static_cast<std::byte*>(dst);
    op.src = static_cast<const std::byte*>(local);
    op.rs = rs;
    return post_recv(op);
  }

  // ---------------- completion ----------------

  // done, test, wait, wait_all, wait_any_progress: detail::PoolCompletion (pool_completion.hpp).

  // ---------------- errors ----------------

  bool aborted() const { return aborted_; }
  [[noreturn]] void rethrow() const { throw_error(error_kind_, error_what_); }

  // Errors ordered by collective call (transport.hpp, OrderedErrors), as in MeshTransport: a
  // peer's error of a later call than the one this rank is in is held until this rank begins
  // that call; after begin_call, aborted() says whether the call may run.
  void begin_call(std::uint64_t seq);

  // Records err as this transport's fatal error and sends it to every peer (a small eager
  // message on the control tag); outstanding receives are cancelled so that MPI writes no more
  // into buffers the caller is about to free. The process stays alive: no MPI_Abort.
  void abort(const Error& err);

 protected:
  // ---------------- native collectives (MpiNativeTransport) ----------------

  static constexpr std::size_t kMaxCount = INT_MAX;
  static constexpr std::size_t kKeepStagingBytes = std::size_t{16} << 20;

  // Every rank's signature, compared before a native collective: MPI itself would hang,
  // truncate or mix data on a mismatched call, kolo names both sides. Being an allgather it is
  // also a barrier. Every rank sees the same table, so every rank throws the same message.
  void check_signatures(const AlgoOptions& o);

  // Runs one native collective to completion: started non-blocking and waited for with the
  // deadline, the control channel polled meanwhile (or, with native_blocking, the blocking call).
  template <class Start, class Blocking>
  void native(const char* what, const AlgoOptions& o, Start&& start, Blocking&& blocking);

  // Staging for a non-blocking native collective: copies of the input and room for the output.
  std::byte* stage_in(const void* src, std::size_t bytes) {
    nb_->in.resize(bytes);
    if (bytes > 0) std::memcpy(nb_->in.data(), src, bytes);
    return nb_->in.data();
  }
  std::byte* stage_out(std::size_t bytes) {
    nb_->out.resize(bytes);
    return nb_->out.data();
  }
  bool native_in_place() const { return opts_.native_blocking; }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::shared_ptr<detail::mpi::NativeBuffers> nb_ = std::make_shared<detail::mpi::NativeBuffers>();

 private:
  friend class detail::PoolCompletion<MpiTransport>;  // reaches pool_, progress() and block()
  struct Peer {
    detail::OpQueue sendq, recvq;
    std::uint64_t sent = 0;      // messages posted to this peer
    std::uint64_t received = 0;  // messages received from it
    bool gone = false;           // it said goodbye
    Clock::time_point gone_at;
    std::uint64_t bye_sent_to_me = 0, bye_received_from_me = 0, bye_collectives = 0;
  };

  // ---------------- setup and teardown ----------------

  void setup() {
    detail::mpi::check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN),
                       "MPI_Comm_set_errhandler");
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    // Rank 0 decides what must agree: the instance token (tags and control messages of this
    // instance differ from any earlier one's, so a stale message can never be matched) and the
    // wire-protocol options.
    std::uint64_t agreed[4] = {0, opts_.inline_bytes, opts_.check_signatures ? 1u : 0u,
                               opts_.native_blocking ? 1u : 0u};
    if (rank_ == 0) {
      std::random_device rd;
      agreed[0] = (static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^
                  static_cast<std::uint64_t>(Clock::now().time_since_epoch().count());
    }
    detail::mpi::check(MPI_Bcast(agreed, 4, MPI_UINT64_T, 0, comm_), "MPI_Bcast");
    token_ = agreed[0];
    inline_bytes_ = static_cast<std::size_t>(agreed[1]);
    opts_.inline_bytes = inline_bytes_;
    opts_.check_signatures = agreed[2] != 0;
    opts_.native_blocking = agreed[3] != 0;
    int* ub = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(comm_, MPI_TAG_UB, &ub, &flag);
    const long long tag_ub = flag && ub ? *ub : 32767;  // the standard's minimum
    const auto slots = static_cast<std::uint64_t>((std::min<long long>(tag_ub, 1 << 30) - 16) / 4);
    tag_base_ = 16 + static_cast<int>(token_ % slots) * 4;

    // Topology: local ranks share memory, cross ranks are the same local rank on other hosts.
    MPI_Comm local = MPI_COMM_NULL, cross = MPI_COMM_NULL;
    detail::mpi::check(
        MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local),
        "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
    MPI_Comm_rank(local, &topo_.local_rank);
    MPI_Comm_size(local, &topo_.local_size);
    MPI_Comm_free(&local);
    detail::mpi::check(MPI_Comm_split(comm_, topo_.local_rank, rank_, &cross), "MPI_Comm_split");
    MPI_Comm_rank(cross, &topo_.cross_rank);
    MPI_Comm_size(cross, &topo_.cross_size);
    MPI_Comm_free(&cross);
    topo_.rank = rank_;
    topo_.size = size_;
    topo_.timeout_seconds = opts_.timeout_seconds;
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int len = 0;
    MPI_Get_processor_name(name, &len);
    topo_.host_key.assign(name, static_cast<std::size_t>(len));

    spin_us_ = opts_.spin_us;
    if (spin_us_ < 0) {
      // Spinning only pays while every rank of this host has its own core.
      const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
      spin_us_ = static_cast<unsigned>(topo_.local_size) <= cores ? 50.0 : 2.0;
    }
    peers_.resize(static_cast<std::size_t>(size_));
    post_control_recv();
  }

  static void close_hook(void* self) noexcept { static_cast<MpiTransport*>(self)->close(); }

  // Says goodbye (unless aborted: the peers have the error already), cancels what is still
  // posted, and retires the duplicate. Idempotent; a no-op once MPI is finalized.
  void close() noexcept;

  // ---------------- control channel ----------------

  int tag_header() const { return tag_base_; }
  int tag_data() const { return tag_base_ + 1; }
  int tag_control() const { return tag_base_ + 2; }

  void post_control_recv();

  void send_control(const detail::mpi::ControlMessage& m, std::size_t bytes);

  void send_control_to(int p, const detail::mpi::ControlMessage& m, std::size_t bytes);

  void poll_control();

  // A peer that said goodbye is only an error for operations it can no longer complete: a
  // receive beyond what it sent, a send beyond what it received. A peer that leaves after its
  // last message (a normal end) troubles nobody. Its last messages get a grace period to land:
  // the goodbye travels on another tag and MPI may match it before them.
  void check_gone();

  void check_gone_native(const AlgoOptions& o);

  [[noreturn]] void peer_left(int p, const Signature& sig, const std::string& what);

  // Cancels outstanding receives and polls, up to the deadline, for every request of this
  // transport to complete or be cancelled; true when none is left.
  bool cancel_and_drain(const Deadline& dl);

  // ---------------- op bookkeeping ----------------

  detail::mpi::MpiOp& post(int peer, detail::OpKind kind, const Signature& sig, std::size_t bytes);

  Request post_recv(detail::mpi::MpiOp& op);

  void mpi_call(int rc, const char* what, const detail::mpi::MpiOp& op) const {
    if (rc != MPI_SUCCESS) {
      throw Error(std::string(what) + " to/from rank " + std::to_string(op.peer) + " in " +
                  op.sig.describe() + " failed: " + detail::mpi::error_text(rc));
    }
  }

  bool test_request(MPI_Request& r, const detail::mpi::MpiOp& op, MPI_Status* st = nullptr);

  void complete(detail::OpQueue& q) {
    auto& op = pool_[q.front()];
    if (op.staging.capacity() > kKeepStagingBytes) {  // a huge one-off message: give it back
      op.staging.clear();
      op.staging.shrink_to_fit();
    }
    pool_.complete_front(q);
  }

  [[noreturn]] void fail(const Error& e) {
    abort(e);
    rethrow();
  }

  // ---------------- progress ----------------

  void progress();

  // Completes in posting order (the Transport contract), testing only the head: MPI_Test on it
  // drives MPI's progress engine for all the others as well.
  void progress_sends(Peer& peer);

  void progress_recvs(Peer& peer, int p);

  void deliver(detail::mpi::MpiOp& op, const std::byte* incoming);

  void check_header(detail::mpi::MpiOp& op, int p, std::size_t got);

  void block(const Deadline& dl);

  std::string seconds_text() const {
    char to[32];
    std::snprintf(to, sizeof(to), "%g", opts_.timeout_seconds);
    return to;
  }

  std::string timeout_message() const;

  MpiOptions opts_;
  Topology topo_;
  int thread_level_ = MPI_THREAD_SINGLE;
  std::uint64_t token_ = 0;
  int tag_base_ = 16;
  std::size_t inline_bytes_ = 4000;
  double spin_us_ = 2;
  std::vector<Peer> peers_;
  detail::OpPool<detail::mpi::MpiOp> pool_;  // slots never move while MPI holds pointers
  // control channel
  std::unique_ptr<detail::mpi::ControlMessage> control_in_ =
      std::make_unique<detail::mpi::ControlMessage>();
  MPI_Request control_req_ = MPI_REQUEST_NULL;
  std::vector<std::unique_ptr<detail::mpi::ControlMessage>> control_out_;
  std::vector<MPI_Request> control_reqs_;
  bool any_gone_ = false;
  // native collectives started / completed (a departing rank reports the latter)
  std::uint64_t native_started_ = 0;
  std::uint64_t native_done_ = 0;
  // errors
  bool closed_ = false;
  bool aborted_ = false;
  ErrorKind error_kind_ = ErrorKind::generic;
  std::string error_what_;
  int abort_origin_ = -1;
  std::uint64_t abort_seq_ = 0;  // the call of a forwarded error (with abort_origin_)
  std::uint64_t call_seq_ = 0;   // the collective call this rank is in (begin_call)
  // A peer's error of a later call, held (held_seq_ 0: none).
  std::uint64_t held_seq_ = 0;
  ErrorKind held_kind_ = ErrorKind::generic;
  int held_origin_ = -1;
  std::string held_what_;
};

}  // namespace kolo

#include "kolo/transport/mpi/control.hpp"   // the definitions of the control channel
#include "kolo/transport/mpi/progress.hpp"  // ... and of posting and progress
