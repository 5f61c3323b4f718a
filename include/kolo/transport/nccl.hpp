// kolo/transport/nccl.hpp — NCCL for device buffers, the mesh for host buffers.
//
//   kolo::Communicator<kolo::NcclTransport> comm =
//   kolo::Communicator<kolo::NcclTransport>::from_env(); comm.allreduce(kolo::TensorView(d_grad, n,
//   kolo::DataType::float32, kolo::Device::cuda(0)));
//
// NcclTransport is a CudaStagedTransport (kolo/transport/cuda_staged.hpp) whose device-buffer
// collectives go to NCCL: allreduce (ncclAvg for averages), allgather(v), broadcast,
// reduce_scatter and alltoall (grouped ncclSend/ncclRecv), on the kolo-owned stream. Host
// buffers keep kolo's own algorithms over shared memory / TCP — one communicator, placement
// decides (device tensors to NCCL, host tensors to the mesh).
//
// Setup: each NCCL communicator's leader calls ncclGetUniqueId and publishes it through kolo's
// rendezvous store; every rank joins with a non-blocking ncclCommInitRankConfig, waited for
// under KOLO_TIMEOUT_SECONDS. A device error on any rank (no GPU, a bad KOLO_CUDA_DEVICE) is a
// ConfigError on every rank.
//
// Topology: on one host (or with KOLO_NCCL_HIERARCHICAL=0) one NCCL communicator spans all
// ranks. When the topology has several hosts with the same number of ranks each, NCCL runs
// inside each host only and the hosts are joined by the mesh (TCP): allreduce is an NCCL
// reduce-scatter inside the host, an allreduce of each shard across hosts staged through pinned
// host memory (one rank per host and shard, in parallel), and an NCCL allgather inside the host.
// The other collectives are staged whole in that mode.
//
// Errors: NCCL results become kolo errors (ncclInvalidArgument/Usage: ConfigError,
// ncclRemoteError: PeerLostError, others: Error) with ncclGetLastError's text. While a
// collective runs the waiting thread polls the stream, ncclCommGetAsyncError, the deadline and
// the mesh; on any error the communicator calls abort(), which runs ncclCommAbort (ending the
// NCCL kernels that wait for a dead peer) and tells every rank through the mesh. Nothing waits
// forever. KOLO_NCCL=0 stages everything through the host instead (the no-NCCL fallback).
#pragma once

#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "kolo/algorithm/allreduce_hierarchical.hpp"
#include "kolo/algorithm/group_view.hpp"
#include "kolo/core/wait.hpp"
#include "kolo/transport/cuda_staged.hpp"

namespace kolo {

namespace nccl_detail {

inline std::string result_text(ncclResult_t r) {
  return std::string(ncclGetErrorString(r)) + " (ncclResult " +
         std::to_string(static_cast<int>(r)) + ")";
}

[[noreturn]] inline void throw_result(ncclResult_t r, const std::string& what,
                                      ncclComm_t comm = nullptr) {
  std::string msg = "NCCL error in " + what + ": " + result_text(r);
  if (const char* last = ncclGetLastError(comm); last != nullptr && last[0] != '\0') {
    msg += ": ";
    msg += last;
  }
  switch (r) {
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      throw ConfigError(msg);
    case ncclRemoteError:
      throw PeerLostError(msg);
    default:
      throw Error(msg);
  }
}

inline ncclDataType_t dtype(DataType d) {
  switch (d) {
    case DataType::float16:
      return ncclFloat16;
    case DataType::bfloat16:
      return ncclBfloat16;
    case DataType::float32:
      return ncclFloat32;
    case DataType::float64:
      return ncclFloat64;
    case DataType::int8:
      return ncclInt8;
    case DataType::uint8:
      return ncclUint8;
    case DataType::int32:
      return ncclInt32;
    case DataType::int64:
      return ncclInt64;
  }
  throw ConfigError("NCCL: invalid DataType value " + std::to_string(static_cast<int>(d)));
}

inline ncclRedOp_t redop(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::average:
      return ncclAvg;
    case ReduceOp::min:
      return ncclMin;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::product:
      return ncclProd;
  }
  throw ConfigError("NCCL: invalid ReduceOp value " + std::to_string(static_cast<int>(op)));
}

inline std::string id_to_hex(const ncclUniqueId& id) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  s.reserve(2 * sizeof(id.internal));
  for (char c : id.internal) {
    const auto u = static_cast<unsigned char>(c);
    s += digits[u >> 4];
    s += digits[u & 15];
  }
  return s;
}

