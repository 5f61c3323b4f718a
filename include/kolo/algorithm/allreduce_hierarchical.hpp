// kolo/algorithm/allreduce_hierarchical.hpp — two-level allreduce for several hosts with several
// ranks each (Horovod's hierarchical allreduce; NCCL's intra/inter split).
//
//  1. Inside each host, a ring reduce-scatter over shared memory: local rank i ends with block i
//     (of L = ranks per host) reduced over its host.
//  2. Across hosts, an allreduce of block i among the ranks with local rank i — one per host, all
//     L shards at once, each on a GroupView of the transport (so any flat algorithm runs there
//     unchanged; the caller picks it, normally through the Selector for S/L bytes over H hosts).
//  3. Inside each host, a ring allgather of the blocks.
// Cost, H hosts, L ranks each, intra link (αi, βi), inter link (αx, βx) shared by the L shards:
//     2(L-1)·αi + 2(L-1)/L·S·βi + (L-1)/L·S·γ  +  T_cross(S/L, H ranks, βx·L)
// Only (H-1)/H of the data crosses the host boundary twice, against (n-1)/n for a flat ring
// whose every step also waits for the slow link: hierarchical wins when the inter-host link is
// the bottleneck, and on latency (2(H-1) slow steps instead of 2(n-1)).
//
// Hosts must have equal rank counts (the shards of different hosts must be the same blocks);
// with uneven hosts the Communicator falls back to a flat algorithm (HostGroups::uniform).
//
// Bit-identical on every rank: block i is finished by the cross allreduce of shard i (itself
// bit-identical on its members), divided once there for ReduceOp::average, then only copied.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "kolo/algorithm/entry.hpp"
#include "kolo/algorithm/group_view.hpp"
#include "kolo/algorithm/options.hpp"
#include "kolo/algorithm/ring_allgather.hpp"
#include "kolo/algorithm/ring_allreduce.hpp"
#include "kolo/algorithm/ring_allreduce_wire.hpp"
#include "kolo/algorithm/ring_pipeline.hpp"
#include "kolo/core/reduce.hpp"
#include "kolo/transport/transport_ref.hpp"

namespace kolo {

// This rank's two groups: the ranks of its host, and its peers of the same local rank.
struct HostGroups {
  std::vector<int> local;  // global ranks on this host, in local-rank order (includes this rank)
  std::vector<int> cross;  // global ranks with this rank's local rank, one per host, host order
  int hosts = 1;
  int max_local_size = 1;  // the most ranks on any host (the same number on every rank)
  bool uniform = true;     // every host has the same number of ranks
  bool known = false;      // built from real host membership (host keys), not assumed

  // One host holding every rank (what is assumed when nothing is known).
  static HostGroups single_host(int size, int rank) {
    HostGroups g;
    for (int r = 0; r < size; ++r) g.local.push_back(r);
    g.cross = {rank};
    g.max_local_size = size;
    return g;
  }

  // From every rank's host key (Bootstrap::host_keys()); hosts in order of their first rank,
  // like Bootstrap's cross ranks.
  static HostGroups from_host_keys(const std::vector<std::string>& keys, int rank) {
    HostGroups g;
    g.known = true;
    std::map<std::string, int> host_of;
    std::vector<std::vector<int>> members;
    for (int r = 0; r < static_cast<int>(keys.size()); ++r) {
      const auto [it, added] =
          host_of.emplace(keys[static_cast<std::size_t>(r)], static_cast<int>(members.size()));
      if (added) members.emplace_back();
      members[static_cast<std::size_t>(it->second)].push_back(r);
    }
    g.hosts = static_cast<int>(members.size());
    const auto& mine =
        members[static_cast<std::size_t>(host_of[keys[static_cast<std::size_t>(rank)]])];
    g.local = mine;
    const auto lr =
        static_cast<std::size_t>(std::find(mine.begin(), mine.end(), rank) - mine.begin());
    for (const auto& m : members) {
      g.uniform = g.uniform && m.size() == mine.size();
      g.max_local_size = std::max(g.max_local_size, static_cast<int>(m.size()));
      if (lr < m.size()) g.cross.push_back(m[lr]);
    }
    return g;
  }

