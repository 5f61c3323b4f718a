// kolo/algorithm/ring_pipeline.hpp — the segmented, pipelined ring driver shared by ring
// allreduce, reduce-scatter and allgather.
//
// A ring collective is a sequence of stages; at stage t each rank sends one block to its right
// neighbour and receives one block from its left neighbour (copying it or reducing it into
// place). The block a rank sends at stage t is the one it received at stage t-1, so instead of
// finishing a whole stage before starting the next, each block is cut into segments and segment
// j of stage t is sent as soon as segment j of stage t-1 has arrived: several segments are in
// flight at once and the ring behaves like a pipeline (Patarasuk & Yuan 2009; NCCL's "slices").
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <deque>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "kolo/algorithm/options.hpp"
#include "kolo/transport/transport_ref.hpp"

namespace kolo {

// One stage as seen by this rank. Sizes of the sent and received blocks may differ (allgatherv);
// the right neighbour's recv block at stage t is always this rank's send block at stage t, so
// both ends cut it into the same segments.
struct RingStage {
  const std::byte* send = nullptr;
  std::size_t send_bytes = 0;
  std::byte* recv = nullptr;         // destination of the received block
  const std::byte* local = nullptr;  // reduce: dst = local (op) incoming; nullptr: plain copy
  std::size_t recv_bytes = 0;
};

// A ring over a list of tensors instead of one buffer (Communicator::allreduce_coalesced, the
// engine's fused batches): the collective's buffer is the tensors laid end to end, a logical
// byte range that no memory holds. A stage's addresses are offsets into it, on the input side
// (the tensors' inputs) or the output side, and each message is posted in pieces (IoPiece,
// transport VectoredP2P) that name the tensors' own memory: no pack, no unpack.
struct PieceAddr {
  enum Side : unsigned char { none, in, out };
  Side side = none;
  std::size_t off = 0;
  PieceAddr() = default;
  PieceAddr(std::nullptr_t) {}  // NOLINT(google-explicit-constructor): "no local operand"
  PieceAddr(Side s, std::size_t o) : side(s), off(o) {}
  PieceAddr operator+(std::size_t d) const { return {side, off + d}; }
  explicit operator bool() const { return side != none; }
};

struct PieceStage {
  PieceAddr send;
  std::size_t send_bytes = 0;
  PieceAddr recv;
  PieceAddr local;  // set: reduce into recv from local (op) incoming; none: plain copy
  std::size_t recv_bytes = 0;
};

// The tensors of a ring over pieces, in order, and the pieces of the messages posted so far.
class PieceMap {
 public:
  struct Part {
    const std::byte* in;
    std::byte* out;
    std::size_t bytes;
  };
  // Sets the tensors, in order (empty ones may be left out), and each one's end offset.
  void assign(std::span<const Part> parts) {
    parts_.assign(parts.begin(), parts.end());
    ends_.resize(parts_.size());
    std::size_t e = 0;
    for (std::size_t i = 0; i < parts_.size(); ++i) ends_[i] = e += parts_[i].bytes;
    arena_.clear();
  }
  std::size_t bytes() const { return ends_.empty() ? 0 : ends_.back(); }
  std::size_t parts() const { return parts_.size(); }
  // Room for `pieces` pieces in all: the pieces of a posted message must not move until it
  // completes, so the arena never grows while a ring runs (take() checks).
  void reserve(std::size_t pieces) {
    arena_.clear();
    arena_.reserve(pieces);
  }
  // The pieces of bytes [a.off, a.off + len) of side a.side, and, for a reduce, the input side
  // at `local` as each piece's src: appended to the arena, returned as (first, count).
  std::pair<const IoPiece*, std::size_t> take(PieceAddr a, std::size_t len, PieceAddr local) {
    if (local && local.off != a.off) throw Error("PieceMap: a reduce's operands differ in offset");
    const std::size_t first = arena_.size();
    for_runs(a.off, len, [&](std::size_t k, std::size_t at, std::size_t n) {
      const Part& p = parts_[k];
      IoPiece v;
      if (a.side == PieceAddr::in) {
        v.src = p.in + at;
      } else if (local) {
        v.dst = p.out + at;
        v.src = p.in + at;
      } else {
        v.dst = p.out + at;
        v.src = p.out + at;  // a send of the output side reads it; a receive ignores src
      }
      v.bytes = n;
      if (arena_.size() == arena_.capacity()) {
        throw Error("PieceMap: more pieces than reserved (an internal error)");
      }
      arena_.push_back(v);
    });
    return {arena_.data() + first, arena_.size() - first};
  }
  // f(part, offset in it, bytes) for the parts of bytes [off, off + len), in order.
  template <class F>
  void for_runs(std::size_t off, std::size_t len, F&& f) const {
    std::size_t k =
        static_cast<std::size_t>(std::upper_bound(ends_.begin(), ends_.end(), off) - ends_.begin());
    const std::size_t end = off + len;
    for (; k < parts_.size() && off < end; ++k) {
      const std::size_t b = ends_[k] - parts_[k].bytes;
      const std::size_t n = std::min(end, ends_[k]) - off;
      if (n > 0) f(k, off - b, n);
      off += n;
    }
  }
  const Part& part(std::size_t k) const { return parts_[k]; }
  // How many pieces a message of bytes [off, off + len) takes at most.
  std::size_t pieces_of(std::size_t off, std::size_t len) const {
    const auto lo = std::upper_bound(ends_.begin(), ends_.end(), off);
    const auto hi = std::lower_bound(lo, ends_.end(), off + len);
    return static_cast<std::size_t>(hi - lo) + 1;
  }

