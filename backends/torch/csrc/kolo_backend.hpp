// kolo_backend.hpp — kolo as a torch.distributed backend ("kolo"): a c10d::Backend whose
// collectives run on kolo's Communicator, bootstrapped through the c10d::Store torch hands it.
//
// Threading: every asynchronous call from Python only validates its arguments and queues a task;
// one worker thread per backend runs the tasks in issue order, so the calling thread never blocks
// on communication (DDP's reducer relies on that). A work is completed (its future's callbacks
// run) after the communicator is released, and a callback that waits for a later operation gets
// a second worker to run it, so callbacks may issue and wait on collectives (comm hooks do).
// Point-to-point operations are posted without waiting and completed as the transport delivers
// them, so a rank may isend to a peer and then irecv from it. Each task completes its KoloWork:
// wait() returns or rethrows, and getFuture()'s future is marked completed with the output tensors
// (or with the error).
//
// The caller's thread runs an operation itself in two cases, both where it would otherwise only
// wait: a synchronous call (torch's asyncOp = false) issued while nothing is queued or running,
// and wait() without a timeout on a work that is next in line and not started. Either way the
// order of issue is kept (one thread at a time owns the communicator), and the data is reduced
// on the core that last touched it, without a hand-off to the worker and back.
//
// Refused calls (docs/torch.md, "Errors"): a collective whose arguments the backend refuses
// (an unsupported dtype or op, a bad root, a list of the wrong length...) raises on the calling
// thread, as with Gloo, and is refused in its place in the issue order: a task queued like any
// operation calls Communicator::refuse, so every operation issued before it completes on every
// rank and each peer's matching call fails at once with this rank's message, instead of waiting
// for the group's timeout. A collective's body that fails before kolo saw the call (a CUDA
// tensor on another device, say) refuses the same way.
//
// CUDA tensors: in a build with CUDA (KOLO_TORCH_CUDA=1 at install), contiguous CUDA tensors of
// allreduce, broadcast, all_gather_into_tensor, reduce_scatter_tensor and all_to_all_single
// (equal splits) go to a kolo Communicator<NcclTransport> created on the group's first such
// call, after kolo's stream has waited for the caller's current stream; every other CUDA
// tensor, and every CUDA tensor in a CPU build, is staged through host memory.
#pragma once

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <kolo/communicator.hpp>

// Supported torch versions: 2.9 and later (docs/torch.md). c10d's Backend changed twice in that
// range, and one source serves both sides of each change:
// - torch 2.14 made all_gather_single, all_gather_single_coalesced, reduce_scatter_single,
//   reduce_scatter_single_coalesced and all_to_all_single the canonical virtuals (the older names
//   _allgather_base etc. became forwarding aliases). kolo implements the new names and has the
//   old ones call them; before 2.14 the new names are plain members, reached only that way.
// - torch 2.13 renamed NCCLPreMulSumSupplement (PREMUL_SUM's factor) to PreMulSumSupplement.
#define KOLO_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) ||       \
   (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))
#if !KOLO_TORCH_AT_LEAST(2, 9)
#error "kolo_torch needs torch 2.9 or later (c10d::Backend's split and getBackendOptions)"
#endif
// c10d::Backend::supportsShrinking/shrink (torch.distributed.shrink_group): in torch 2.15, not
// in 2.9 (the versions between were not checked); on older torch these are plain members.
#if KOLO_TORCH_AT_LEAST(2, 15)
#define KOLO_TORCH_SHRINK_OVERRIDE override
#else
#define KOLO_TORCH_SHRINK_OVERRIDE
#endif
// getError and the abort hooks (supportsAbortHooks, registerAbortHook, unregisterAbortHook):
// virtuals of c10d::Backend in torch 2.15; plain members on older torch, as shrink.
#if KOLO_TORCH_AT_LEAST(2, 15)
#define KOLO_TORCH_ERROR_OVERRIDE override
#else
#define KOLO_TORCH_ERROR_OVERRIDE
#endif
#if KOLO_TORCH_AT_LEAST(2, 14)
#define KOLO_TORCH_SINGLE_OVERRIDE override
#else
#define KOLO_TORCH_SINGLE_OVERRIDE
#endif

namespace kolo_torch {

struct Task;   // one queued operation
struct Sched;  // the queue and who owns the communicator (shared with the works)
class CudaPath;

// The result of one operation: torch's Work, plus the future DDP's reducer and comm hooks use.
class KoloWork : public c10d::Work {
 public:
  KoloWork(int rank, c10d::OpType op, const char* title, std::vector<at::Tensor> outputs,
           std::weak_ptr<Sched> sched);