  int local_size() const { return static_cast<int>(local.size()); }
};

// The cross-host step: an in-place allreduce of `block` (count elements) over `group` (op is
// never average: the division is done here, once).
using CrossAllreduce = void (*)(void* ctx, TransportRef group, void* block, std::size_t count,
                                DataType dtype, ReduceOp op, const AlgoOptions& opt);

namespace detail {

// How many chunks the pipelined hierarchical allreduce cuts `bytes` into (1: not pipelined).
inline std::size_t hierarchical_chunks(std::size_t bytes, const AlgoOptions& opt) {
  if (opt.hierarchical_chunk_bytes == 0) return 1;
  return std::clamp<std::size_t>(bytes / opt.hierarchical_chunk_bytes, 1, 256);
}

// Drives `a` to its end, giving `b` (when set) a turn at every step: two rings on disjoint peers
// (one inside the host, one across hosts) progress together, and the rank sleeps only when
// neither can move.
template <class A, class B>
void drive_together(TransportRef t, A& a, std::optional<B>* b, const AlgoOptions& opt) {
  for (;;) {
    const bool done = a.progress();
    if (b != nullptr && b->has_value()) (*b)->progress();
    if (done) return;
    t.wait_any_progress(opt.deadline);
  }
}

// The pipelined schedule over K chunks; each step on this rank in a fixed order, the same on
// every rank (a host's peers see its rings in one order, and so do its peers across hosts):
//   RS(0); start X(0);
//   for k in 1..K-1: RS(k) while X(k-1) runs; finish X(k-1); start X(k); AG(k-1) while X(k) runs
//   finish X(K-1); AG(K-1)
// RS/AG: the reduce-scatter / allgather of a chunk inside the host; X: the ring across hosts of
// this rank's block of the chunk. At most one ring inside the host and one across hosts are in
// flight, so each channel carries one ring's messages at a time, in the same order at both ends.
// `P` provides rs(k, cross), cross_start(k), cross_finish(k) and ag(k, cross), where `cross` is
// the std::optional holding the running X.
template <class P>
void hierarchical_pipeline(std::size_t chunks, P& p) {
  p.rs(0, false);
  p.cross_start(0);
  for (std::size_t k = 1; k < chunks; ++k) {
    p.rs(k, true);
    p.cross_finish(k - 1);
    p.cross_start(k);
    p.ag(k - 1, true);
  }
  p.cross_finish(chunks - 1);
  p.ag(chunks - 1, false);
}

// The block of local rank b within chunk k (elements, from the tensor's start).
inline BlockRange chunk_block(std::size_t count, std::size_t chunks, std::size_t k, int L, int b) {
  const BlockRange c = even_block(count, static_cast<int>(chunks), static_cast<int>(k));
  const BlockRange r = even_block(c.count, L, mod(b, L));
  return {c.begin + r.begin, r.count};
}

// The host's ring reduce-scatter (ring_reduce_scatter's schedule on uneven blocks) as stages of
// `Stage` (RingStage in bytes, WireStage in elements: `unit` bytes or 1 per element): at stage s
// send block lr-s-1 and fold block lr-s-2 into dst, so the last block folded is lr.
// `block(b)`: local block b's range in elements.
template <class Stage, class In, class Out, class Block>
void host_reduce_scatter_stages(std::vector<Stage>& st, In src, Out dst, std::size_t unit, int L,
                                int lr, const Block& block) {
  st.clear();
  for (int s = 0; s < L - 1; ++s) {
    const BlockRange sb = block(lr - s - 1), rb = block(lr - s - 2);
    st.push_back({(s == 0 ? src : dst) + sb.begin * unit, sb.count * unit, dst + rb.begin * unit,
                  src + rb.begin * unit, rb.count * unit});
  }
}

// The host's ring allgather, in place, as stages: at stage u send block lr-u (this rank's
// first), receive block lr-u-1.
template <class Stage, class Out, class Block>
void host_allgather_stages(std::vector<Stage>& st, Out dst, std::size_t unit, int L, int lr,
                           const Block& block) {
  st.clear();
  for (int u = 0; u < L - 1; ++u) {
    const BlockRange sb = block(lr - u), rb = block(lr - u - 1);
    st.push_back(
        {dst + sb.begin * unit, sb.count * unit, dst + rb.begin * unit, nullptr, rb.count * unit});
  }
}

// The pipelined hierarchical allreduce for any dtype and op: ring reduce-scatter and allgather
// inside the host, a ring allreduce across hosts (average divided after it, once).
class HierarchicalRingPipeline {
 public:
  HierarchicalRingPipeline(TransportRef t, const HostGroups& g, const std::byte* src,
                           std::byte* dst, std::size_t count, DataType dtype, ReduceOp op,
                           std::size_t chunks, const AlgoOptions& opt)
      : t_(t),
        host_(t, g.local),
        peers_(t, g.cross),
        src_(src),
        dst_(dst),
        count_(count),
        dtype_(dtype),
        average_(op == ReduceOp::average),
        es_(dtype_size(dtype)),
        rs_{reduce_function(dtype, op == ReduceOp::average ? ReduceOp::sum : op), es_},
        chunks_(chunks),
        L_(g.local_size()),
        lr_(host_.rank()),
        opt_(opt) {}

