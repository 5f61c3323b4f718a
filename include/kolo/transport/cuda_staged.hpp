// kolo/transport/cuda_staged.hpp — device buffers over the host transports: the fallback when
// NCCL is absent (or KOLO_NCCL=0), and the base of the NCCL transport.
//
// CudaStagedTransport is a MeshTransport (shared memory inside a host, TCP across hosts) that
// also takes CUDA device buffers: a collective on device memory is copied to pinned host memory
// on a kolo-owned stream, run by kolo's own algorithms over the mesh, and copied back. Host
// buffers take the mesh as they always do. It owns the CUDA side every device policy needs: the
// device choice (KOLO_CUDA_DEVICE), the stream, waiting on the stream under the collective's
// deadline while watching the mesh for a failing peer, and the engine's device fusion hooks
// (kolo/cuda/device_ops.hpp). Needs only the CUDA runtime: any host compiler builds it.
//
// Ordering: the stream is created with default flags, so it waits for work queued before on the
// legacy default stream; work on other streams must be finished (or synchronised) before a
// device buffer is handed to kolo, as with Horovod's ready events.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <string>
#include <thread>
#include <vector>

#include "kolo/algorithm/allreduce_recursive_doubling.hpp"
#include "kolo/algorithm/alltoall_pairwise.hpp"
#include "kolo/algorithm/broadcast_binomial.hpp"
#include "kolo/algorithm/options.hpp"
#include "kolo/algorithm/ring_allgather.hpp"
#include "kolo/algorithm/ring_allreduce.hpp"
#include "kolo/algorithm/ring_reduce_scatter.hpp"
#include "kolo/core/env.hpp"
#include "kolo/core/error.hpp"
#include "kolo/core/wait.hpp"
#include "kolo/cuda/device_ops.hpp"
#include "kolo/topology/bootstrap.hpp"
#include "kolo/transport/mesh.hpp"
#include "kolo/transport/transport_config.hpp"

namespace kolo {

namespace cuda_detail {

inline std::string cuda_error_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

inline void check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw Error("CUDA error in " + what + " (" + cuda_error_text(e) + ")");
}

// Device (or managed) memory: true; host memory, registered or not: false.
inline bool is_device_pointer(const void* p) {
  if (p == nullptr) return false;
  cudaPointerAttributes a{};
  const cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // plain host memory on old drivers: not an error to keep
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

// A growable cudaMalloc'd buffer (device) or cudaMallocHost'd one (pinned host).
class CudaBuffer {
 public:
  explicit CudaBuffer(bool pinned_host) : host_(pinned_host) {}
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;
  ~CudaBuffer() { release(); }

  // Valid until the next reserve(); the caller has synchronised any earlier use.
  std::byte* reserve(std::size_t bytes, const char* what) {
    if (bytes <= cap_ && p_ != nullptr) return p_;
    release();
    const std::size_t want = std::max<std::size_t>(bytes, 1);
    void* p = nullptr;
    check(host_ ? cudaMallocHost(&p, want) : cudaMalloc(&p, want),
          std::string(host_ ? "cudaMallocHost" : "cudaMalloc") + " of " + std::to_string(want) +
              " bytes for " + what);
    p_ = static_cast<std::byte*>(p);
    cap_ = want;
    return p_;
  }

 private:
  void release() noexcept {
    if (p_ == nullptr) return;
    if (host_) {
      (void)cudaFreeHost(p_);
    } else {
      (void)cudaFree(p_);
    }
    p_ = nullptr;
    cap_ = 0;
  }
  bool host_;
  std::byte* p_ = nullptr;
  std::size_t cap_ = 0;
};

}  // namespace cuda_detail

// The CUDA environment knobs (docs/gpu.md).
struct CudaOptions {
  int device = -1;   // KOLO_CUDA_DEVICE; -1: KOLO_DEVICES' first, else local rank mod count
  bool nccl = true;  // KOLO_NCCL=0: the NCCL transport stages device buffers through the host
  // KOLO_CUDA_SPIN_US: yield-polling of the stream before sleeping. 1 ms: a GPU rank has a core
  // of its own, and sleeping (20 µs asked, 50-80 µs got) added that much to every collective.
  int spin_us = 1000;
  bool hierarchical = true;  // KOLO_NCCL_HIERARCHICAL=0: one NCCL communicator across hosts too

