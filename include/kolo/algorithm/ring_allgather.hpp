// kolo/algorithm/ring_allgather.hpp — ring allgather and allgatherv: every rank ends with the
// concatenation of all ranks' inputs, in rank order.
//
// At stage t a rank forwards block r-t and receives block r-t-1, so after n-1 stages it has
// them all; blocks may differ in size (allgatherv) because the right neighbour receives at
// stage t exactly the block this rank sends at stage t. Cost: (n-1)·α + (n-1)/n·S·β.
#pragma once

#include <cstring>
#include <span>
#include <vector>

#include "kolo/algorithm/entry.hpp"
#include "kolo/algorithm/options.hpp"
#include "kolo/algorithm/ring_pipeline.hpp"
#include "kolo/transport/transport_ref.hpp"

namespace kolo {

// counts[i]: elements contributed by rank i; out holds sum(counts) elements.
inline void allgatherv_ring(TransportRef t, const void* in, void* out,
                            std::span<const std::size_t> counts, std::size_t elem_size,
                            const AlgoOptions& opt) {
  const int n = t.size();
  const int r = t.rank();
  std::vector<std::size_t> offset(static_cast<std::size_t>(n) + 1, 0);
  for (int i = 0; i < n; ++i)
    offset[static_cast<std::size_t>(i) + 1] =
        offset[static_cast<std::size_t>(i)] + counts[static_cast<std::size_t>(i)];
  auto* dst = static_cast<std::byte*>(out);
  const auto* src = static_cast<const std::byte*>(in);
  auto at = [&](int b) { return dst + offset[static_cast<std::size_t>(b)] * elem_size; };
  auto bytes = [&](int b) { return counts[static_cast<std::size_t>(b)] * elem_size; };
  // Our own block: in place when the caller already put it there.
  if (at(r) != src && bytes(r) > 0) std::memmove(at(r), src, bytes(r));
  if (n == 1 || offset.back() == 0) return;
  std::vector<RingStage> stages;
  for (int s = 0; s < n - 1; ++s) {
    const int sb = mod(r - s, n), rb = mod(r - s - 1, n);
    stages.push_back({s == 0 ? src : at(sb), bytes(sb), at(rb), nullptr, bytes(rb)});
  }
  run_ring(t, stages, ReduceSpec{nullptr, elem_size}, opt);
}

inline void allgather_ring(TransportRef t, const void* in, void* out, std::size_t count,
                           std::size_t elem_size, const AlgoOptions& opt) {
  std::vector<std::size_t> counts(static_cast<std::size_t>(t.size()), count);
  allgatherv_ring(t, in, out, counts, elem_size, opt);
}

namespace cost {

// Ring allgather: n-1 steps of S/n bytes (S: the whole result).
//   (n-1)·α + (n-1)/n·S·β
inline double ring_allgather(int n, double S, LinkCost l) {
  if (n <= 1) return 0;
  return (n - 1) * l.alpha + static_cast<double>(n - 1) / n * S * l.beta;
}

}  // namespace cost

// The registry's entry (allgather and allgatherv).
inline AlgorithmEntry<AllgatherAlgorithm> ring_allgather_algorithm() {
  AlgorithmEntry<AllgatherAlgorithm> e;
  e.name = "ring";
  e.cost = [](const CostQuery& q) { return cost::ring_allgather(q.n, q.bytes, q.link); };
  e.run = [](TransportRef t, const AllgatherArgs& a, const AlgoOptions& o, const AlgoContext&) {
    allgatherv_ring(t, a.in, a.out, a.counts, a.elem_size, o);
  };
  return e;
}

}  // namespace kolo
