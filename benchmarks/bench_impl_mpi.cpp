// bench_impl_mpi.cpp — kolo-bench's `--impl mpi`: the MPI collectives (Open MPI here), run as
//   mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np N kolo-bench --impl mpi
//
// Built only when find_package(MPI) finds a C++-capable MPI (KOLO_BENCH_HAVE_MPI). MPI has no
// 16-bit float types: float16/bfloat16 travel as 2-byte contiguous types reduced by a user
// operation that calls kolo's kernel, which is what a framework on MPI has to do too. MPI has
// no average either: it is a sum followed by one division pass (Horovod's way), timed.
#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include <kolo/core/reduce.hpp>

#include "bench_impl.hpp"

namespace kolo::bench {

namespace {

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw std::runtime_error(std::string(what) + " failed: " + std::string(msg, len));
}

// The user operations learn their element type only from the MPI datatype handle.
MPI_Datatype g_float16 = MPI_DATATYPE_NULL;
MPI_Datatype g_bfloat16 = MPI_DATATYPE_NULL;

template <ReduceOp Op>
void half_op(void* in, void* inout, int* len, MPI_Datatype* type) {
  const DataType t = *type == g_bfloat16 ? DataType::bfloat16 : DataType::float16;
  reduce(inout, inout, in, static_cast<std::size_t>(*len), t, Op);
}

class MpiImpl final : public Impl {
 public:
  MpiImpl() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) check(MPI_Init(nullptr, nullptr), "MPI_Init");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    check(MPI_Type_contiguous(2, MPI_BYTE, &g_float16), "MPI_Type_contiguous");
    check(MPI_Type_contiguous(2, MPI_BYTE, &g_bfloat16), "MPI_Type_contiguous");
    MPI_Type_commit(&g_float16);
    MPI_Type_commit(&g_bfloat16);
    MPI_Op_create(&half_op<ReduceOp::sum>, 1, &half_ops_[0]);
    MPI_Op_create(&half_op<ReduceOp::product>, 1, &half_ops_[1]);
    MPI_Op_create(&half_op<ReduceOp::min>, 1, &half_ops_[2]);
    MPI_Op_create(&half_op<ReduceOp::max>, 1, &half_ops_[3]);
  }

  ~MpiImpl() override {
    for (MPI_Op& op : half_ops_) MPI_Op_free(&op);
    MPI_Type_free(&g_float16);
    MPI_Type_free(&g_bfloat16);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::vector<std::string> describe() const override {
    char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string v(version, static_cast<std::size_t>(len));
    if (auto nl = v.find_first_of("\r\n"); nl != std::string::npos) v.resize(nl);
    const char* btl = std::getenv("OMPI_MCA_btl");
    return {
        "impl: mpi, " + v,
        std::string("transport: MPI's choice; OMPI_MCA_btl=") + (btl ? btl : "(unset: default)"),
        "algorithm: MPI's choice (Open MPI tuned collectives); average = MPI_SUM + one division "
        "pass; float16/bfloat16 = 2-byte types with a user op (kolo's kernel)",
    };
  }

  std::optional<std::string> unsupported(const OpSpec&, bool) const override {
    return std::nullopt;
  }

  BoundOp bind(const OpSpec& s, void* in, void* out, bool in_place) override {
    const MPI_Datatype type = mpi_type(s.dtype);
    const MPI_Op op = mpi_op(s.dtype, s.op);
    const int n = size_;
    const bool avg = s.op == ReduceOp::average;
    const int count = static_cast<int>(s.count);
    const int block = static_cast<int>(s.count / static_cast<std::size_t>(n));
    const void* send = in_place ? MPI_IN_PLACE : in;
    switch (s.coll) {
      case Coll::allreduce:
        return {[=] {
                  check(MPI_Allreduce(send, out, count, type, op, MPI_COMM_WORLD), "MPI_Allreduce");
                  if (avg) finish_average(out, s.count, s.dtype, n);
                },
                out};
      case Coll::allgather:
        return {[=] {
                  check(MPI_Allgather(send, block, type, out, block, type, MPI_COMM_WORLD),
                        "MPI_Allgather");
                },
                out};
      case Coll::broadcast: {
        // MPI_Bcast is in place; out-of-place = the root's copy first (timed), as for kolo.
        const std::size_t bytes = s.count * dtype_size(s.dtype);
        const bool copy = !in_place && rank_ == s.root;
        const int root = s.root;
        return {[=] {
                  if (copy) std::memcpy(out, in, bytes);
                  check(MPI_Bcast(out, count, type, root, MPI_COMM_WORLD), "MPI_Bcast");
                },
                out};
      }
      case Coll::reduce_scatter: {
        // In place, MPI reads the whole input from the receive buffer and leaves this rank's
        // block at its start (not at rank * block, where NCCL puts it).
        void* recv = in_place ? in : out;
        return {[=] {
                  check(MPI_Reduce_scatter_block(send, recv, block, type, op, MPI_COMM_WORLD),
                        "MPI_Reduce_scatter_block");
                  if (avg) finish_average(recv, static_cast<std::size_t>(block), s.dtype, n);
                },
                recv};
      }
      case Coll::alltoall:
        return {[=] {
                  check(MPI_Alltoall(send, block, type, out, block, type, MPI_COMM_WORLD),
                        "MPI_Alltoall");
                },
                out};
    }
    throw std::logic_error("unknown collective");
  }

  double sum_over_ranks(double v) override {
    double r = 0;
    check(MPI_Allreduce(&v, &r, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
    return r;
  }

  void barrier() override { check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

 private:
  static MPI_Datatype mpi_type(DataType t) {
    switch (t) {
      case DataType::float16:
        return g_float16;
      case DataType::bfloat16:
        return g_bfloat16;
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
    throw std::logic_error("unknown data type");
  }

  MPI_Op mpi_op(DataType t, ReduceOp op) const {
    const bool half = t == DataType::float16 || t == DataType::bfloat16;
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::average:
        return half ? half_ops_[0] : MPI_SUM;
      case ReduceOp::product:
        return half ? half_ops_[1] : MPI_PROD;
      case ReduceOp::min:
        return half ? half_ops_[2] : MPI_MIN;
      case ReduceOp::max:
        return half ? half_ops_[3] : MPI_MAX;
    }
    throw std::logic_error("unknown reduce op");
  }

  int rank_ = 0;
  int size_ = 1;
  MPI_Op half_ops_[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
};

}  // namespace

std::unique_ptr<Impl> make_mpi_impl() {
  return std::make_unique<MpiImpl>();
}

}  // namespace kolo::bench
