// kolo/algorithm/broadcast_binomial.hpp — binomial-tree broadcast, segmented.
//
// Ranks are numbered relative to the root (v = rank - root mod n). Rank v receives from v minus
// its lowest set bit and sends to v + 2^k for every 2^k below that bit, the largest subtree first
// (it has the longest way to go). Every rank holds the data after ceil(log2 n) rounds, so the
// cost is ceil(log2 n)·(α + S·β) (Thakur, Rabenseifner & Gropp 2005, §3) against the chain's
// (n-1)·α + S·β for large S: the tree is the small-message choice, the chain the large one.
//
// Segments are forwarded as soon as they arrive, as in the chain, so mid-sized messages overlap
// the levels of the tree instead of paying log2(n)·S·β in full.
#pragma once

#include <algorithm>
#include <cmath>
#include <deque>
#include <vector>

#include "kolo/algorithm/entry.hpp"
#include "kolo/algorithm/options.hpp"
#include "kolo/transport/transport_ref.hpp"

namespace kolo {

inline void broadcast_binomial(TransportRef t, void* data, std::size_t bytes, int root,
                               const AlgoOptions& opt) {
  const int n = t.size();
  if (n == 1) return;
  const int v = mod(t.rank() - root, n);
  auto actual = [&](int rel) { return mod(rel + root, n); };
  // The lowest set bit of v bounds the subtree v owns; the root owns everything.
  int span = 1;
  while (span < n && (v & span) == 0) span <<= 1;
  const int parent = v == 0 ? -1 : actual(v - span);
  std::vector<int> children;
  for (int m = span >> 1; m >= 1; m >>= 1) {
    if (v + m < n) children.push_back(actual(v + m));
  }

  auto* p = static_cast<std::byte*>(data);
  const std::size_t seg = std::max<std::size_t>(1, opt.segment_bytes);
  const std::size_t nseg = bytes == 0 ? 1 : (bytes + seg - 1) / seg;
  auto len_of = [&](std::size_t j) { return std::min(seg, bytes - std::min(bytes, j * seg)); };
  std::deque<TransportRef::Request> recvs, sends;
  std::size_t posted = 0, received = parent < 0 ? nseg : 0, forwarded = 0;
  for (;;) {
    while (parent >= 0 && posted < nseg && posted - received < opt.recv_window) {
      recvs.push_back(t.irecv(parent, p + posted * seg, len_of(posted), opt.sig));
      ++posted;
    }
    while (!recvs.empty() && t.done(recvs.front())) {
      recvs.pop_front();
      ++received;
    }
    // A segment goes to every child as soon as it is here (the root has all of them).
    for (; forwarded < received; ++forwarded) {
      for (int c : children)
        sends.push_back(t.isend(c, p + forwarded * seg, len_of(forwarded), opt.sig));
    }
    while (!sends.empty() && t.done(sends.front())) sends.pop_front();
    if (received == nseg && sends.empty()) return;
    t.wait_any_progress(opt.deadline);
  }
}

namespace cost {

// Binomial broadcast, pipelined: the root sends each of the S/s segments to ceil(log2 n)
// children in turn, the largest subtree first, so the last segment is everywhere after
//   (S/s)·ceil(log2 n)·(α + s·β)
// — log2(n) latency steps for one segment, but log2(n) times the chain's bandwidth term.
inline double binomial_broadcast(int n, double S, LinkCost l, std::size_t segment_bytes) {
  if (n <= 1) return 0;
  const int levels = log2_ceil(n);
  const double s = std::max(1.0, std::min(S, static_cast<double>(segment_bytes)));
  const double k = std::max(1.0, std::ceil(S / s));
  return k * levels * (l.alpha + s * l.beta);
}

}  // namespace cost

// The registry's entry.
inline AlgorithmEntry<BroadcastAlgorithm> binomial_broadcast_algorithm() {
  AlgorithmEntry<BroadcastAlgorithm> e;
  e.name = "binomial";
  e.aliases = {"tree"};
  e.cost = [](const CostQuery& q) {
    return cost::binomial_broadcast(q.n, q.bytes, q.link, q.segment_bytes);
  };
  e.run = [](TransportRef t, const BroadcastArgs& a, const AlgoOptions& o, const AlgoContext&) {
    broadcast_binomial(t, a.data, a.nbytes, a.root, o);
  };
  return e;
}

}  // namespace kolo
