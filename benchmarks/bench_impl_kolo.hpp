// bench_impl_kolo.hpp — kolo-bench's `--impl kolo` over any transport: kolo::Communicator<T>.
//
// One template for every route: MeshTransport (shm, tcp, routed; KOLO_TRANSPORT, under kolo-run,
// bench_impl_kolo.cpp) and MpiTransport / MpiNativeTransport (under mpirun,
// bench_impl_kolo_mpi.cpp, built only with MPI).
//
// `--algo` forces the Selector's choice for allreduce and broadcast (every rank makes the same
// call, as Communicator::selector() requires); `--compression fp16|bf16` runs
// Communicator::allreduce_compressed, the engine's path for one tensor: float32 in and out,
// 16-bit messages (converted segment by segment where the ring runs; otherwise compress,
// allreduce the 16-bit copy, decompress), all timed.
#pragma once

#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <thread>

#include <kolo/algorithm/selector.hpp>
#include <kolo/communicator.hpp>
#include <kolo/compression/compressor.hpp>
#include <kolo/kolo.hpp>

#include "bench_impl.hpp"

namespace kolo::bench {

template <class T>
class KoloImpl final : public Impl {
 public:
  KoloImpl(Communicator<T> comm, const KoloConfig& cfg, std::string route)
      : comm_(std::move(comm)),
        cfg_(cfg),
        route_(std::move(route)),
        compression_(CompressionPolicy::parse(cfg.compression)) {
    // Validated by the command line already; here the choice is applied.
    switch (cfg_.coll) {
      case Coll::allreduce:
        force<AllreduceAlgorithm>();
        break;
      case Coll::broadcast:
        force<BroadcastAlgorithm>();
        break;
      case Coll::allgather:
        force<AllgatherAlgorithm>();
        break;
      case Coll::reduce_scatter:
        force<ReduceScatterAlgorithm>();
        break;
      case Coll::alltoall:
        force<AlltoallAlgorithm>();
        break;
    }
  }

  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }

  std::vector<std::string> describe() const override {
    const CommunicatorOptions co = CommunicatorOptions::from_env();
    return {
        std::string("impl: kolo ") + kolo::version + ", Communicator over " + route_,
        "topology: hosts " + std::to_string(comm_.cross_size()) + ", local ranks " +
            std::to_string(comm_.local_size()) + ", hardware threads " +
            std::to_string(std::thread::hardware_concurrency()),
        "algorithm: --algo " + cfg_.algo + "; per collective and size by the Selector: " +
            comm_.selector().describe() + "; segment " + std::to_string(co.segment_bytes) + " B",
        std::string("buffers: ") +
            (cfg_.shared_buffers
                 ? std::string("shared (Communicator::allocate; ") +
                       (comm_.zero_copy_routes() ? "the local peers map them: zero copy)"
                                                 : "not shared on these routes)")
                 : "plain (malloc)"),
        "compression: " + std::string(compression_.name) +
            (compression_.enabled() ? " (Communicator::allreduce_compressed: float32 in and out, "
                                      "16-bit messages; tolerance 2^-10 fp16, 2^-7 bf16 relative)"
                                    : ""),
    };
  }

  std::optional<std::string> unsupported(const OpSpec& spec, bool in_place) const override {
    if (spec.coll == Coll::alltoall && in_place && size() > 1) {
      return "in-place alltoall is not supported by kolo";
    }
    return std::nullopt;
  }

  BoundOp bind(const OpSpec& s, void* in, void* out, bool in_place) override {
    const auto n = static_cast<std::size_t>(size());
    const DataType t = s.dtype;
    Communicator<T>* c = &comm_;
    switch (s.coll) {
      case Coll::allreduce:
        if (compression_.enabled()) return bind_compressed(s, in, out);
        return {
            [=] { c->allreduce(TensorView(in, s.count, t), TensorView(out, s.count, t), s.op); },
            out};
      case Coll::allgather:
        return {[=] { c->allgather(TensorView(in, s.count / n, t), TensorView(out, s.count, t)); },
                out};
      case Coll::broadcast: {
        // kolo's broadcast is in place; out-of-place is what a caller would write: the root
        // copies its input into the output buffer first (timed).
        const std::size_t bytes = s.count * dtype_size(t);
        const bool copy = !in_place && rank() == s.root;
        return {[=] {
                  if (copy) std::memcpy(out, in, bytes);
                  c->broadcast(TensorView(out, s.count, t), s.root);
                },
                out};
      }
      case Coll::reduce_scatter:
        return {[=] {
                  c->reduce_scatter(TensorView(in, s.count, t), TensorView(out, s.count / n, t),
                                    s.op);
                },
                out};
      case Coll::alltoall:
        return {[=] { c->alltoall(TensorView(in, s.count, t), TensorView(out, s.count, t)); }, out};
    }
    throw std::logic_error("unknown collective");
  }

  std::string last_algorithm() const override {
    switch (cfg_.coll) {
      case Coll::allreduce:
        return algorithm_name(comm_.last_allreduce_algorithm());
      case Coll::broadcast:
        return algorithm_name(comm_.last_broadcast_algorithm());
      case Coll::allgather:
        return algorithm_name(comm_.last_allgather_algorithm());
      case Coll::reduce_scatter:
        return algorithm_name(comm_.last_reduce_scatter_algorithm());
      case Coll::alltoall:
        return algorithm_name(comm_.last_alltoall_algorithm());
    }
    return {};
  }

 private:
  template <class Algo>
  void force() {
    if (auto a = parse_algorithm<Algo>(cfg_.algo)) comm_.selector().force(*a);
  }

 public:
  double tolerance() const override {
    if (!compression_.enabled()) return 0.0;
    return compression_.wire == DataType::bfloat16 ? 1.0 / 128 : 1.0 / 1024;
  }

  double sum_over_ranks(double v) override {
    comm_.allreduce(std::span<double>(&v, 1), ReduceOp::sum);
    return v;
  }

  void barrier() override { comm_.barrier(); }

  // --buffers shared: every buffer from Communicator::allocate_region (a collective: every rank
  // allocates the same sizes in the same order, which the harness does).
  void* allocate(std::size_t bytes) override {
    if (!cfg_.shared_buffers) return Impl::allocate(bytes);
    auto r = comm_.allocate_region(bytes);
    void* p = r->base;
    regions_[p] = std::move(r);
    return p;
  }
  void deallocate(void* p) override {
    if (!cfg_.shared_buffers) return Impl::deallocate(p);
    regions_.erase(p);
  }

 private:
  BoundOp bind_compressed(const OpSpec& s, void* in, void* out) {
    const CompressionPolicy pol = compression_;
    Communicator<T>* c = &comm_;
    const TensorView vin(in, s.count, DataType::float32), vout(out, s.count, DataType::float32);
    const ReduceOp op = s.op;
    return {[=] { c->allreduce_compressed(vin, vout, op, pol); }, out};
  }

  Communicator<T> comm_;
  KoloConfig cfg_;
  std::string route_;
  CompressionPolicy compression_;
  std::map<void*, std::shared_ptr<detail::SharedRegion>> regions_;
};

}  // namespace kolo::bench
