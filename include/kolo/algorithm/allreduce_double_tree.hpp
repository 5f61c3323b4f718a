// kolo/algorithm/allreduce_double_tree.hpp — pipelined double-binary-tree allreduce (Sanders,
// Speck & Träff 2009, "two-tree algorithms"; NCCL's tree algorithm since 2.4).
//
// One binary tree reduces a vector to its root and broadcasts it back down: 2·depth latency
// steps instead of the ring's 2(n-1). Alone it wastes half the links — the leaves (half the
// ranks) never receive during the reduction nor send during the broadcast. Two trees fix that:
// each carries half of the data, and the second tree is built so that the leaves of the first
// are its inner nodes (mirror the ranks when n is even, shift them by one when n is odd). Every
// rank then sends and receives about S bytes in each phase — the ring's bandwidth, with
// O(log n) latency. Both halves are cut into segments and pipelined: a node forwards segment j
// up (or down) while segment j+1 is still arriving, so the time is about
//     (2·depth + segments)·(α + s·β·c) + S·γ,  depth = ceil(log2 n), s the segment size
// (c ≈ 2: an inner node receives two children per segment and also serves the other tree).
//
// The tree: position 0 is the root with a single child, the largest power of two below n; a
// position q > 0 with lowest set bit b sits at height log2(b), its children are q - b/2 and the
// nearest q + b/2, q + b/4, ... that exists. Odd positions are the leaves, so about half the
// ranks are inner nodes of each tree and the two trees' inner nodes are disjoint.
//
// Messages between two ranks may belong to both trees (a rank can be my child in one tree and my
// parent in the other), and the transport matches messages per peer only by order. So every link
// carries its messages in one fixed order known to both ends — by a key that is the segment
// number for upward messages and the segment number plus a lag for downward ones, upward first
// within a key — and each rank posts its sends and receives in that order. This cannot
// deadlock: an upward message depends only on upward messages of the same segment and tree from
// the children, a downward one on its own segment's upward messages (a smaller key) and on the
// parent's downward message (same key, acyclic: a tree); with link order (key, up before down)
// induction over keys posts everything.
//
// Bit-identical on every rank: each element is reduced once, on its way up one tree (an inner
// node folds in its first child, then its second, always in that order), finished at that
// tree's root, and only copied on the way down. ReduceOp::average: the root divides once.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <utility>
#include <vector>

#include "kolo/algorithm/allreduce_prologue.hpp"
#include "kolo/algorithm/entry.hpp"
#include "kolo/algorithm/options.hpp"
#include "kolo/core/reduce.hpp"
#include "kolo/transport/transport_ref.hpp"

