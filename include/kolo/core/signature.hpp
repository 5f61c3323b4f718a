// kolo/core/signature.hpp — what a rank believes the current collective is.
//
// Every message carries the sender's Signature; the receiver compares it with its own. Ranks
// that called different collectives, or the same one with a different count, dtype, op or root,
// or in a different order, are caught on the first message they exchange — at no extra round
// trip — and the error names both sides: "rank 1 called allreduce #3 (999 x float32, sum) but
// rank 0 called allreduce #3 (1000 x float32, sum)".
#pragma once

#include <cstdint>
#include <string>

#include "kolo/core/dtype.hpp"

namespace kolo {

enum class Collective : std::uint8_t {
  none = 0,
  allreduce = 1,
  allgather = 2,
  allgatherv = 3,
  broadcast = 4,
  reduce_scatter = 5,
  alltoall = 6,
  barrier = 7,
  bootstrap = 8,
  user = 9,  // point-to-point messages sent by users of the transport directly
  reduce = 10,
  gather = 11,
  scatter = 12,
  alltoallv = 13,
  send_recv = 14,  // Communicator::send/recv: count, dtype and tag travel in the signature
  split = 15,
};

inline const char* collective_name(Collective c) noexcept {
  switch (c) {
    case Collective::none:
      return "none";
    case Collective::allreduce:
      return "allreduce";
    case Collective::allgather:
      return "allgather";
    case Collective::allgatherv:
      return "allgatherv";
    case Collective::broadcast:
      return "broadcast";
    case Collective::reduce_scatter:
      return "reduce_scatter";
    case Collective::alltoall:
      return "alltoall";
    case Collective::barrier:
      return "barrier";
    case Collective::bootstrap:
      return "bootstrap";
    case Collective::user:
      return "user message";
    case Collective::reduce:
      return "reduce";
    case Collective::gather:
      return "gather";
    case Collective::scatter:
      return "scatter";
    case Collective::alltoallv:
      return "alltoallv";
    case Collective::send_recv:
      return "send/recv";
    case Collective::split:
      return "split";
  }
  return "unknown";
}

struct Signature {
  Collective collective = Collective::none;
  DataType dtype = DataType::uint8;
  ReduceOp op = ReduceOp::sum;
  std::uint8_t reserved = 0;
  std::int32_t root = -1;
  std::uint64_t count = 0;  // elements per rank (or the rank's own count where they may differ)
  std::uint64_t seq = 0;    // this communicator's collective number: catches reordered calls
  std::uint64_t extra = 0;  // e.g. a hash of allgatherv's counts

  friend bool operator==(const Signature&, const Signature&) = default;

  std::string describe() const {
    std::string s = std::string(collective_name(collective)) + " #" + std::to_string(seq) + " (" +
                    std::to_string(count) + " x " + std::string(dtype_name(dtype));
    if (collective == Collective::allreduce || collective == Collective::reduce_scatter ||
        collective == Collective::reduce) {
      s += ", " + std::string(reduce_op_name(op));
    }
    if (root >= 0) s += ", root " + std::to_string(root);
    if (collective == Collective::allgatherv) s += ", counts hash " + std::to_string(extra);
    if (collective == Collective::send_recv) s += ", tag " + std::to_string(extra);
    return s + ")";
  }
};
static_assert(sizeof(Signature) == 32);

}  // namespace kolo
