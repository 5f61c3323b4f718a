// kolo/engine/detail/batch_plan.hpp — the batch plan: a pure function from a cycle's responses
// to the collectives that run them (fused allreduce batches up to the threshold, a group
// whole, allgathers and broadcasts alone), and from a batch's parameters to its path (device,
// compressed, one rank, one tensor, in pieces, through the fusion buffer). The same inputs on
// every rank give the same plan, so every rank runs the same collectives.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kolo/core/reduce.hpp"
#include "kolo/engine/detail/records.hpp"

namespace kolo::detail::engine {

// One collective of a cycle: members[begin, end) of its plan, indices into the responses.
struct Batch {
  OpKind kind = OpKind::allreduce;
  std::size_t begin = 0, end = 0;
  std::size_t bytes = 0;  // allreduce: the tensors' own bytes
};

// A cycle's batches in the order they run. Reused from cycle to cycle (no allocation once a
// step's size has been seen).
struct BatchPlan {
  std::vector<Batch> batches;
  std::vector<std::size_t> members;
  std::vector<std::uint8_t> done;  // scratch: responses already in a batch

  std::span<const std::size_t> of(const Batch& b) const {
    return std::span<const std::size_t>(members).subspan(b.begin, b.end - b.begin);
  }
};

// Plans `rs`: skipping responses with an error (they need no collective), each allgather and
// broadcast alone, and for each allreduce in order the later ones of the same dtype, op,
// scaling and device, up to `threshold` bytes (the first always; a group's members always).
inline void plan_batches(const std::vector<Response>& rs, std::size_t threshold, BatchPlan& plan) {
  plan.batches.clear();
  plan.members.clear();
  plan.done.assign(rs.size(), 0);
  for (std::size_t i = 0; i < rs.size(); ++i) {
    if (plan.done[i] || !rs[i].error().empty()) continue;
    const RequestParams& rp = *rs[i].p;
    Batch b;
    b.kind = rp.kind;
    b.begin = plan.members.size();
    if (rp.kind != OpKind::allreduce) {
      plan.members.push_back(i);
      plan.done[i] = 1;
    } else {
      for (std::size_t j = i; j < rs.size(); ++j) {
        if (plan.done[j]) continue;
        const Response& q = rs[j];
        const RequestParams& qp = *q.p;
        if (qp.kind != OpKind::allreduce || !q.error().empty()) continue;
        if (qp.dtype != rp.dtype || qp.op != rp.op || qp.prescale != rp.prescale ||
            qp.postscale != rp.postscale || qp.device != rp.device) {
          continue;
        }
        const std::size_t bytes = qp.count * dtype_size(qp.dtype);
        const bool same_group = !rp.group.empty() && qp.group == rp.group;
        if (j != i && !same_group && b.bytes + bytes > threshold) continue;
        plan.members.push_back(j);
        b.bytes += bytes;
        plan.done[j] = 1;
      }
    }
    b.end = plan.members.size();
    plan.batches.push_back(b);
  }
}

// What an allreduce batch's path depends on besides its parameters: the same on every rank.
struct PathInputs {
  int size = 1;                // ranks
  int active = 1;              // ranks that have not joined
  bool compression = false;    // KOLO_COMPRESSION is on
  bool vectored = false;       // the transport has vectored messages (VectoredP2P)
  bool fusion_pieces = false;  // EngineOptions::fusion_pieces
};

// How a batch travels.
enum class Path : std::uint8_t {
  device,      // device tensors: the transport's pack/unpack kernels
  compressed,  // float32 on a 16-bit wire
  alone,       // one rank: each output its own input, scaled
  single,      // one tensor: the collective on its own memory
  pieces,      // fused in pieces (allreduce_coalesced), no fusion buffer
  fused,       // the fusion buffer (or the tensors' own memory when they lie back to back)
};

// What an average divides by: the ranks, or (join_average = active_ranks) those not joined.
inline int divisor_of(const RequestParams& p, const PathInputs& in) {
  return p.op != ReduceOp::average                     ? 1
         : p.join_average == JoinAverage::active_ranks ? in.active
                                                       : in.size;
}

// Whether a batch of these parameters converts float32 to the 16-bit wire.
inline bool compresses(const RequestParams& p, bool compression) {
  return compression && p.dtype == DataType::float32 &&
         (p.op == ReduceOp::sum || p.op == ReduceOp::average);
}

// Whether a fused batch of these parameters travels in pieces (allreduce_coalesced), with no
// fusion buffer: a host allreduce on a transport with vectored messages, unscaled (an average
// divided by all ranks, as the collective divides), uncompressed, with every rank's tensors
// (none joined). Every input of this choice is the same on every rank, so all ranks take it.
//
// Also where the shared fusion buffer would take the zero-copy path (one host, no more ranks
// than cores): packing half the batch, reading the peers' halves in place and unpacking
// measured slower than the pieces once the reduction kernel ran at full speed (N = 2, 1024 x
// 4 KiB: 342-415 us against 282-288; 16 x 4 MiB: 13.0-14.0 ms against 6.3-6.6;
// docs/performance.md). A tensor in a Buffer is still read in place by a collective of its
// own, and scaled or compressed batches still go through the shared fusion buffer.
inline bool in_pieces(const RequestParams& p, int divisor, const PathInputs& in) {
  if (!in.vectored) return false;
  return in.fusion_pieces && in.size > 1 && in.active == in.size && p.device == 0 &&
         p.prescale == 1.0 && p.postscale == 1.0 && !compresses(p, in.compression) &&
         (p.op != ReduceOp::average || divisor == in.size);
}

// The path of an allreduce batch of `tensors` tensors with parameters `p` (the first
// member's). `alone_ok`: false once the one-rank path declined (an invalid dtype or op, or a
// joined rank's zeros), so that the collective names the problem.
inline Path allreduce_path(const RequestParams& p, std::size_t tensors, const PathInputs& in,
                           bool alone_ok = true) {
  const int divisor = divisor_of(p, in);
  if (p.device != 0) return Path::device;
  if (compresses(p, in.compression)) return Path::compressed;
  if (alone_ok && in.size == 1 && divisor == 1) return Path::alone;
  if (tensors == 1) return Path::single;
  if (in_pieces(p, divisor, in)) return Path::pieces;
  return Path::fused;
}

}  // namespace kolo::detail::engine
