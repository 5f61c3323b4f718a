// bench_impl_nccl.cpp — kolo-bench's `--impl nccl`: NCCL collectives on one GPU per rank,
// bootstrapped through kolo's store (the ncclUniqueId travels as a store value).
//
// Compiled only when the CUDA toolkit and NCCL are found (KOLO_BENCH_HAVE_NCCL); without a
// visible GPU it refuses at start-up with a message that says so (exit status 3).
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <string>

#include <kolo/topology/bootstrap.hpp>
#include <kolo/transport/nccl.hpp>  // the dtype/op mapping

#include "bench_impl.hpp"

namespace kolo::bench {

namespace {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(r));
}

class NcclImpl final : public Impl {
 public:
  NcclImpl() {
    int devices = 0;
    const cudaError_t e = cudaGetDeviceCount(&devices);
    if (e != cudaSuccess || devices == 0) {
      throw Unavailable(std::string("--impl nccl needs a CUDA GPU, and none is visible (") +
                        (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") + ")");
    }
    boot_ = std::make_unique<Bootstrap>(Topology::from_env());
    const Topology& topo = boot_->topology();
    const int local = topo.local_rank >= 0 ? topo.local_rank : 0;
    device_ = !topo.devices.empty() ? topo.devices.front() : local % devices;
    cuda_check(cudaSetDevice(device_), "cudaSetDevice");
    ncclUniqueId id{};
    if (boot_->rank() == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    const auto ids = boot_->allgather(
        "nccl-id",
        boot_->rank() == 0 ? std::string(reinterpret_cast<const char*>(&id), sizeof(id)) : "");
    std::memcpy(&id, ids[0].data(), sizeof(id));
    nccl_check(ncclCommInitRank(&comm_, boot_->size(), id, boot_->rank()), "ncclCommInitRank");
    cuda_check(cudaStreamCreate(&stream_), "cudaStreamCreate");
    cuda_check(cudaMalloc(&scalar_, sizeof(double)), "cudaMalloc");
  }

  ~NcclImpl() override {
    cudaFree(scalar_);
    cudaStreamDestroy(stream_);
    ncclCommDestroy(comm_);
  }

  int rank() const override { return boot_->rank(); }
  int size() const override { return boot_->size(); }

  std::vector<std::string> describe() const override {
    int v = 0;
    ncclGetVersion(&v);
    return {"impl: nccl " + std::to_string(v) + ", device " + std::to_string(device_),
            "transport: NCCL's choice; algorithm: NCCL's tuner (NCCL_ALGO)"};
  }

  std::optional<std::string> unsupported(const OpSpec&, bool) const override {
    return std::nullopt;
  }

  BoundOp bind(const OpSpec& s, void* in, void* out, bool in_place) override {
    const ncclDataType_t t = nccl_detail::dtype(s.dtype);
    const ncclRedOp_t op = nccl_detail::redop(s.op);
    const std::size_t n = static_cast<std::size_t>(size());
    const std::size_t block = s.count / n;
    const std::size_t es = dtype_size(s.dtype);
    ncclComm_t comm = comm_;
    cudaStream_t st = stream_;
    (void)in_place;  // NCCL's in-place forms are the same calls with aliased pointers
    switch (s.coll) {
      case Coll::allreduce:
        return {
            [=] { nccl_check(ncclAllReduce(in, out, s.count, t, op, comm, st), "ncclAllReduce"); },
            out};
      case Coll::allgather:
        return {[=] { nccl_check(ncclAllGather(in, out, block, t, comm, st), "ncclAllGather"); },
                out};
      case Coll::broadcast:
        return {[=] {
                  nccl_check(ncclBroadcast(in, out, s.count, t, s.root, comm, st), "ncclBroadcast");
                },
                out};
      case Coll::reduce_scatter:
        return {[=] {
                  nccl_check(ncclReduceScatter(in, out, block, t, op, comm, st),
                             "ncclReduceScatter");
                },
                out};
      case Coll::alltoall:
        return {[=] {
                  nccl_check(ncclGroupStart(), "ncclGroupStart");
                  for (std::size_t p = 0; p < n; ++p) {
                    const auto* src = static_cast<const char*>(in) + p * block * es;
                    auto* dst = static_cast<char*>(out) + p * block * es;
                    nccl_check(ncclSend(src, block, t, static_cast<int>(p), comm, st), "ncclSend");
                    nccl_check(ncclRecv(dst, block, t, static_cast<int>(p), comm, st), "ncclRecv");
                  }
                  nccl_check(ncclGroupEnd(), "ncclGroupEnd");
                },
                out};
    }
    throw std::logic_error("unknown collective");
  }

  double sum_over_ranks(double v) override {
    cuda_check(cudaMemcpy(scalar_, &v, sizeof(v), cudaMemcpyHostToDevice), "cudaMemcpy");
    nccl_check(ncclAllReduce(scalar_, scalar_, 1, ncclFloat64, ncclSum, comm_, stream_),
               "ncclAllReduce");
    synchronize();
    cuda_check(cudaMemcpy(&v, scalar_, sizeof(v), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return v;
  }

  void barrier() override { sum_over_ranks(0.0); }
  void synchronize() override {
    cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  bool device_memory() const override { return true; }
  void* allocate(std::size_t bytes) override {
    void* p = nullptr;
    cuda_check(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
    return p;
  }
  void deallocate(void* p) override { cudaFree(p); }
  void copy_to_buffer(void* dst, const void* host, std::size_t bytes) override {
    cuda_check(cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  void copy_from_buffer(void* host, const void* src, std::size_t bytes) override {
    cuda_check(cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  }

 private:
  std::unique_ptr<Bootstrap> boot_;
  int device_ = 0;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  double* scalar_ = nullptr;
};

}  // namespace

std::unique_ptr<Impl> make_nccl_impl() {
  return std::make_unique<NcclImpl>();
}

}  // namespace kolo::bench
