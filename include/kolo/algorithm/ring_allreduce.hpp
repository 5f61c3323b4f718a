// kolo/algorithm/ring_allreduce.hpp — bandwidth-optimal ring allreduce: reduce-scatter, then
// allgather, both around the ring, segmented and pipelined (ring_pipeline.hpp).
//
// Cost (Thakur, Rabenseifner & Gropp 2005), n ranks, S bytes: 2(n-1)·α + 2(n-1)/n·S·β +
// (n-1)/n·S·γ. Memory passes per rank: every byte of the result is written once by a reduction
// or a copy, the input read once; with the shared-memory transport each transferred byte is
// also copied once into a slot by the sender (see docs/performance.md for the full count).
//
// Any rank count and any element count: blocks differ by at most one element, empty blocks
// still exchange an (empty) message so every rank sees every step, and count 0 returns at once.
// ReduceOp::average is a sum whose division is applied by the owner of each block right after
// its last reduction, before the block is passed around: count/n divisions per rank, not count.
#pragma once

#include <cstring>
#include <vector>

#include "kolo/algorithm/allreduce_prologue.hpp"
#include "kolo/algorithm/entry.hpp"
#include "kolo/algorithm/options.hpp"
#include "kolo/algorithm/ring_pipeline.hpp"
#include "kolo/core/reduce.hpp"
#include "kolo/core/tensor.hpp"
#include "kolo/transport/transport_ref.hpp"

namespace kolo {

inline void allreduce_ring(TransportRef t, const void* in, void* out, std::size_t count,
                           DataType dtype, ReduceOp op, const AlgoOptions& opt) {
  const auto f = allreduce_prologue(t, in, out, count, dtype, op);
  if (!f) return;
  const int n = f->n;
  const int r = f->r;
  const std::size_t es = f->es;
  const std::byte* src = f->src;
  std::byte* dst = f->dst;
  const std::vector<RingStage> stages =
      ring_allreduce_stage_list<RingStage>(r, n, src, dst, count, es);
  const std::size_t last_rs = static_cast<std::size_t>(n - 2);
  const BlockRange owned = even_block(count, n, mod(r + 1, n));
  auto finish = [&](std::size_t stage, std::size_t off, std::size_t len) {
    if (stage == last_rs && len > 0) {
      finish_average(dst + owned.begin * es + off, len / es, dtype, n);
    }
  };
  RingRun ring(
      t, stages, f->rs, opt,
      op != ReduceOp::average
          ? nullptr
          : +[](void* c, std::size_t stage, std::size_t off,
                std::size_t len) { (*static_cast<decltype(finish)*>(c))(stage, off, len); },
      &finish);
  ring.overlap_after(last_rs, opt.ring_overlap_lag);
  while (!ring.progress()) t.wait_any_progress(opt.deadline);
}

// The same ring over a list of tensors (`map`: each one's input and output), in pieces: the
// messages of the ring over the tensors laid end to end, each posted as a vectored send or
// receive (TransportRef::vectored() must be true) that reads and writes the tensors' own
// memory. What a fused batch costs without a fusion buffer: no pack and no unpack pass.
inline void allreduce_ring_pieces(TransportRef t, PieceMap& map, DataType dtype, ReduceOp op,
                                  const AlgoOptions& opt) {
  const std::size_t es = dtype_size(dtype);
  const std::size_t count = map.bytes() / es;
  const int n = t.size();
  const int r = t.rank();
  if (count == 0) return;
  if (n == 1) {
    for (std::size_t k = 0; k < map.parts(); ++k) {
      const PieceMap::Part& p = map.part(k);
      if (p.bytes > 0 && p.in != p.out) std::memcpy(p.out, p.in, p.bytes);
    }
    return;
  }
  if (!t.vectored()) throw Error("allreduce_ring_pieces: the transport has no vectored messages");
  const ReduceSpec rs{reduce_function(dtype, op), es};
  const std::vector<PieceStage> stages = ring_allreduce_stage_list<PieceStage>(
      r, n, PieceAddr{PieceAddr::in, 0}, PieceAddr{PieceAddr::out, 0}, count, es);
  // Every message's pieces stay put until it completes: room for all of them up front.
  const std::size_t seg = std::max(es, opt.segment_bytes / es * es);
  std::size_t room = 0;
  for (const PieceStage& st : stages) {
    room += detail::segment_count(st.send_bytes, seg) + map.pieces_of(st.send.off, st.send_bytes);
    room += detail::segment_count(st.recv_bytes, seg) + map.pieces_of(st.recv.off, st.recv_bytes);
  }
  map.reserve(room);
  const std::size_t last_rs = static_cast<std::size_t>(n - 2);
  const BlockRange owned = even_block(count, n, mod(r + 1, n));
  auto finish = [&](std::size_t stage, std::size_t off, std::size_t len) {
    if (op != ReduceOp::average || stage != last_rs || len == 0) return;
    map.for_runs(owned.begin * es + off, len, [&](std::size_t k, std::size_t at, std::size_t m) {
      finish_average(map.part(k).out + at, m / es, dtype, n);
    });
  };
  BasicRingRun<PieceStage> ring(
      t, stages, rs, opt,
      [](void* c, std::size_t stage, std::size_t off, std::size_t len) {
        (*static_cast<decltype(finish)*>(c))(stage, off, len);
      },
      &finish, &map);
  ring.overlap_after(last_rs, opt.ring_overlap_lag);  // the same messages as allreduce_ring's
  while (!ring.progress()) t.wait_any_progress(opt.deadline);
}

namespace cost {

// Ring: reduce-scatter + allgather, each n-1 steps of S/n bytes.
//   2(n-1)·α + 2(n-1)/n·S·β + (n-1)/n·S·γ
inline double ring(int n, double S, LinkCost l, double gamma) {
  if (n <= 1) return 0;
  const double f = static_cast<double>(n - 1) / n;
  return 2.0 * (n - 1) * l.alpha + 2.0 * f * S * l.beta + f * S * gamma;
}

}  // namespace cost

// The registry's entry (algorithm/registry.hpp). Its hops cross a host boundary one at a time,
// so it is costed without the inter-host sharing the other algorithms pay.
inline AlgorithmEntry<AllreduceAlgorithm> ring_allreduce_algorithm() {
  AlgorithmEntry<AllreduceAlgorithm> e;
  e.name = "ring";
  e.cost = [](const CostQuery& q) { return cost::ring(q.n, q.bytes, q.link, q.gamma); };
  e.run = [](TransportRef t, const AllreduceArgs& a, const AlgoOptions& o, const AlgoContext&) {
    allreduce_ring(t, a.in, a.out, a.count, a.dtype, a.op, o);
  };
  return e;
}

}  // namespace kolo
