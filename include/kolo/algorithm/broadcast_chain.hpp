// kolo/algorithm/broadcast_chain.hpp — pipelined chain broadcast: root → root+1 → … → root-1.
//
// Each rank forwards a segment as soon as it has it, so for large messages the time approaches
// one message transfer, S·β + (n-1)·α·(segment)/… — bandwidth-optimal for large S; a binomial
// tree (log n latency) is the small-message choice (algorithm selection work).
#pragma once

#include <deque>

#include "kolo/algorithm/options.hpp"
#include "kolo/transport/transport.hpp"

namespace kolo {

template <Transport T>
void broadcast_chain(T& t, void* data, std::size_t bytes, int root, const AlgoOptions& opt) {
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
  std::deque<typename T::Request> recvs, sendq;
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

}  // namespace kolo
