// kolo_backend.cpp — the "kolo" torch.distributed backend (see kolo_backend.hpp) and its Python
// module kolo_torch._C. One translation unit: torch's headers are most of the build time.
#include "kolo_backend.hpp"
#include "torch_config.hpp"

#include <torch/python.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <pybind11/chrono.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <thread>
#include <unordered_set>
#include <utility>
#include <variant>

#include <kolo/core/config.hpp>
#include <kolo/core/wait.hpp>
#include <kolo/net/auth.hpp>
#include <kolo/topology/kv_store.hpp>

#ifdef KOLO_TORCH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <kolo/transport/nccl.hpp>
#endif

namespace kolo_torch {
namespace {

// ---- the c10d::Store as kolo's KvStore ----

// Runs a store call, turning torch's exceptions into kolo's error types (a timeout stays a
// timeout: kolo's messages and the torch user's except clauses depend on it).
template <class F>
auto store_call(const char* what, const std::string& key, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error& e) {
    const std::string msg = std::string("torch.distributed store ") + what + "(" + key +
                            "): " + e.what_without_backtrace();
    if (msg.find("imeout") != std::string::npos || msg.find("timed out") != std::string::npos) {
      throw kolo::TimeoutError(msg);
    }
    throw kolo::PeerLostError(msg);
  }
}

class C10dKvStore final : public kolo::KvStore {
 public:
  explicit C10dKvStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::string& value) override {
    store_call("set", key,
               [&] { store_->set(key, std::vector<uint8_t>(value.begin(), value.end())); });
  }
  std::string get(const std::string& key) override {
    const auto v = store_call("get", key, [&] { return store_->get(key); });
    return {v.begin(), v.end()};
  }
  std::optional<std::string> try_get(const std::string& key) override {
    if (!store_call("check", key, [&] { return store_->check({key}); })) return std::nullopt;
    return get(key);
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    return store_call("add", key, [&] { return store_->add(key, delta); });
  }
  void wait(const std::vector<std::string>& keys) override {
    store_call("wait", keys.empty() ? std::string() : keys.front(), [&] { store_->wait(keys); });
  }
  // torch's compareSet (kolo's semantics are torch's); a store without one (a Python Store
  // subclass that did not implement it) is a ConfigError, as KvStore's default.
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override {
    const auto v = store_call("compareSet", key, [&] {
      try {
        return store_->compareSet(key, std::vector<uint8_t>(expected.begin(), expected.end()),
                                  std::vector<uint8_t>(desired.begin(), desired.end()));
      } catch (const c10::NotImplementedError&) {
        throw kolo::ConfigError(describe() +
                                " cannot compare-and-set: shrink/grow need kolo's store or "
                                "torch's TCPStore/FileStore/HashStore");
      }
    });
    return {v.begin(), v.end()};
  }
  // Up to 1 s (the short slices of shrink's agreement loop): check() every 2 ms, because torch's
  // TCPStore logs two warnings on every expired wait(keys, timeout). Longer: torch's wait; its
  // timeout (a DistStoreError, kolo::TimeoutError through store_call) is the answer false.
  bool wait_for(const std::vector<std::string>& keys, double seconds) override {
    if (keys.empty()) return true;
    const auto check = [&] {
      return store_call("check", keys.front(), [&] { return store_->check(keys); });
    };
    if (!(seconds > 1.0)) {  // NaN too: one check
      const double s = seconds > 0 ? seconds : 0.0;
      const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(s);
      for (;;) {
        if (check()) return true;
        if (std::chrono::steady_clock::now() >= until) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
    const auto ms = std::chrono::milliseconds(
        static_cast<std::int64_t>(std::ceil(std::min(seconds, 1e7) * 1000.0)));
    try {
      store_call("wait", keys.front(), [&] { store_->wait(keys, ms); });
      return true;
    } catch (const kolo::TimeoutError&) {
      return false;
    }
  }
  void erase(const std::string& key) override {
    store_call("deleteKey", key, [&] { store_->deleteKey(key); });
  }
  // The TCP store under the prefixes, when there is one: ranks advertise the interface through
  // which they reach it, as with kolo's own store.
  std::optional<kolo::net::HostPort> address() const override {
    c10d::Store* s = store_.get();
    for (int depth = 0; s != nullptr && depth < 16; ++depth) {
      if (auto* tcp = dynamic_cast<c10d::TCPStore*>(s)) {
        return kolo::net::HostPort{tcp->getHost(), tcp->getPort()};
      }
      auto* prefix = dynamic_cast<c10d::PrefixStore*>(s);
      if (prefix == nullptr) break;
      s = prefix->getUnderlyingStore().get();
    }
    return std::nullopt;
  }
  std::string describe() const override { return "torch.distributed store"; }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

// ---- tensors ----

[[noreturn]] void fail(const std::string& msg) {
  throw std::runtime_error("kolo: " + msg);
}

std::optional<kolo::DataType> kolo_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return kolo::DataType::float32;
    case at::kDouble:
      return kolo::DataType::float64;
    case at::kHalf:
      return kolo::DataType::float16;
    case at::kBFloat16:
      return kolo::DataType::bfloat16;
    case at::kChar:
      return kolo::DataType::int8;
    case at::kByte:
    case at::kBool:  // one byte, 0 or 1: reduced with max (or) and min (and)
      return kolo::DataType::uint8;
    case at::kInt:
      return kolo::DataType::int32;
    case at::kLong:
      return kolo::DataType::int64;
    default:
      return std::nullopt;
  }
}

kolo::DataType dtype_for(const at::Tensor& t, const char* op) {
  const auto d = kolo_dtype(t.scalar_type());
  if (!d) {
    fail(std::string(op) + ": dtype " + std::string(c10::toString(t.scalar_type())) +
         " is not supported (float32/64, float16, bfloat16, int8, uint8, int32, int64, bool)");
  }
  return *d;
}

// kolo's reduction for torch's op on this dtype.
kolo::ReduceOp reduce_op(const c10d::ReduceOp& op, at::ScalarType st, const char* coll) {
  const bool is_bool = st == at::kBool;
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return is_bool ? kolo::ReduceOp::max : kolo::ReduceOp::sum;
    case c10d::ReduceOp::PREMUL_SUM:
      return kolo::ReduceOp::sum;  // the factor is applied first (premul_factor)
    case c10d::ReduceOp::AVG:
      if (is_bool) fail(std::string(coll) + ": ReduceOp.AVG is not defined for bool tensors");
      return kolo::ReduceOp::average;
    case c10d::ReduceOp::PRODUCT:
      return is_bool ? kolo::ReduceOp::min : kolo::ReduceOp::product;
    case c10d::ReduceOp::MIN:
      return kolo::ReduceOp::min;
    case c10d::ReduceOp::MAX:
      return kolo::ReduceOp::max;
    case c10d::ReduceOp::BOR:
      if (is_bool) return kolo::ReduceOp::max;
      break;
    case c10d::ReduceOp::BAND:
      if (is_bool) return kolo::ReduceOp::min;
      break;
    case c10d::ReduceOp::BXOR:
      break;
    default:
      fail(std::string(coll) + ": reduce op " + std::to_string(static_cast<int>(op.op_)) +
           " is not supported");
  }
  const char* name = op.op_ == c10d::ReduceOp::BAND  ? "BAND"
                     : op.op_ == c10d::ReduceOp::BOR ? "BOR"
                                                     : "BXOR";
  fail(std::string(coll) + ": ReduceOp." + name + " is not supported for " +
       std::string(c10::toString(st)) + " tensors (BAND and BOR: bool tensors only; BXOR: none)");
}

// PREMUL_SUM's factor (a double or a one-element tensor), or nullopt for other ops.
std::optional<double> premul_factor(const c10d::ReduceOp& op) {
  if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return std::nullopt;
#if KOLO_TORCH_AT_LEAST(2, 13)
  using Supplement = c10d::PreMulSumSupplement;
#else
  using Supplement = c10d::NCCLPreMulSumSupplement;
#endif
  const auto* s = dynamic_cast<const Supplement*>(op.supplement_.get());
  if (s == nullptr) fail("PREMUL_SUM without a factor");
  if (s->tensor_factor.defined()) return s->tensor_factor.to(at::kCPU).item<double>();
  return s->double_factor;
}

// A tensor as kolo sees it: contiguous host memory. For a CUDA or non-contiguous tensor `host`
// is a copy taken when the operation is queued (on the caller's thread, in its stream order),
// written back into `user` by write_back() when the operation completes.
struct Staged {
  at::Tensor user;
  at::Tensor host;
  bool copy = false;

  void write_back() const {
    if (copy) user.copy_(host);
  }
  kolo::TensorView view(const char* op) const {
    return kolo::TensorView(host.data_ptr(), static_cast<std::size_t>(host.numel()),
                            dtype_for(host, op));
  }
};

Staged stage(const at::Tensor& t, const char* op, bool read_input = true) {
  if (!t.defined()) fail(std::string(op) + ": an undefined tensor");
  if (t.is_sparse()) fail(std::string(op) + ": sparse tensors are not supported");
  if (t.device().type() != at::kCPU && t.device().type() != at::kCUDA) {
    fail(std::string(op) + ": tensors on " + t.device().str() + " are not supported (cpu, cuda)");
  }
  dtype_for(t, op);
  Staged s;
  s.user = t;
  if (t.device().is_cpu() && t.is_contiguous()) {
    s.host = t;
    return s;
  }
  s.copy = true;
  if (read_input) {
    s.host = t.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true).contiguous();
  } else {
    s.host = at::empty(t.sizes(), t.options().device(at::kCPU));
  }
  return s;
}

void check_single(const std::vector<at::Tensor>& ts, const char* op) {
  if (ts.size() != 1) {
    fail(std::string(op) + ": expects exactly one tensor per call (got " +
         std::to_string(ts.size()) + ")");
  }
}

