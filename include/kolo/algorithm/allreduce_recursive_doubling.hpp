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

#include "kolo/algorithm/options.hpp"
#include "kolo/core/reduce.hpp"
#include "kolo/transport/transport.hpp"

namespace kolo {

template <Transport T>
void allreduce_recursive_doubling(T& t, const void* in, void* out, std::size_t count,
                                  DataType dtype, ReduceOp op, std::vector<std::byte>& scratch,
                                  const AlgoOptions& opt) {
  const int n = t.size();
  const int r = t.rank();
  const std::size_t es = dtype_size(dtype);
  const std::size_t bytes = count * es;
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(out);
  if (count == 0) return;
  if (n == 1) {
    if (src != dst) std::memcpy(dst, src, bytes);
    return;
  }
  if (scratch.size() < bytes) scratch.resize(bytes);
  const ReduceSpec rs{reduce_function(dtype, op), es};
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

}  // namespace kolo