 private:
  std::vector<Part> parts_;
  std::vector<std::size_t> ends_;
  std::vector<IoPiece> arena_;
};

namespace detail {

inline std::size_t segment_count(std::size_t bytes, std::size_t seg) {
  return bytes == 0 ? 1 : (bytes + seg - 1) / seg;  // an empty block still sends one message
}

// One message of a ring: segment `seg` of stage `stage`.
struct RingSeg {
  std::size_t stage, seg;
};

// The order in which a ring's messages travel one way, given each stage's segment count
// (`segs(s)`, s < nstages): stage by stage, segment by segment, except that stage `overlap` + 1
// starts `lag` segments after stage `overlap` started and runs interleaved with it. Segment j of
// stage s has the key start(s) + j; ties (the two interleaved stages) go in stage order. The
// sender derives its order from its send sizes, the receiver from its receive sizes, which are
// the same blocks (stage s moves the same block on both ends of a link), so both walk the same
// sequence; a segment's key exceeds the key of the segment it forwards (stage s-1, segment j),
// so every rank can always send its next message once its left neighbour has sent the ones of
// smaller keys, whatever the arrival order: no deadlock.
template <class SegCount>
std::vector<RingSeg> ring_message_order(std::size_t nstages, SegCount segs, std::size_t overlap,
                                        std::size_t lag) {
  std::vector<std::pair<std::size_t, RingSeg>> keyed;
  std::size_t start = 0, prev_k = 0;
  for (std::size_t s = 0; s < nstages; ++s) {
    const std::size_t k = segs(s);
    if (s > 0) start += s == overlap + 1 ? std::min(lag, prev_k) : prev_k;
    for (std::size_t j = 0; j < k; ++j) keyed.push_back({start + j, RingSeg{s, j}});
    prev_k = k;
  }
  std::stable_sort(keyed.begin(), keyed.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<RingSeg> order(keyed.size());
  for (std::size_t i = 0; i < keyed.size(); ++i) order[i] = keyed[i].second;
  return order;
}

}  // namespace detail

// The stages of a ring allreduce of `count` elements at rank r of n, as `Stage`s: RingStage
// (byte pointers, sizes in bytes: `unit` = the element size) or WireStage (float pointers,
// sizes in elements: `unit` = 1). Reduce-scatter: stage s sends block r-s and folds block r-s-1
// into dst; allgather: this rank owns block r+1, stage u sends block r+1-u and receives block
// r-u. The last fold is stage n-2.
template <class Stage, class In, class Out>
std::vector<Stage> ring_allreduce_stage_list(int r, int n, In src, Out dst, std::size_t count,
                                             std::size_t unit) {
  std::vector<Stage> stages;
  stages.reserve(static_cast<std::size_t>(2 * (n - 1)));
  auto block = [&](int b) { return even_block(count, n, mod(b, n)); };
  for (int s = 0; s < n - 1; ++s) {
    const BlockRange sb = block(r - s), rb = block(r - s - 1);
    stages.push_back({(s == 0 ? src : dst) + sb.begin * unit, sb.count * unit,
                      dst + rb.begin * unit, src + rb.begin * unit, rb.count * unit});
  }
  for (int u = 0; u < n - 1; ++u) {
    const BlockRange sb = block(r + 1 - u), rb = block(r - u);
    stages.push_back(
        {dst + sb.begin * unit, sb.count * unit, dst + rb.begin * unit, nullptr, rb.count * unit});
  }
  return stages;
}

// Called after each received segment lands: (context, stage, byte offset in the block, bytes).
using RingReceived = void (*)(void* ctx, std::size_t stage, std::size_t offset, std::size_t bytes);

// The ring driver as an object: progress() does whatever needs no waiting (retires finished
// messages, posts receives ahead and every send whose data is ready) and says whether the ring
// is done; run_ring waits for the transport between calls. Several rings on disjoint peers can
// progress in one loop (the pipelined hierarchical allreduce overlaps a ring inside the host
// with one across hosts). `stages` and `opt` must outlive the object.
//
// BasicRingRun<PieceStage> is the same ring over the tensors of a PieceMap, in pieces: its
// messages are those of the ring over the tensors packed end to end, so its peers may run either.
template <class Stage>
class BasicRingRun {
 public:
  // `on_received(ctx, t, offset, bytes)` runs after each received segment lands (used to fold
  // ReduceOp::average's division into the last reduce step; nullptr: nothing). `map`: the
  // tensors of a PieceStage ring (nullptr for RingStage).
  BasicRingRun(TransportRef t, const std::vector<Stage>& stages, const ReduceSpec& rs,
               const AlgoOptions& opt, RingReceived on_received = nullptr, void* ctx = nullptr,
               PieceMap* map = nullptr)
      : t_(t),
        map_(map),
        stages_(stages),
        rs_(rs),
        opt_(opt),
        on_received_(on_received),
        ctx_(ctx),
        right_(mod(t.rank() + 1, t.size())),
        left_(mod(t.rank() - 1, t.size())),
        // Segment size: a multiple of the element size so reductions never split an element.
        seg_(std::max(es(rs), opt.segment_bytes / es(rs) * es(rs))),
        recv_off_(stages.size() + 1, 0) {
    for (std::size_t s = 0; s < stages_.size(); ++s) {
      recv_off_[s + 1] = recv_off_[s] + detail::segment_count(stages_[s].recv_bytes, seg_);
      send_total_ += detail::segment_count(stages_[s].send_bytes, seg_);
    }
  }