inline ncclUniqueId id_from_hex(const std::string& s) {
  ncclUniqueId id{};
  if (s.size() != 2 * sizeof(id.internal)) {
    throw Error("NCCL: malformed unique id from the rendezvous store (" + std::to_string(s.size()) +
                " hex digits)");
  }
  auto nib = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw Error("NCCL: malformed unique id from the rendezvous store");
  };
  for (std::size_t i = 0; i < sizeof(id.internal); ++i) {
    id.internal[i] = static_cast<char>((nib(s[2 * i]) << 4) | nib(s[2 * i + 1]));
  }
  return id;
}

}  // namespace nccl_detail

class NcclTransport : public CudaStagedTransport {
 public:
  NcclTransport(Bootstrap& boot, RouteMode mode, MeshOptions mesh = MeshOptions::from_env(),
                CudaOptions cuda = CudaOptions::from_env())
      : CudaStagedTransport(boot, mode, mesh, cuda) {
    if (!cuda_.nccl) return;  // KOLO_NCCL=0: everything staged
    groups_ = HostGroups::from_host_keys(
        boot.host_keys().empty() ? std::vector<std::string>(1, std::string("h")) : boot.host_keys(),
        rank());
    hierarchical_ = cuda_.hierarchical && groups_.hosts > 1 && groups_.uniform;
    // The ranks of this rank's NCCL communicator and its leader (lowest rank).
    std::vector<int> members;
    if (hierarchical_) {
      members = groups_.local;
    } else {
      for (int r = 0; r < size(); ++r) members.push_back(r);
    }
    nccl_size_ = static_cast<int>(members.size());
    nccl_rank_ =
        static_cast<int>(std::find(members.begin(), members.end(), rank()) - members.begin());
    std::string mine = "-";
    if (nccl_rank_ == 0) {
      ncclUniqueId id{};
      const ncclResult_t r = ncclGetUniqueId(&id);
      mine = r == ncclSuccess ? nccl_detail::id_to_hex(id)
                              : "!ncclGetUniqueId failed: " + nccl_detail::result_text(r);
    }
    const std::vector<std::string> all = agree(boot, "nccl-uid", mine);
    const ncclUniqueId id = nccl_detail::id_from_hex(all[static_cast<std::size_t>(members[0])]);
    select_device();
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;  // so that a rank that never joins is a timeout, not a hang
    const ncclResult_t r = ncclCommInitRankConfig(&comm_, nccl_size_, id, nccl_rank_, &cfg);
    const Deadline dl = Deadline::after(timeout_seconds());
    try {
      if (r != ncclSuccess && r != ncclInProgress) {
        nccl_detail::throw_result(r, "ncclCommInitRankConfig", comm_);
      }
      settle(dl, "NCCL communicator setup (ncclCommInitRankConfig)");
    } catch (const Error& e) {
      abort(e);
      throw;
    }
  }

  // The factory (transport.hpp, Connectable): the staged transport's options.
  using Options = CudaStagedTransport::Options;
  static std::unique_ptr<NcclTransport> connect(Bootstrap& boot, const Options& o) {
    return std::make_unique<NcclTransport>(boot, o.mode, o.mesh, o.cuda);
  }

  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;

  ~NcclTransport() override {
    if (comm_ == nullptr) return;
    if (aborted()) {
      (void)ncclCommAbort(comm_);
    } else {
      (void)ncclCommDestroy(comm_);
    }
  }

  // The NCCL communicator (nullptr with KOLO_NCCL=0); for callers that add their own NCCL calls
  // on stream().
  ncclComm_t nccl_comm() const { return comm_; }
  bool nccl_enabled() const { return comm_ != nullptr; }
  bool hierarchical() const { return hierarchical_; }