void check_root(int root, int size, const char* op) {
  if (root < 0 || root >= size) {
    fail(std::string(op) + ": root rank " + std::to_string(root) + " is not in [0, " +
         std::to_string(size) + ")");
  }
}

// One flat contiguous host tensor holding `parts` back to back (for list-of-tensor collectives).
at::Tensor flat_like(const std::vector<at::Tensor>& parts, const at::Tensor& like) {
  int64_t n = 0;
  for (const auto& p : parts) n += p.numel();
  return at::empty({n}, like.options().device(at::kCPU));
}

void check_same_dtype(const std::vector<at::Tensor>& parts, at::ScalarType st, const char* op) {
  for (const auto& p : parts) {
    if (p.scalar_type() != st) {
      fail(std::string(op) + ": tensors of different dtypes (" +
           std::string(c10::toString(p.scalar_type())) + " and " + std::string(c10::toString(st)) +
           ")");
    }
  }
}

kolo::TensorView view_of(const at::Tensor& host, const char* op) {
  return kolo::TensorView(host.data_ptr(), static_cast<std::size_t>(host.numel()),
                          dtype_for(host, op));
}

// Copies the flat tensor's consecutive slices into `parts` (reshaped to each part's shape).
void scatter_flat(const at::Tensor& flat, std::vector<at::Tensor>& parts) {
  int64_t off = 0;
  for (auto& p : parts) {
    const int64_t n = p.numel();
    p.copy_(flat.narrow(0, off, n).view(p.sizes()));
    off += n;
  }
}

// The host copy of `parts` back to back.
at::Tensor gather_flat(const std::vector<at::Tensor>& parts, const at::Tensor& like) {
  at::Tensor flat = flat_like(parts, like);
  int64_t off = 0;
  for (const auto& p : parts) {
    const int64_t n = p.numel();
    flat.narrow(0, off, n).copy_(p.reshape({n}));
    off += n;
  }
  return flat;
}

// The key prefix of this backend's communicators in torch's store: under torchrun's elastic
// restarts (--max-restarts) the agent's store outlives a failed attempt, so each attempt
// (TORCHELASTIC_RESTART_COUNT) keeps its keys apart — else the new ranks would read the dead
// attempt's job token and addresses.
// This process's reconfigure handle: unique per backend (host, pid, random bits).
std::string reconfigure_handle() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "?");
  return "kolo:" + std::string(host) + ":" + std::to_string(::getpid()) + ":" +
         kolo::net::generate_secret().substr(0, 16);
}

std::string store_prefix(const std::string& base) {
  const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
  if (attempt == nullptr || *attempt == '\0' || std::string(attempt) == "0") return base;
  return base + "attempt" + attempt + "/";
}

std::exception_ptr wrap(const std::exception& e) {
  std::string what = e.what();
  if (what.rfind("kolo", 0) != 0) what = "kolo: " + what;
  // torch's wording for a deadline, which scripts and PyTorch's tests match on
  if (dynamic_cast<const kolo::TimeoutError*>(&e) != nullptr) {
    what = "kolo: Timed out - " + what.substr(6);
  }
  return std::make_exception_ptr(std::runtime_error(what));
}

// An error's text as the peers get it through a refusal: torch's without its backtrace, and
// without this backend's "kolo: " (the peers' wrap() adds it again).
std::string error_text(const std::exception& e) {
  const auto* c = dynamic_cast<const c10::Error*>(&e);
  std::string what = c != nullptr ? c->what_without_backtrace() : e.what();
  if (what.rfind("kolo: ", 0) == 0) what.erase(0, 6);
  return what;
}

}  // namespace

// ---- KoloWork ----

namespace {
// The type of every work's future value (built once, not per operation).
const c10::TypePtr& list_of_tensors() {
  static const c10::TypePtr t = c10::ListType::create(c10::TensorType::get());
  return t;
}
}  // namespace

KoloWork::KoloWork(int rank, c10d::OpType op, const char* title, std::vector<at::Tensor> outputs,
                   std::weak_ptr<Sched> sched)
    : c10d::Work(rank, op, title),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(list_of_tensors())),
      sched_(std::move(sched)) {}

// How long a waiting thread spins (yielding) before it blocks: KOLO_TORCH_SPIN_US, default 50.
std::chrono::microseconds spin_budget() {
  // Read through kolo's configuration table (name, range and error text in one place).
  static const std::chrono::microseconds us = [] {
    const auto n = kolo::config::get_int(kolo::process_env(), kolo::config::vars::torch_spin_us);
    return std::chrono::microseconds(n ? *n : 50);
  }();
  return us;
}

// Spins up to the budget (sched_yield between looks) until pred() holds; true if it did. The
// core wait policy (kolo/core/wait.hpp), a yield at every look as before; budget 0: one look.
template <class Pred>
bool spin_until(Pred pred) {
  thread_local kolo::wait::YieldCadence cadence(1);
  return kolo::wait::spin_until(pred, spin_budget(), cadence);
}

void KoloWork::complete(std::exception_ptr error) {
  // The future first: a thread that wait()ed may read it as soon as the work is finished.
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
  finish(error);
  done_.store(true, std::memory_order_release);
}

// ---- the queue ----

struct Task {
  c10::intrusive_ptr<KoloWork> work;
  std::function<void(Task&)> body;
  // Set by a point-to-point body: true once the posted request completed (may throw).
  std::function<bool()> poll;
  // Runs after completion and before the work is marked done (copies back into user tensors).
  std::function<void()> after;
  // A collective (not point to point): a caller's thread may run it (see kolo_backend.hpp).
  bool here_ok = true;
};

struct Sched {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Task>> queue;
  std::atomic<std::size_t> queued{0};  // queue.size(), readable without the lock
  // One thread at a time uses the communicator: a worker (running a task, or polling the
  // point-to-point requests) or a caller running an operation itself.
  bool busy = false;
  // Point-to-point requests in flight, polled by the worker that holds the communicator (any
  // of them: the one that posted a request may be inside a callback when it completes). Only
  // the owner (busy) changes it, without the lock; others read it under mu once !busy.
  std::vector<std::shared_ptr<Task>> posted;
  std::atomic<std::size_t> n_posted{0};  // posted.size(), readable without the lock
  // Worker threads started, and how many of them are completing works (running the futures'
  // callbacks, which may wait for later operations): see KoloBackend::worker_loop.
  int workers = 0;
  int in_callbacks = 0;
  // Works finished by the owner, to complete after it released the communicator: one at a time
  // by whichever worker is free (the one that finished them, unless it is held in a callback).
  std::deque<std::pair<std::shared_ptr<Task>, std::exception_ptr>> completions;
  bool stopping = false;
  bool aborting = false;
  std::string stop_reason;
  // KoloBackend::refuse_now, for a collective's body that failed before kolo saw the call
  // (refuse_unseen); called by the thread that owns the communicator.
  std::function<void(const std::string&)> refuse;
  // The backend's record of a collective's failure (getError, the abort hooks).
  std::function<void(const std::exception&)> failed;

  // Under mu: takes the communicator for a caller's thread when nothing runs, nothing is
  // posted or being completed and the group is not stopping (the caller checks that nothing is
  // queued before).
  bool claim_locked() {
    // Nor while a work is being completed: an operation a caller runs itself must not be done
    // before one issued earlier (callbacks that issue work get a worker instead).
    if (stopping || busy || !posted.empty() || in_callbacks != 0 || !completions.empty()) {
      return false;
    }
    busy = true;
    return true;
  }
  // Gives the communicator back; wakes the worker (or stop()) only when one of them waits for
  // it: waking an idle worker after every synchronous call would cost a context switch each.
  void release() {
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      busy = false;
      wake = stopping || !queue.empty();
    }
    if (wake) cv.notify_all();
  }
};

namespace {

// A collective's body threw `e`. A kolo error was kolo's own (the communicator has already told
// the peers, or failed with them); anything else happened before the body's kolo call, which the
// peers are making or about to: refuse it, so that theirs fails too instead of waiting.
void refuse_unseen(Sched& s, const Task& t, const std::exception& e) {
  if (!t.here_ok || dynamic_cast<const kolo::Error*>(&e) != nullptr || !s.refuse) return;
  s.refuse(error_text(e));
}

// A task whose body (and poll) finished, or failed with `e`: runs its copy-back by the thread
// that owns the communicator, and returns its outcome for KoloWork::complete, called after
// the communicator is released.
std::exception_ptr finish_task(Task& t, std::exception_ptr e) {
  if (!e && t.after) {
    try {
      t.after();
    } catch (const std::exception& x) {
      e = wrap(x);
    }
  }
  t.after = nullptr;
  return e;
}

// Runs a collective task on the calling thread, which owns the communicator (Sched::busy),
// copies the results back, releases the communicator, then completes the work: the future's
// callbacks run on this thread without holding it (a callback may issue the next operation).
void run_here(Sched& s, Task& t) {
  // The caller may hold the GIL (a binding that keeps it): other Python threads run meanwhile.
  std::optional<pybind11::gil_scoped_release> no_gil;
  if (Py_IsInitialized() != 0 && PyGILState_Check() != 0) no_gil.emplace();
  std::exception_ptr err;
  try {
    t.body(t);
  } catch (const std::exception& e) {
    refuse_unseen(s, t, e);
    if (s.failed) s.failed(e);
    err = wrap(e);
  }
  try {
    if (!err && t.after) t.after();
  } catch (const std::exception& e) {
    err = wrap(e);
  }
  t.after = nullptr;
  s.release();
  t.work->complete(err);
}

}  // namespace