  static CudaOptions from_env(const EnvLookup& env = process_env()) {
    CudaOptions o;
    if (auto v = config::get_int(env, config::vars::cuda_device)) o.device = static_cast<int>(*v);
    if (auto v = config::get_flag(env, config::vars::nccl)) o.nccl = *v;
    if (auto v = config::get_int(env, config::vars::cuda_spin_us)) o.spin_us = static_cast<int>(*v);
    if (auto v = config::get_flag(env, config::vars::nccl_hierarchical)) o.hierarchical = *v;
    return o;
  }
};

class CudaStagedTransport : public MeshTransport {
 public:
  static constexpr bool accepts_device_buffers = true;

  CudaStagedTransport(Bootstrap& boot, RouteMode mode, MeshOptions mesh = MeshOptions::from_env(),
                      CudaOptions cuda = CudaOptions::from_env())
      : MeshTransport(boot, mode, mesh), cuda_(cuda) {
    // Every rank learns every rank's setup error, so a bad KOLO_CUDA_DEVICE on one rank is a
    // ConfigError on all of them instead of a hang on the others.
    std::string err;
    try {
      open_device(boot.topology());
    } catch (const Error& e) {
      err = e.what();
    }
    agree(boot, "cuda-setup", err.empty() ? std::string("ok") : "!" + err);
  }

  // The factory (transport.hpp, Connectable): route policy, mesh and CUDA variables, all read
  // before the rendezvous.
  struct Options {
    RouteMode mode = RouteMode::routed;
    MeshOptions mesh;
    CudaOptions cuda;
    static Options from_env(const EnvLookup& env) {
      return {route_mode_from_env(env), MeshOptions::from_env(env), CudaOptions::from_env(env)};
    }
  };
  static std::unique_ptr<CudaStagedTransport> connect(Bootstrap& boot, const Options& o) {
    return std::make_unique<CudaStagedTransport>(boot, o.mode, o.mesh, o.cuda);
  }

  CudaStagedTransport(const CudaStagedTransport&) = delete;
  CudaStagedTransport& operator=(const CudaStagedTransport&) = delete;