namespace kolo {

// A rank's place in one tree: parent (-1 at the root) and up to two children (-1 when absent).
struct TreeLinks {
  int parent = -1;
  int child[2] = {-1, -1};
  int children() const { return (child[0] >= 0) + (child[1] >= 0); }
};

// The in-order binary tree over positions 0..n-1 described above.
inline TreeLinks inorder_tree_position(int n, int q) {
  TreeLinks l;
  if (n <= 1) return l;
  if (q == 0) {
    int top = 1;
    while (top * 2 < n) top *= 2;
    l.child[0] = top;
    return l;
  }
  const int low = q & -q;
  // q = k·low with k odd. For k = 1 mod 4, q is the left child of q + low (if that exists);
  // otherwise, and when q + low is past the end, it hangs below q - low.
  const bool left_child = ((q / low) & 3) == 1;
  l.parent = (left_child && q + low < n) ? q + low : q - low;
  if (low > 1) {
    l.child[0] = q - low / 2;
    for (int h = low / 2; h >= 1; h /= 2) {
      if (q + h < n) {
        l.child[1] = q + h;
        break;
      }
    }
  }
  return l;
}

// Rank r's links in tree `which` (0 or 1) of the double binary tree over n ranks.
inline TreeLinks double_tree_links(int n, int r, int which) {
  if (which == 0) return inorder_tree_position(n, r);
  // Tree 1: the same shape on permuted positions, chosen so that tree 0's leaves (odd ranks)
  // become tree 1's inner nodes: mirror for even n, shift by one for odd n.
  const bool even = n % 2 == 0;
  auto to_pos = [&](int rank) { return even ? n - 1 - rank : mod(rank - 1, n); };
  auto to_rank = [&](int pos) { return pos < 0 ? -1 : even ? n - 1 - pos : mod(pos + 1, n); };
  const TreeLinks p = inorder_tree_position(n, to_pos(r));
  TreeLinks l;
  l.parent = to_rank(p.parent);
  l.child[0] = to_rank(p.child[0]);
  l.child[1] = to_rank(p.child[1]);
  return l;
}

// Segment size for the trees. Per segment a step costs about α + c·s·β (c = 2 children), and
// the pipeline takes 2·depth + H/s steps for H bytes per tree, so the time
//     (2·depth + H/s)·(α + 2·s·β)
// is smallest at s = sqrt(H·(α/β) / (4·depth)). `alpha_over_beta` is α/β in bytes (the Selector
// passes its measured constants); the result is kept within [16 KiB, cap] and a multiple of
// 4 KiB, and must be computed identically on every rank.
inline std::size_t double_tree_segment(std::size_t half_bytes, int n, double alpha_over_beta,
                                       std::size_t cap) {
  int depth = 1;
  while ((1 << depth) < n) ++depth;
  const double best =
      std::sqrt(static_cast<double>(half_bytes) * std::max(1.0, alpha_over_beta) / (4.0 * depth));
  const std::size_t lo = std::min<std::size_t>(16 * 1024, cap);
  std::size_t seg = std::clamp<std::size_t>(static_cast<std::size_t>(best), lo, std::max(lo, cap));
  if (seg >= 4096) seg = seg / 4096 * 4096;
  return std::max<std::size_t>(1, seg);
}

// α/β of the default constants (15 µs, 0.15 ns/B): used when nobody passes a segment.
inline constexpr double kDefaultAlphaOverBeta = 100000.0;

inline void allreduce_double_tree(TransportRef t, const void* in, void* out, std::size_t count,
                                  DataType dtype, ReduceOp op, const AlgoOptions& opt) {
  const auto f = allreduce_prologue(t, in, out, count, dtype, op);
  if (!f) return;
  const int n = f->n;
  const int r = f->r;
  const std::size_t es = f->es;
  const std::byte* src = f->src;
  std::byte* dst = f->dst;
  const ReduceSpec rs = f->rs;

  // Halves: tree 0 carries elements [0, c0), tree 1 [c0, count).
  const std::size_t c0 = (count + 1) / 2;
  const std::size_t half_begin[2] = {0, c0 * es};
  const std::size_t half_bytes[2] = {c0 * es, (count - c0) * es};
  const std::size_t seg =
      opt.tree_segment_bytes > 0
          ? std::max(es, opt.tree_segment_bytes / es * es)
          : std::max(es, double_tree_segment(half_bytes[0], n, kDefaultAlphaOverBeta,
                                             opt.segment_bytes) /
                             es * es);
  std::size_t nseg[2];
  for (int h = 0; h < 2; ++h) nseg[h] = (half_bytes[h] + seg - 1) / seg;  // 0 for an empty half
  const std::size_t kmax = nseg[0];                                       // nseg[1] <= nseg[0]
  const TreeLinks tree[2] = {double_tree_links(n, r, 0), double_tree_links(n, r, 1)};

  enum class Kind : std::uint8_t { up_send, down_send, up_recv, down_recv };
  struct Msg {
    std::uint32_t j;
    std::uint8_t h;
    Kind kind;
    std::uint8_t child;  // up_recv: which child (0 folds into the input, 1 into the result)
  };
  struct Link {
    int peer = -1;
    std::vector<Msg> sends, recvs;  // in link order
    std::size_t send_next = 0, recv_next = 0;
    std::deque<TransportRef::Request> send_q, recv_q;  // posted, not yet retired
    std::size_t recv_retired = 0, send_retired = 0;
  };
  std::vector<Link> links;
  auto link_of = [&](int peer) -> Link& {
    for (auto& l : links) {
      if (l.peer == peer) return l;
    }
    Link l;
    l.peer = peer;
    links.push_back(std::move(l));
    return links.back();
  };
  // Every link's message order, known to both ends: by key, where the upward message of
  // segment j has key j and the downward one key j + lag; within a key all upward messages
  // (tree 0, then tree 1) before the downward ones. The lag lets the reduction run `lag`
  // segments ahead of the broadcast on a link that carries both (a rank that is my child in one
  // tree and my parent in the other): without it, segment j+1 would wait on that link for
  // segment j's whole round trip through the root.
  int depth = 1;
  while ((1 << depth) < n) ++depth;
  const std::size_t lag = static_cast<std::size_t>(2 * depth + 2);
  for (std::size_t key = 0; key < kmax + lag; ++key) {
    for (std::uint8_t h = 0; h < 2; ++h) {  // upward: segment j = key
      if (key >= nseg[h]) continue;
      const auto jj = static_cast<std::uint32_t>(key);
      const TreeLinks& tl = tree[h];
      if (tl.parent >= 0) link_of(tl.parent).sends.push_back({jj, h, Kind::up_send, 0});
      for (std::uint8_t c = 0; c < 2; ++c) {
        if (tl.child[c] >= 0) link_of(tl.child[c]).recvs.push_back({jj, h, Kind::up_recv, c});
      }
    }
    for (std::uint8_t h = 0; h < 2; ++h) {  // downward: segment j = key - lag
      if (key < lag || key - lag >= nseg[h]) continue;
      const auto jj = static_cast<std::uint32_t>(key - lag);
      const TreeLinks& tl = tree[h];
      if (tl.parent >= 0) link_of(tl.parent).recvs.push_back({jj, h, Kind::down_recv, 0});
      for (std::uint8_t c = 0; c < 2; ++c) {
        if (tl.child[c] >= 0) link_of(tl.child[c]).sends.push_back({jj, h, Kind::down_send, 0});
      }
    }
  }

  // Per (tree, segment): children folded in so far, and whether the final value is here.
  std::vector<std::uint8_t> folded(2 * kmax, 0), final_ready(2 * kmax, 0);
  auto idx = [&](const Msg& m) { return static_cast<std::size_t>(m.h) * kmax + m.j; };
  auto range = [&](const Msg& m) {
    const std::size_t off = half_begin[m.h] + static_cast<std::size_t>(m.j) * seg;
    const std::size_t len = std::min(seg, half_bytes[m.h] - static_cast<std::size_t>(m.j) * seg);
    return std::pair<std::size_t, std::size_t>{off, len};
  };
  auto finish_if_root = [&](const Msg& m) {
    const TreeLinks& tl = tree[m.h];
    if (tl.parent < 0 && folded[idx(m)] == tl.children()) {
      const auto [off, len] = range(m);
      if (op == ReduceOp::average) finish_average(dst + off, len / es, dtype, n);
      final_ready[idx(m)] = 1;
    }
  };

  auto send_ready = [&](const Msg& m) {
    if (m.kind == Kind::up_send) return folded[idx(m)] == tree[m.h].children();
    return final_ready[idx(m)] != 0;
  };
  auto recv_ready = [&](const Msg& m) {
    // The second child folds into the first child's result: wait until that one is in.
    return m.kind != Kind::up_recv || m.child == 0 || folded[idx(m)] >= 1;
  };

  for (;;) {
    bool changed = false;
    bool all_done = true;
    for (auto& l : links) {
      // Retire in posting order (the transport completes per peer in that order).
      while (!l.recv_q.empty() && t.done(l.recv_q.front())) {
        const Msg& m = l.recvs[l.recv_retired++];
        l.recv_q.pop_front();
        if (m.kind == Kind::up_recv) {
          ++folded[idx(m)];
          finish_if_root(m);
        } else {
          final_ready[idx(m)] = 1;
        }
        changed = true;
      }
      while (!l.send_q.empty() && t.done(l.send_q.front())) {
        l.send_q.pop_front();
        ++l.send_retired;
        changed = true;
      }
    }
    for (auto& l : links) {
      while (l.send_next < l.sends.size() && send_ready(l.sends[l.send_next])) {
        const Msg& m = l.sends[l.send_next++];
        const auto [off, len] = range(m);
        // A leaf of this tree sends its input untouched; everyone else sends the result.
        const std::byte* from =
            (m.kind == Kind::up_send && tree[m.h].children() == 0) ? src + off : dst + off;
        l.send_q.push_back(t.isend(l.peer, from, len, opt.sig));
        changed = true;
      }
      while (l.recv_next < l.recvs.size() && l.recv_q.size() < opt.recv_window &&
             recv_ready(l.recvs[l.recv_next])) {
        const Msg& m = l.recvs[l.recv_next++];
        const auto [off, len] = range(m);
        TransportRef::Request q;
        if (m.kind == Kind::down_recv) {
          // Safe to post early: the parent sends the final value only after it has our partial
          // sum of this segment, so our send of it has left this buffer.
          q = t.irecv(l.peer, dst + off, len, opt.sig);
        } else {
          q = t.irecv_reduce(l.peer, dst + off, (m.child == 0 ? src : dst) + off, len, rs, opt.sig);
        }
        l.recv_q.push_back(q);
        changed = true;
      }
      all_done = all_done && l.recv_retired == l.recvs.size() && l.send_retired == l.sends.size();
    }
    if (all_done) break;
    if (!changed) t.wait_any_progress(opt.deadline);
  }
}

namespace cost {

// The double tree's shape, from the trees themselves: depth, and the most links any rank serves
// in both trees together (each link carries S/2 up and S/2 down per tree).
struct TreeShape {
  int depth = 0;
  int max_links = 0;
  int max_children = 0;  // in one tree: how many segments one rank folds per segment
};
inline TreeShape double_tree_shape(int n) {
  TreeShape s;
  if (n <= 1) return s;
  // Depth: follow parents from every rank (n is small: ranks of one job).
  for (int which = 0; which < 2; ++which) {
    for (int r = 0; r < n; ++r) {
      int d = 0;
      for (int x = r; double_tree_links(n, x, which).parent >= 0;
           x = double_tree_links(n, x, which).parent)
        ++d;
      s.depth = std::max(s.depth, d);
    }
  }
  for (int r = 0; r < n; ++r) {
    int links = 0;
    for (int which = 0; which < 2; ++which) {
      const TreeLinks l = double_tree_links(n, r, which);
      links += (l.parent >= 0) + l.children();
      s.max_children = std::max(s.max_children, l.children());
    }
    s.max_links = std::max(s.max_links, links);
  }
  return s;
}

// Pipelined double binary tree, segments of s bytes, depth D, a rank serving at most E links:
//   2·D·(α + c·s·β)  [filling and draining the pipeline, c children per segment]
//   + E·(S/2)·β      [the busiest rank's traffic: S/2 per link and direction]
//   + c/2·S·γ        [an inner node folds c segments of its tree per segment]
inline double double_tree(const TreeShape& ts, int n, double S, LinkCost l, double gamma,
                          std::size_t segment_cap) {
  if (n <= 1) return 0;
  const double half = std::ceil(S / 2);
  const double s = std::min(half, static_cast<double>(double_tree_segment(
                                      static_cast<std::size_t>(half), n,
                                      l.alpha / std::max(l.beta, 1e-15), segment_cap)));
  const double c = ts.max_children;
  return 2.0 * ts.depth * (l.alpha + c * s * l.beta) + ts.max_links * (S / 2) * l.beta +
         c / 2 * S * gamma;
}

}  // namespace cost

namespace detail {

// The tree's shape per rank count, computed once (the Selector asks per call).
inline const cost::TreeShape& cached_tree_shape(int n) {
  static thread_local std::vector<std::pair<int, cost::TreeShape>> memo;
  for (const auto& [k, v] : memo) {
    if (k == n) return v;
  }
  memo.emplace_back(n, cost::double_tree_shape(n));
  return memo.back().second;
}

}  // namespace detail

// The registry's entry. The segment comes from the constants of the link the call runs on
// (AlgoContext::link: rank 0's measured ones, so every rank cuts the same segments).
inline AlgorithmEntry<AllreduceAlgorithm> double_tree_allreduce_algorithm() {
  AlgorithmEntry<AllreduceAlgorithm> e;
  e.name = "tree";
  e.aliases = {"double-tree", "double-binary-tree"};
  e.cost = [](const CostQuery& q) {
    return cost::double_tree(detail::cached_tree_shape(q.n), q.n, q.bytes, q.contended(), q.gamma,
                             q.segment_bytes);
  };
  e.run = [](TransportRef t, const AllreduceArgs& a, const AlgoOptions& o, const AlgoContext& ctx) {
    AlgoOptions opt = o;
    if (opt.tree_segment_bytes == 0 && (ctx.link.alpha > 0 || ctx.link.beta > 0)) {
      const std::size_t half = (a.count + 1) / 2 * dtype_size(a.dtype);
      opt.tree_segment_bytes = double_tree_segment(
          half, t.size(), ctx.link.alpha / std::max(ctx.link.beta, 1e-15), ctx.segment_cap);
    }
    allreduce_double_tree(t, a.in, a.out, a.count, a.dtype, a.op, opt);
  };
  return e;
}

}  // namespace kolo