bool KoloWork::wait(std::chrono::milliseconds timeout) {
  if (timeout == ::kNoTimeout && !done_.load(std::memory_order_acquire)) {
    // Next in line and not started: run it here rather than wait for the worker to.
    if (auto s = sched_.lock()) {
      std::shared_ptr<Task> mine;
      {
        std::lock_guard<std::mutex> lock(s->mu);
        if (!s->queue.empty() && s->queue.front()->work.get() == this &&
            s->queue.front()->here_ok && s->claim_locked()) {
          mine = std::move(s->queue.front());
          s->queue.pop_front();
          s->queued.fetch_sub(1, std::memory_order_relaxed);
        }
      }
      if (mine) run_here(*s, *mine);
    }
  }
  spin_until([this] { return done_.load(std::memory_order_acquire); });
  if (timeout != ::kNoTimeout) {
    // c10d's own timed wait raises a bare "Operation timed out!". The operation is not
    // cancelled, and cannot be on one rank alone: it keeps its place in the group's issue
    // order, which every rank must follow call for call (dropping it would pair this rank's
    // next call with the peers' current one). So the error says what happens next.
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, timeout, [this] { return completed_; })) {
      TORCH_CHECK(false, "kolo: ", c10d::opTypeToString(opType_), " on rank ", rank_,
                  " timed out after ", timeout.count(),
                  " ms in Work.wait(timeout); it was not cancelled: it still runs in the "
                  "group's order and writes into its output tensors when it completes "
                  "(is_completed() turns true, its future completes). Abort the process "
                  "group to stop it");
    }
  }
  return c10d::Work::wait(timeout);
}

namespace {
std::chrono::milliseconds effective_timeout(std::chrono::milliseconds torch_timeout) {
  if (kolo::config::is_set(kolo::process_env(), kolo::config::vars::timeout_seconds)) {
    return std::chrono::milliseconds(0);  // kolo's own knob wins (read by Topology::for_rank)
  }
  return torch_timeout;
}

// torch's asyncOp (torch >= 2.7): false for a call whose caller waits at once.
template <class O>
bool is_sync(const O& opts) {
  if constexpr (requires { opts.asyncOp; }) {
    return !opts.asyncOp;
  } else {
    return false;
  }
}
}  // namespace

// ---- CUDA tensors on kolo's NCCL transport (a build with KOLO_TORCH_CUDA) ----

#ifdef KOLO_TORCH_CUDA
// The group's Communicator<NcclTransport>, created on the first CUDA operation (by the worker or
// a caller that owns the communicator, on every rank at the same point of the issue order: a
// collective) on the device of that operation's tensor, through the group's store under keys
// of its own. Ranks that never touch a CUDA tensor never create it, so CPU-only jobs on GPU
// machines pay nothing and need no GPU each.
class CudaPath {
 public:
  using Nccl = kolo::Communicator<kolo::NcclTransport>;

  CudaPath(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
           std::chrono::milliseconds timeout)
      : store_(std::move(store)), rank_(rank), size_(size), timeout_(timeout) {}

  Nccl& comm(int device) {
    if (comm_) {
      if (device != device_) {
        fail("CUDA tensors of one process group must be on one device: cuda:" +
             std::to_string(device_) +
             " was used first, this one is on cuda:" + std::to_string(device));
      }
      return *comm_;
    }
    if (!error_.empty()) fail(error_);
    try {
      kolo::Topology topo = kolo::Topology::for_rank(rank_, size_);
      if (const auto t = effective_timeout(timeout_); t.count() > 0) {
        topo.timeout_seconds = static_cast<double>(t.count()) / 1000.0;
      }
      // The transport's options read before the rendezvous, as the Communicator does (a bad
      // value fails every rank), and handed to it: the Communicator bootstraps, connects and
      // sets up its selection (routes, host groups, the tuning probe) as for host tensors.
      kolo::NcclTransport::Options topts =
          kolo::NcclTransport::Options::from_env(kolo::process_env());
      topts.cuda.device = device;  // the tensor's device, whatever KOLO_CUDA_DEVICE says
      comm_ = std::make_unique<Nccl>(std::move(topo), std::make_shared<C10dKvStore>(store_),
                                     store_prefix("kolo-nccl/"), topts);
      device_ = device;
      live_.store(comm_.get(), std::memory_order_release);
    } catch (const std::exception& e) {
      error_ = std::string("the NCCL communicator for CUDA tensors could not be created (rank ") +
               std::to_string(rank_) + " of " + std::to_string(size_) +
               ", cuda:" + std::to_string(device) + "): " + e.what() +
               " (KOLO_NCCL=0 stages CUDA tensors through host memory instead)";
      comm_.reset();
      fail(error_);
    }
    return *comm_;
  }

  // Refuses the NCCL communicator's next collective call (KoloBackend::refuse_now), when it
  // exists. By the thread that owns the communicators.
  void refuse(const kolo::Error& e) {
    if (comm_) comm_->refuse(e);
  }

  // Thread-safe: fails the operation running on the NCCL communicator (abort()).
  void interrupt(const std::string& why) {
    if (Nccl* c = live_.load(std::memory_order_acquire)) c->transport().interrupt(why);
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<Nccl> comm_;
  std::atomic<Nccl*> live_{nullptr};
  int device_ = -1;
  std::string error_;
};

namespace {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    fail(std::string("CUDA error in ") + what + ": " + cudaGetErrorName(e) + ": " +
         cudaGetErrorString(e));
  }
}

// The point of the caller's current stream (on the tensor's device) at which the operation was
// issued: kolo's stream waits for it, so the collective reads what the caller's kernels wrote.
class ReadyEvent {
 public:
  explicit ReadyEvent(const at::Tensor& t) : device_(t.get_device()) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    cuda_check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
    cuda_check(cudaEventRecord(event_, c10::cuda::getCurrentCUDAStream(device_).stream()),
               "cudaEventRecord (the caller's stream)");
  }
  ReadyEvent(const ReadyEvent&) = delete;
  ReadyEvent& operator=(const ReadyEvent&) = delete;
  ~ReadyEvent() {
    if (event_ != nullptr) (void)cudaEventDestroy(event_);
  }
  int device() const { return device_; }
  // Makes kolo's stream wait for the caller's work (no host wait).
  void block(cudaStream_t kolo_stream) const {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
    cuda_check(cudaStreamWaitEvent(kolo_stream, event_, 0), "cudaStreamWaitEvent");
  }

 private:
  int device_;
  cudaEvent_t event_ = nullptr;
};

kolo::TensorView device_view(const at::Tensor& t, const char* op) {
  return kolo::TensorView(t.data_ptr(), static_cast<std::size_t>(t.numel()), dtype_for(t, op),
                          kolo::Device::cuda(t.get_device()));
}

}  // namespace
#else
class CudaPath {};
#endif

bool KoloBackend::built_with_cuda() {
#ifdef KOLO_TORCH_CUDA
  return true;
#else
  return false;
#endif
}

bool KoloBackend::on_nccl(const at::Tensor& t) const {
#ifdef KOLO_TORCH_CUDA
  return t.defined() && t.is_cuda() && t.is_contiguous() && !t.is_sparse() && cuda_ != nullptr;
#else
  (void)t;
  return false;
#endif
}

// ---- the backend ----

KoloBackend::KoloBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                         std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size),
      timeout_(timeout),
      options_(c10::make_intrusive<Options>("kolo", timeout)),
      sched_(std::make_shared<Sched>()) {
  try {
    spin_budget();  // KOLO_TORCH_SPIN_US is checked here, on every rank alike
    kolo::Topology topo = kolo::Topology::for_rank(rank, size);
    if (const auto t = effective_timeout(timeout); t.count() > 0) {
      topo.timeout_seconds = static_cast<double>(t.count()) / 1000.0;
    }
    kv_ = std::make_shared<C10dKvStore>(store);
    handle_ = reconfigure_handle();
    comm_ = std::make_unique<Comm>(std::move(topo), kv_, store_prefix("kolo/"));
  } catch (const std::exception& e) {
    fail(std::string("could not start the process group (rank ") + std::to_string(rank) + " of " +
         std::to_string(size) + "): " + e.what());
  }
#ifdef KOLO_TORCH_CUDA
  cuda_ = std::make_unique<CudaPath>(store, rank, size, timeout);
#endif
  sched_->refuse = [this](const std::string& why) { refuse_now(why); };
  sched_->failed = [this](const std::exception& e) { note_failure(e); };
  std::lock_guard<std::mutex> lock(sched_->mu);
  add_worker_locked();
}

KoloBackend::KoloBackend(std::unique_ptr<Comm> comm, std::chrono::milliseconds timeout,
                         std::shared_ptr<kolo::KvStore> store)
    : c10d::Backend(comm->rank(), comm->size()),
      comm_(std::move(comm)),
      kv_(std::move(store)),
      handle_(reconfigure_handle()),
      timeout_(timeout),
      options_(c10::make_intrusive<Options>("kolo", timeout)),
      sched_(std::make_shared<Sched>()) {
  sched_->refuse = [this](const std::string& why) { refuse_now(why); };
  sched_->failed = [this](const std::exception& e) { note_failure(e); };
  std::lock_guard<std::mutex> lock(sched_->mu);
  add_worker_locked();
}