  // Before the first progress(): stage `stage` + 1 starts `lag` segments after stage `stage`
  // starts, instead of after it ends, and the two run interleaved (lag 0: no change). Every
  // rank of the ring must make the same call. An allreduce uses it on its last reduce-scatter
  // stage (AlgoOptions::ring_overlap_lag): each finished segment is then sent on while it is in
  // cache, not a whole block after it was reduced.
  void overlap_after(std::size_t stage, std::size_t lag) {
    if (lag == 0 || stage + 1 >= stages_.size()) return;
    send_order_ = detail::ring_message_order(
        stages_.size(),
        [&](std::size_t s) { return detail::segment_count(stages_[s].send_bytes, seg_); }, stage,
        lag);
    recv_order_ = detail::ring_message_order(
        stages_.size(),
        [&](std::size_t s) { return detail::segment_count(stages_[s].recv_bytes, seg_); }, stage,
        lag);
    recv_pos_.resize(recv_order_.size());
    for (std::size_t p = 0; p < recv_order_.size(); ++p) {
      recv_pos_[recv_off_[recv_order_[p].stage] + recv_order_[p].seg] = p;
    }
  }

  bool progress() {
    const std::size_t recv_total = recv_off_[stages_.size()];
    // Retire receives in order (the transport completes them in posting order).
    while (!recvs_.empty() && t_.done(recvs_.front().req)) {
      const Pending& p = recvs_.front();
      if (on_received_ != nullptr) {
        const std::size_t off = p.seg * seg_;
        on_received_(ctx_, p.stage, off, piece(stages_[p.stage].recv_bytes, off));
      }
      recvs_.pop_front();
      ++recv_done_;
    }
    while (!sends_.empty() && t_.done(sends_.front().req)) sends_.pop_front();
    // Post receives ahead, within the window.
    while (recv_posted_ < recv_total && recv_posted_ - recv_done_ < opt_.recv_window) {
      post_recv(recv_posted_++);
    }
    // Post the sends in their order while their data is ready: stage 0 at once, stage t segment
    // j once stage t-1 segment j has been received (its bytes are what we forward).
    while (send_posted_ < send_total_) {
      const Seg m = send_order_.empty() ? next_send_ : send_order_[send_posted_];
      if (m.stage > 0) {  // the position of the receive it forwards
        const std::size_t flat = recv_off_[m.stage - 1] + m.seg;
        if ((recv_pos_.empty() ? flat : recv_pos_[flat]) >= recv_done_) break;
      }
      const Stage& st = stages_[m.stage];
      const std::size_t off = m.seg * seg_;
      sends_.push_back({m.stage, m.seg, post_send(st, off, piece(st.send_bytes, off))});
      ++send_posted_;
      if (send_order_.empty() && ++next_send_.seg == detail::segment_count(st.send_bytes, seg_)) {
        next_send_ = {m.stage + 1, 0};
      }
    }
    return recv_done_ == recv_total && send_posted_ == send_total_ && sends_.empty();
  }

