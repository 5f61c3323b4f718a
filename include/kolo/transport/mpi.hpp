// kolo/transport/mpi.hpp — kolo over MPI, for jobs started by mpirun and for kolo inside an
// existing MPI application. The only kolo header that includes <mpi.h>.
//
//   MpiTransport        kolo's own algorithms (ring, trees, recursive doubling, …) over
//                       MPI_Isend / MPI_Irecv / MPI_Test on a duplicate of the caller's
//                       communicator: the Transport concept, signatures, deadlines, abort.
//   MpiNativeTransport  the same, plus native_<collective>(): Communicator hands allreduce,
//                       allgather, broadcast, reduce_scatter, alltoall and barrier to MPI's own
//                       collectives (MPI_Iallreduce and friends, with deadlines, on kolo-owned
//                       copies; MpiOptions::native_blocking: MPI_Allreduce & co. in place, no
//                       deadline). float16/bfloat16 travel as a 2-byte contiguous MPI type reduced
//                       by user operations that compute in fp32 (kolo's kernels); average is MPI's
//                       sum followed by kolo::finish_average. Signatures are compared first.
//
//   auto comm = kolo::Communicator<kolo::MpiTransport>(
//       std::make_unique<kolo::MpiTransport>(MPI_COMM_WORLD));   // or any intracommunicator
//
// Construction is collective over the given communicator (like MPI_Comm_dup, which it calls):
// everything kolo sends goes over the duplicate, so the application's own traffic, tags and
// collectives on the original never meet kolo's. Topology comes from MPI: local ranks from
// MPI_Comm_split_type(MPI_COMM_TYPE_SHARED), cross ranks from a split by local rank (as Horovod
// does: cross_size is the number of hosts as seen by local rank 0). No KOLO_* variable is needed;
// KOLO_TIMEOUT_SECONDS, KOLO_SPIN_US and the KOLO_MPI_* knobs of MpiOptions are read if set.
//
// MPI's lifetime. If MPI is not initialised when the first transport is built, kolo calls
// MPI_Init_thread asking for MPI_THREAD_MULTIPLE and accepts what the library provides (Open MPI
// and MPICH give MULTIPLE; kolo itself only needs the calls of one communicator to come from one
// thread at a time, i.e. SERIALIZED, as for every kolo transport), and then finalizes at process
// exit — only then, and only after a successful exit (see below). If the application initialised
// MPI, it stays the owner: kolo never finalizes it. Either way kolo hangs a delete callback on
// MPI_COMM_SELF, which MPI_Finalize runs first, so live transports are closed cleanly before
// MPI goes away.
//
// Wire protocol. Every message is a 48-byte header (magic, payload size, the sender's Signature)
// followed by the payload: in the same MPI message when the payload is small (<= inline_bytes, so
// header and data make one eager message), else as a second message on a data tag. Receives
// always post room for a whole inline message, so a sender that disagrees about the size is still
// received and named: a mismatch becomes a MismatchError naming both calls, exactly as with
// kolo's own transports. Payloads travel between kolo-owned buffers (copied in on send, copied or
// folded with kolo's reduce kernels into the destination on receive), never straight from or into
// the caller's memory: after an abort the caller frees its buffers while MPI may still be moving
// a matched message (docs/mpi.md tells how zero-copy wedged Open MPI). Buffers of requests still
// pending when a transport closes are kept alive rather than freed under MPI's feet.
//
// Errors. Every wait polls MPI_Test with a backoff (spin KOLO_SPIN_US, then sched_yield, then
// sleeps growing to 1 ms — never a hot spin when ranks outnumber cores) and throws TimeoutError
// past its deadline. abort(err) does NOT call MPI_Abort: it sends the error (kind, origin,
// reason) to every rank of the communicator on a control tag and keeps the process alive; every
// rank throws the same exception class ("[reported by rank R]") at its next wait, and the
// application decides whether to exit. A transport that is destroyed, or whose process exits,
// tells its peers how many messages and collectives it completed with each of them: a peer still
// waiting for it then gets a PeerLostError at once instead of a timeout. A rank killed by a
// signal is the launcher's business: mpirun ends the whole job. A closed transport's duplicate
// communicator is not freed before MPI_Finalize (see close(): Open MPI reuses freed context ids
// and a late notice would land in the next communicator), so each transport built costs one
// communicator handle for the life of MPI.
//
// Exit. On a failing exit (status != 0) kolo does not call MPI_Finalize: under Open MPI it waits
// in a fence for every other rank, and those may be waiting for this one. mpirun sees the
// non-zero status and terminates the job instead. (glibc's on_exit gives the status; elsewhere
// kolo finalizes on every exit.)
#pragma once

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the deprecated C++ bindings: not needed, slow to compile
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
#include <sched.h>
#include <stdlib.h>
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
#include "kolo/transport/op_pool.hpp"
#include "kolo/transport/transport.hpp"