c10::intrusive_ptr<c10d::Backend> KoloBackend::shrink(const std::vector<int64_t>& ranks_to_exclude,
                                                      int shrink_flags,
                                                      const c10::intrusive_ptr<Options>& opts) {
  (void)shrink_flags;  // kolo always revokes first (SHRINK_ABORT's meaning)
  std::vector<int> excluded;
  for (const auto r : ranks_to_exclude) excluded.push_back(static_cast<int>(r));
  std::sort(excluded.begin(), excluded.end());
  const std::chrono::milliseconds timeout = opts ? opts->timeout : timeout_;
  std::unique_ptr<Comm> next;
  {
    // No GIL to release: torch's binding of Backend.shrink runs without it.
    quiesce(true, "the process group is being shrunk (torch.distributed.shrink_group)");
    if (!comm_) fail("shrink: this process group has been shut down");
    kolo::ShrinkOptions so;
    if (opts) so.timeout_seconds = static_cast<double>(timeout.count()) / 1000.0;
    try {
      next = std::make_unique<Comm>(comm_->shrink(excluded, so));
    } catch (const std::exception& e) {
      fail(std::string("shrink_group: ") + e.what());
    }
  }
  const std::vector<int>& agreed = next->lineage().excluded;
  if (agreed != excluded) {
    auto text = [](const std::vector<int>& v) {
      std::string t = "[";
      for (int r : v) t += (t.size() > 1 ? ", " : "") + std::to_string(r);
      return t + "]";
    };
    fail("shrink_group(" + text(excluded) + "): the surviving ranks agree that " + text(agreed) +
         " are gone; torch numbers the new group from the list it is given, so call "
         "dist.shrink_group(" +
         text(agreed) + ") (kolo_torch.lost_ranks() is this rank's view)");
  }
  return c10::make_intrusive<KoloBackend>(std::move(next), timeout, kv_);
}

std::vector<int> KoloBackend::lost_ranks() {
  std::lock_guard<std::mutex> lock(sched_->mu);
  if (!comm_) return {};
  return comm_->lost_ranks();
}

#ifdef C10D_BACKEND_HAS_RECONFIGURE
c10::intrusive_ptr<c10d::Work> KoloBackend::reconfigure(const c10d::ReconfigureOptions& opts) {
  std::vector<std::string> handles;
  if (const auto* v = std::get_if<std::vector<c10d::ReconfigureHandle>>(&opts.handles)) {
    handles = *v;
  } else {
    const auto& set = std::get<std::unordered_set<c10d::ReconfigureHandle>>(opts.handles);
    handles.assign(set.begin(), set.end());
    std::sort(handles.begin(), handles.end());
  }
  const std::string what = "reconfigure(uuid=" + std::to_string(opts.uuid) + ")";
  if (handles.empty()) fail(what + ": no handles given");
  std::vector<std::string> sorted = handles;
  std::sort(sorted.begin(), sorted.end());
  if (const auto d = std::adjacent_find(sorted.begin(), sorted.end()); d != sorted.end()) {
    fail(what + ": handle " + *d + " is given twice");
  }
  const auto mine = std::find(handles.begin(), handles.end(), handle_);
  if (mine == handles.end()) {
    fail(what + ": this process's handle " + handle_ + " is not among the " +
         std::to_string(handles.size()) + " handles given");
  }
  if (!kv_) fail(what + ": this process group has no rendezvous store to build through");
  if (uuids_.count(opts.uuid) != 0) {
    fail(what + ": this uuid was used before on this process group; pass a fresh one");
  }
  uuids_.insert(opts.uuid);
  const int rank = static_cast<int>(mine - handles.begin());
  const int size = static_cast<int>(handles.size());
  const std::chrono::milliseconds timeout =
      opts.timeout ? std::chrono::duration_cast<std::chrono::milliseconds>(*opts.timeout)
                   : timeout_;
  std::unique_ptr<Comm> next;
  {
    // The rendezvous waits for the other members: other Python threads run meanwhile.
    std::optional<pybind11::gil_scoped_release> no_gil;
    if (PyGILState_Check()) no_gil.emplace();
    quiesce(true, "the process group is being reconfigured (torch.distributed._reconfigure)");
    std::vector<std::shared_ptr<Task>> stale;
    {
      std::lock_guard<std::mutex> lock(sched_->mu);
      stale.swap(sched_->posted);
      sched_->n_posted.store(0);
      for (auto& [task, err] : sched_->completions) stale.push_back(task);
      sched_->completions.clear();
    }
    const auto err = std::make_exception_ptr(
        std::runtime_error("kolo: the process group was reconfigured before this completed"));
    for (auto& t : stale) t->work->complete(err);
    try {
      kolo::Topology topo = kolo::Topology::for_rank(rank, size);
      if (const auto t = effective_timeout(timeout); t.count() > 0) {
        topo.timeout_seconds = static_cast<double>(t.count()) / 1000.0;
      }
      next = std::make_unique<Comm>(std::move(topo), kv_,
                                    store_prefix("kolo/reconf/" + std::to_string(opts.uuid) + "/"));
    } catch (const std::exception& e) {
      fail(what + " (rank " + std::to_string(rank) + " of " + std::to_string(size) +
           "): " + e.what());
    }
  }
  comm_ = std::move(next);
#ifdef KOLO_TORCH_CUDA
  cuda_.reset();  // CUDA tensors are staged through host memory after a reconfigure
#endif
  rank_ = rank;
  size_ = size;
  error_type_.store(0);
  {
    std::lock_guard<std::mutex> lock(hooks_mu_);
    hooks_ran_ = false;
  }
  auto work = c10::make_intrusive<KoloWork>(rank_, c10d::OpType::UNKNOWN, "kolo:reconfigure",
                                            std::vector<at::Tensor>{}, sched_);
  {
    std::lock_guard<std::mutex> lock(sched_->mu);
    sched_->stopping = false;
    sched_->aborting = false;
    sched_->stop_reason.clear();
    add_worker_locked();
  }
  work->complete(nullptr);
  return work;
}
#endif

KoloBackend::~KoloBackend() {
  stop(false, "the process group was destroyed");
}

c10::intrusive_ptr<c10d::Backend> KoloBackend::create(const c10::intrusive_ptr<c10d::Store>& store,
                                                      int rank, int size,
                                                      std::chrono::duration<float> timeout) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(timeout);
  // The rendezvous may wait for other ranks: let other Python threads run meanwhile.
  pybind11::gil_scoped_release no_gil;
  return c10::make_intrusive<KoloBackend>(store, rank, size, ms);
}

c10::intrusive_ptr<c10d::Work> KoloBackend::enqueue(c10d::OpType op, const char* title,
                                                    std::vector<at::Tensor> outputs,
                                                    std::function<void(Task&)> body, bool sync) {
  Sched& s = *sched_;
  auto task = std::make_shared<Task>();
  task->work = c10::make_intrusive<KoloWork>(rank_, op, title, std::move(outputs), sched_);
  task->body = std::move(body);
  task->here_ok = op != c10d::OpType::SEND && op != c10d::OpType::RECV;
  bool here = false;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.stopping) fail(std::string(title) + ": " + s.stop_reason);
    issued_.fetch_add(1, std::memory_order_relaxed);
    // A synchronous call with nothing before it: run it on this thread (its caller waits anyway).
    if (sync && task->here_ok && s.queue.empty() && s.claim_locked()) {
      here = true;
    } else {
      s.queue.push_back(task);
      s.queued.fetch_add(1, std::memory_order_release);
      // Every worker is inside a callback (which may be waiting for this very task).
      if (s.in_callbacks == s.workers) add_worker_locked();
    }
  }
  if (here) {
    run_here(s, *task);
  } else {
    s.cv.notify_one();
  }
  return task->work;
}

// Callbacks never deadlock. A worker completes the works it finished (KoloWork::complete runs
// their futures' `then` callbacks inline) only after it has released the communicator, one at
// a time from Sched::completions, and while it does it counts as in a callback: a callback may
// issue a collective and wait for it (PowerSGD's hook waits on a future), or wait for another
// work finished with its own, and when a task is queued, a request is in flight or a work
// waits to be completed while every worker is in a callback, another worker thread starts
// (add_worker_locked) and takes over. One thread at a time still owns the communicator
// (Sched::busy) and tasks leave the queue in issue order, so the order holds with any number of
// workers. The second thread starts only when a callback of the group issues work, and stays for
// the group's life (the one after it likewise, for a callback in a callback, ...). The other way
// considered, a completion thread that runs every future's callbacks, costs a hand-off per
// asynchronous operation and still deadlocks when a callback waits for an operation whose own
// completion is queued behind it on that thread.
void KoloBackend::add_worker_locked() {
  ++sched_->workers;
  threads_.emplace_back([this] { worker_loop(); });
}

