// kolo/algorithm/ring_reduce_scatter.hpp — ring reduce-scatter: rank r ends with block r of the
// elementwise reduction, blocks of equal size `count` (the input holds n·count elements).
//
// The schedule is the first half of ring allreduce shifted by one block so that the block a
// rank finishes is its own: at stage t send block r-t-1, receive block r-t-2. Partial sums
// travel through a scratch buffer (the input stays untouched, the output holds one block);
// the last reduction writes straight into the output. Cost: (n-1)·α + (n-1)/n·S·β + (n-1)/n·S·γ.
#pragma once

#include <cstring>
#include <vector>

#include "kolo/algorithm/entry.hpp"
#include "kolo/algorithm/options.hpp"
#include "kolo/algorithm/ring_pipeline.hpp"
#include "kolo/core/reduce.hpp"
#include "kolo/transport/transport_ref.hpp"

namespace kolo {

inline void reduce_scatter_ring(TransportRef t, const void* in, void* out, std::size_t count,
                                DataType dtype, ReduceOp op, std::vector<std::byte>& scratch,
                                const AlgoOptions& opt) {
  const int n = t.size();
  const int r = t.rank();
  const std::size_t es = dtype_size(dtype);
  const std::size_t block_bytes = count * es;
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(out);
  if (count == 0) return;
  if (n == 1) {
    if (src != dst) std::memmove(dst, src, block_bytes);
    return;
  }
  if (scratch.size() < block_bytes * static_cast<std::size_t>(n)) {
    scratch.resize(block_bytes * static_cast<std::size_t>(n));
  }
  std::byte* tmp = scratch.data();
  const ReduceSpec rs{reduce_function(dtype, op), es};
  std::vector<RingStage> stages;
  for (int s = 0; s < n - 1; ++s) {
    const auto sb = static_cast<std::size_t>(mod(r - s - 1, n));
    const auto rb = static_cast<std::size_t>(mod(r - s - 2, n));
    const bool last = s == n - 2;
    stages.push_back({(s == 0 ? src : tmp) + sb * block_bytes, block_bytes,
                      last ? dst : tmp + rb * block_bytes, src + rb * block_bytes, block_bytes});
  }
  run_ring(t, stages, rs, opt);
  if (op == ReduceOp::average) finish_average(dst, count, dtype, n);
}

namespace cost {

// Ring reduce-scatter: n-1 steps of S/n bytes (S: the whole input), each folded in.
//   (n-1)·α + (n-1)/n·S·β + (n-1)/n·S·γ
inline double ring_reduce_scatter(int n, double S, LinkCost l, double gamma) {
  if (n <= 1) return 0;
  const double f = static_cast<double>(n - 1) / n;
  return (n - 1) * l.alpha + f * S * l.beta + f * S * gamma;
}

}  // namespace cost

// The registry's entry.
inline AlgorithmEntry<ReduceScatterAlgorithm> ring_reduce_scatter_algorithm() {
  AlgorithmEntry<ReduceScatterAlgorithm> e;
  e.name = "ring";
  e.cost = [](const CostQuery& q) {
    return cost::ring_reduce_scatter(q.n, q.bytes, q.link, q.gamma);
  };
  e.run = [](TransportRef t, const ReduceScatterArgs& a, const AlgoOptions& o,
             const AlgoContext& ctx) {
    std::vector<std::byte> local;
    reduce_scatter_ring(t, a.in, a.out, a.count, a.dtype, a.op,
                        ctx.scratch != nullptr ? *ctx.scratch : local, o);
  };
  return e;
}

}  // namespace kolo
