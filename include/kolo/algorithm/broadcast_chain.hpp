// kolo/algorithm/broadcast_chain.hpp — pipelined chain broadcast: root → root+1 → … → root-1.
//
// Each rank forwards a segment as soon as it has it, so for large messages the time approaches
// one message transfer, S·β + (n-1)·α·(segment)/… — bandwidth-optimal for large S; a binomial
// tree (log n latency) is the small-message choice (algorithm selection work).
#pragma once

#include <algorithm>
#include <cmath>
#include <deque>

#include "kolo/algorithm/entry.hpp"
#include "kolo/algorithm/options.hpp"
#include "kolo/transport/transport_ref.hpp"

namespace kolo {

inline void broadcast_chain(TransportRef t, void* data, std::size_t bytes, int root,
                            const AlgoOptions& opt) {
  const int n = t.size();
  if (n == 1) return;
  const int pos = mod(t.rank() - root, n);
  const int right = mod(t.rank() + 1, n);
  const int left = mod(t.rank() - 1, n);
  auto* p = static_cast<std::byte*>(data);
  const std::size_t seg = std::max<std::size_t>(1, opt.segment_bytes);
  const std::size_t nseg = bytes == 0 ? 1 : (bytes + seg - 1) / seg;
  auto len_of = [&](std::size_t j) { return std::min(seg, bytes - std::min(bytes, j * seg)); };
  const bool receives = pos > 0;
  const bool sends = pos < n - 1;
  std::deque<TransportRef::Request> recvs, sendq;
  std::size_t posted = 0, received = receives ? 0 : nseg, sent = 0;
  for (;;) {
    while (receives && posted < nseg && posted - received < opt.recv_window) {
      recvs.push_back(t.irecv(left, p + posted * seg, len_of(posted), opt.sig));
      ++posted;
    }
    while (!recvs.empty() && t.done(recvs.front())) {
      recvs.pop_front();
      ++received;
    }
    while (sends && sent < received) {
      sendq.push_back(t.isend(right, p + sent * seg, len_of(sent), opt.sig));
      ++sent;
    }
    while (!sendq.empty() && t.done(sendq.front())) sendq.pop_front();
    if (received == nseg && (!sends || sent == nseg) && sendq.empty()) return;
    t.wait_any_progress(opt.deadline);
  }
}

namespace cost {

// Chain broadcast, pipelined in segments of s: the last segment leaves the root after S/s
// steps and needs n-2 more hops: (n-2 + S/s)·(α + s·β).
inline double chain_broadcast(int n, double S, LinkCost l, std::size_t segment_bytes) {
  if (n <= 1) return 0;
  const double s = std::max(1.0, std::min(S, static_cast<double>(segment_bytes)));
  const double k = std::max(1.0, std::ceil(S / s));
  return (n - 2 + k) * (l.alpha + s * l.beta);
}

}  // namespace cost

// The registry's entry.
inline AlgorithmEntry<BroadcastAlgorithm> chain_broadcast_algorithm() {
  AlgorithmEntry<BroadcastAlgorithm> e;
  e.name = "chain";
  e.cost = [](const CostQuery& q) {
    return cost::chain_broadcast(q.n, q.bytes, q.link, q.segment_bytes);
  };
  e.run = [](TransportRef t, const BroadcastArgs& a, const AlgoOptions& o, const AlgoContext&) {
    broadcast_chain(t, a.data, a.nbytes, a.root, o);
  };
  return e;
}

}  // namespace kolo