 private:
  struct Pending {
    std::size_t stage, seg;
    TransportRef::Request req;
  };
  using Seg = detail::RingSeg;
  static std::size_t es(const ReduceSpec& rs) { return rs.elem_size ? rs.elem_size : 1; }
  std::size_t piece(std::size_t bytes, std::size_t off) const {
    return std::min(seg_, bytes - std::min(off, bytes));
  }
  void post_recv(std::size_t flat) {
    std::size_t s = 0, j = 0;
    if (recv_order_.empty()) {  // stage by stage
      while (recv_off_[s + 1] <= flat) ++s;
      j = flat - recv_off_[s];
    } else {
      s = recv_order_[flat].stage;
      j = recv_order_[flat].seg;
    }
    const Stage& st = stages_[s];
    const std::size_t off = j * seg_;
    const std::size_t len = piece(st.recv_bytes, off);
    if constexpr (std::is_same_v<Stage, PieceStage>) {
      const auto v = map_->take(st.recv + off, len, st.local ? st.local + off : PieceAddr{});
      recvs_.push_back({s, j,
                        st.local ? t_.irecv_reducev(left_, v.first, v.second, len, rs_, opt_.sig)
                                 : t_.irecvv(left_, v.first, v.second, len, opt_.sig)});
    } else {
      const TransportRef::Request r =
          st.local ? t_.irecv_reduce(left_, st.recv + off, st.local + off, len, rs_, opt_.sig)
                   : t_.irecv(left_, st.recv + off, len, opt_.sig);
      recvs_.push_back({s, j, r});
    }
  }
  TransportRef::Request post_send(const Stage& st, std::size_t off, std::size_t len) {
    if constexpr (std::is_same_v<Stage, PieceStage>) {
      const auto v = map_->take(st.send + off, len, PieceAddr{});
      return t_.isendv(right_, v.first, v.second, len, opt_.sig);
    } else {
      return t_.isend(right_, st.send + off, len, opt_.sig);
    }
  }

  TransportRef t_;
  PieceMap* map_;
  const std::vector<Stage>& stages_;
  ReduceSpec rs_;
  const AlgoOptions& opt_;
  RingReceived on_received_;
  void* ctx_;
  int right_, left_;
  std::size_t seg_;
  std::vector<std::size_t> recv_off_;  // per stage: its first segment's index in recv_pos_
  // With overlap_after(): the messages' order each way, and each receive's position in it
  // (empty: stage by stage, where a receive's position is its flat index).
  std::vector<Seg> send_order_, recv_order_;
  std::vector<std::size_t> recv_pos_;
  Seg next_send_{0, 0};  // stage by stage: the next send
  std::size_t send_total_ = 0;
  std::deque<Pending> recvs_, sends_;
  std::size_t recv_posted_ = 0, recv_done_ = 0, send_posted_ = 0;
};

using RingRun = BasicRingRun<RingStage>;

// Runs the stages to the end; `on_received(ctx, t, offset, bytes)` runs after each received
// segment lands (used to fold ReduceOp::average's division into the last reduce step; nullptr:
// nothing).
inline void run_ring(TransportRef t, const std::vector<RingStage>& stages, const ReduceSpec& rs,
                     const AlgoOptions& opt, RingReceived on_received = nullptr,
                     void* ctx = nullptr) {
  RingRun ring(t, stages, rs, opt, on_received, ctx);
  while (!ring.progress()) t.wait_any_progress(opt.deadline);
}

// The same with any callable `on_received(stage, offset, bytes)`.
template <class OnReceived>
requires std::invocable<OnReceived&, std::size_t, std::size_t, std::size_t>
void run_ring(TransportRef t, const std::vector<RingStage>& stages, const ReduceSpec& rs,
              const AlgoOptions& opt, OnReceived&& on_received) {
  run_ring(
      t, stages, rs, opt,
      [](void* c, std::size_t stage, std::size_t off, std::size_t len) {
        (*static_cast<std::remove_reference_t<OnReceived>*>(c))(stage, off, len);
      },
      const_cast<void*>(static_cast<const void*>(&on_received)));
}

}  // namespace kolo