  void rs(std::size_t k, bool with_cross) {
    if (L_ == 1) {
      const BlockRange c = block(k, 0);
      if (src_ != dst_) std::memcpy(dst_ + c.begin * es_, src_ + c.begin * es_, c.count * es_);
      return;
    }
    host_reduce_scatter_stages(local_stages_, src_, dst_, es_, L_, lr_,
                               [&](int b) { return block(k, b); });
    run_local(with_cross);
  }

  void cross_start(std::size_t k) {
    const BlockRange own = block(k, lr_);
    if (peers_.size() == 1 || own.count == 0) return;
    std::byte* b = dst_ + own.begin * es_;
    cross_stages_ =
        ring_allreduce_stage_list<RingStage>(peers_.rank(), peers_.size(), b, b, own.count, es_);
    cross_.emplace(peers_, cross_stages_, rs_, opt_);
  }

  void cross_finish(std::size_t k) {
    if (cross_.has_value()) {
      while (!cross_->progress()) t_.wait_any_progress(opt_.deadline);
      cross_.reset();
    }
    const BlockRange own = block(k, lr_);
    if (average_) finish_average(dst_ + own.begin * es_, own.count, dtype_, t_.size());
  }

  void ag(std::size_t k, bool with_cross) {
    if (L_ == 1) return;
    host_allgather_stages(local_stages_, dst_, es_, L_, lr_, [&](int b) { return block(k, b); });
    run_local(with_cross);
  }

 private:
  BlockRange block(std::size_t k, int b) const { return chunk_block(count_, chunks_, k, L_, b); }
  void run_local(bool with_cross) {
    RingRun local(host_, local_stages_, rs_, opt_);
    drive_together(t_, local, with_cross ? &cross_ : nullptr, opt_);
  }

  TransportRef t_;
  GroupView host_, peers_;
  const std::byte* src_;
  std::byte* dst_;
  std::size_t count_;
  DataType dtype_;
  bool average_;
  std::size_t es_;
  ReduceSpec rs_;
  std::size_t chunks_;
  int L_, lr_;
  const AlgoOptions& opt_;
  std::vector<RingStage> local_stages_, cross_stages_;
  std::optional<RingRun> cross_;
};

// The same for float32 with 16-bit messages in all three rings (allreduce_hierarchical_wire).
class HierarchicalWirePipeline {
 public:
  HierarchicalWirePipeline(TransportRef t, const HostGroups& g, const float* in, float* out,
                           std::size_t count, bool average, std::size_t chunks,
                           const AlgoOptions& opt, const WireSlots& local_ws,
                           const WireSlots& cross_ws)
      : t_(t),
        host_(t, g.local),
        peers_(t, g.cross),
        in_(in),
        out_(out),
        count_(count),
        divisor_(average ? t.size() : 1),
        chunks_(chunks),
        L_(g.local_size()),
        lr_(host_.rank()),
        opt_(opt),
        local_ws_(local_ws),
        cross_ws_(cross_ws) {}

  void rs(std::size_t k, bool with_cross) {
    if (L_ == 1) {
      const BlockRange c = block(k, 0);
      if (in_ != out_) std::memcpy(out_ + c.begin, in_ + c.begin, c.count * sizeof(float));
      return;
    }
    // Partial sums travel in the wire type and are folded into float32 accumulators.
    host_reduce_scatter_stages(local_stages_, in_, out_, 1, L_, lr_,
                               [&](int b) { return block(k, b); });
    run_local(with_cross);
  }

  void cross_start(std::size_t k) {
    const BlockRange own = block(k, lr_);
    if (own.count == 0) return;
    float* b = out_ + own.begin;
    if (peers_.size() == 1) {  // one host: the owner's division and rounding only
      finish_average(b, own.count, DataType::float32, divisor_);
      cross_ws_.round_trip(b, own.count);
      return;
    }
    // The block's owner in the ring across hosts divides by the whole rank count and rounds.
    cross_stages_ =
        ring_allreduce_stage_list<WireStage>(peers_.rank(), peers_.size(), b, b, own.count, 1);
    cross_.emplace(peers_, cross_stages_, static_cast<std::size_t>(peers_.size() - 2), divisor_,
                   opt_, cross_ws_);
  }

  void cross_finish(std::size_t) {
    if (!cross_.has_value()) return;
    while (!cross_->progress()) t_.wait_any_progress(opt_.deadline);
    cross_.reset();
  }

