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

#include <deque>
#include <vector>

#include "kolo/algorithm/options.hpp"
#include "kolo/transport/transport.hpp"

namespace kolo {

template <Transport T>
void broadcast_binomial(T& t, void* data, std::size_t bytes, int root, const AlgoOptions& opt) {
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
  std::deque<typename T::Request> recvs, sends;
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

}  // namespace kolo
