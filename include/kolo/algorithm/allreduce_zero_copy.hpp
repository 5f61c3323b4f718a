// kolo/algorithm/allreduce_zero_copy.hpp — the allreduce of buffers that every rank maps
// (kolo::Buffer, the engine's fusion buffer; transport/shared_region.hpp): no message carries
// data, each rank reads its peers' memory in place.
//
//   1. barrier: every input is written;
//   2. reduce-scatter in place: rank r reduces block r of all N inputs, read straight from the
//      peers' buffers, into block r of its own output (a cache-sized chunk at a time, so the
//      partial result is re-read from cache, not memory);
//   3. barrier: every block is reduced;
//   4. allgather: rank r copies block j out of rank j's output, for every j != r;
//   5. barrier: nobody reads this rank's buffers any more, so the caller may write them.
//
// Memory traffic for the job is (3N-1)·S (each rank reads S and writes S/N in step 2, and reads
// and writes (N-1)/N·S in step 4) — the zero-copy bound, against the channel ring's copies into
// and out of slots. The barriers are zero-byte messages through the mesh: their release/acquire
// orders the memory accesses, and a peer that dies during any step fails the next barrier with
// PeerLostError on every rank.
//
// Each block is reduced once, by its owner, so every rank ends with the same bits. In place
// (in == out on a rank) is safe: rank r writes only block r of its output, which no other rank
// reads before the second barrier.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>

#include "kolo/algorithm/barrier_dissemination.hpp"
#include "kolo/algorithm/options.hpp"
#include "kolo/core/dtype.hpp"
#include "kolo/core/reduce.hpp"
#include "kolo/transport/transport_ref.hpp"

namespace kolo {

struct ZeroCopyArgs {
  std::span<const std::byte* const> in;  // by rank: where its input lies in this process
  std::span<std::byte* const> out;       // by rank: where its output lies in this process
  std::size_t count = 0;
  DataType dtype = DataType::float32;
  ReduceOp op = ReduceOp::sum;
};

inline void allreduce_zero_copy(TransportRef t, const ZeroCopyArgs& a, const AlgoOptions& opt) {
  const int n = t.size();
  const int me = t.rank();
  const std::size_t es = dtype_size(a.dtype);
  const ReduceFn fn = reduce_function(a.dtype, a.op == ReduceOp::average ? ReduceOp::sum : a.op);
  auto block = [&](int r, std::size_t& lo, std::size_t& len) {
    lo = a.count * static_cast<std::size_t>(r) / static_cast<std::size_t>(n);
    const std::size_t hi = a.count * static_cast<std::size_t>(r + 1) / static_cast<std::size_t>(n);
    len = hi - lo;
  };
  barrier_dissemination(t, opt);  // 1. inputs written
  {
    std::size_t lo, len;
    block(me, lo, len);
    // 32 KiB per chunk: the partial sum stays in L1/L2 while the next input is folded in.
    const std::size_t chunk = std::max<std::size_t>(1, (32 * 1024) / es);
    std::byte* dst = a.out[static_cast<std::size_t>(me)] + lo * es;
    for (std::size_t off = 0; off < len; off += chunk) {
      const std::size_t m = std::min(chunk, len - off);
      const std::size_t b = (lo + off) * es;
      std::byte* d = dst + off * es;
      // Own input first: in place, d is this rank's input, read before it is overwritten.
      const std::byte* first = a.in[static_cast<std::size_t>(me)] + b;
      if (n == 1) {
        if (d != first) std::memcpy(d, first, m * es);
      } else {
        fn(d, first, a.in[static_cast<std::size_t>((me + 1) % n)] + b, m);
        for (int k = 2; k < n; ++k) fn(d, d, a.in[static_cast<std::size_t>((me + k) % n)] + b, m);
      }
      if (a.op == ReduceOp::average) finish_average(d, m, a.dtype, n);
    }
  }
  if (n == 1) return;
  barrier_dissemination(t, opt);  // 3. every block reduced
  for (int k = 1; k < n; ++k) {
    const int j = (me + k) % n;
    std::size_t lo, len;
    block(j, lo, len);
    if (len > 0) {
      std::memcpy(a.out[static_cast<std::size_t>(me)] + lo * es,
                  a.out[static_cast<std::size_t>(j)] + lo * es, len * es);
    }
  }
  barrier_dissemination(t, opt);  // 5. nobody reads this rank's buffers any more
}

}  // namespace kolo
