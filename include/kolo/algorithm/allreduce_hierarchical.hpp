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
    for (int s = 0; s < L - 1; ++s) {
      const BlockRange sb = block(lr - s - 1), rb = block(lr - s - 2);
      stages.push_back({(s == 0 ? src : dst) + sb.begin * es, sb.count * es, dst + rb.begin * es,
                        src + rb.begin * es, rb.count * es});
    }
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
// pass of its own over the tensor: each step is a ring of run_ring_wire, converting segment by
// segment as it sends and widening as it receives.
//  1. Inside each host, the reduce-scatter: partial sums travel in the wire type and are folded
//     into a float32 accumulator; local rank i ends with block i summed over its host, float32.
//  2. Across hosts, allreduce_ring_wire of block i among the ranks with local rank i: the
//     block's owner in that ring divides by the whole rank count (average) and rounds it to the
//     wire type, so every member ends with the same wire values, widened.
//  3. Inside each host, the allgather in the wire type: the blocks are wire values already, so
//     the conversions are exact and every rank ends with the same bits.
// Rounding: at most L - 1 + H - 1 roundings of partial sums (the host's, then the ring's) and
// one of the result, as allreduce_ring_wire over L·H ranks. Hosts must be uniform.
inline void allreduce_hierarchical_wire(TransportRef t, const HostGroups& g, const float* in,
                                        float* out, std::size_t count, const CompressionPolicy& c,
                                        bool average, const AlgoOptions& opt,
                                        std::vector<std::byte>& scratch) {
  const WireSlots ws(c, opt, scratch);
  if (count == 0) return;
  if (!g.uniform) {
    throw Error("allreduce_hierarchical: hosts have different rank counts (use a flat algorithm)");
  }
  const int L = g.local_size();
  GroupView host(t, g.local);
  const int lr = host.rank();
  auto block = [&](int b) { return even_block(count, L, mod(b, L)); };

  // 1. Reduce-scatter inside the host (allreduce_hierarchical's schedule): at stage s send block
  //    lr-s-1 and fold block lr-s-2 into out, so the last block folded is lr.
  std::vector<WireStage> stages;
  if (L == 1) {
    if (in != out) std::memcpy(out, in, count * sizeof(float));
  } else {
    for (int s = 0; s < L - 1; ++s) {
      const BlockRange sb = block(lr - s - 1), rb = block(lr - s - 2);
      stages.push_back(
          {(s == 0 ? in : out) + sb.begin, sb.count, out + rb.begin, in + rb.begin, rb.count});
    }
    run_ring_wire(host, stages, kNoFinish, 1, c, opt, ws);
  }

  // 2. Across hosts: block lr over the ranks holding it everywhere; its owner there divides by
  //    the rank count of the whole allreduce and rounds.
  const BlockRange own = block(lr);
  GroupView peers(t, g.cross);
  allreduce_ring_wire_divided(peers, out + own.begin, out + own.begin, own.count, c,
                              average ? t.size() : 1, opt, ws);

  // 3. Allgather inside the host: at stage u send block lr-u (ours first), receive lr-u-1.
  if (L > 1) {
    stages.clear();
    for (int u = 0; u < L - 1; ++u) {
      const BlockRange sb = block(lr - u), rb = block(lr - u - 1);
      stages.push_back({out + sb.begin, sb.count, out + rb.begin, nullptr, rb.count});
    }
    run_ring_wire(host, stages, kNoFinish, 1, c, opt, ws);
  }
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