  virtual ~CudaStagedTransport() {
    if (event_ != nullptr) (void)cudaEventDestroy(event_);
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  const CudaOptions& cuda_options() const { return cuda_; }

  // ---- collectives on device buffers, staged through pinned host memory ----
  // Each returns false for host buffers: the communicator then runs its own algorithms.

  bool native_allreduce(const void* in, void* out, std::size_t n, DataType d, ReduceOp op,
                        const AlgoOptions& o) {
    if (!device_pair(in, out, "allreduce")) return false;
    const std::size_t bytes = n * dtype_size(d);
    std::byte* h = host_.reserve(bytes, "allreduce staging");
    to_host(h, in, bytes, o);
    if (bytes <= 64 * 1024) {
      allreduce_recursive_doubling(*this, h, h, n, d, op, scratch_, o);
    } else {
      allreduce_ring(*this, h, h, n, d, op, o);
    }
    to_device(out, h, bytes, o);
    return true;
  }

  bool native_allgatherv(const void* in, void* out, std::span<const std::size_t> counts, DataType d,
                         const AlgoOptions& o) {
    if (!device_pair(in, out, "allgather")) return false;
    const std::size_t es = dtype_size(d);
    std::size_t total = 0;
    std::size_t mine_at = 0;
    for (std::size_t q = 0; q < counts.size(); ++q) {
      if (static_cast<int>(q) == rank()) mine_at = total;
      total += counts[q];
    }
    std::byte* h = host_.reserve(total * es, "allgather staging");
    const std::size_t mine = counts[static_cast<std::size_t>(rank())] * es;
    to_host(h + mine_at * es, in, mine, o);
    allgatherv_ring(*this, h + mine_at * es, h, counts, es, o);
    to_device(out, h, total * es, o);
    return true;
  }

  bool native_broadcast(void* data, std::size_t n, DataType d, int root, const AlgoOptions& o) {
    if (!device_pair(data, data, "broadcast")) return false;
    const std::size_t bytes = n * dtype_size(d);
    std::byte* h = host_.reserve(bytes, "broadcast staging");
    if (rank() == root) to_host(h, data, bytes, o);
    broadcast_binomial(*this, h, bytes, root, o);
    if (rank() != root) to_device(data, h, bytes, o);
    return true;
  }

  bool native_reduce_scatter(const void* in, void* out, std::size_t n, DataType d, ReduceOp op,
                             const AlgoOptions& o) {
    if (!device_pair(in, out, "reduce_scatter")) return false;
    const std::size_t es = dtype_size(d);
    const std::size_t all = n * es * static_cast<std::size_t>(size());
    std::byte* h = host_.reserve(all + n * es, "reduce_scatter staging");
    to_host(h, in, all, o);
    reduce_scatter_ring(*this, h, h + all, n, d, op, scratch_, o);
    to_device(out, h + all, n * es, o);
    return true;
  }

  bool native_alltoall(const void* in, void* out, std::size_t n, DataType d, const AlgoOptions& o) {
    if (!device_pair(in, out, "alltoall")) return false;
    const std::size_t block = n * dtype_size(d);
    const std::size_t all = block * static_cast<std::size_t>(size());
    std::byte* h = host_.reserve(2 * all, "alltoall staging");
    to_host(h, in, all, o);
    alltoall_pairwise(*this, h, h + all, block, o);
    to_device(out, h + all, all, o);
    return true;
  }

  // ---- the engine's device fusion hooks ----

  // A device buffer of at least `bytes`, reused across cycles; valid until the next call.
  std::byte* device_fusion_buffer(std::size_t bytes) {
    return fusion_.reserve(bytes, "the device fusion buffer");
  }

  // Packs a fused batch into `buf` on the stream (one launch with kolo/cuda/kernels.cuh).
  void device_pack(const cuda::FusionItem* items, std::size_t n, DataType in, DataType wire,
                   void* buf, double scale) {
    select_device();
    if (const auto* k = cuda::registered_kernels()) {
      k->pack(items, n, in, wire, buf, scale, stream_);
      return;
    }
    if (in != wire || scale != 1.0) need_kernels("packing with a scale factor or compression");
    const std::size_t es = dtype_size(wire);
    auto* b = static_cast<std::byte*>(buf);
    for (std::size_t i = 0; i < n; ++i) {
      const auto& it = items[i];
      if (it.count == 0) continue;
      if (it.src == nullptr) {
        cuda_detail::check(cudaMemsetAsync(b + it.offset * es, 0, it.count * es, stream_),
                           "cudaMemsetAsync (fusion pack)");
      } else {
        cuda_detail::check(cudaMemcpyAsync(b + it.offset * es, it.src, it.count * es,
                                           cudaMemcpyDeviceToDevice, stream_),
                           "cudaMemcpyAsync (fusion pack)");
      }
    }
  }

  // Unpacks a reduced batch out of `buf` (times scale / divisor) on the stream.
  void device_unpack(const cuda::FusionItem* items, std::size_t n, DataType wire, DataType out,
                     const void* buf, double scale, int divisor) {
    select_device();
    if (const auto* k = cuda::registered_kernels()) {
      k->unpack(items, n, wire, out, buf, scale, divisor, stream_);
      return;
    }
    if (wire != out || scale != 1.0 || divisor != 1) {
      need_kernels("unpacking with a scale factor, an average or decompression");
    }
    const std::size_t es = dtype_size(wire);
    const auto* b = static_cast<const std::byte*>(buf);
    for (std::size_t i = 0; i < n; ++i) {
      const auto& it = items[i];
      if (it.count == 0 || it.dst == nullptr) continue;
      cuda_detail::check(cudaMemcpyAsync(it.dst, b + it.offset * es, it.count * es,
                                         cudaMemcpyDeviceToDevice, stream_),
                         "cudaMemcpyAsync (fusion unpack)");
    }
  }

  // Waits for everything queued on the stream, under the deadline, watching the mesh.
  void device_synchronize(const Deadline& dl, const char* what = "device work") {
    wait_stream(dl, what);
  }

 protected:
  // Exchanges one string per rank through the rendezvous store; an entry starting with '!' is
  // that rank's setup error, thrown as a ConfigError on every rank.
  std::vector<std::string> agree(Bootstrap& boot, const std::string& name,
                                 const std::string& mine) {
    std::vector<std::string> all = boot.allgather(name, mine);
    for (std::size_t r = 0; r < all.size(); ++r) {
      if (!all[r].empty() && all[r][0] == '!') {
        const std::string who =
            static_cast<int>(r) == rank() ? "this rank" : "rank " + std::to_string(r);
        throw ConfigError("CUDA setup failed on " + who + ": " + all[r].substr(1));
      }
    }
    return all;
  }

  void select_device() const {
    cuda_detail::check(cudaSetDevice(device_), "cudaSetDevice(" + std::to_string(device_) + ")");
  }

  // Polls an event recorded after the queued work: yields for spin_us, then sleeps briefly,
  // never spinning without yielding. Between polls: the deadline, the mesh (a peer that
  // aborted or died), and whatever a subclass watches (NCCL's asynchronous errors).
  void wait_stream(const Deadline& dl, const char* what) {
    select_device();
    cuda_detail::check(cudaEventRecord(event_, stream_), "cudaEventRecord");
    // core/wait.hpp: yield at every poll for spin_us, then sleep 20 us between polls.
    wait::Backoff backoff({.spin = std::chrono::microseconds(cuda_.spin_us),
                           .yield_every = 1,
                           .first_sleep = std::chrono::microseconds(20),
                           .max_sleep = std::chrono::microseconds(20)});
    for (unsigned i = 0;; ++i) {
      const cudaError_t q = cudaEventQuery(event_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) {
        throw Error(std::string("CUDA error while waiting for ") + what + " on device " +
                    std::to_string(device_) + " (" + cuda_detail::cuda_error_text(q) + ")");
      }
      if ((i & 15) == 0) {
        check_async();
        if (size() > 1) poll();
        if (dl.expired()) {
          throw TimeoutError(std::string(what) + " on CUDA device " + std::to_string(device_) +
                             " did not finish within the deadline (KOLO_TIMEOUT_SECONDS=" +
                             std::to_string(timeout_seconds()) + ")");
        }
      }
      backoff.pause(&dl);
    }
  }

  // Hook for asynchronous errors of a device library (NCCL); throws when there is one.
  virtual void check_async() {}

  // True for a device pair, false for a host pair; a mix is refused.
  bool device_pair(const void* a, const void* b, const char* what) const {
    const bool da = cuda_detail::is_device_pointer(a);
    const bool db = cuda_detail::is_device_pointer(b);
    if (a != nullptr && b != nullptr && da != db) {
      throw ConfigError(std::string(what) +
                        ": one buffer is in device memory and the other in host memory; pass "
                        "both on the device or both on the host");
    }
    return da || db;
  }

  void to_host(void* h, const void* d, std::size_t bytes, const AlgoOptions& o) {
    if (bytes == 0) return;
    select_device();
    cuda_detail::check(cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, stream_),
                       "cudaMemcpyAsync device to host");
    wait_stream(o.deadline, "the copy to host");
  }
  void to_device(void* d, const void* h, std::size_t bytes, const AlgoOptions& o) {
    if (bytes == 0) return;
    select_device();
    cuda_detail::check(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, stream_),
                       "cudaMemcpyAsync host to device");
    wait_stream(o.deadline, "the copy to the device");
  }

