// kolo/transport/mpi/native.hpp — MPI's own collectives for kolo: MpiNativeTransport's
// native_<collective>() (MPI_Iallreduce and friends on kolo-owned copies, with deadlines; or the
// blocking calls in place), the signature check before each, and the MPI types and operations
// for kolo's DataType and ReduceOp. Design: transport/mpi.hpp.
#pragma once

#include <climits>
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kolo/transport/mpi/transport.hpp"

namespace kolo {

namespace detail::mpi {

// The MPI type of a kolo DataType (the 16-bit floats: kolo's 2-byte contiguous types).
inline MPI_Datatype datatype_of(DataType d) {
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

// The MPI operation of a ReduceOp for a DataType (the 16-bit floats: kolo's user operations).
inline MPI_Op op_of(DataType d, ReduceOp op) {
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

}  // namespace detail::mpi

inline void MpiTransport::check_signatures(const AlgoOptions& o) {
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
        return MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, table, sizeof(Signature), MPI_BYTE,
                             comm_);
      });
  for (int q = 1; q < size_; ++q) {
    const Signature& s = table[q];
    if (s != table[0]) {
      fail(MismatchError("collective mismatch: rank " + std::to_string(q) + " called " +
                         s.describe() + " but rank 0 called " + table[0].describe() +
                         " (native MPI collectives; seen by rank " + std::to_string(rank_) + ")"));
    }
  }
}

template <class Start, class Blocking>
void MpiTransport::native(const char* what, const AlgoOptions& o, Start&& start,
                          Blocking&& blocking) {
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
    const MPI_Datatype t = detail::mpi::datatype_of(d);
    const MPI_Op mop = detail::mpi::op_of(d, op);
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
    const MPI_Datatype t = detail::mpi::datatype_of(d);
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
    const MPI_Datatype t = detail::mpi::datatype_of(d);
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
    const MPI_Datatype t = detail::mpi::datatype_of(d);
    const MPI_Op mop = detail::mpi::op_of(d, op);
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
    const MPI_Datatype t = detail::mpi::datatype_of(d);
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