void KoloBackend::worker_loop() {
  Sched& s = *sched_;
  std::vector<std::pair<std::shared_ptr<Task>, std::exception_ptr>> done;
  // Completes the pending works one at a time, counted in in_callbacks (without the lock).
  auto complete_pending = [&] {
    for (;;) {
      std::pair<std::shared_ptr<Task>, std::exception_ptr> c;
      bool wake = false;
      {
        std::lock_guard<std::mutex> lock(s.mu);
        if (s.completions.empty()) return;
        c = std::move(s.completions.front());
        s.completions.pop_front();
        ++s.in_callbacks;
        // Its callbacks may wait for what is pending: a worker must be free to do that.
        const bool pending = !s.queue.empty() || !s.completions.empty() ||
                             s.n_posted.load(std::memory_order_relaxed) != 0;
        if (pending && s.in_callbacks == s.workers) {
          add_worker_locked();
        } else {
          wake = !s.completions.empty();  // a free worker completes the next meanwhile
        }
      }
      if (wake) s.cv.notify_all();
      c.first->work->complete(c.second);
      std::lock_guard<std::mutex> lock(s.mu);
      --s.in_callbacks;
    }
  };
  for (;;) {
    std::shared_ptr<Task> task;
    std::vector<std::shared_ptr<Task>> aborted;
    if (s.n_posted.load(std::memory_order_acquire) == 0) {
      spin_until([&s] { return s.queued.load(std::memory_order_acquire) > 0; });
    }
    {
      std::unique_lock<std::mutex> lock(s.mu);
      auto ready = [&] {
        return !s.completions.empty() || (!s.busy && (s.stopping || !s.queue.empty()));
      };
      // (s.posted itself only once !busy: its owner changes it without the lock)
      if (s.n_posted.load(std::memory_order_relaxed) == 0) {
        s.cv.wait(lock, ready);
      } else {
        // Requests in flight progress in the transport; look at them again shortly (a
        // blocking sleep, not a spin: ranks may outnumber cores).
        s.cv.wait_for(lock, std::chrono::microseconds(100), ready);
      }
      if (!s.completions.empty()) {
        lock.unlock();
        complete_pending();
        continue;
      }
      if (s.busy) continue;  // another worker or a caller owns the communicator
      if (!s.queue.empty()) {
        task = std::move(s.queue.front());
        s.queue.pop_front();
        s.queued.fetch_sub(1, std::memory_order_relaxed);
      } else if (s.stopping && (s.posted.empty() || s.aborting)) {
        if (s.posted.empty()) {
          --s.workers;
          return;
        }
        aborted.swap(s.posted);
        s.n_posted.store(0, std::memory_order_relaxed);
      }
      s.busy = true;
    }
    if (!aborted.empty()) {
      const auto err = std::make_exception_ptr(std::runtime_error("kolo: " + s.stop_reason));
      for (auto& t : aborted) done.emplace_back(std::move(t), err);
    }
    if (task) {
      std::exception_ptr err;
      try {
        task->body(*task);
      } catch (const std::exception& e) {
        refuse_unseen(s, *task, e);
        note_failure(e);
        err = wrap(e);
      }
      if (task->poll && !err) {
        s.posted.push_back(task);  // (this thread owns the communicator: busy)
      } else {
        done.emplace_back(task, finish_task(*task, err));
      }
    }
    for (auto it = s.posted.begin(); it != s.posted.end();) {
      bool finished = false;
      std::exception_ptr err;
      try {
        finished = (*it)->poll();
      } catch (const std::exception& e) {
        finished = true;
        note_failure(e);
        err = wrap(e);
      }
      if (finished) {
        done.emplace_back(*it, finish_task(**it, err));
        it = s.posted.erase(it);
      } else {
        ++it;
      }
    }
    bool wake = false;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      s.busy = false;
      s.n_posted.store(s.posted.size(), std::memory_order_relaxed);
      wake = s.stopping || !s.queue.empty();
      for (auto& d : done) s.completions.push_back(std::move(d));
      done.clear();
    }
    if (wake) s.cv.notify_all();  // another worker, or stop(), waits for the communicator
    complete_pending();
  }
}

void KoloBackend::stop(bool abort_now, const std::string& why) {
  quiesce(abort_now, why);
#ifdef KOLO_TORCH_CUDA
  cuda_.reset();
#endif
  comm_.reset();
}

void KoloBackend::quiesce(bool abort_now, const std::string& why) {
  Sched& s = *sched_;
  std::deque<std::shared_ptr<Task>> dropped;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.stopping) {
      s.stopping = true;
      s.stop_reason = why;
    }
    if (abort_now) {
      s.aborting = true;
      dropped.swap(s.queue);
      s.queued.store(0);
    }
  }
  s.cv.notify_all();
  const auto err = std::make_exception_ptr(std::runtime_error("kolo: " + why));
  for (auto& t : dropped) t->work->complete(err);
  if (abort_now) {
    // The operation running now (on the worker or a caller's thread) fails at its next look at
    // the transport; kolo's abort then tells the peers, whose operations fail too.
    const std::string reason = "rank " + std::to_string(rank_) + ": " + why;
    if (comm_) comm_->transport().interrupt(reason);
#ifdef KOLO_TORCH_CUDA
    if (cuda_) cuda_->interrupt(reason);
#endif
  }
  for (;;) {
    // A worker that is in a callback may start another before it returns: join until none.
    std::vector<std::thread> workers;
    {
      std::lock_guard<std::mutex> lock(s.mu);
      workers.swap(threads_);
    }
    if (workers.empty()) break;
    for (auto& t : workers) t.join();
  }
  {
    // A caller's thread may still own the communicator.
    std::unique_lock<std::mutex> lock(s.mu);
    s.cv.wait(lock, [&s] { return !s.busy; });
  }
}

void KoloBackend::abort() {
  run_abort_hooks();
  stop(true, "the process group was aborted");
}

void KoloBackend::note_failure(const std::exception& e) {
  const auto* k = dynamic_cast<const kolo::Error*>(&e);
  if (k == nullptr || k->kind() == kolo::ErrorKind::config) return;  // refused arguments
  const std::string what = e.what();
  const c10d::ErrorType type = k->kind() == kolo::ErrorKind::timeout ? c10d::ErrorType::TIMEOUT
                               : what.find("[reported by rank") != std::string::npos
                                   ? c10d::ErrorType::REMOTE_ERROR
                                   : c10d::ErrorType::COMM_ERROR;
  int none = 0;
  if (error_type_.compare_exchange_strong(none, static_cast<int>(type))) run_abort_hooks();
}

void KoloBackend::run_abort_hooks() {
  std::map<int64_t, std::function<void()>> hooks;
  {
    std::lock_guard<std::mutex> lock(hooks_mu_);
    if (hooks_ran_) return;
    hooks_ran_ = true;
    hooks = abort_hooks_;
  }
  for (auto& [id, hook] : hooks) {
    try {
      hook();
    } catch (const std::exception& e) {
      TORCH_WARN("kolo: abort hook ", id, " raised: ", e.what());
    } catch (...) {
      TORCH_WARN("kolo: abort hook ", id, " raised");
    }
  }
}

c10d::ErrorType KoloBackend::getError() {
  return static_cast<c10d::ErrorType>(error_type_.load());
}

void KoloBackend::registerAbortHook(int64_t hook_id, std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(hooks_mu_);
  abort_hooks_[hook_id] = std::move(hook);
}

void KoloBackend::unregisterAbortHook(int64_t hook_id) {
  std::lock_guard<std::mutex> lock(hooks_mu_);
  abort_hooks_.erase(hook_id);
}
void KoloBackend::shutdown() {
  stop(false, "the process group was shut down");
}

// ---- refused calls ----

template <class F>
c10::intrusive_ptr<c10d::Work> KoloBackend::checked(F&& issue) {
  try {
    return issue();
  } catch (const std::exception& e) {
    refuse_in_order(e);
    throw;
  }
}

void KoloBackend::refuse_in_order(const std::exception& e) {
  try {
    // Synchronous: run on this thread when nothing is queued or running (the caller raises
    // next, so nothing is gained by handing it to the worker), else queued behind the rest.
    enqueue(
        c10d::OpType::UNKNOWN, "kolo:refused", {},
        [this, why = error_text(e)](Task& /*task*/) { refuse_now(why); }, /*sync=*/true);
  } catch (const std::exception&) {
    // The group is stopping (enqueue refused the task): every later call on it fails anyway.
  }
}

void KoloBackend::refuse_now(const std::string& why) {
  const kolo::ConfigError e(why);
  if (comm_) comm_->refuse(e);
#ifdef KOLO_TORCH_CUDA
  if (cuda_) cuda_->refuse(e);
#endif
}

// ---- collectives ----

c10::intrusive_ptr<c10d::Work> KoloBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                      const c10d::AllreduceOptions& opts) {
  return checked([&]() -> c10::intrusive_ptr<c10d::Work> {
    check_single(tensors, "allreduce");
    const at::Tensor& t = tensors[0];
    const kolo::ReduceOp op = reduce_op(opts.reduceOp, t.scalar_type(), "allreduce");
    const auto factor = premul_factor(opts.reduceOp);
#ifdef KOLO_TORCH_CUDA
    if (on_nccl(t)) {
      dtype_for(t, "allreduce");
      if (factor) t.mul_(*factor);  // on the caller's stream, before the ready point
      auto ready = std::make_shared<ReadyEvent>(t);
      return enqueue(
          c10d::OpType::ALLREDUCE, "kolo:all_reduce", tensors,
          [this, t, ready, op](Task& /*task*/) {
            auto& c = cuda_->comm(ready->device());
            ready->block(c.transport().stream());
            c.allreduce(device_view(t, "allreduce"), op);
          },
          is_sync(opts));
    }
#endif
    auto s = std::make_shared<Staged>(stage(t, "allreduce"));
    return enqueue(
        c10d::OpType::ALLREDUCE, "kolo:all_reduce", tensors,
        [this, s, op, factor](Task& task) {
          if (factor) s->host.mul_(*factor);
          comm_->allreduce(s->view("allreduce"), op);
          task.after = [s] { s->write_back(); };
        },
        is_sync(opts));
  });
}

c10::intrusive_ptr<c10d::Work> KoloBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  return checked([&]() -> c10::intrusive_ptr<c10d::Work> {
    if (tensors.empty()) fail("allreduce_coalesced: no tensors");
    const at::ScalarType st = tensors[0].scalar_type();
    check_same_dtype(tensors, st, "allreduce_coalesced");
    const kolo::ReduceOp op = reduce_op(opts.reduceOp, st, "allreduce_coalesced");
    const auto factor = premul_factor(opts.reduceOp);
    // In place on each tensor's host memory (the tensor itself when it is a contiguous CPU
    // tensor): kolo's coalesced allreduce reads and writes them where they lie, with no flat copy
    // in and out. The same tensor twice in the list would overlap itself: then through a flat copy.
    auto staged = std::make_shared<std::vector<Staged>>();
    bool distinct = true;
    std::vector<const void*> seen;
    for (const auto& t : tensors) {
      staged->push_back(stage(t, "allreduce_coalesced"));
      const void* p = staged->back().host.data_ptr();
      if (staged->back().host.numel() > 0) {
        distinct = distinct && std::find(seen.begin(), seen.end(), p) == seen.end();
        seen.push_back(p);
      }
    }
    if (!distinct) {
      std::vector<at::Tensor> host;
      for (const Staged& s : *staged) host.push_back(s.host);
      auto flat = std::make_shared<at::Tensor>(gather_flat(host, tensors[0]));
      auto outs = std::make_shared<std::vector<at::Tensor>>(tensors);
      return enqueue(
          c10d::OpType::ALLREDUCE_COALESCED, "kolo:all_reduce_coalesced", tensors,
          [this, flat, outs, op, factor](Task& task) {
            if (factor) flat->mul_(*factor);
            comm_->allreduce(view_of(*flat, "allreduce_coalesced"), op);
            task.after = [flat, outs] { scatter_flat(*flat, *outs); };
          },
          is_sync(opts));
    }
    return enqueue(
        c10d::OpType::ALLREDUCE_COALESCED, "kolo:all_reduce_coalesced", tensors,
        [this, staged, op, factor](Task& task) {
          std::vector<kolo::TensorView> views;
          views.reserve(staged->size());
          for (Staged& s : *staged) {
            if (factor) s.host.mul_(*factor);
            views.push_back(s.view("allreduce_coalesced"));
          }
          comm_->allreduce_coalesced(views, views, op);
          task.after = [staged] {
            for (const Staged& s : *staged) s.write_back();
          };
        },
        is_sync(opts));
  });
}