namespace kolo {

struct MpiOptions {
  double timeout_seconds = 30.0;  // KOLO_TIMEOUT_SECONDS: every collective's deadline
  double spin_us = -1;            // KOLO_SPIN_US; < 0: 50 µs when ranks <= cores, else 2 µs
  // The rest must agree across ranks, so rank 0's values are used everywhere.
  std::size_t inline_bytes = 4000;  // KOLO_MPI_INLINE_BYTES: header + payload in one message
                                    // (4000 + 48 stays under Open MPI vader's 4 KiB eager limit)
  bool check_signatures = true;     // KOLO_MPI_CHECK_SIGNATURES: native collectives first
                                    // allgather the 32-byte signatures (mismatch -> MismatchError)
  bool native_blocking = false;     // KOLO_MPI_NATIVE_BLOCKING: MPI_Allreduce & co. instead of
                                    // MPI_Iallreduce & co. (faster algorithms in Open MPI, but the
                                    // wait has no deadline: a missing rank hangs it)

  static MpiOptions from_env(const EnvLookup& env = process_env()) {
    MpiOptions o;
    if (auto v = config::get_real(env, config::vars::timeout_seconds)) o.timeout_seconds = *v;
    if (auto v = config::get_real(env, config::vars::spin_us)) o.spin_us = *v;
    if (auto v = config::get_int(env, config::vars::mpi_inline_bytes)) {
      o.inline_bytes = static_cast<std::size_t>(*v);
    }
    if (auto v = config::get_flag(env, config::vars::mpi_check_signatures)) o.check_signatures = *v;
    if (auto v = config::get_flag(env, config::vars::mpi_native_blocking)) o.native_blocking = *v;
    return o;
  }
};

namespace detail::mpi {

inline std::string error_text(int rc) {
  char msg[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(msg, static_cast<std::size_t>(len));
}

inline void check(int rc, const std::string& what) {
  if (rc != MPI_SUCCESS) throw Error(what + " failed: " + error_text(rc));
}

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Waiting without a file descriptor to sleep on (MPI progresses only inside MPI calls): spin
// while the peer is likely running, then give the core away, then sleep in growing steps. A wait
// that completes starts the next one from the spin again, so streaming traffic stays in the spin.
class Backoff {
 public:
  explicit Backoff(double spin_us)
      : start_(Clock::now()),
        spin_end_(start_ + std::chrono::nanoseconds(static_cast<long long>(spin_us * 1000))),
        yield_end_(spin_end_ + std::chrono::microseconds(200)) {}

  void pause() {
    const auto now = Clock::now();
    if (now < spin_end_) {
      cpu_relax();
    } else if (now < yield_end_) {
      ::sched_yield();
    } else {
      timespec ts{0, sleep_ns_};
      ::nanosleep(&ts, nullptr);
      sleep_ns_ = std::min<long>(sleep_ns_ * 2, 1000000);  // at most 1 ms between polls
    }
  }

 private:
  Clock::time_point start_, spin_end_, yield_end_;
  long sleep_ns_ = 20000;
};

// Process-wide MPI state kolo owns. Never destroyed: exit handlers and static destructors of
// the application (a Communicator in a static) may run in any order after main.
struct Runtime {
  struct Hook {
    void* self;
    void (*close)(void*) noexcept;
  };
  std::mutex mu;
  std::vector<Hook> live;  // transports to close before MPI_Finalize
  bool kolo_initialized = false;
  bool hooked = false;
  int keyval = MPI_KEYVAL_INVALID;
  MPI_Datatype float16 = MPI_DATATYPE_NULL;  // MPI_Type_contiguous(2, MPI_BYTE)
  MPI_Datatype bfloat16 = MPI_DATATYPE_NULL;
  MPI_Op half_ops[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};  // sum prod min max
  // Buffers that an MPI request may still write: those of a non-blocking collective abandoned
  // after an error (MPI cannot cancel collectives) and of point-to-point requests still pending
  // when their transport closed. Never freed: freeing them would let MPI write into the heap.
  std::vector<std::shared_ptr<void>> graveyard;
};

inline Runtime& runtime() {
  static Runtime* r = new Runtime;  // NOLINT: deliberately leaked, see above
  return *r;
}

inline void bury(std::shared_ptr<void> p) {
  Runtime& rt = runtime();
  std::lock_guard<std::mutex> lk(rt.mu);
  rt.graveyard.push_back(std::move(p));
}

// User operation for the 16-bit float types: widen to fp32, reduce, round back to nearest-even
// (kolo's kernel), so MPI's result equals kolo's ring. The type handle says which 16-bit type.
template <ReduceOp Op>
void half_reduce(void* in, void* inout, int* len, MPI_Datatype* type) {
  const DataType t = *type == runtime().bfloat16 ? DataType::bfloat16 : DataType::float16;
  reduce_function(t, Op)(inout, inout, in, static_cast<std::size_t>(*len));
}

// Closes every live transport (goodbye to peers, free the duplicates) and frees kolo's MPI
// types and operations. Runs from MPI_Finalize (MPI_COMM_SELF's delete callback) or from the
// exit handler on a failing exit.
inline void close_all() noexcept {
  Runtime& rt = runtime();
  std::vector<Runtime::Hook> live;
  {
    std::lock_guard<std::mutex> lk(rt.mu);
    live = rt.live;
  }
  for (const auto& h : live) h.close(h.self);
}

inline int on_comm_self_delete(MPI_Comm, int, void*, void*) {
  close_all();
  Runtime& rt = runtime();
  std::lock_guard<std::mutex> lk(rt.mu);
  for (MPI_Op& op : rt.half_ops) {
    if (op != MPI_OP_NULL) MPI_Op_free(&op);
  }
  if (rt.float16 != MPI_DATATYPE_NULL) MPI_Type_free(&rt.float16);
  if (rt.bfloat16 != MPI_DATATYPE_NULL) MPI_Type_free(&rt.bfloat16);
  return MPI_SUCCESS;
}

inline void on_process_exit(int status) noexcept {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin) return;
  if (status == 0) {
    MPI_Finalize();  // runs on_comm_self_delete first
    return;
  }
  // Failing exit: peers waiting for this rank learn that it is gone, and MPI_Finalize is
  // skipped (it would wait for ranks that may be waiting for us); mpirun ends the job.
  close_all();
}

#if defined(__GLIBC__)
inline void on_exit_with_status(int status, void*) {
  on_process_exit(status);
}
#else
inline void on_exit_without_status() {
  on_process_exit(0);
}
#endif

// Initialises MPI if nobody has, installs kolo's finalize hook once; returns the thread level.
inline int ensure_initialized() {
  Runtime& rt = runtime();
  std::lock_guard<std::mutex> lk(rt.mu);
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (fin) throw Error("MPI has already been finalized: kolo's MPI transport needs MPI running");
  if (!init) {
    int provided = MPI_THREAD_SINGLE;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    rt.kolo_initialized = true;
#if defined(__GLIBC__)
    ::on_exit(&on_exit_with_status, nullptr);
#else
    std::atexit(&on_exit_without_status);
#endif
  }
  if (!rt.hooked) {
    check(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &on_comm_self_delete, &rt.keyval, nullptr),
          "MPI_Comm_create_keyval");
    check(MPI_Comm_set_attr(MPI_COMM_SELF, rt.keyval, nullptr), "MPI_Comm_set_attr");
    check(MPI_Type_contiguous(2, MPI_BYTE, &rt.float16), "MPI_Type_contiguous");
    check(MPI_Type_contiguous(2, MPI_BYTE, &rt.bfloat16), "MPI_Type_contiguous");
    check(MPI_Type_commit(&rt.float16), "MPI_Type_commit");
    check(MPI_Type_commit(&rt.bfloat16), "MPI_Type_commit");
    check(MPI_Op_create(&half_reduce<ReduceOp::sum>, 1, &rt.half_ops[0]), "MPI_Op_create");
    check(MPI_Op_create(&half_reduce<ReduceOp::product>, 1, &rt.half_ops[1]), "MPI_Op_create");
    check(MPI_Op_create(&half_reduce<ReduceOp::min>, 1, &rt.half_ops[2]), "MPI_Op_create");
    check(MPI_Op_create(&half_reduce<ReduceOp::max>, 1, &rt.half_ops[3]), "MPI_Op_create");
    rt.hooked = true;
  }
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  return level;
}

inline bool finalized() {
  int fin = 0;
  MPI_Finalized(&fin);
  return fin != 0;
}

// ---- wire formats ----

inline constexpr std::uint32_t kHeaderMagic = 0x4b4d5031;   // "KMP1"
inline constexpr std::uint32_t kControlMagic = 0x4b4d5043;  // "KMPC"
inline constexpr std::uint32_t kControlAbort = 1;
inline constexpr std::uint32_t kControlGoodbye = 2;
inline constexpr std::size_t kMaxMessage = std::size_t{1} << 30;  // MPI counts are ints

struct WireHeader {
  std::uint32_t magic;
  std::uint32_t inline_payload;  // 1: the payload follows in this message
  std::uint64_t bytes;
  Signature sig;
};
static_assert(sizeof(WireHeader) == 48);

struct ControlMessage {
  std::uint32_t magic = kControlMagic;
  std::uint32_t type = 0;
  std::uint64_t token = 0;  // which transport instance (stale messages are ignored)
  std::int32_t kind = 0;    // abort: ErrorKind
  std::int32_t origin = -1;
  std::uint64_t sent_to_you = 0;        // goodbye: messages sent to the receiver
  std::uint64_t received_from_you = 0;  // goodbye: messages received from the receiver
  std::uint64_t collectives_done = 0;   // goodbye: native collectives completed
  std::uint64_t seq = 0;                // abort: the call it belongs to (RemoteAbort::seq)
  char reason[2048] = {};
};
inline constexpr std::size_t kControlHeaderBytes = offsetof(ControlMessage, reason);

// A point-to-point operation as MPI carries it: a header message (with the payload inline when
// small) and, for a large payload, data messages from or into a kolo-owned staging copy.
struct MpiOp : P2POp {
  bool header_done = false;
  bool inline_payload = false;
  MPI_Request head = MPI_REQUEST_NULL;
  std::vector<MPI_Request> data;  // payload messages of a large op (1 GiB each at most)
  std::size_t data_done = 0;
  std::vector<std::byte> wire;     // header (+ inline payload), owned: MPI reads/writes it
  std::vector<std::byte> staging;  // large payloads: kolo-owned copy sent, or landing zone
};

// What non-blocking native collectives read and write: kolo's, not the caller's, so that a
// collective abandoned after an error (it cannot be cancelled) never touches the caller's memory
// again; on abandonment the whole set is buried and replaced.
struct NativeBuffers {
  std::vector<std::byte> in, out;
  std::vector<Signature> sigs;
};

// A closed transport's state that pending MPI requests still point into.
struct Leftovers {
  std::deque<MpiOp> ops;
  std::unique_ptr<ControlMessage> control_in;
  std::vector<std::unique_ptr<ControlMessage>> control_out;
};

}  // namespace detail::mpi

