// kolo/algorithm/options.hpp — what every algorithm receives besides buffers: the signature
// stamped on its messages, its deadline, and its pipelining unit.
#pragma once

#include <algorithm>
#include <cstddef>

#include "kolo/core/deadline.hpp"
#include "kolo/core/signature.hpp"

namespace kolo {

struct AlgoOptions {
  Signature sig;
  Deadline deadline = Deadline::lazy(30);
  // Pipelining unit: a segment received at step t is forwarded at step t+1 while later segments
  // of step t are still arriving, so a ring of n ranks costs (2(n-1) + segments - 1) segment
  // times instead of 2(n-1) block times.
  std::size_t segment_bytes = 256 * 1024;
  std::size_t recv_window = 16;  // receives posted ahead of need
  // The double tree's segment (0: derived from the size alone). Must be the same on every rank;
  // the Communicator sets it from the Selector's measured constants (Selector::tree_segment).
  std::size_t tree_segment_bytes = 0;
  // The hierarchical allreduce's pipelining unit: a tensor of at least twice this many bytes is
  // cut into chunks of about this size, and the ring across hosts of one chunk runs while the
  // rings inside the host run for its neighbours (0: no chunks). The same on every rank.
  std::size_t hierarchical_chunk_bytes = 4 << 20;
  // The ring allreduce's allgather starts this many segments after its last reduce-scatter
  // stage starts, the two interleaved, so that each finished segment is sent on while it is in
  // cache (0: after that stage ends). Must be the same on every rank: the Communicator sets it
  // from facts every rank shares (kRingOverlapLag where every link is TCP and no host has more
  // ranks than cores).
  std::size_t ring_overlap_lag = 0;
};

// Measured (64 MiB over TCP loopback, N = 2, 256 KiB segments; docs/performance.md): lags of 1
// to 3 segments took 16.5-17.8 ms against 24.6 ms stage by stage, 4 segments 17.6-23.1 ms and
// 16 no gain; on shared memory (N = 2) and with 4 ranks on 2 cores over TCP any lag was slower.
inline constexpr std::size_t kRingOverlapLag = 2;

// Elements [begin, begin+count) of block b when `total` elements are split into n blocks as
// evenly as possible (the first total % n blocks get one more): any count, any rank count.
struct BlockRange {
  std::size_t begin;
  std::size_t count;
};

inline BlockRange even_block(std::size_t total, int n, int b) {
  const std::size_t base = total / static_cast<std::size_t>(n);
  const std::size_t extra = total % static_cast<std::size_t>(n);
  const auto ub = static_cast<std::size_t>(b);
  return {ub * base + std::min(ub, extra), base + (ub < extra ? 1 : 0)};
}

inline int mod(int a, int n) {
  return ((a % n) + n) % n;
}

}  // namespace kolo