c10::intrusive_ptr<c10d::Work> KoloBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                      const c10d::BroadcastOptions& opts) {
  return checked([&]() -> c10::intrusive_ptr<c10d::Work> {
    check_single(tensors, "broadcast");
    check_root(static_cast<int>(opts.rootRank), size_, "broadcast");
    if (opts.rootTensor != 0) fail("broadcast: rootTensor must be 0");
    const int root = static_cast<int>(opts.rootRank);
#ifdef KOLO_TORCH_CUDA
    if (on_nccl(tensors[0])) {
      const at::Tensor t = tensors[0];
      dtype_for(t, "broadcast");
      auto ready = std::make_shared<ReadyEvent>(t);
      return enqueue(
          c10d::OpType::BROADCAST, "kolo:broadcast", tensors,
          [this, t, ready, root](Task& /*task*/) {
            auto& c = cuda_->comm(ready->device());
            ready->block(c.transport().stream());
            c.broadcast(device_view(t, "broadcast"), root);
          },
          is_sync(opts));
    }
#endif
    auto s = std::make_shared<Staged>(stage(tensors[0], "broadcast", rank_ == root));
    return enqueue(
        c10d::OpType::BROADCAST, "kolo:broadcast", tensors,
        [this, s, root](Task& task) {
          comm_->broadcast(s->view("broadcast"), root);
          task.after = [s] { s->write_back(); };
        },
        is_sync(opts));
  });
}

c10::intrusive_ptr<c10d::Work> KoloBackend::reduce(std::vector<at::Tensor>& tensors,
                                                   const c10d::ReduceOptions& opts) {
  return checked([&]() -> c10::intrusive_ptr<c10d::Work> {
    check_single(tensors, "reduce");
    const int root = static_cast<int>(opts.rootRank);
    check_root(root, size_, "reduce");
    const at::Tensor& t = tensors[0];
    const kolo::ReduceOp op = reduce_op(opts.reduceOp, t.scalar_type(), "reduce");
    const auto factor = premul_factor(opts.reduceOp);
    auto s = std::make_shared<Staged>(stage(t, "reduce"));
    return enqueue(
        c10d::OpType::REDUCE, "kolo:reduce", tensors,
        [this, s, op, root, factor](Task& task) {
          if (factor) s->host.mul_(*factor);
          const kolo::TensorView v = s->view("reduce");
          comm_->reduce(v, v, op, root);
          if (rank_ == root) task.after = [s] { s->write_back(); };
        },
        is_sync(opts));
  });
}

c10::intrusive_ptr<c10d::Work> KoloBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllgatherOptions& opts) {
  return checked([&]() -> c10::intrusive_ptr<c10d::Work> {
    check_single(inputs, "allgather");
    if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != size_) {
      fail("allgather: expects one output list of " + std::to_string(size_) + " tensors");
    }
    const at::Tensor& in = inputs[0];
    check_same_dtype(outputs[0], in.scalar_type(), "allgather");
    auto s = std::make_shared<Staged>(stage(in, "allgather"));
    auto outs = std::make_shared<std::vector<at::Tensor>>(outputs[0]);
    std::vector<std::size_t> counts;
    bool uniform = true;
    for (const auto& o : *outs) {
      counts.push_back(static_cast<std::size_t>(o.numel()));
      uniform = uniform && o.numel() == in.numel();
    }
    if (counts[static_cast<std::size_t>(rank_)] != static_cast<std::size_t>(in.numel())) {
      fail("allgather: output tensor " + std::to_string(rank_) + " has " +
           std::to_string(counts[static_cast<std::size_t>(rank_)]) +
           " elements but this rank's input has " + std::to_string(in.numel()));
    }
    return enqueue(
        c10d::OpType::ALLGATHER, "kolo:all_gather", outputs[0],
        [this, s, outs, counts, uniform](Task& task) {
          auto flat = std::make_shared<at::Tensor>(flat_like(*outs, s->host));
          if (uniform) {
            comm_->allgather(s->view("allgather"), view_of(*flat, "allgather"));
          } else {
            comm_->allgatherv(s->view("allgather"), view_of(*flat, "allgather"), counts);
          }
          task.after = [flat, outs] { scatter_flat(*flat, *outs); };
        },
        is_sync(opts));
  });
}

c10::intrusive_ptr<c10d::Work> KoloBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                            const c10d::AllgatherOptions& opts) {
  return all_gather_single(output, input, opts);
}

c10::intrusive_ptr<c10d::Work> KoloBackend::all_gather_single(at::Tensor& output, at::Tensor& input,
                                                              const c10d::AllgatherOptions& opts) {
  return checked([&]() -> c10::intrusive_ptr<c10d::Work> {
    if (output.scalar_type() != input.scalar_type()) {
      fail("all_gather_into_tensor: output and input dtypes differ");
    }
    if (output.numel() != input.numel() * size_) {
      fail("all_gather_into_tensor: output has " + std::to_string(output.numel()) +
           " elements, expected world size x input = " + std::to_string(size_) + " x " +
           std::to_string(input.numel()));
    }
#ifdef KOLO_TORCH_CUDA
    if (on_nccl(input) && on_nccl(output) && input.get_device() == output.get_device()) {
      dtype_for(input, "all_gather_into_tensor");
      auto ready = std::make_shared<ReadyEvent>(output);
      return enqueue(
          c10d::OpType::_ALLGATHER_BASE, "kolo:all_gather_into_tensor", {output},
          [this, input, output, ready](Task& /*task*/) {
            auto& c = cuda_->comm(ready->device());
            ready->block(c.transport().stream());
            c.allgather(device_view(input, "all_gather_into_tensor"),
                        device_view(output, "all_gather_into_tensor"));
          },
          is_sync(opts));
    }
#endif
    auto in = std::make_shared<Staged>(stage(input, "all_gather_into_tensor"));
    auto out = std::make_shared<Staged>(stage(output, "all_gather_into_tensor", false));
    return enqueue(
        c10d::OpType::_ALLGATHER_BASE, "kolo:all_gather_into_tensor", {output},
        [this, in, out](Task& task) {
          comm_->allgather(in->view("all_gather_into_tensor"), out->view("all_gather_into_tensor"));
          task.after = [out] { out->write_back(); };
        },
        is_sync(opts));
  });
}

// outputs[q][i] receives rank q's inputs[i]: every input goes into one flat buffer, one
// allgather moves all of them, and the blocks are unpacked per rank and input.
c10::intrusive_ptr<c10d::Work> KoloBackend::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return checked([&]() -> c10::intrusive_ptr<c10d::Work> {
    if (inputs.empty()) fail("allgather_coalesced: no input tensors");
    if (static_cast<int>(outputs.size()) != size_) {
      fail("allgather_coalesced: " + std::to_string(outputs.size()) +
           " output lists for a world of " + std::to_string(size_) + " (one list per rank)");
    }
    const at::ScalarType st = inputs[0].scalar_type();
    check_same_dtype(inputs, st, "allgather_coalesced");
    std::vector<at::Tensor> host;
    std::vector<at::Tensor> all_outputs;
    for (const auto& t : inputs) host.push_back(stage(t, "allgather_coalesced").host);
    for (std::size_t q = 0; q < outputs.size(); ++q) {
      if (outputs[q].size() != inputs.size()) {
        fail("allgather_coalesced: output list " + std::to_string(q) + " has " +
             std::to_string(outputs[q].size()) + " tensors for " + std::to_string(inputs.size()) +
             " inputs");
      }
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        if (outputs[q][i].numel() != inputs[i].numel() || outputs[q][i].scalar_type() != st) {
          fail("allgather_coalesced: output [" + std::to_string(q) + "][" + std::to_string(i) +
               "] must match input " + std::to_string(i) + " in size and dtype");
        }
        all_outputs.push_back(outputs[q][i]);
      }
    }
    auto flat_in = std::make_shared<at::Tensor>(gather_flat(host, inputs[0]));
    auto outs = std::make_shared<std::vector<at::Tensor>>(all_outputs);
    return enqueue(
        c10d::OpType::ALLGATHER_COALESCED, "kolo:all_gather_coalesced", all_outputs,
        [this, flat_in, outs](Task& task) {
          auto flat_out = std::make_shared<at::Tensor>(
              at::empty({flat_in->numel() * size_}, flat_in->options()));
          comm_->allgather(view_of(*flat_in, "allgather_coalesced"),
                           view_of(*flat_out, "allgather_coalesced"));
          task.after = [flat_out, outs] { scatter_flat(*flat_out, *outs); };
        },
        is_sync(opts));
  });
}