  void ag(std::size_t k, bool with_cross) {
    if (L_ == 1) return;
    // The blocks are wire values already: the conversions are exact.
    host_allgather_stages(local_stages_, out_, 1, L_, lr_, [&](int b) { return block(k, b); });
    run_local(with_cross);
  }

 private:
  BlockRange block(std::size_t k, int b) const { return chunk_block(count_, chunks_, k, L_, b); }
  void run_local(bool with_cross) {
    WireRingRun local(host_, local_stages_, kNoFinish, 1, opt_, local_ws_);
    drive_together(t_, local, with_cross ? &cross_ : nullptr, opt_);
  }

  TransportRef t_;
  GroupView host_, peers_;
  const float* in_;
  float* out_;
  std::size_t count_;
  int divisor_;
  std::size_t chunks_;
  int L_, lr_;
  const AlgoOptions& opt_;
  const WireSlots& local_ws_;
  const WireSlots& cross_ws_;
  std::vector<WireStage> local_stages_, cross_stages_;
  std::optional<WireRingRun> cross_;
};

}  // namespace detail

inline void allreduce_hierarchical(TransportRef t, const HostGroups& g, const void* in, void* out,
                                   std::size_t count, DataType dtype, ReduceOp op,
                                   CrossAllreduce cross, void* cross_ctx, const AlgoOptions& opt) {
  const std::size_t es = dtype_size(dtype);
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(out);
  if (count == 0) return;
  if (!g.uniform) {
    throw Error("allreduce_hierarchical: hosts have different rank counts (use a flat algorithm)");
  }
  const std::size_t chunks = detail::hierarchical_chunks(count * es, opt);
  if (chunks > 1 && g.cross.size() > 1) {
    // Large: pipelined in chunks, the ring across hosts (the bandwidth-optimal flat algorithm
    // at these sizes) overlapping the rings inside the host.
    detail::HierarchicalRingPipeline p(t, g, src, dst, count, dtype, op, chunks, opt);
    detail::hierarchical_pipeline(chunks, p);
    return;
  }
  const int L = g.local_size();
  const ReduceOp inner_op = op == ReduceOp::average ? ReduceOp::sum : op;
  const ReduceSpec rs{reduce_function(dtype, inner_op), es};

  GroupView host(t, g.local);
  const int lr = host.rank();
  auto block = [&](int b) { return even_block(count, L, mod(b, L)); };

  // 1. Reduce-scatter inside the host (ring_reduce_scatter's schedule on uneven blocks): at
  //    stage s send block lr-s-1 and fold block lr-s-2 into out, so the last block folded is lr.
  if (L == 1) {
    if (src != dst) std::memcpy(dst, src, count * es);
  } else {
    std::vector<RingStage> stages;
    detail::host_reduce_scatter_stages(stages, src, dst, es, L, lr, block);
    run_ring(host, stages, rs, opt);
  }

  // 2. Across hosts: shard lr, on the ranks holding the same block everywhere.
  const BlockRange own = block(lr);
  if (g.cross.size() > 1 && own.count > 0) {
    GroupView peers(t, g.cross);
    cross(cross_ctx, peers, static_cast<void*>(dst + own.begin * es), own.count, dtype, inner_op,
          opt);
  }
  if (op == ReduceOp::average) finish_average(dst + own.begin * es, own.count, dtype, t.size());

  // 3. Allgather inside the host (in place: our block already sits at its offset).
  if (L > 1) {
    std::vector<std::size_t> counts(static_cast<std::size_t>(L));
    for (int b = 0; b < L; ++b) counts[static_cast<std::size_t>(b)] = block(b).count;
    allgatherv_ring(host, dst + own.begin * es, dst, counts, es, opt);
  }
}

// The same with any callable `cross(TransportRef group, void* block, size_t count, ReduceOp op)`.
template <class Cross>
requires std::invocable<Cross&, TransportRef, void*, std::size_t, ReduceOp>
void allreduce_hierarchical(TransportRef t, const HostGroups& g, const void* in, void* out,
                            std::size_t count, DataType dtype, ReduceOp op, Cross&& cross,
                            const AlgoOptions& opt) {
  allreduce_hierarchical(
      t, g, in, out, count, dtype, op,
      [](void* c, TransportRef group, void* block, std::size_t n, DataType, ReduceOp inner,
         const AlgoOptions&) {
        (*static_cast<std::remove_reference_t<Cross>*>(c))(group, block, n, inner);
      },
      const_cast<void*>(static_cast<const void*>(&cross)), opt);
}

// The hierarchical allreduce of float32 with its messages in a 16-bit wire type (fp16/bf16), no
// pass of its own over the tensor: each step is a wire ring (WireRingRun), converting segment by
// segment as it sends and widening as it receives.
//  1. Inside each host, the reduce-scatter: partial sums travel in the wire type and are folded
//     into a float32 accumulator; local rank i ends with block i summed over its host, float32.
//  2. Across hosts, the wire ring allreduce of block i among the ranks with local rank i: the
//     block's owner in that ring divides by the whole rank count (average) and rounds it to the
//     wire type, so every member ends with the same wire values, widened.
//  3. Inside each host, the allgather in the wire type: the blocks are wire values already, so
//     the conversions are exact and every rank ends with the same bits.
// A tensor of at least 2 · opt.hierarchical_chunk_bytes (float32 bytes) is cut into chunks and
// pipelined as the float32 hierarchical allreduce is. Rounding: at most L - 1 + H - 1 roundings
// of partial sums (the host's, then the ring's) and one of the result, as allreduce_ring_wire
// over L·H ranks. Hosts must be uniform. `scratch` grows to two sets of staging slots.
inline void allreduce_hierarchical_wire(TransportRef t, const HostGroups& g, const float* in,
                                        float* out, std::size_t count, const CompressionPolicy& c,
                                        bool average, const AlgoOptions& opt,
                                        std::vector<std::byte>& scratch) {
  WireSlots::reserve(c, opt, scratch, 2);
  const WireSlots local_ws(c, opt, scratch, 0), cross_ws(c, opt, scratch, 1);
  if (count == 0) return;
  if (!g.uniform) {
    throw Error("allreduce_hierarchical: hosts have different rank counts (use a flat algorithm)");
  }
  const std::size_t chunks = detail::hierarchical_chunks(count * sizeof(float), opt);
  detail::HierarchicalWirePipeline p(t, g, in, out, count, average, chunks, opt, local_ws,
                                     cross_ws);
  detail::hierarchical_pipeline(chunks, p);
}

namespace cost {

// Hierarchical: ring reduce-scatter and allgather inside the host over the intra link, and the
// best flat allreduce of S/L bytes across the H hosts, whose L shards share the inter link.
//   2(L-1)·αi + 2(L-1)/L·S·βi + (L-1)/L·S·γ + T_cross(S/L, H, αx, βx·L)
template <class Cross>
double hierarchical(int L, int H, double S, LinkCost intra, LinkCost inter, double gamma,
                    Cross&& best_cross) {
  LinkCost shared = inter;
  shared.beta *= L;
  return ring(L, S, intra, gamma) + best_cross(H, S / L, shared);
}

}  // namespace cost

// The registry's entry: runs where hosts are equal (one host included: then it is a ring
// reduce-scatter + allgather); the model picks it only for several hosts of several ranks.
inline AlgorithmEntry<AllreduceAlgorithm> hierarchical_allreduce_algorithm() {
  AlgorithmEntry<AllreduceAlgorithm> e;
  e.name = "hierarchical";
  e.flat = false;
  e.applies = [](const SelectionShape& s) { return s.uniform; };
  e.cost = [](const CostQuery& q) {
    const SelectionShape* s = q.shape;
    if (s == nullptr || !s->hierarchical_ok || q.best_flat_allreduce == nullptr) {
      return std::numeric_limits<double>::infinity();
    }
    LinkCost intra = s->intra;
    intra.beta *= q.oversubscription;  // host-local copies share the host's cores
    return cost::hierarchical(
        s->local_size, s->hosts, q.bytes, intra, s->inter, q.gamma,
        [&](int H, double S, LinkCost l) { return q.best_flat_allreduce(q.self, H, S, l); });
  };
  e.run = [](TransportRef t, const AllreduceArgs& a, const AlgoOptions& o, const AlgoContext& ctx) {
    const HostGroups g =
        ctx.groups != nullptr ? *ctx.groups : HostGroups::single_host(t.size(), t.rank());
    allreduce_hierarchical(
        t, g, a.in, a.out, a.count, a.dtype, a.op,
        [](void* c, TransportRef group, void* block, std::size_t n, DataType d, ReduceOp op,
           const AlgoOptions& opt) {
          const auto& cx = *static_cast<const AlgoContext*>(c);
          const AllreduceArgs sub{block, block, n, d, op};
          if (cx.sub_allreduce != nullptr) {
            cx.sub_allreduce(cx.self, group, sub, opt);
          } else {
            allreduce_ring(group, block, block, n, d, op, opt);
          }
        },
        const_cast<void*>(static_cast<const void*>(&ctx)), o);
  };
  return e;
}

}  // namespace kolo
