// kolo/algorithm/allreduce_recursive_doubling.hpp — latency-optimal allreduce for small
// messages (Thakur, Rabenseifner & Gropp 2005, §4.1).
//
// In round k every rank exchanges its whole partial result with the rank whose (virtual) index
// differs in bit k and folds it in: ceil(log2 n) rounds instead of the ring's 2(n-1), at the price
// of sending the whole buffer each round. Cost: log2(p)·(α + S·β + S·γ) (+2 steps when n is not a
// power of two: the first 2·rem ranks pair up so that a power of two p = n - rem remains; even
// ranks hand their data to their odd neighbour and get the result back at the end).
//
// Every rank ends with bit-identical results: each round both partners combine the same two
// values, and the ops are commutative in IEEE arithmetic (a+b == b+a exactly), so no rank's
// rounding differs from another's — what data-parallel training needs.
#pragma once

#include <cstring>
#include <vector>

#include "kolo/algorithm/allreduce_prologue.hpp"
#include "kolo/algorithm/entry.hpp"
#include "kolo/algorithm/options.hpp"
#include "kolo/core/reduce.hpp"
#include "kolo/transport/transport_ref.hpp"

namespace kolo {

inline void allreduce_recursive_doubling(TransportRef t, const void* in, void* out,
                                         std::size_t count, DataType dtype, ReduceOp op,
                                         std::vector<std::byte>& scratch, const AlgoOptions& opt) {
  const auto f = allreduce_prologue(t, in, out, count, dtype, op);
  if (!f) return;
  const int n = f->n;
  const int r = f->r;
  const std::size_t bytes = f->bytes;
  const std::byte* src = f->src;
  std::byte* dst = f->dst;
  const ReduceSpec rs = f->rs;
  if (scratch.size() < bytes) scratch.resize(bytes);
  // Two buffers alternate: a round sends `cur` and folds the partner's data into `next`, so a
  // send still reading `cur` never races the reduction writing `next`. In place (src == dst)
  // the first round must fold into the spare buffer: a send larger than the transport's
  // buffering is still reading `cur` while the partner's data arrives.
  std::byte* spare = scratch.data();
  const std::byte* cur = src;
  std::byte* next = src == dst ? spare : dst;
  auto exchange = [&](int partner) {
    auto sq = t.isend(partner, cur, bytes, opt.sig);
    auto rq = t.irecv_reduce(partner, next, cur, bytes, rs, opt.sig);
    t.wait(rq, opt.deadline);
    t.wait(sq, opt.deadline);
    cur = next;
    next = (next == dst) ? spare : dst;
  };

  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int rem = n - p;
  int vrank;
  if (r < 2 * rem) {
    if (r % 2 == 0) {  // hand our data to r+1, sit out, get the result back at the end
      auto sq = t.isend(r + 1, src, bytes, opt.sig);
      t.wait(sq, opt.deadline);
      auto rq = t.irecv(r + 1, dst, bytes, opt.sig);
      t.wait(rq, opt.deadline);
      return;  // the sender already divided for average
    }
    auto rq = t.irecv_reduce(r - 1, next, cur, bytes, rs, opt.sig);  // fold the even rank in
    t.wait(rq, opt.deadline);
    cur = next;
    next = (next == dst) ? spare : dst;
    vrank = r / 2;
  } else {
    vrank = r - rem;
  }
  for (int mask = 1; mask < p; mask <<= 1) {
    const int vpartner = vrank ^ mask;
    exchange(vpartner < rem ? vpartner * 2 + 1 : vpartner + rem);
  }
  if (cur != dst) std::memcpy(dst, cur, bytes);
  if (op == ReduceOp::average) finish_average(dst, count, dtype, n);
  if (r < 2 * rem) {  // odd partner returns the result to the even rank that sat out
    auto sq = t.isend(r - 1, dst, bytes, opt.sig);
    t.wait(sq, opt.deadline);
  }
}

namespace cost {

// Recursive doubling: log2(p) rounds exchanging everything.
//   log2(p)·(α + S·β + S·γ) [+ fold]
inline double recursive_doubling(int n, double S, LinkCost l, double gamma) {
  if (n <= 1) return 0;
  return log2_floor(n) * (l.alpha + S * l.beta + S * gamma) + non_pow2_fold(n, S, l, gamma);
}

}  // namespace cost

// The registry's entry. A pairwise exchange: its byte terms take the oversubscription factor.
inline AlgorithmEntry<AllreduceAlgorithm> recursive_doubling_allreduce_algorithm() {
  AlgorithmEntry<AllreduceAlgorithm> e;
  e.name = "recursive-doubling";
  e.cost = [](const CostQuery& q) {
    return cost::recursive_doubling(q.n, q.bytes, q.exchange_link(), q.gamma * q.exchange_factor());
  };
  e.run = [](TransportRef t, const AllreduceArgs& a, const AlgoOptions& o, const AlgoContext& ctx) {
    std::vector<std::byte> local;
    allreduce_recursive_doubling(t, a.in, a.out, a.count, a.dtype, a.op,
                                 ctx.scratch != nullptr ? *ctx.scratch : local, o);
  };
  return e;
}

}  // namespace kolo
