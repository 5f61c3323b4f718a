// kolo/algorithm/allreduce_direct.hpp — the one-round ("one-shot") allreduce for small messages
// on a few ranks: every rank sends its whole input to every other rank and reduces the N inputs
// itself.
//
// One round of messages instead of recursive doubling's log2 p rounds plus, when N is not a power
// of two, its two fold steps. Cost, counting each of the N - 1 sends as a message of its own:
//   (N-1)·(α + S·β + S·γ)
// so the model takes it where recursive doubling needs more latency steps than N - 1: at N = 3
// (one exchange and two fold steps). Measured on the 2-core machine with more ranks than cores,
// in fresh runs of 20 allreduces of 8 B, its sends did not overlap: it was 1.7x faster than
// recursive doubling at N = 3, level at N = 4 and 5 and slower at N = 6 to 8. In long loops of
// small allreduces it pipelines across calls and was faster at N = 8 too (force it there:
// KOLO_ALLREDUCE=direct:0-512;auto:513-max).
//
// Every rank ends with bit-identical results: each reduces the same N inputs in rank order
// (x0 op x1 op ... op xN-1), whatever order the messages arrived in.
//
// Large messages run in rounds of at most one segment (KOLO_SEGMENT_BYTES) each, so the scratch
// it takes is at most N segments; the model never picks it there (its bytes term grows with N).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kolo/algorithm/allreduce_prologue.hpp"
#include "kolo/algorithm/cost_model.hpp"
#include "kolo/algorithm/entry.hpp"
#include "kolo/algorithm/options.hpp"
#include "kolo/core/reduce.hpp"
#include "kolo/transport/transport_ref.hpp"

namespace kolo {

inline void allreduce_direct(TransportRef t, const void* in, void* out, std::size_t count,
                             DataType dtype, ReduceOp op, std::vector<std::byte>& scratch,
                             const AlgoOptions& opt) {
  const auto f = allreduce_prologue(t, in, out, count, dtype, op);
  if (!f) return;
  const int n = f->n;
  const int r = f->r;
  const std::size_t es = f->es;
  const std::size_t bytes = f->bytes;
  const std::byte* src = f->src;
  std::byte* dst = f->dst;
  const ReduceSpec rs = f->rs;
  const bool in_place = src == dst;
  // One round per chunk of at most a segment (whole elements); a slot of scratch per rank. In
  // place, this rank's own input is copied into its slot: the reduction overwrites it.
  const std::size_t cap = std::max(es, std::min(bytes, std::max(opt.segment_bytes, es)) / es * es);
  const std::size_t need = static_cast<std::size_t>(n) * cap;
  if (scratch.size() < need) scratch.resize(need);
  auto slot = [&](int j) { return scratch.data() + static_cast<std::size_t>(j) * cap; };
  // The round's requests: on the stack for up to 8 ranks.
  using Request = TransportRef::Request;
  constexpr int kInline = 14;
  Request inline_reqs[kInline];
  std::vector<Request> heap;
  Request* reqs = inline_reqs;
  if (2 * (n - 1) > kInline) {
    heap.resize(2 * static_cast<std::size_t>(n - 1));
    reqs = heap.data();
  }
  for (std::size_t off = 0; off < bytes;) {
    const std::size_t len = std::min(cap, bytes - off);
    const std::byte* mine = src + off;
    // Receives first, then the sends in ring order (rank r+1 first), so that the first messages
    // of all ranks go to different peers.
    for (int k = 1; k < n; ++k) {
      const int p = (r + n - k) % n;
      reqs[k - 1] = t.irecv(p, slot(p), len, opt.sig);
    }
    for (int k = 1; k < n; ++k) {
      reqs[n - 2 + k] = t.isend((r + k) % n, mine, len, opt.sig);
    }
    if (in_place) std::memcpy(slot(r), mine, len);
    // Every send done before the result is written (in place, a send may still read `mine`).
    for (int k = 0; k < 2 * (n - 1); ++k) t.wait(reqs[k], opt.deadline);
    auto input = [&](int j) -> const std::byte* { return j == r && !in_place ? mine : slot(j); };
    std::byte* d = dst + off;
    const std::size_t m = len / es;
    rs.fn(d, input(0), input(1), m);
    for (int j = 2; j < n; ++j) rs.fn(d, d, input(j), m);
    off += len;
  }
  if (op == ReduceOp::average) finish_average(dst, count, dtype, n);
}

namespace cost {

// One round: every rank sends S to each of the N-1 others and reduces N inputs.
//   (N-1)·(α + S·β + S·γ), per round of at most one segment
inline double direct(int n, double S, LinkCost l, double gamma, std::size_t segment) {
  if (n <= 1) return 0;
  const double seg = static_cast<double>(std::max<std::size_t>(segment, 1));
  const double rounds = std::max(1.0, std::ceil(S / seg));
  return (n - 1) * (rounds * l.alpha + S * (l.beta + gamma));
}

}  // namespace cost

// The registry's entry. Every rank of a host sends across hosts, so the link is the contended
// one, and with more ranks than cores its byte terms take the exchange algorithms' factor, like
// recursive doubling's: each of its messages is read on another core. At two ranks it is
// recursive doubling's one exchange, which the model keeps (+infinity here); forced, it runs at
// any size and rank count.
inline AlgorithmEntry<AllreduceAlgorithm> direct_allreduce_algorithm() {
  AlgorithmEntry<AllreduceAlgorithm> e;
  e.name = "direct";
  e.aliases = {"one-shot"};
  e.cost = [](const CostQuery& q) {
    if (q.n <= 2) return std::numeric_limits<double>::infinity();
    return cost::direct(q.n, q.bytes, q.exchange_link(), q.gamma * q.exchange_factor(),
                        q.segment_bytes);
  };
  e.run = [](TransportRef t, const AllreduceArgs& a, const AlgoOptions& o, const AlgoContext& ctx) {
    std::vector<std::byte> local;
    allreduce_direct(t, a.in, a.out, a.count, a.dtype, a.op,
                     ctx.scratch != nullptr ? *ctx.scratch : local, o);
  };
  return e;
}

}  // namespace kolo