  // Tells every rank about err and aborts the NCCL communicator: kernels waiting for a peer
  // end, and the error is what every later call throws.
  void abort(const Error& err) {
    if (comm_ != nullptr) {
      (void)ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    MeshTransport::abort(err);
  }

  bool native_allreduce(const void* in, void* out, std::size_t n, DataType d, ReduceOp op,
                        const AlgoOptions& o) {
    if (!device_pair(in, out, "allreduce")) return false;
    if (!use_nccl()) return CudaStagedTransport::native_allreduce(in, out, n, d, op, o);
    if (hierarchical_) {
      hierarchical_allreduce(in, out, n, d, op, o);
      return true;
    }
    if (nccl_size_ == 1 && op == ReduceOp::average) {
      // One rank: the average is the input. NCCL 2.28.3's single-rank ncclAvg left the last
      // elements of a 1048579-element float tensor at 0 on an H100 (docs/gpu.md); a copy is
      // exact.
      if (in != out && n > 0) {
        select_device();
        cuda_detail::check(
            cudaMemcpyAsync(out, in, n * dtype_size(d), cudaMemcpyDeviceToDevice, stream_),
            "cudaMemcpyAsync (single-rank allreduce)");
      }
      wait_stream(o.deadline, "the single-rank allreduce");
      return true;
    }
    run(o, "ncclAllReduce", [&] {
      return ncclAllReduce(in, out, n, nccl_detail::dtype(d), nccl_detail::redop(op), comm_,
                           stream_);
    });
    return true;
  }

  bool native_allgatherv(const void* in, void* out, std::span<const std::size_t> counts, DataType d,
                         const AlgoOptions& o) {
    if (!device_pair(in, out, "allgather")) return false;
    if (!use_nccl() || hierarchical_) {
      return CudaStagedTransport::native_allgatherv(in, out, counts, d, o);
    }
    const bool equal =
        std::all_of(counts.begin(), counts.end(), [&](std::size_t c) { return c == counts[0]; });
    const ncclDataType_t t = nccl_detail::dtype(d);
    if (equal) {
      run(o, "ncclAllGather", [&] { return ncclAllGather(in, out, counts[0], t, comm_, stream_); });
      return true;
    }
    // Uneven counts: one broadcast per rank into its slice, fused by an NCCL group.
    run(o, "grouped ncclBroadcast (allgatherv)", [&] {
      ncclResult_t g = ncclGroupStart();
      std::size_t at = 0;
      const std::size_t es = dtype_size(d);
      for (std::size_t q = 0; q < counts.size() && g == ncclSuccess; ++q) {
        void* dst = static_cast<std::byte*>(out) + at * es;
        g = ncclBroadcast(static_cast<int>(q) == rank() ? in : dst, dst, counts[q], t,
                          static_cast<int>(q), comm_, stream_);
        at += counts[q];
      }
      const ncclResult_t e = ncclGroupEnd();
      return g != ncclSuccess ? g : e;
    });
    return true;
  }

  bool native_broadcast(void* data, std::size_t n, DataType d, int root, const AlgoOptions& o) {
    if (!device_pair(data, data, "broadcast")) return false;
    if (!use_nccl() || hierarchical_) {
      return CudaStagedTransport::native_broadcast(data, n, d, root, o);
    }
    run(o, "ncclBroadcast",
        [&] { return ncclBroadcast(data, data, n, nccl_detail::dtype(d), root, comm_, stream_); });
    return true;
  }

  bool native_reduce_scatter(const void* in, void* out, std::size_t n, DataType d, ReduceOp op,
                             const AlgoOptions& o) {
    if (!device_pair(in, out, "reduce_scatter")) return false;
    if (!use_nccl() || hierarchical_) {
      return CudaStagedTransport::native_reduce_scatter(in, out, n, d, op, o);
    }
    run(o, "ncclReduceScatter", [&] {
      return ncclReduceScatter(in, out, n, nccl_detail::dtype(d), nccl_detail::redop(op), comm_,
                               stream_);
    });
    return true;
  }

  bool native_alltoall(const void* in, void* out, std::size_t n, DataType d, const AlgoOptions& o) {
    if (!device_pair(in, out, "alltoall")) return false;
    if (!use_nccl() || hierarchical_) {
      return CudaStagedTransport::native_alltoall(in, out, n, d, o);
    }
    const ncclDataType_t t = nccl_detail::dtype(d);
    const std::size_t block = n * dtype_size(d);
    run(o, "grouped ncclSend/ncclRecv (alltoall)", [&] {
      ncclResult_t g = ncclGroupStart();
      for (int q = 0; q < size() && g == ncclSuccess; ++q) {
        g = ncclSend(static_cast<const std::byte*>(in) + q * block, n, t, q, comm_, stream_);
        if (g == ncclSuccess) {
          g = ncclRecv(static_cast<std::byte*>(out) + q * block, n, t, q, comm_, stream_);
        }
      }
      const ncclResult_t e = ncclGroupEnd();
      return g != ncclSuccess ? g : e;
    });
    return true;
  }

 protected:
  void check_async() override {
    if (comm_ == nullptr) return;
    ncclResult_t a = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm_, &a);
    if (r != ncclSuccess) nccl_detail::throw_result(r, "ncclCommGetAsyncError", comm_);
    if (a != ncclSuccess && a != ncclInProgress) {
      nccl_detail::throw_result(a, "an NCCL operation (asynchronous error)", comm_);
    }
  }