  std::vector<at::Tensor> result() override { return outputs_; }
  // Without a timeout, runs the operation on this thread when it is next in line and has not
  // started. Then spins briefly (yielding the core) before blocking: a small collective
  // completes within microseconds, and a blocked thread's wake-up costs tens of them on a
  // loaded VM.
  bool wait(std::chrono::milliseconds timeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  int sourceRank() const override { return source_rank_; }

  // Marks the work done (nullptr: success) and completes the future. Called once.
  void complete(std::exception_ptr error);
  void set_source_rank(int r) { source_rank_ = r; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  int source_rank_ = -1;
  std::atomic<bool> done_{false};
  std::weak_ptr<Sched> sched_;
};

class KoloBackend : public c10d::Backend {
 public:
  using Comm = kolo::Communicator<>;

  // Builds the communicator (a rendezvous through `store`: every rank of the group calls this
  // at the same point, as for any torch backend). timeout bounds every collective unless
  // KOLO_TIMEOUT_SECONDS is set.
  KoloBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
              std::chrono::milliseconds timeout);
  // Over a communicator built already (shrink's result): its rank and size; `store` is the
  // rendezvous store a later reconfigure() builds through (the parent's).
  KoloBackend(std::unique_ptr<Comm> comm, std::chrono::milliseconds timeout,
              std::shared_ptr<kolo::KvStore> store = nullptr);
  ~KoloBackend() override;

  // torch.distributed.Backend.register_backend's creator: (store, rank, size, timeout).
  static c10::intrusive_ptr<c10d::Backend> create(const c10::intrusive_ptr<c10d::Store>& store,
                                                  int rank, int size,
                                                  std::chrono::duration<float> timeout);

  const std::string getBackendName() const override { return "kolo"; }
  // torch's split_group clones these for the children (the timeout is the one kept).
  c10::intrusive_ptr<Options> getBackendOptions() override { return options_; }
  // The number of operations issued on this group so far (the same on every rank of a
  // correct program: torch compares them to find ranks that fell out of step).
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return issued_.load(); }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> all_gather_single(at::Tensor& output, at::Tensor& input,
                                                   const c10d::AllgatherOptions& opts)
      KOLO_TORCH_SINGLE_OVERRIDE;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> all_gather_single_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) KOLO_TORCH_SINGLE_OVERRIDE;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single(at::Tensor& output, at::Tensor& input,
                                                       const c10d::ReduceScatterOptions& opts)
      KOLO_TORCH_SINGLE_OVERRIDE;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_single_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) KOLO_TORCH_SINGLE_OVERRIDE;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> all_to_all_single(
      at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
      std::vector<int64_t>& input_splits,
      const c10d::AllToAllOptions& opts) KOLO_TORCH_SINGLE_OVERRIDE;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

  bool supportsSplitting() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;

  // torch.distributed.shrink_group: the survivors' new backend (kolo::Communicator::shrink).
  // Queued operations fail, the running one is interrupted, then the survivors agree through
  // the store on who is gone; that set must equal ranks_to_exclude (torch numbers the new group
  // from the list), else every survivor raises naming both. SHRINK_DEFAULT and SHRINK_ABORT
  // alike: kolo always revokes the old communicator first. opts_override's timeout bounds the
  // shrink and the new group's collectives. This backend is unusable afterwards.
  bool supportsShrinking() const KOLO_TORCH_SHRINK_OVERRIDE { return true; }
  c10::intrusive_ptr<c10d::Backend> shrink(
      const std::vector<int64_t>& ranks_to_exclude, int shrink_flags = 0,
      const c10::intrusive_ptr<Options>& opts_override = nullptr) KOLO_TORCH_SHRINK_OVERRIDE;

#ifdef C10D_BACKEND_HAS_RECONFIGURE
  // torch's reconfigure regime (dist._supports_reconfigure, _get_reconfigure_handle,
  // _reconfigure: in-process fault tolerance with a new membership, torch >= 2.15). The handle
  // names this process's backend ("kolo:<host>:<pid>:<random>"); reconfigure(opts) fails what
  // is queued, interrupts what runs, and builds a new communicator over the members whose
  // handles opts lists (a vector: ranks by position; a set: ranks in the handles' sorted order),
  // through the group's store under a prefix of opts.uuid's. Every member calls it with the
  // same uuid and handles; a uuid used before on this group, a list without this process's
  // handle or with one twice are refused before anything changes. The backend's rank and size
  // become the new ones (torch's ProcessGroup keeps the numbers it was built with). The group
  // is usable again afterwards, getError() is SUCCESS and the abort hooks armed again. kolo's
  // group forms at init_process_group whatever enable_reconfigure says.
  bool supportsReconfigure() const override {
    return true;
  }
  c10d::ReconfigureHandle get_reconfigure_handle() const override {
    return handle_;
  }
  c10::intrusive_ptr<c10d::Work> reconfigure(const c10d::ReconfigureOptions& opts) override;