  CudaOptions cuda_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t event_ = nullptr;
  cuda_detail::CudaBuffer host_{true};
  cuda_detail::CudaBuffer fusion_{false};
  std::vector<std::byte> scratch_;

 private:
  void open_device(const Topology& topo) {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
      throw ConfigError(
          "no CUDA device is usable on this host (cudaGetDeviceCount: " +
          (e != cudaSuccess ? cuda_detail::cuda_error_text(e) : std::string("0 devices")) + ")");
    }
    if (cuda_.device >= count) {
      throw ConfigError("KOLO_CUDA_DEVICE=" + std::to_string(cuda_.device) +
                        " is not a device of this host, which has " + std::to_string(count) +
                        " CUDA device(s) (0-" + std::to_string(count - 1) + ")");
    }
    if (cuda_.device < 0 && !topo.devices.empty()) {  // the launcher's GPU list (Spark)
      const int first = topo.devices.front();
      if (first < 0 || first >= count) {
        throw ConfigError("KOLO_DEVICES names GPU " + std::to_string(first) +
                          ", which is not a device of this host, which has " +
                          std::to_string(count) + " CUDA device(s)");
      }
      device_ = first;
    } else {
      device_ = cuda_.device >= 0 ? cuda_.device : std::max(topo.local_rank, 0) % count;
    }
    select_device();
    cuda_detail::check(cudaStreamCreateWithFlags(&stream_, cudaStreamDefault), "cudaStreamCreate");
    cuda_detail::check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming),
                       "cudaEventCreate");
  }

  [[noreturn]] static void need_kernels(const char* what) {
    throw ConfigError(std::string("device fusion: ") + what +
                      " needs kolo's CUDA kernels: include <kolo/cuda/kernels.cuh> in one .cu "
                      "file of the program (compiled by nvcc)");
  }
};

static_assert(check_transport<CudaStagedTransport>());

}  // namespace kolo