c10::intrusive_ptr<c10d::Work> KoloBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return all_gather_single_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> KoloBackend::all_gather_single_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return checked([&]() -> c10::intrusive_ptr<c10d::Work> {
    if (outputs.size() != inputs.size()) fail("allgather_into_tensor_coalesced: count mismatch");
    std::vector<std::pair<std::shared_ptr<Staged>, std::shared_ptr<Staged>>> pairs;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (outputs[i].numel() != inputs[i].numel() * size_ ||
          outputs[i].scalar_type() != inputs[i].scalar_type()) {
        fail("allgather_into_tensor_coalesced: output " + std::to_string(i) +
             " must be world size x its input, same dtype");
      }
      pairs.emplace_back(
          std::make_shared<Staged>(stage(inputs[i], "allgather_into_tensor")),
          std::make_shared<Staged>(stage(outputs[i], "allgather_into_tensor", false)));
    }
    return enqueue(
        c10d::OpType::COALESCED, "kolo:all_gather_into_tensor_coalesced", outputs,
        [this, pairs](Task& task) {
          for (const auto& [in, out] : pairs) {
            comm_->allgather(in->view("allgather_into_tensor"), out->view("allgather_into_tensor"));
          }
          task.after = [pairs] {
            for (const auto& p : pairs) p.second->write_back();
          };
        },
        is_sync(opts));
  });
}

c10::intrusive_ptr<c10d::Work> KoloBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                   std::vector<at::Tensor>& inputs,
                                                   const c10d::GatherOptions& opts) {
  return checked([&]() -> c10::intrusive_ptr<c10d::Work> {
    check_single(inputs, "gather");
    const int root = static_cast<int>(opts.rootRank);
    check_root(root, size_, "gather");
    const at::Tensor& in = inputs[0];
    std::vector<at::Tensor> outs_list;
    if (rank_ == root) {
      if (outputs.size() != 1 || static_cast<int>(outputs[0].size()) != size_) {
        fail("gather: the root expects one output list of " + std::to_string(size_) + " tensors");
      }
      for (const auto& o : outputs[0]) {
        if (o.numel() != in.numel() || o.scalar_type() != in.scalar_type()) {
          fail("gather: every output tensor must match the input in size and dtype");
        }
      }
      outs_list = outputs[0];
    } else if (!outputs.empty() && !outputs[0].empty()) {
      fail("gather: only the root (rank " + std::to_string(root) + ") passes output tensors");
    }
    auto s = std::make_shared<Staged>(stage(in, "gather"));
    auto outs = std::make_shared<std::vector<at::Tensor>>(outs_list);
    return enqueue(
        c10d::OpType::GATHER, "kolo:gather", outs_list,
        [this, s, outs, root](Task& task) {
          if (rank_ == root) {
            auto flat = std::make_shared<at::Tensor>(flat_like(*outs, s->host));
            comm_->gather(s->view("gather"), view_of(*flat, "gather"), root);
            task.after = [flat, outs] { scatter_flat(*flat, *outs); };
          } else {
            comm_->gather(s->view("gather"), kolo::TensorView(), root);
          }
        },
        is_sync(opts));
  });
}

c10::intrusive_ptr<c10d::Work> KoloBackend::scatter(std::vector<at::Tensor>& outputs,
                                                    std::vector<std::vector<at::Tensor>>& inputs,
                                                    const c10d::ScatterOptions& opts) {
  return checked([&]() -> c10::intrusive_ptr<c10d::Work> {
    check_single(outputs, "scatter");
    const int root = static_cast<int>(opts.rootRank);
    check_root(root, size_, "scatter");
    const at::Tensor& out = outputs[0];
    std::shared_ptr<at::Tensor> flat;
    if (rank_ == root) {
      if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != size_) {
        fail("scatter: the root expects one input list of " + std::to_string(size_) + " tensors");
      }
      std::vector<at::Tensor> host;
      for (const auto& i : inputs[0]) {
        if (i.numel() != out.numel() || i.scalar_type() != out.scalar_type()) {
          fail("scatter: every input tensor must match the output in size and dtype");
        }
        host.push_back(stage(i, "scatter").host);
      }
      flat = std::make_shared<at::Tensor>(gather_flat(host, out));
    } else if (!inputs.empty() && !inputs[0].empty()) {
      fail("scatter: only the root (rank " + std::to_string(root) + ") passes input tensors");
    }
    auto s = std::make_shared<Staged>(stage(out, "scatter", false));
    return enqueue(
        c10d::OpType::SCATTER, "kolo:scatter", outputs,
        [this, s, flat, root](Task& task) {
          comm_->scatter(flat ? view_of(*flat, "scatter") : kolo::TensorView(), s->view("scatter"),
                         root);
          task.after = [s] { s->write_back(); };
        },
        is_sync(opts));
  });
}

c10::intrusive_ptr<c10d::Work> KoloBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return checked([&]() -> c10::intrusive_ptr<c10d::Work> {
    check_single(outputs, "reduce_scatter");
    const at::Tensor& out = outputs[0];
    if (inputs.size() != 1 || static_cast<int>(inputs[0].size()) != size_) {
      fail("reduce_scatter: expects one input list of " + std::to_string(size_) + " tensors");
    }
    std::vector<at::Tensor> host;
    for (const auto& i : inputs[0]) {
      if (i.numel() != out.numel() || i.scalar_type() != out.scalar_type()) {
        fail("reduce_scatter: every input tensor must match the output in size and dtype");
      }
      host.push_back(stage(i, "reduce_scatter").host);
    }
    const kolo::ReduceOp op = reduce_op(opts.reduceOp, out.scalar_type(), "reduce_scatter");
    const auto factor = premul_factor(opts.reduceOp);
    auto flat = std::make_shared<at::Tensor>(gather_flat(host, out));
    auto s = std::make_shared<Staged>(stage(out, "reduce_scatter", false));
    return enqueue(
        c10d::OpType::REDUCE_SCATTER, "kolo:reduce_scatter", outputs,
        [this, s, flat, op, factor](Task& task) {
          if (factor) flat->mul_(*factor);
          comm_->reduce_scatter(view_of(*flat, "reduce_scatter"), s->view("reduce_scatter"), op);
          task.after = [s] { s->write_back(); };
        },
        is_sync(opts));
  });
}

c10::intrusive_ptr<c10d::Work> KoloBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  return reduce_scatter_single(output, input, opts);
}

c10::intrusive_ptr<c10d::Work> KoloBackend::reduce_scatter_single(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  return checked([&]() -> c10::intrusive_ptr<c10d::Work> {
    if (output.scalar_type() != input.scalar_type()) {
      fail("reduce_scatter_tensor: output and input dtypes differ");
    }
    if (input.numel() != output.numel() * size_) {
      fail("reduce_scatter_tensor: input has " + std::to_string(input.numel()) +
           " elements, expected world size x output = " + std::to_string(size_) + " x " +
           std::to_string(output.numel()));
    }
    const kolo::ReduceOp op = reduce_op(opts.reduceOp, output.scalar_type(), "reduce_scatter");
    const auto factor = premul_factor(opts.reduceOp);
#ifdef KOLO_TORCH_CUDA
    if (on_nccl(input) && on_nccl(output) && input.get_device() == output.get_device()) {
      dtype_for(input, "reduce_scatter_tensor");
      // PREMUL_SUM scales a copy (on the caller's stream, before the ready point).
      const at::Tensor in = factor ? input.mul(*factor) : input;
      auto ready = std::make_shared<ReadyEvent>(output);
      return enqueue(
          c10d::OpType::_REDUCE_SCATTER_BASE, "kolo:reduce_scatter_tensor", {output},
          [this, in, output, ready, op](Task& /*task*/) {
            auto& c = cuda_->comm(ready->device());
            ready->block(c.transport().stream());
            c.reduce_scatter(device_view(in, "reduce_scatter_tensor"),
                             device_view(output, "reduce_scatter_tensor"), op);
          },
          is_sync(opts));
    }
#endif
    // The input is scaled in place for PREMUL_SUM: take a copy then.
    auto in = std::make_shared<Staged>(stage(factor ? input.clone() : input, "reduce_scatter"));
    auto out = std::make_shared<Staged>(stage(output, "reduce_scatter", false));
    return enqueue(
        c10d::OpType::_REDUCE_SCATTER_BASE, "kolo:reduce_scatter_tensor", {output},
        [this, in, out, op, factor](Task& task) {
          if (factor) in->host.mul_(*factor);
          comm_->reduce_scatter(in->view("reduce_scatter"), out->view("reduce_scatter"), op);
          task.after = [out] { out->write_back(); };
        },
        is_sync(opts));
  });
}

c10::intrusive_ptr<c10d::Work> KoloBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return reduce_scatter_single_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> KoloBackend::reduce_scatter_single_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return checked([&]() -> c10::intrusive_ptr<c10d::Work> {
    if (outputs.size() != inputs.size()) fail("reduce_scatter_tensor_coalesced: count mismatch");
    std::vector<std::pair<std::shared_ptr<Staged>, std::shared_ptr<Staged>>> pairs;
    std::vector<kolo::ReduceOp> ops;
    const auto factor = premul_factor(opts.reduceOp);
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].numel() != outputs[i].numel() * size_ ||
          outputs[i].scalar_type() != inputs[i].scalar_type()) {
        fail("reduce_scatter_tensor_coalesced: input " + std::to_string(i) +
             " must be world size x its output, same dtype");
      }
      ops.push_back(reduce_op(opts.reduceOp, outputs[i].scalar_type(), "reduce_scatter"));
      pairs.emplace_back(
          std::make_shared<Staged>(stage(factor ? inputs[i].clone() : inputs[i], "reduce_scatter")),
          std::make_shared<Staged>(stage(outputs[i], "reduce_scatter", false)));
    }
    return enqueue(
        c10d::OpType::COALESCED, "kolo:reduce_scatter_tensor_coalesced", outputs,
        [this, pairs, ops, factor](Task& task) {
          for (std::size_t i = 0; i < pairs.size(); ++i) {
            if (factor) pairs[i].first->host.mul_(*factor);
            comm_->reduce_scatter(pairs[i].first->view("reduce_scatter"),
                                  pairs[i].second->view("reduce_scatter"), ops[i]);
          }
          task.after = [pairs] {
            for (const auto& p : pairs) p.second->write_back();
          };
        },
        is_sync(opts));
  });
}