#endif
  // The ranks of this group this rank's failure detector holds for gone now (kolo_torch's
  // lost_ranks(group), what to pass to dist.shrink_group); empty while none is. Safe after a
  // failure; while operations run, a view of that moment.
  std::vector<int> lost_ranks();

  // Fails every queued operation at once, interrupts the running one (it fails on this rank
  // and, through kolo's abort, on its peers), joins the worker and releases the connections;
  // later calls raise.
  void abort() override;
  // Finishes the queued operations, then releases everything.
  void shutdown() override;

  // The first failure of a collective on this backend, as torch classifies it: TIMEOUT (a kolo
  // TimeoutError), REMOTE_ERROR (an error another rank reported: "[reported by rank R]"),
  // COMM_ERROR (a peer lost, a revoked communicator, a mismatch); SUCCESS until one happened.
  // Argument errors refused before anything was sent do not count.
  c10d::ErrorType getError() KOLO_TORCH_ERROR_OVERRIDE;
  // Abort hooks run once, before the backend aborts: on abort(), or at the first failure of a
  // collective (kolo then aborts the communicator on every rank), on the thread that saw it.
  bool supportsAbortHooks() const KOLO_TORCH_ERROR_OVERRIDE {
    return true;
  }
  void registerAbortHook(int64_t hook_id, std::function<void()> hook) KOLO_TORCH_ERROR_OVERRIDE;
  void unregisterAbortHook(int64_t hook_id) KOLO_TORCH_ERROR_OVERRIDE;

  // For tests and benchmarks: the kolo communicator under this backend.
  Comm& communicator() {
    return *comm_;
  }
  // True when this extension was built with CUDA (the NCCL path for CUDA tensors).
  static bool built_with_cuda();

 private:
  // Queues `body` (or, for a synchronous call with nothing queued or running, runs it on the
  // calling thread) and returns its work.
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType op, const char* title,
                                         std::vector<at::Tensor> outputs,
                                         std::function<void(Task&)> body, bool sync = false);
  // A worker thread: runs the queued tasks and polls the posted requests while it owns the
  // communicator, then completes the works it finished (see the .cpp for why in that order).
  void worker_loop();
  // Starts one more worker thread (under Sched::mu): every worker is inside a callback and
  // work is pending.
  void add_worker_locked();
  void stop(bool abort_now, const std::string& why);
  // Records a collective's failure for getError (the first one wins) and runs the abort hooks.
  void note_failure(const std::exception& e);
  void run_abort_hooks();
  // stop() up to the release: no worker left and the communicator free (not reset).
  void quiesce(bool abort_now, const std::string& why);
  // True when `t` takes the NCCL path (a CUDA build, a contiguous CUDA tensor).
  bool on_nccl(const at::Tensor& t) const;

  // Runs a collective's argument checks and queues it (`issue`, which returns enqueue's work).
  // When they throw, the call is refused in its place in the issue order (refuse_in_order) and
  // the error is rethrown to the caller.
  template <class F>
  c10::intrusive_ptr<c10d::Work> checked(F&& issue);
  // Queues (or, with nothing queued or running, runs) a task that refuses the communicators'
  // next collective call with e's text: the peers' matching call fails with it. Never throws.
  void refuse_in_order(const std::exception& e);
  // Refuses the next collective call of the group's communicators (host, and NCCL once it
  // exists) with `why`. By the thread that owns the communicator.
  void refuse_now(const std::string& why);

  std::unique_ptr<Comm> comm_;
  std::shared_ptr<kolo::KvStore> kv_;  // the group's rendezvous store (torch's, adapted)
  std::string handle_;                 // get_reconfigure_handle()
  std::set<int64_t> uuids_;            // the uuids reconfigure() was called with
  std::unique_ptr<CudaPath> cuda_;     // nullptr in a CPU build
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<Options> options_;

  std::shared_ptr<Sched> sched_;
  std::atomic<std::uint64_t> issued_{0};  // operations issued so far
  std::vector<std::thread> threads_;      // the worker threads (under Sched::mu; joined by stop())
  std::atomic<int> error_type_{0};        // c10d::ErrorType of the first failure (getError)
  std::mutex hooks_mu_;                   // the abort hooks, and whether they ran
  std::map<int64_t, std::function<void()>> abort_hooks_;
  bool hooks_ran_ = false;
};

}  // namespace kolo_torch
