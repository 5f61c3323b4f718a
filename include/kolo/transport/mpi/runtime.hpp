// kolo/transport/mpi/runtime.hpp — MPI itself as kolo uses it, process-wide: MpiOptions, MPI
// error texts, initialising MPI when nobody has, the finalize and exit hooks that close live
// transports first, the 16-bit float types and reduce operations, the graveyard of buffers MPI may
// still write, and the backoff every MPI wait uses. The only place (with its includers) that
// includes <mpi.h>; lifetime rules: transport/mpi.hpp.
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
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kolo/core/config.hpp"
#include "kolo/core/deadline.hpp"
#include "kolo/core/dtype.hpp"
#include "kolo/core/env.hpp"
#include "kolo/core/error.hpp"
#include "kolo/core/reduce.hpp"
#include "kolo/core/wait.hpp"

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

// Waiting without a file descriptor to sleep on (MPI progresses only inside MPI calls): kolo's
// one wait policy (core/wait.hpp) with MPI's phases: spin while the peer is likely running
// (yielding at least every 20 us), then 200 us of yields, then sleeps from 20 us doubling to 1 ms.
// A wait that completes starts the next one from the spin again, so streaming traffic stays in
// the spin.
class Backoff : public wait::Backoff {
 public:
  explicit Backoff(double spin_us)
      : wait::Backoff({.spin = std::chrono::nanoseconds(static_cast<long long>(spin_us * 1000)),
                       .yield_for = std::chrono::microseconds(200)}) {}
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

}  // namespace detail::mpi

}  // namespace kolo
