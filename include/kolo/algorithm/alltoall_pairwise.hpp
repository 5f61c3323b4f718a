// kolo/algorithm/alltoall_pairwise.hpp — alltoall by direct exchange: block j of rank i's input
// becomes block i of rank j's output.
//
// Every send and receive is posted at once; the transport progresses them together, so all
// n-1 peers transfer in parallel (shared memory channels and sockets are independent). Ordering
// by distance (r+s, r-s) spreads the load when the transport serialises. Cost: (n-1)·α +
// (n-1)/n·S·β.
#pragma once

#include <cstring>
#include <vector>

#include "kolo/algorithm/entry.hpp"
#include "kolo/algorithm/options.hpp"
#include "kolo/transport/transport_ref.hpp"

namespace kolo {

inline void alltoall_pairwise(TransportRef t, const void* in, void* out, std::size_t block_bytes,
                              const AlgoOptions& opt) {
  const int n = t.size();
  const int r = t.rank();
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(out);
  auto blk = [&](int b) { return static_cast<std::size_t>(b) * block_bytes; };
  if (src + blk(r) != dst + blk(r)) std::memmove(dst + blk(r), src + blk(r), block_bytes);
  std::vector<TransportRef::Request> reqs;
  reqs.reserve(static_cast<std::size_t>(2 * n));
  for (int s = 1; s < n; ++s) {
    const int from = mod(r - s, n);
    reqs.push_back(t.irecv(from, dst + blk(from), block_bytes, opt.sig));
  }
  for (int s = 1; s < n; ++s) {
    const int to = mod(r + s, n);
    reqs.push_back(t.isend(to, src + blk(to), block_bytes, opt.sig));
  }
  for (auto& q : reqs) t.wait(q, opt.deadline);
}

namespace cost {

// Pairwise alltoall: n-1 messages of S/n bytes out and in, all posted at once (S: the input).
//   (n-1)·α + (n-1)/n·S·β
inline double pairwise_alltoall(int n, double S, LinkCost l) {
  if (n <= 1) return 0;
  return (n - 1) * l.alpha + static_cast<double>(n - 1) / n * S * l.beta;
}

}  // namespace cost

// The registry's entry.
inline AlgorithmEntry<AlltoallAlgorithm> pairwise_alltoall_algorithm() {
  AlgorithmEntry<AlltoallAlgorithm> e;
  e.name = "pairwise";
  e.aliases = {"direct"};
  e.cost = [](const CostQuery& q) { return cost::pairwise_alltoall(q.n, q.bytes, q.contended()); };
  e.run = [](TransportRef t, const AlltoallArgs& a, const AlgoOptions& o, const AlgoContext&) {
    alltoall_pairwise(t, a.in, a.out, a.block_bytes, o);
  };
  return e;
}

}  // namespace kolo
