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
// With a BlockSink (the engine's fused batches, Communicator::allreduce_to), step 4 hands every
// reduced block to the sink where it lies, the own block and then the peers', instead of copying
// the peers' blocks into this rank's output: the engine unpacks straight from the owners' blocks
// into the tensors, one pass over S where the gather and then the unpack were two.
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

// Where a reduced range of elements is handed instead of being gathered into the output:
// fn(ctx, first, count, src) gets elements [first, first + count) at `src`, which may be a peer's
// memory and is valid only during the call. The ranges of one call are disjoint and cover them all.
struct BlockSink {
  void* ctx = nullptr;
  void (*fn)(void* ctx, std::size_t first, std::size_t count, const std::byte* src) = nullptr;

  explicit operator bool() const { return fn != nullptr; }
  void operator()(std::size_t first, std::size_t count, const std::byte* src) const {
    fn(ctx, first, count, src);
  }
};

// Where this rank's own input lies when its own block is not in the shared buffer (the engine
// skips packing the block that only this rank reads): fn(ctx, first, count) returns where element
// `first` of this rank's input lies and lowers `count` to how many elements lie contiguous from
// there (at least one). Only this rank's own block is read through it; the peers read the shared
// buffer, which must hold every other block.
struct BlockSource {
  void* ctx = nullptr;
  const std::byte* (*fn)(void* ctx, std::size_t first, std::size_t& count) = nullptr;

  explicit operator bool() const { return fn != nullptr; }
  // Calls f(offset, count, where) for the contiguous runs of elements [first, first + count).
  template <class F>
  void runs(std::size_t first, std::size_t count, F&& f) const {
    for (std::size_t done = 0; done < count;) {
      std::size_t m = count - done;
      const std::byte* p = fn(ctx, first + done, m);
      f(done, m, p);
      done += m;
    }
  }
};

// Elements [first, first + count) of a `total`-element allreduce that rank `rank` of `n` reduces
// (its block): the zero-copy allreduce's split, for a caller that prepares its own block apart.
inline void zero_copy_block(std::size_t total, int rank, int n, std::size_t& first,
                            std::size_t& count) {
  first = total * static_cast<std::size_t>(rank) / static_cast<std::size_t>(n);
  count = total * static_cast<std::size_t>(rank + 1) / static_cast<std::size_t>(n) - first;
}

struct ZeroCopyArgs {
  std::span<const std::byte* const> in;  // by rank: where its input lies in this process
  std::span<std::byte* const> out;       // by rank: where its output lies in this process
  std::size_t count = 0;
  DataType dtype = DataType::float32;
  ReduceOp op = ReduceOp::sum;
  BlockSink sink;   // set: step 4 hands the blocks to it; this rank's output keeps its own block
  BlockSource own;  // set: this rank's own block of the input is read through it, not from in
};

inline void allreduce_zero_copy(TransportRef t, const ZeroCopyArgs& a, const AlgoOptions& opt) {
  const int n = t.size();
  const int me = t.rank();
  const std::size_t es = dtype_size(a.dtype);
  const ReduceFn fn = reduce_function(a.dtype, a.op == ReduceOp::average ? ReduceOp::sum : a.op);
  auto block = [&](int r, std::size_t& lo, std::size_t& len) {
    zero_copy_block(a.count, r, n, lo, len);
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
      auto fold = [&](std::size_t at, std::size_t cnt, const std::byte* first) {
        std::byte* dd = d + at * es;
        const std::size_t bb = b + at * es;
        if (n == 1) {
          if (dd != first) std::memcpy(dd, first, cnt * es);
          return;
        }
        fn(dd, first, a.in[static_cast<std::size_t>((me + 1) % n)] + bb, cnt);
        for (int k = 2; k < n; ++k) {
          fn(dd, dd, a.in[static_cast<std::size_t>((me + k) % n)] + bb, cnt);
        }
      };
      if (a.own) {
        a.own.runs(lo + off, m, fold);
      } else {
        fold(0, m, a.in[static_cast<std::size_t>(me)] + b);
      }
      if (a.op == ReduceOp::average) finish_average(d, m, a.dtype, n);
    }
  }
  if (n == 1) {
    if (a.sink && a.count > 0) a.sink(0, a.count, a.out[0]);
    return;
  }
  barrier_dissemination(t, opt);  // 3. every block reduced
  for (int k = a.sink ? 0 : 1; k < n; ++k) {
    const int j = (me + k) % n;
    std::size_t lo, len;
    block(j, lo, len);
    if (len > 0 && a.sink) {
      a.sink(lo, len, a.out[static_cast<std::size_t>(j)] + lo * es);
    } else if (len > 0) {
      std::memcpy(a.out[static_cast<std::size_t>(me)] + lo * es,
                  a.out[static_cast<std::size_t>(j)] + lo * es, len * es);
    }
  }
  barrier_dissemination(t, opt);  // 5. nobody reads this rank's buffers any more
}

}  // namespace kolo