namespace {
// Element counts per peer from torch's split sizes (rows of dim 0), or an even split.
std::vector<std::size_t> split_counts(const at::Tensor& t, const std::vector<int64_t>& splits,
                                      int size, const char* what) {
  std::vector<std::size_t> counts(static_cast<std::size_t>(size));
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  const int64_t row = rows == 0 ? 0 : t.numel() / rows;
  if (splits.empty()) {
    if (rows % size != 0) {
      fail(std::string("all_to_all_single: ") + what + " has " + std::to_string(rows) +
           " rows, not divisible by the world size " + std::to_string(size) +
           " (pass split sizes)");
    }
    std::fill(counts.begin(), counts.end(), static_cast<std::size_t>(rows / size * row));
    return counts;
  }
  if (static_cast<int>(splits.size()) != size) {
    fail(std::string("all_to_all_single: ") + what + " split sizes have " +
         std::to_string(splits.size()) + " entries for a world of " + std::to_string(size));
  }
  int64_t sum = 0;
  for (std::size_t i = 0; i < splits.size(); ++i) {
    if (splits[i] < 0) fail(std::string("all_to_all_single: a negative ") + what + " split size");
    sum += splits[i];
    counts[i] = static_cast<std::size_t>(splits[i] * row);
  }
  if (sum != rows) {
    fail(std::string("all_to_all_single: ") + what + " split sizes add up to " +
         std::to_string(sum) + " but the tensor has " + std::to_string(rows) + " rows");
  }
  return counts;
}
}  // namespace

c10::intrusive_ptr<c10d::Work> KoloBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                          std::vector<int64_t>& output_splits,
                                                          std::vector<int64_t>& input_splits,
                                                          const c10d::AllToAllOptions& opts) {
  return all_to_all_single(output, input, output_splits, input_splits, opts);
}

c10::intrusive_ptr<c10d::Work> KoloBackend::all_to_all_single(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t>& output_splits,
                                                              std::vector<int64_t>& input_splits,
                                                              const c10d::AllToAllOptions& opts) {
  return checked([&]() -> c10::intrusive_ptr<c10d::Work> {
    if (output.scalar_type() != input.scalar_type()) {
      fail("all_to_all_single: output and input dtypes differ");
    }
    const auto send = split_counts(input, input_splits, size_, "input");
    const auto recv = split_counts(output, output_splits, size_, "output");
#ifdef KOLO_TORCH_CUDA
    const bool even =
        std::all_of(send.begin(), send.end(), [&](auto c) { return c == send[0]; }) && recv == send;
    if (even && on_nccl(input) && on_nccl(output) && input.get_device() == output.get_device()) {
      dtype_for(input, "all_to_all_single");
      auto ready = std::make_shared<ReadyEvent>(output);
      return enqueue(
          c10d::OpType::ALLTOALL_BASE, "kolo:all_to_all_single", {output},
          [this, input, output, ready](Task& /*task*/) {
            auto& c = cuda_->comm(ready->device());
            ready->block(c.transport().stream());
            c.alltoall(device_view(input, "all_to_all_single"),
                       device_view(output, "all_to_all_single"));
          },
          is_sync(opts));
    }
#endif
    auto in = std::make_shared<Staged>(stage(input, "all_to_all_single"));
    auto out = std::make_shared<Staged>(stage(output, "all_to_all_single", false));
    return enqueue(
        c10d::OpType::ALLTOALL_BASE, "kolo:all_to_all_single", {output},
        [this, in, out, send, recv](Task& task) {
          comm_->alltoallv(in->view("all_to_all_single"), send, out->view("all_to_all_single"),
                           recv);
          task.after = [out] { out->write_back(); };
        },
        is_sync(opts));
  });
}

c10::intrusive_ptr<c10d::Work> KoloBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllToAllOptions& opts) {
  return checked([&]() -> c10::intrusive_ptr<c10d::Work> {
    if (static_cast<int>(outputs.size()) != size_ || static_cast<int>(inputs.size()) != size_) {
      fail("all_to_all: expects " + std::to_string(size_) + " input and output tensors");
    }
    const at::ScalarType st = inputs[0].scalar_type();
    check_same_dtype(inputs, st, "all_to_all");
    check_same_dtype(outputs, st, "all_to_all");
    std::vector<std::size_t> send;
    std::vector<std::size_t> recv;
    std::vector<at::Tensor> host;
    for (const auto& i : inputs) {
      send.push_back(static_cast<std::size_t>(i.numel()));
      host.push_back(stage(i, "all_to_all").host);
    }
    for (const auto& o : outputs) recv.push_back(static_cast<std::size_t>(o.numel()));
    auto flat_in = std::make_shared<at::Tensor>(gather_flat(host, inputs[0]));
    auto outs = std::make_shared<std::vector<at::Tensor>>(outputs);
    return enqueue(
        c10d::OpType::ALLTOALL, "kolo:all_to_all", outputs,
        [this, flat_in, outs, send, recv](Task& task) {
          auto flat_out = std::make_shared<at::Tensor>(flat_like(*outs, *flat_in));
          comm_->alltoallv(view_of(*flat_in, "all_to_all"), send, view_of(*flat_out, "all_to_all"),
                           recv);
          task.after = [flat_out, outs] { scatter_flat(*flat_out, *outs); };
        },
        is_sync(opts));
  });
}

c10::intrusive_ptr<c10d::Work> KoloBackend::barrier(const c10d::BarrierOptions& opts) {
  return enqueue(
      c10d::OpType::BARRIER, "kolo:barrier", {}, [this](Task& /*task*/) { comm_->barrier(); },
      is_sync(opts));
}

c10::intrusive_ptr<c10d::Work> KoloBackend::send(std::vector<at::Tensor>& tensors, int dst,
                                                 int tag) {
  check_single(tensors, "send");
  check_root(dst, size_, "send");
  auto s = std::make_shared<Staged>(stage(tensors[0], "send"));
  return enqueue(c10d::OpType::SEND, "kolo:send", tensors, [this, s, dst, tag](Task& task) {
    auto req = std::make_shared<Comm::P2PRequest>(comm_->isend(s->view("send"), dst, tag));
    task.poll = [this, s, req] { return comm_->test(*req); };
  });
}

c10::intrusive_ptr<c10d::Work> KoloBackend::recv(std::vector<at::Tensor>& tensors, int src,
                                                 int tag) {
  check_single(tensors, "recv");
  check_root(src, size_, "recv");
  auto s = std::make_shared<Staged>(stage(tensors[0], "recv", false));
  auto work = enqueue(c10d::OpType::RECV, "kolo:recv", tensors, [this, s, src, tag](Task& task) {
    auto req = std::make_shared<Comm::P2PRequest>(comm_->irecv(s->view("recv"), src, tag));
    task.poll = [this, s, req] { return comm_->test(*req); };
    task.after = [s] { s->write_back(); };
  });
  static_cast<KoloWork*>(work.get())->set_source_rank(src);
  return work;
}

c10::intrusive_ptr<c10d::Work> KoloBackend::recvAnysource(std::vector<at::Tensor>& /*tensors*/,
                                                          int /*tag*/) {
  fail("recv from any source is not supported: pass the source rank (src=...)");
}

c10::intrusive_ptr<c10d::Backend> KoloBackend::split(const c10::intrusive_ptr<c10d::Store>& store,
                                                     const std::vector<int>& ranks,
                                                     const c10::intrusive_ptr<Options>& opts) {
  const auto it = std::find(ranks.begin(), ranks.end(), rank_);
  if (it == ranks.end()) return nullptr;
  // The child rendezvouses through the store torch hands it (a prefix of its own per group).
  return c10::make_intrusive<KoloBackend>(store, static_cast<int>(it - ranks.begin()),
                                          static_cast<int>(ranks.size()),
                                          opts ? opts->timeout : timeout_);
}

}  // namespace kolo_torch

PYBIND11_MODULE(_C, m) {
  m.doc() = "kolo as a torch.distributed backend (native part of kolo_torch)";
  m.def("create_backend", &kolo_torch::KoloBackend::create, pybind11::arg("store"),
        pybind11::arg("rank"), pybind11::arg("size"), pybind11::arg("timeout"),
        "Creates the kolo backend of one process group: (store, rank, world size, timeout).");
  m.def("built_with_cuda", &kolo_torch::KoloBackend::built_with_cuda,
        "True when this build sends contiguous CUDA tensors through kolo's NCCL transport "
        "(installed with KOLO_TORCH_CUDA=1); False: CUDA tensors are staged through host memory.");
  m.def(
      "communicator_allreduce_",
      [](const c10::intrusive_ptr<c10d::Backend>& backend, at::Tensor& t) {
        auto* kb = dynamic_cast<kolo_torch::KoloBackend*>(backend.get());
        if (kb == nullptr) throw std::runtime_error("kolo: not a kolo backend");
        if (!t.is_contiguous() || !t.device().is_cpu()) {
          throw std::runtime_error("kolo: a contiguous CPU tensor is needed");
        }
        pybind11::gil_scoped_release no_gil;
        // Straight on the communicator, bypassing the queue: for benchmarks that measure what
        // the plugin adds (use only while no other operation of this group is in flight).
        kb->communicator().allreduce(kolo_torch::view_of(t, "allreduce"), kolo::ReduceOp::sum);
      },
      "Benchmark helper: a sum allreduce straight on the kolo communicator.");
  m.def(
      "lost_ranks",
      [](const c10::intrusive_ptr<c10d::Backend>& backend) {
        auto* kb = dynamic_cast<kolo_torch::KoloBackend*>(backend.get());
        if (kb == nullptr) throw std::runtime_error("kolo: not a kolo backend");
        return kb->lost_ranks();
      },
      "The ranks of the backend's group its failure detector holds for gone.");
}