 private:
  bool use_nccl() {
    if (comm_ == nullptr) {
      if (cuda_.nccl && aborted()) rethrow();
      return false;
    }
    return true;
  }

  // Enqueues an NCCL call (the lambda) on the stream and waits for it under the deadline.
  template <class F>
  void run(const AlgoOptions& o, const char* what, F&& enqueue) {
    select_device();
    const ncclResult_t r = enqueue();
    if (r != ncclSuccess && r != ncclInProgress) nccl_detail::throw_result(r, what, comm_);
    settle(o.deadline, what);
    wait_stream(o.deadline, what);
  }

  // A non-blocking communicator may still be enqueueing (ncclInProgress): wait until it is not.
  void settle(const Deadline& dl, const char* what) {
    // core/wait.hpp: yield at every check for 64 us, then sleep 50 us between checks.
    wait::Backoff backoff({.spin = std::chrono::microseconds(64),
                           .yield_every = 1,
                           .first_sleep = std::chrono::microseconds(50),
                           .max_sleep = std::chrono::microseconds(50)});
    for (;;) {
      ncclResult_t a = ncclSuccess;
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &a);
      if (r != ncclSuccess) nccl_detail::throw_result(r, "ncclCommGetAsyncError", comm_);
      if (a == ncclSuccess) return;
      if (a != ncclInProgress) nccl_detail::throw_result(a, what, comm_);
      if (size() > 1) poll();
      if (dl.expired()) {
        throw TimeoutError(std::string(what) + " did not complete within the deadline " +
                           "(KOLO_TIMEOUT_SECONDS=" + std::to_string(timeout_seconds()) +
                           "): a rank that never joined, or a peer that stopped?");
      }
      backoff.pause(&dl);
    }
  }

  // NCCL reduce-scatter inside the host, the shard's allreduce across hosts through the host
  // (in parallel: one cross-host group per local rank), NCCL allgather inside the host.
  void hierarchical_allreduce(const void* in, void* out, std::size_t n, DataType d, ReduceOp op,
                              const AlgoOptions& o) {
    const auto L = static_cast<std::size_t>(nccl_size_);
    const std::size_t es = dtype_size(d);
    const std::size_t shard = (n + L - 1) / L;
    const bool padded = shard * L != n;
    // The working buffer: the output itself when the count divides evenly, else a padded copy.
    std::byte* work = static_cast<std::byte*>(out);
    if (padded) {
      work = device_fusion_buffer(shard * L * es);
      select_device();
      cuda_detail::check(cudaMemsetAsync(work + n * es, 0, (shard * L - n) * es, stream_),
                         "cudaMemsetAsync (hierarchical padding)");
    }
    if (padded || in != out) {
      cuda_detail::check(cudaMemcpyAsync(work, in, n * es, cudaMemcpyDeviceToDevice, stream_),
                         "cudaMemcpyAsync (hierarchical input)");
    }
    const ReduceOp wire = op == ReduceOp::average ? ReduceOp::sum : op;
    std::byte* mine = work + static_cast<std::size_t>(nccl_rank_) * shard * es;
    run(o, "ncclReduceScatter (inside the host)", [&] {
      return ncclReduceScatter(work, mine, shard, nccl_detail::dtype(d), nccl_detail::redop(wire),
                               comm_, stream_);
    });
    std::byte* h = host_.reserve(shard * es, "hierarchical staging");
    to_host(h, mine, shard * es, o);
    GroupView cross(*this, groups_.cross);
    if (op == ReduceOp::average) {
      // The average over every rank: sum across hosts here, divide once on the host.
      allreduce_ring(cross, h, h, shard, d, ReduceOp::sum, o);
      finish_average(h, shard, d, size());
    } else {
      allreduce_ring(cross, h, h, shard, d, op, o);
    }
    to_device(mine, h, shard * es, o);
    run(o, "ncclAllGather (inside the host)",
        [&] { return ncclAllGather(mine, work, shard, nccl_detail::dtype(d), comm_, stream_); });
    if (padded) {
      cuda_detail::check(cudaMemcpyAsync(out, work, n * es, cudaMemcpyDeviceToDevice, stream_),
                         "cudaMemcpyAsync (hierarchical output)");
      wait_stream(o.deadline, "the hierarchical output copy");
    }
  }

  ncclComm_t comm_ = nullptr;
  HostGroups groups_;
  bool hierarchical_ = false;
  int nccl_size_ = 1;
  int nccl_rank_ = 0;
};

static_assert(check_transport<NcclTransport>());

}  // namespace kolo
