// bench_impl.hpp — what kolo-bench needs from a collective implementation (kolo, Open MPI, Gloo,
// NCCL), so that one harness times, checks and prints all of them the same way.
//
// Each implementation lives in its own translation unit (bench_impl_<name>.cpp) because each
// drags in its own headers (<mpi.h>, <gloo/...>, <nccl.h>) and is built only when its library
// is found; kolo_bench.cpp sees only this header.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "kolo/core/dtype.hpp"

namespace kolo::bench {

enum class Coll { allreduce, allgather, broadcast, reduce_scatter, alltoall };

inline constexpr Coll kAllColls[] = {Coll::allreduce, Coll::allgather, Coll::broadcast,
                                     Coll::reduce_scatter, Coll::alltoall};

constexpr std::string_view coll_name(Coll c) {
  switch (c) {
    case Coll::allreduce:
      return "allreduce";
    case Coll::allgather:
      return "allgather";
    case Coll::broadcast:
      return "broadcast";
    case Coll::reduce_scatter:
      return "reduce_scatter";
    case Coll::alltoall:
      return "alltoall";
  }
  return "?";
}

constexpr bool coll_reduces(Coll c) {
  return c == Coll::allreduce || c == Coll::reduce_scatter;
}

// One measured operation. `count` is the element count of the row as nccl-tests prints it: for
// allgather and reduce_scatter it counts all ranks' data (per rank: count / size), for alltoall
// it is one rank's whole send buffer.
struct OpSpec {
  Coll coll = Coll::allreduce;
  DataType dtype = DataType::float32;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  std::size_t count = 0;
};

// A bound operation: `run` performs it once on the buffers it was bound to; `result` is where
// the output lands (differs from the conventional place only for MPI-style in-place
// reduce-scatter, which leaves the block at the start of the buffer).
struct BoundOp {
  std::function<void()> run;
  const void* result = nullptr;
};

// The requested implementation or feature cannot run in this build or on this machine
// (library not found at build time, no GPU): exit status 3, not a wrong result.
class Unavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Impl {
 public:
  virtual ~Impl() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // `# `-less header lines describing the implementation (version, transport, algorithm).
  virtual std::vector<std::string> describe() const = 0;

  // Why `spec` cannot run (out-of-place or in-place), or nullopt when it can: printed as N/A.
  virtual std::optional<std::string> unsupported(const OpSpec& spec, bool in_place) const = 0;

  // Binds spec to buffers laid out as nccl-tests does (see kolo_bench.cpp), outside the timed
  // loop, so per-buffer setup (Gloo's old-style algorithm objects) is not timed.
  virtual BoundOp bind(const OpSpec& spec, void* in, void* out, bool in_place) = 0;

  // The algorithm the last operation ran, when the implementation says (kolo's Selector).
  virtual std::string last_algorithm() const { return {}; }
  // Relative tolerance of the check: 0 (exact) unless the implementation rounds on purpose
  // (kolo's fp16/bf16 wire compression).
  virtual double tolerance() const { return 0.0; }

  // Sum of `v` over all ranks, through the implementation itself (times, wrong counts).
  virtual double sum_over_ranks(double v) = 0;
  virtual void barrier() = 0;
  // Waits for outstanding asynchronous work (a CUDA stream); host implementations are done.
  virtual void synchronize() {}

  // Buffers: host memory by default; a device implementation (NCCL) overrides all four.
  virtual bool device_memory() const { return false; }
  virtual void* allocate(std::size_t bytes);
  virtual void deallocate(void* p);
  virtual void copy_to_buffer(void* dst, const void* host, std::size_t bytes);
  virtual void copy_from_buffer(void* host, const void* src, std::size_t bytes);
};

// What `--impl kolo` is asked for: the collective (so --algo applies to the right Selector
// choice), the algorithm (auto or a name kolo's Selector knows) and the wire compression.
struct KoloConfig {
  Coll coll = Coll::allreduce;
  std::string algo = "auto";
  std::string compression = "none";
  bool shared_buffers = false;  // --buffers shared: Communicator::allocate (zero copy on a host)
};

// Factories; each throws Unavailable when its library was not found at build time.
// kolo over MeshTransport; the route (shm, tcp, routed) comes from KOLO_TRANSPORT.
std::unique_ptr<Impl> make_kolo_impl(const KoloConfig& cfg);
// kolo over MpiTransport (native: MpiNativeTransport, MPI's own collectives), under mpirun.
std::unique_ptr<Impl> make_kolo_mpi_impl(const KoloConfig& cfg, bool native);
std::unique_ptr<Impl> make_mpi_impl();
// ring_chunked: Gloo's old-style AllreduceRingChunked for allreduce, else the new-style API.
std::unique_ptr<Impl> make_gloo_impl(bool ring_chunked);
std::unique_ptr<Impl> make_nccl_impl();

}  // namespace kolo::bench