class MpiTransport {
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

  bool done(Request r) const { return pool_.done(r); }

  bool test(Request r) {
    if (done(r)) return true;
    progress();
    return done(r);
  }

  void wait(Request r, const Deadline& dl) {
    while (!done(r)) block(dl);
  }

  template <class Range>
  void wait_all(const Range& reqs, const Deadline& dl) {
    for (const Request& r : reqs) wait(r, dl);
  }

  // Blocks until an operation has completed since this last returned (or none is pending).
  void wait_any_progress(const Deadline& dl) {
    if (!pool_.completed_since_seen()) block(dl);
    pool_.mark_seen();
  }

  // ---------------- errors ----------------

  bool aborted() const { return aborted_; }
  [[noreturn]] void rethrow() const { throw_error(error_kind_, error_what_); }

  // Errors ordered by collective call (transport.hpp, OrderedErrors), as in MeshTransport: a
  // peer's error of a later call than the one this rank is in is held until this rank begins
  // that call; after begin_call, aborted() says whether the call may run.
  void begin_call(std::uint64_t seq) {
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

  // Records err as this transport's fatal error and sends it to every peer (a small eager
  // message on the control tag); outstanding receives are cancelled so that MPI writes no more
  // into buffers the caller is about to free. The process stays alive: no MPI_Abort.
  void abort(const Error& err) {
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

 protected:
  // ---------------- native collectives (MpiNativeTransport) ----------------

  static constexpr std::size_t kMaxCount = INT_MAX;
  static constexpr std::size_t kKeepStagingBytes = std::size_t{16} << 20;

  MPI_Datatype mpi_datatype(DataType d) const {
    const auto& rt = detail::mpi::runtime();
    switch (d) {
      case DataType::float16:
        return rt.float16;
      case DataType::bfloat16:
        return rt.bfloat16;
      case DataType::float32:
        return MPI_FLOAT;
      case DataType::float64:
        return MPI_DOUBLE;
      case DataType::int8:
        return MPI_INT8_T;
      case DataType::uint8:
        return MPI_UINT8_T;
      case DataType::int32:
        return MPI_INT32_T;
      case DataType::int64:
        return MPI_INT64_T;
    }
    throw ConfigError("invalid DataType value " + std::to_string(static_cast<int>(d)));
  }

  MPI_Op mpi_op(DataType d, ReduceOp op) const {
    const bool half = d == DataType::float16 || d == DataType::bfloat16;
    const auto& ops = detail::mpi::runtime().half_ops;
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::average:  // a sum, divided once by the caller (finish_average)
        return half ? ops[0] : MPI_SUM;
      case ReduceOp::product:
        return half ? ops[1] : MPI_PROD;
      case ReduceOp::min:
        return half ? ops[2] : MPI_MIN;
      case ReduceOp::max:
        return half ? ops[3] : MPI_MAX;
    }
    throw ConfigError("invalid ReduceOp value " + std::to_string(static_cast<int>(op)));
  }

  // Every rank's signature, compared before a native collective: MPI itself would hang,
  // truncate or mix data on a mismatched call, kolo names both sides. Being an allgather it is
  // also a barrier. Every rank sees the same table, so every rank throws the same message.
  void check_signatures(const AlgoOptions& o) {
    if (!opts_.check_signatures) return;
    std::vector<Signature>& sigs = nb_->sigs;
    sigs.assign(static_cast<std::size_t>(size_), Signature{});
    sigs[static_cast<std::size_t>(rank_)] = o.sig;
    Signature* table = sigs.data();
    native(
        "MPI_Iallgather (signature check)", o,
        [&](MPI_Request* r) {
          return MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, table, sizeof(Signature),
                                MPI_BYTE, comm_, r);
        },
        [&] {
          return MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, table, sizeof(Signature),
                               MPI_BYTE, comm_);
        });
    for (int q = 1; q < size_; ++q) {
      const Signature& s = table[q];
      if (s != table[0]) {
        fail(MismatchError("collective mismatch: rank " + std::to_string(q) + " called " +
                           s.describe() + " but rank 0 called " + table[0].describe() +
                           " (native MPI collectives; seen by rank " + std::to_string(rank_) +
                           ")"));
      }
    }
  }

  // Runs one native collective to completion: started non-blocking and waited for with the
  // deadline, the control channel polled meanwhile (or, with native_blocking, the blocking call).
  template <class Start, class Blocking>
  void native(const char* what, const AlgoOptions& o, Start&& start, Blocking&& blocking) {
    if (aborted_) rethrow();
    if (closed_) throw Error("MpiTransport used after it was closed (MPI_Finalize)");
    ++native_started_;
    try {
      progress();  // an error some rank already sent us wins over starting a doomed collective
      check_gone_native(o);
      if (opts_.native_blocking) {
        detail::mpi::check(blocking(), std::string(what) + " in " + o.sig.describe());
      } else {
        MPI_Request r = MPI_REQUEST_NULL;
        detail::mpi::check(start(&r), std::string(what) + " in " + o.sig.describe());
        try {
          detail::mpi::Backoff backoff(spin_us_);
          for (;;) {
            int flag = 0;
            detail::mpi::check(MPI_Test(&r, &flag, MPI_STATUS_IGNORE),
                               std::string(what) + " in " + o.sig.describe());
            if (flag) break;
            progress();  // the control channel: an abort or a departed rank ends the wait
            check_gone_native(o);
            if (o.deadline.expired()) {
              throw TimeoutError("rank " + std::to_string(rank_) + " timed out in " +
                                 o.sig.describe() + " after " + seconds_text() + " s in " + what +
                                 ": some rank did not enter it (raise KOLO_TIMEOUT_SECONDS if "
                                 "the job is just slow)");
            }
            backoff.pause();
          }
        } catch (...) {
          if (r != MPI_REQUEST_NULL) {  // abandoned: MPI may still write its buffers
            detail::mpi::bury(std::move(nb_));
            nb_ = std::make_shared<detail::mpi::NativeBuffers>();
          }
          throw;
        }
      }
    } catch (const Error& e) {
      fail(e);
    }
    ++native_done_;
  }

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
  void close() noexcept {
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

  // ---------------- control channel ----------------

  int tag_header() const { return tag_base_; }
  int tag_data() const { return tag_base_ + 1; }
  int tag_control() const { return tag_base_ + 2; }

  void post_control_recv() {
    detail::mpi::check(MPI_Irecv(control_in_.get(), sizeof(*control_in_), MPI_BYTE, MPI_ANY_SOURCE,
                                 tag_control(), comm_, &control_req_),
                       "MPI_Irecv (control)");
  }

  void send_control(const detail::mpi::ControlMessage& m, std::size_t bytes) {
    for (int p = 0; p < size_; ++p) {
      if (p != rank_ && !peers_[static_cast<std::size_t>(p)].gone) send_control_to(p, m, bytes);
    }
  }

  void send_control_to(int p, const detail::mpi::ControlMessage& m, std::size_t bytes) {
    // Kept until the send completes (drained on close); eager-sized, so it completes at once.
    control_out_.push_back(std::make_unique<detail::mpi::ControlMessage>(m));
    control_reqs_.push_back(MPI_REQUEST_NULL);
    if (MPI_Isend(control_out_.back().get(), static_cast<int>(bytes), MPI_BYTE, p, tag_control(),
                  comm_, &control_reqs_.back()) != MPI_SUCCESS) {
      control_reqs_.back() = MPI_REQUEST_NULL;  // best effort: that peer will time out instead
    }
  }

  void poll_control() {
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

  // A peer that said goodbye is only an error for operations it can no longer complete: a
  // receive beyond what it sent, a send beyond what it received. A peer that leaves after its
  // last message (a normal end) troubles nobody. Its last messages get a grace period to land:
  // the goodbye travels on another tag and MPI may match it before them.
  void check_gone() {
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

  void check_gone_native(const AlgoOptions& o) {
    if (!any_gone_) return;
    for (int p = 0; p < size_; ++p) {
      const Peer& peer = peers_[static_cast<std::size_t>(p)];
      if (peer.gone && peer.bye_collectives < native_started_)
        peer_left(p, o.sig, "without taking part in it");
    }
  }

  [[noreturn]] void peer_left(int p, const Signature& sig, const std::string& what) {
    throw PeerLostError("rank " + std::to_string(p) + " left during " + sig.describe() + " " +
                        what +
                        " (its MpiTransport was destroyed or its process exited); "
                        "detected by rank " +
                        std::to_string(rank_));
  }

  // Cancels outstanding receives and polls, up to the deadline, for every request of this
  // transport to complete or be cancelled; true when none is left.
  bool cancel_and_drain(const Deadline& dl) {
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

  // ---------------- op bookkeeping ----------------

  detail::mpi::MpiOp& post(int peer, detail::OpKind kind, const Signature& sig, std::size_t bytes) {
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

  Request post_recv(detail::mpi::MpiOp& op) {
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
          mpi_call(MPI_Irecv(target + off, static_cast<int>(n), MPI_BYTE, op.peer, tag_data(),
                             comm_, &op.data.back()),
                   "MPI_Irecv", op);
        }
      }
    } catch (const Error& e) {
      fail(e);
    }
    return pool_.handle(op);
  }

  void mpi_call(int rc, const char* what, const detail::mpi::MpiOp& op) const {
    if (rc != MPI_SUCCESS) {
      throw Error(std::string(what) + " to/from rank " + std::to_string(op.peer) + " in " +
                  op.sig.describe() + " failed: " + detail::mpi::error_text(rc));
    }
  }

  bool test_request(MPI_Request& r, const detail::mpi::MpiOp& op, MPI_Status* st = nullptr) {
    if (r == MPI_REQUEST_NULL) return true;
    int flag = 0;
    MPI_Status local;
    mpi_call(MPI_Test(&r, &flag, st ? st : &local), "MPI_Test", op);
    return flag != 0;
  }

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

  void progress() {
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

  // Completes in posting order (the Transport contract), testing only the head: MPI_Test on it
  // drives MPI's progress engine for all the others as well.
  void progress_sends(Peer& peer) {
    while (!peer.sendq.empty()) {
      detail::mpi::MpiOp& op = pool_[peer.sendq.front()];
      if (!test_request(op.head, op)) return;
      for (; op.data_done < op.data.size(); ++op.data_done) {
        if (!test_request(op.data[op.data_done], op)) return;
      }
      complete(peer.sendq);
    }
  }

  void progress_recvs(Peer& peer, int p) {
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

  void deliver(detail::mpi::MpiOp& op, const std::byte* incoming) {
    if (op.kind == detail::OpKind::recv) {
      std::memcpy(op.dst, incoming, op.bytes);
    } else {
      op.rs.fn(op.dst, op.src, incoming, op.bytes / op.rs.elem_size);
    }
  }

  void check_header(detail::mpi::MpiOp& op, int p, std::size_t got) {
    detail::mpi::WireHeader h{};
    if (got >= sizeof(h)) std::memcpy(&h, op.wire.data(), sizeof(h));
    if (got < sizeof(h) || h.magic != detail::mpi::kHeaderMagic) {
      throw Error("MPI transport protocol error: rank " + std::to_string(p) + " sent " +
                  std::to_string(got) + " bytes that are not a kolo message header, during " +
                  op.sig.describe() + " on rank " + std::to_string(rank_));
    }
    if (h.sig != op.sig || h.bytes != op.bytes)
      detail::throw_mismatch(p, rank_, h.sig, h.bytes, op);
    op.inline_payload = h.inline_payload != 0;
    if (op.inline_payload != (op.bytes <= inline_bytes_) ||
        (op.inline_payload && got != sizeof(h) + op.bytes)) {
      throw Error("MPI transport protocol error: rank " + std::to_string(p) +
                  " framed its message differently (KOLO_MPI_INLINE_BYTES differs?) in " +
                  op.sig.describe());
    }
  }

  void block(const Deadline& dl) {
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

  std::string seconds_text() const {
    char to[32];
    std::snprintf(to, sizeof(to), "%g", opts_.timeout_seconds);
    return to;
  }

  std::string timeout_message() const {
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
           " after " + seconds_text() + " s waiting for " +
           (waiting.empty() ? "nothing" : waiting) +
           " (MPI transport; raise KOLO_TIMEOUT_SECONDS if the job is just slow)";
  }

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

static_assert(check_transport<MpiTransport>());

// MpiTransport plus MPI's own collectives: Communicator<MpiNativeTransport> calls these (see the
// HasNative* concepts in communicator.hpp) and falls back to kolo's algorithms over the same
// point-to-point layer when one returns false (a count beyond MPI's int). allgatherv itself is
// not routed here by Communicator (only allgather is); see docs/mpi.md.
class MpiNativeTransport : public MpiTransport {
 public:
  using MpiTransport::MpiTransport;

  bool native_allreduce(const void* in, void* out, std::size_t n, DataType d, ReduceOp op,
                        const AlgoOptions& o) {
    if (n > kMaxCount) return false;
    check_signatures(o);
    const MPI_Datatype t = mpi_datatype(d);
    const MPI_Op mop = mpi_op(d, op);
    const int cnt = static_cast<int>(n);
    const std::size_t bytes = n * dtype_size(d);
    const void* send = in == out ? MPI_IN_PLACE : in;
    void* recv = out;
    if (!native_in_place()) {  // reduce a kolo-owned copy in place, copy the result out
      recv = stage_in(in, bytes);
      send = MPI_IN_PLACE;
    }
    native(
        "MPI_Iallreduce", o,
        [&](MPI_Request* r) { return MPI_Iallreduce(send, recv, cnt, t, mop, comm_, r); },
        [&] { return MPI_Allreduce(send, recv, cnt, t, mop, comm_); });
    if (recv != out && bytes > 0) std::memcpy(out, recv, bytes);
    if (op == ReduceOp::average) finish_average(out, n, d, size_);
    return true;
  }

  bool native_allgatherv(const void* in, void* out, std::span<const std::size_t> counts, DataType d,
                         const AlgoOptions& o) {
    std::vector<int> cnt(counts.size()), displ(counts.size());
    std::size_t total = 0;
    for (std::size_t q = 0; q < counts.size(); ++q) {
      if (counts[q] > kMaxCount || total > kMaxCount) return false;
      cnt[q] = static_cast<int>(counts[q]);
      displ[q] = static_cast<int>(total);
      total += counts[q];
    }
    if (total > kMaxCount || counts.size() != static_cast<std::size_t>(size_)) return false;
    check_signatures(o);
    const MPI_Datatype t = mpi_datatype(d);
    const std::size_t es = dtype_size(d);
    const auto me = static_cast<std::size_t>(rank_);
    const std::size_t mine = static_cast<std::size_t>(displ[me]) * es;
    const void* send = in;
    void* recv = out;
    if (!native_in_place()) {
      recv = stage_out(total * es);
      if (counts[me] > 0) std::memcpy(static_cast<std::byte*>(recv) + mine, in, counts[me] * es);
      send = MPI_IN_PLACE;
    } else if (in == static_cast<const std::byte*>(out) + mine) {
      send = MPI_IN_PLACE;  // the input already sits in this rank's slot: say so legally
    }
    native(
        "MPI_Iallgatherv", o,
        [&](MPI_Request* r) {
          return MPI_Iallgatherv(send, cnt[me], t, recv, cnt.data(), displ.data(), t, comm_, r);
        },
        [&] { return MPI_Allgatherv(send, cnt[me], t, recv, cnt.data(), displ.data(), t, comm_); });
    if (recv != out && total > 0) std::memcpy(out, recv, total * es);
    return true;
  }

  bool native_broadcast(void* data, std::size_t n, DataType d, int root, const AlgoOptions& o) {
    if (n > kMaxCount) return false;
    check_signatures(o);
    const MPI_Datatype t = mpi_datatype(d);
    const int cnt = static_cast<int>(n);
    const std::size_t bytes = n * dtype_size(d);
    void* buf = data;
    if (!native_in_place()) buf = rank_ == root ? stage_in(data, bytes) : stage_out(bytes);
    native(
        "MPI_Ibcast", o, [&](MPI_Request* r) { return MPI_Ibcast(buf, cnt, t, root, comm_, r); },
        [&] { return MPI_Bcast(buf, cnt, t, root, comm_); });
    if (buf != data && rank_ != root && bytes > 0) std::memcpy(data, buf, bytes);
    return true;
  }

  // n: elements per rank (the output's count).
  bool native_reduce_scatter(const void* in, void* out, std::size_t n, DataType d, ReduceOp op,
                             const AlgoOptions& o) {
    if (n > kMaxCount || n * static_cast<std::size_t>(size_) > kMaxCount) return false;
    check_signatures(o);
    const MPI_Datatype t = mpi_datatype(d);
    const MPI_Op mop = mpi_op(d, op);
    const std::size_t out_bytes = n * dtype_size(d);
    const std::size_t in_bytes = out_bytes * static_cast<std::size_t>(size_);
    const auto* ib = static_cast<const std::byte*>(in);
    auto* ob = static_cast<std::byte*>(out);
    const void* send = in;
    void* recv = out;
    if (!native_in_place()) {
      send = stage_in(in, in_bytes);
      recv = stage_out(out_bytes);
    } else if (ob < ib + in_bytes && ib < ob + out_bytes) {
      // kolo's in-place form puts the output inside the input (this rank's block); MPI_IN_PLACE
      // would put it at the start instead, so an overlapping output goes through a copy.
      recv = stage_out(out_bytes);
    }
    const int cnt = static_cast<int>(n);
    native(
        "MPI_Ireduce_scatter_block", o,
        [&](MPI_Request* r) {
          return MPI_Ireduce_scatter_block(send, recv, cnt, t, mop, comm_, r);
        },
        [&] { return MPI_Reduce_scatter_block(send, recv, cnt, t, mop, comm_); });
    if (recv != out && out_bytes > 0) std::memcpy(out, recv, out_bytes);
    if (op == ReduceOp::average) finish_average(out, n, d, size_);
    return true;
  }

  // n: elements per destination rank.
  bool native_alltoall(const void* in, void* out, std::size_t n, DataType d, const AlgoOptions& o) {
    if (n > kMaxCount || n * static_cast<std::size_t>(size_) > kMaxCount) return false;
    check_signatures(o);
    const MPI_Datatype t = mpi_datatype(d);
    const int cnt = static_cast<int>(n);
    const std::size_t bytes = n * dtype_size(d) * static_cast<std::size_t>(size_);
    const void* send = in;
    void* recv = out;
    if (!native_in_place()) {
      send = stage_in(in, bytes);
      recv = stage_out(bytes);
    }
    native(
        "MPI_Ialltoall", o,
        [&](MPI_Request* r) { return MPI_Ialltoall(send, cnt, t, recv, cnt, t, comm_, r); },
        [&] { return MPI_Alltoall(send, cnt, t, recv, cnt, t, comm_); });
    if (recv != out && bytes > 0) std::memcpy(out, recv, bytes);
    return true;
  }

  bool native_barrier(const AlgoOptions& o) {
    if (options().check_signatures) {
      check_signatures(o);  // an allgather: nobody leaves it before everyone entered
      return true;
    }
    native(
        "MPI_Ibarrier", o, [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); },
        [&] { return MPI_Barrier(comm_); });
    return true;
  }
};

static_assert(check_transport<MpiNativeTransport>());

}  // namespace kolo
