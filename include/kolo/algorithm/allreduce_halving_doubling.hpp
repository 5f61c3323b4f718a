// kolo/algorithm/allreduce_halving_doubling.hpp — Rabenseifner's allreduce: reduce-scatter by
// recursive halving, then allgather by recursive doubling (Thakur, Rabenseifner & Gropp 2005,
// §4.1; Rabenseifner 2004).
//
// With p = 2^k ranks the data is cut into p blocks. In halving round m = p/2, p/4, ..., 1 a rank
// exchanges half of its current window of blocks with the rank whose index differs in bit m:
// it sends the half the partner keeps and folds the partner's copy of its own half in. After
// log2(p) rounds rank v holds block v fully reduced; the doubling rounds then run the same
// exchanges backwards, each rank sending everything it has. Cost:
//     2·log2(p)·α + 2·(p-1)/p·S·β + (p-1)/p·S·γ
// — the ring's bandwidth with log2(p) instead of p-1 latency steps; its messages shrink
// geometrically, so it wins at medium sizes and ties the ring at large ones.
//
// Any rank count: with n = p + rem, the first 2·rem ranks pair up (MPICH's choice): the even rank
// of a pair hands its whole vector to the odd one and sits out, and gets the result back at the
// end: + (α + S·β + S·γ) before and + (α + S·β) after. Any element count: blocks differ by at
// most one element, and an empty block's exchange is skipped on both ends (both compute the same
// sizes), so counts below p cost only the rounds that carry data.
//
// Bit-identical on every rank: each block is completed by exactly one rank (its owner in the
// last halving round) and only copied afterwards; ReduceOp::average is the owner's single
// division of its block (count/p divisions per rank).
#pragma once

#include <cstring>

#include "kolo/algorithm/allreduce_prologue.hpp"
#include "kolo/algorithm/entry.hpp"
#include "kolo/algorithm/options.hpp"
#include "kolo/core/reduce.hpp"
#include "kolo/transport/transport_ref.hpp"

namespace kolo {

inline void allreduce_halving_doubling(TransportRef t, const void* in, void* out, std::size_t count,
                                       DataType dtype, ReduceOp op, const AlgoOptions& opt) {
  const auto f = allreduce_prologue(t, in, out, count, dtype, op);
  if (!f) return;
  const int n = f->n;
  const int r = f->r;
  const std::size_t es = f->es;
  const std::size_t bytes = f->bytes;
  const std::byte* src = f->src;
  std::byte* dst = f->dst;
  const ReduceSpec rs = f->rs;
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int rem = n - p;

  // `cur` holds this rank's partial result: the input until the first reduction lands in out.
  const std::byte* cur = src;
  int vrank;
  if (r < 2 * rem) {
    if (r % 2 == 0) {  // hand everything to r+1, sit out, receive the result
      auto sq = t.isend(r + 1, src, bytes, opt.sig);
      auto rq = t.irecv(r + 1, dst, bytes, opt.sig);
      t.wait(sq, opt.deadline);
      t.wait(rq, opt.deadline);
      return;
    }
    auto rq = t.irecv_reduce(r - 1, dst, src, bytes, rs, opt.sig);
    t.wait(rq, opt.deadline);
    cur = dst;
    vrank = r / 2;
  } else {
    vrank = r - rem;
  }
  auto real = [&](int v) { return v < rem ? 2 * v + 1 : v + rem; };
  auto block_begin = [&](int b) { return even_block(count, p, b).begin * es; };  // b may be p

  // Reduce-scatter by recursive halving. The window [lo, lo + 2m) of blocks is split at lo + m;
  // the rank with bit m clear keeps the lower half.
  int lo = 0;
  for (int m = p / 2; m >= 1; m /= 2) {
    const int partner = real(vrank ^ m);
    const bool keep_low = (vrank & m) == 0;
    const int keep_lo = keep_low ? lo : lo + m;
    const int send_lo = keep_low ? lo + m : lo;
    const std::size_t kb = block_begin(keep_lo), ke = block_begin(keep_lo + m);
    const std::size_t sb = block_begin(send_lo), se = block_begin(send_lo + m);
    TransportRef::Request sq{}, rq{};
    // Sizes agree on both ends: our send window is the partner's keep window and vice versa.
    if (se > sb) sq = t.isend(partner, cur + sb, se - sb, opt.sig);
    if (ke > kb) rq = t.irecv_reduce(partner, dst + kb, cur + kb, ke - kb, rs, opt.sig);
    if (ke > kb) t.wait(rq, opt.deadline);
    if (se > sb) t.wait(sq, opt.deadline);
    // The sent half is the partner's now; the kept half is complete in out, and later rounds
    // read only inside it.
    cur = dst;
    lo = keep_lo;
  }
  // Block vrank is complete here, and only here.
  if (op == ReduceOp::average) {
    const BlockRange own = even_block(count, p, vrank);
    finish_average(dst + own.begin * es, own.count, dtype, n);
  }

  // Allgather by recursive doubling: the window doubles each round.
  for (int m = 1; m < p; m *= 2) {
    const int partner = real(vrank ^ m);
    const int mine_lo = vrank / m * m;  // our window: m blocks starting here
    const int theirs_lo = (vrank ^ m) / m * m;
    const std::size_t mb = block_begin(mine_lo), me = block_begin(mine_lo + m);
    const std::size_t tb = block_begin(theirs_lo), te = block_begin(theirs_lo + m);
    TransportRef::Request sq{}, rq{};
    if (me > mb) sq = t.isend(partner, dst + mb, me - mb, opt.sig);
    if (te > tb) rq = t.irecv(partner, dst + tb, te - tb, opt.sig);
    if (te > tb) t.wait(rq, opt.deadline);
    if (me > mb) t.wait(sq, opt.deadline);
  }
  if (r < 2 * rem) {  // the odd rank of a pair returns the result to its even partner
    auto sq = t.isend(r - 1, dst, bytes, opt.sig);
    t.wait(sq, opt.deadline);
  }
}

namespace cost {

// Rabenseifner: recursive halving reduce-scatter + recursive doubling allgather.
//   2·log2(p)·α + 2(p-1)/p·S·β + (p-1)/p·S·γ [+ fold]
inline double halving_doubling(int n, double S, LinkCost l, double gamma) {
  if (n <= 1) return 0;
  const int p = floor_pow2(n);
  const double f = static_cast<double>(p - 1) / p;
  return 2.0 * log2_floor(n) * l.alpha + 2.0 * f * S * l.beta + f * S * gamma +
         non_pow2_fold(n, S, l, gamma);
}

}  // namespace cost

// The registry's entry. A pairwise exchange: its byte terms take the oversubscription factor.
inline AlgorithmEntry<AllreduceAlgorithm> halving_doubling_allreduce_algorithm() {
  AlgorithmEntry<AllreduceAlgorithm> e;
  e.name = "halving-doubling";
  e.aliases = {"rabenseifner"};
  e.cost = [](const CostQuery& q) {
    return cost::halving_doubling(q.n, q.bytes, q.exchange_link(), q.gamma * q.exchange_factor());
  };
  e.run = [](TransportRef t, const AllreduceArgs& a, const AlgoOptions& o, const AlgoContext&) {
    allreduce_halving_doubling(t, a.in, a.out, a.count, a.dtype, a.op, o);
  };
  return e;
}

}  // namespace kolo
