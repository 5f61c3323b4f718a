// kolo/algorithm/ring_allreduce_wire.hpp — a float32 ring allreduce whose messages travel in a
// 16-bit wire type (float16 or bfloat16), converted segment by segment on the way in and out.
//
// The engine's older compressed path makes three passes over the whole tensor: compress it into
// a 16-bit buffer, allreduce that buffer, decompress the result. Here there is no 16-bit copy of
// the tensor. The ring is the same as allreduce_ring's (reduce-scatter, then allgather, cut into
// segments and pipelined), but:
// - a segment is converted to the wire type into a small staging slot just before it is sent,
//   and the slot is what the transport copies into its socket or shared-memory slot;
// - a received segment lands in a staging slot, and is widened and added to the float32
//   accumulator (reduce-scatter) or widened into the output (allgather) while it is still in
//   cache.
// The slots are a few segments each (a few hundred KiB in all): the conversions never take a
// pass over memory of their own.
//
// Arithmetic: the accumulator stays float32 for the whole reduce-scatter; a partial sum is
// rounded to the wire type only when it is sent. The owner of each block rounds its finished
// block (after average's division) to the wire type and back, so every rank ends with the same
// values: the wire values, widened. Error per element: at most n - 1 roundings of partial sums
// plus one of the result (float16: 2^-11 relative each; bfloat16: 2^-8).
//
// Any rank count and element count (blocks differ by at most one element, an empty block still
// sends one empty message); in place or not. One rank: the output is the input rounded to the
// wire type and back, as the compressed allreduce of any size gives.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <deque>
#include <vector>

#include "kolo/algorithm/options.hpp"
#include "kolo/algorithm/ring_pipeline.hpp"
#include "kolo/compression/compressor.hpp"
#include "kolo/core/dtype.hpp"
#include "kolo/core/error.hpp"
#include "kolo/core/reduce.hpp"
#include "kolo/transport/transport_ref.hpp"

namespace kolo {

// Measured on the 2-core machine (64 MiB over TCP loopback, N = 2; docs/performance.md): 32 to
// 128 KiB segments with 2 to 4 slots each way were within noise of each other; 256 KiB segments
// with 16 slots (8 MiB of slots, out of cache) were 20-30 % slower.
inline constexpr std::size_t kWireSegmentBytes = 64 * 1024;
inline constexpr std::size_t kWireWindow = 4;
// How many segments the stage after a wire ring's finishing stage starts after it (WireRingRun's
// message order), and how many finished segments' wire values the ring keeps for that stage.
// Measured (64 MiB over TCP loopback, N = 2, fp16): lags of 2 to 8 within noise of each other;
// at lag 4, 8 finished slots served every send, 4 missed up to 32 of 256; 12 leave room.
inline constexpr std::size_t kStageLag = 4;
inline constexpr std::size_t kWireFinSlots = 12;

// One stage of a ring whose messages travel in a 16-bit wire type, in float32 elements: send
// `send_count` elements from `send` to the right neighbour, receive `recv_count` from the left
// one into `recv` — folded (recv = local + incoming) where `local` is set, else recv = incoming.
struct WireStage {
  const float* send;
  std::size_t send_count;
  float* recv;
  const float* local;
  std::size_t recv_count;
};

// Where a wire ring stages its messages: a few segments each way, cut from `scratch`. Two rings
// that run at once need two regions (`region` 0 and 1; size the scratch for both with
// reserve() before making the first).
class WireSlots {
 public:
  WireSlots(const CompressionPolicy& c, const AlgoOptions& opt, std::vector<std::byte>& scratch,
            std::size_t region = 0)
      : c_(c), wes_(dtype_size(c.wire)) {
    if (!c.enabled() || wes_ == 0) {
      throw ConfigError("allreduce over a wire type: no compression given");
    }
    // Segment: the pipelining unit in wire bytes, at most kWireSegmentBytes so that the staging
    // slots stay in the cache (about 1.4 MiB in all, with the finished slots); the messages are
    // that size.
    seg = segment(opt, wes_);
    seg_w = seg * wes_;
    rwin = std::clamp<std::size_t>(opt.recv_window, 1, kWireWindow);
    swin = kWireWindow;
    const std::size_t need = bytes(opt, wes_);
    if (scratch.size() < (region + 1) * need) scratch.resize((region + 1) * need);
    fin = c.fold != nullptr ? kWireFinSlots : 0;
    // Layout: [send slots][recv slots][wire temp][float32 temp][finished slots].
    send_slots = scratch.data() + region * need;
    recv_slots = send_slots + swin * seg_w;
    wire_tmp = recv_slots + rwin * seg_w;
    f32_tmp = reinterpret_cast<float*>(wire_tmp + seg_w);
    fin_slots = wire_tmp + seg_w + seg * sizeof(float);
  }

  // Grows `scratch` to hold `regions` regions at once.
  static void reserve(const CompressionPolicy& c, const AlgoOptions& opt,
                      std::vector<std::byte>& scratch, std::size_t regions) {
    const std::size_t need = regions * bytes(opt, dtype_size(c.wire));
    if (scratch.size() < need) scratch.resize(need);
  }

  // Rounds [p, p+len) to the wire type and back, in cache-sized pieces.
  void round_trip(float* p, std::size_t len) const {
    for (std::size_t i = 0; i < len; i += seg) {
      const std::size_t k = std::min(seg, len - i);
      c_.compress(p + i, wire_tmp, k, 1.0f);
      c_.decompress(wire_tmp, p + i, k, 1.0f);
    }
  }

  std::size_t wire_size() const { return wes_; }
  const CompressionPolicy& policy() const { return c_; }

  std::size_t seg = 0, seg_w = 0, rwin = 0, swin = 0;  // elements, wire bytes, slots each way
  std::size_t fin = 0;  // finished slots: wire values a fold wrote for the next stage's send
  std::byte* send_slots = nullptr;
  std::byte* recv_slots = nullptr;
  std::byte* wire_tmp = nullptr;
  float* f32_tmp = nullptr;
  std::byte* fin_slots = nullptr;

 private:
  static std::size_t segment(const AlgoOptions& opt, std::size_t wes) {
    return std::max<std::size_t>(1, std::min(opt.segment_bytes, kWireSegmentBytes) / wes);
  }
  static std::size_t bytes(const AlgoOptions& opt, std::size_t wes) {
    const std::size_t seg = segment(opt, std::max<std::size_t>(wes, 1));
    const std::size_t rwin = std::clamp<std::size_t>(opt.recv_window, 1, kWireWindow);
    const std::size_t align = alignof(std::max_align_t);
    const std::size_t raw =
        (kWireWindow + rwin + 1 + kWireFinSlots) * seg * wes + seg * sizeof(float);
    return (raw + align - 1) / align * align;
  }

  const CompressionPolicy& c_;
  std::size_t wes_;
};

// run_ring_wire's finish_stage when no stage finishes.
inline constexpr std::size_t kNoFinish = static_cast<std::size_t>(-1);

// Runs `stages` in order around the ring of `t` (rank r sends to r+1 and receives from r-1),
// every block cut into segments and pipelined: a segment is converted into a send slot just
// before it is sent, and a received one is widened (and folded) into place while it is in cache.
// Segment j of stage s is sent once segment j of stage s-1 has landed, so a stage's send block
// must be the block the stage before received (stage 0's is ready before the call). The pieces of
// stage `finish_stage` (none: kNoFinish) are finished as they land: divided by `divisor` (when
// > 1), then rounded to the wire type and back; where the compressor has a fold, the same pass
// leaves their wire values in a finished slot, and the next stage, which runs interleaved with the
// finishing one (detail::ring_message_order), sends them from there without compressing the
// block again.
//
// As an object: progress() does whatever needs no waiting and says whether the ring is done, so
// that rings on disjoint peers can progress in one loop (the pipelined hierarchical allreduce);
// run_ring_wire waits between calls. `stages`, `opt` and `ws` must outlive it.
class WireRingRun {
 public:
  WireRingRun(TransportRef t, const std::vector<WireStage>& stages, std::size_t finish_stage,
              int divisor, const AlgoOptions& opt, const WireSlots& ws)
      : t_(t),
        stages_(stages),
        finish_stage_(finish_stage),
        divisor_(divisor),
        opt_(opt),
        ws_(ws),
        right_(mod(t.rank() + 1, t.size())),
        left_(mod(t.rank() - 1, t.size())),
        recv_off_(stages.size() + 1, 0) {
    for (std::size_t s = 0; s < stages_.size(); ++s) {
      recv_off_[s + 1] = recv_off_[s] + segs(stages_[s].recv_count);
    }
    // The finishing stage's fold can hand its wire values to the next stage's send when that
    // stage sends the block it received.
    const bool hand_on = ws_.fin > 0 && finish_stage_ < stages_.size() &&
                         finish_stage_ + 1 < stages_.size() &&
                         stages_[finish_stage_ + 1].send == stages_[finish_stage_].recv;
    if (hand_on) {
      for (std::size_t i = 0; i < ws_.fin; ++i) fin_free_.push_back(i);
    }
    const std::size_t overlap = hand_on ? finish_stage_ : kNoFinish;
    // The finishing stage and the one that sends its finished block on run interleaved: each
    // finished segment is sent a few segments after it landed, while its wire values wait in a
    // finished slot, instead of a whole block later. (Interleaving every stage, each kStageLag
    // segments behind the one before, was measured too: no faster at N = 4 on 2 cores over
    // TCP, 8 % slower in one run of 5 repeats and level in one of 9, so the other stages keep
    // their slack of a whole block of ready sends.)
    send_order_ = detail::ring_message_order(
        stages_.size(), [&](std::size_t s) { return segs(stages_[s].send_count); }, overlap,
        kStageLag);
    recv_order_ = detail::ring_message_order(
        stages_.size(), [&](std::size_t s) { return segs(stages_[s].recv_count); }, overlap,
        kStageLag);
    recv_pos_.resize(recv_order_.size());
    for (std::size_t p = 0; p < recv_order_.size(); ++p) {
      recv_pos_[recv_off_[recv_order_[p].stage] + recv_order_[p].seg] = p;
    }
  }

  bool progress() {
    const std::size_t nst = stages_.size();
    if (t_.size() == 1 || nst == 0) return true;
    const std::size_t recv_total = recv_order_.size(), send_total = send_order_.size();
    const CompressionPolicy& c = ws_.policy();
    const std::size_t seg = ws_.seg, seg_w = ws_.seg_w, wes = ws_.wire_size();
    // Retire receives in posting order (the transport completes them in that order).
    while (!recvs_.empty() && t_.done(recvs_.front().req)) {
      land(recvs_.front());
      recvs_.pop_front();
      ++recv_done_;
    }
    while (!sends_.empty() && t_.done(sends_.front().req)) {
      if (sends_.front().slot != kNoSlot) fin_free_.push_back(sends_.front().slot);
      sends_.pop_front();
    }
    while (recv_posted_ < recv_total && recv_posted_ - recv_done_ < ws_.rwin) {
      const Msg m = recv_order_[recv_posted_];
      const std::size_t slot = recv_posted_ % ws_.rwin;
      const std::size_t len = piece(stages_[m.stage].recv_count, m.seg);
      recvs_.push_back({m.stage, m.seg, slot,
                        t_.irecv(left_, ws_.recv_slots + slot * seg_w, len * wes, opt_.sig)});
      ++recv_posted_;
    }
    // Post the sends in their order while their data is ready (stage 0 at once; stage s segment
    // j once stage s-1 segment j has landed) and a staging slot is free.
    while (send_posted_ < send_total && sends_.size() < ws_.swin) {
      const Msg m = send_order_[send_posted_];
      if (m.stage > 0 && recv_pos_[recv_off_[m.stage - 1] + m.seg] >= recv_done_) break;
      const WireStage& st = stages_[m.stage];
      const std::size_t len = piece(st.send_count, m.seg);
      std::byte* slot = ws_.send_slots + (send_posted_ % ws_.swin) * seg_w;
      std::size_t fin = kNoSlot;
      if (!fin_ready_.empty() && m.stage == finish_stage_ + 1 &&
          fin_ready_.front().seg == m.seg) {  // the fold wrote this segment's wire values
        fin = fin_ready_.front().slot;
        fin_ready_.pop_front();
        slot = ws_.fin_slots + fin * seg_w;
      } else if (len > 0) {
        c.compress(st.send + m.seg * seg, slot, len, 1.0f);
      }
      sends_.push_back({m.stage, m.seg, fin, t_.isend(right_, slot, len * wes, opt_.sig)});
      ++send_posted_;
    }
    return recv_done_ == recv_total && send_posted_ == send_total && sends_.empty();
  }

 private:
  static constexpr std::size_t kNoSlot = static_cast<std::size_t>(-1);
  struct Pending {
    std::size_t stage, seg;
    std::size_t slot;  // receives: the recv slot; sends: the finished slot sent, or kNoSlot
    TransportRef::Request req;
  };
  using Msg = detail::RingSeg;
  std::size_t segs(std::size_t elems) const {
    return elems == 0 ? std::size_t{1} : (elems + ws_.seg - 1) / ws_.seg;
  }
  std::size_t piece(std::size_t elems, std::size_t j) const {
    const std::size_t off = j * ws_.seg;
    return std::min(ws_.seg, elems - std::min(off, elems));
  }
  // A received segment, still in its slot: widen it into place (adding to the accumulator where
  // the stage folds), then finish it if its stage is the finishing one.
  void land(const Pending& p) {
    const CompressionPolicy& c = ws_.policy();
    const WireStage& st = stages_[p.stage];
    const std::size_t off = p.seg * ws_.seg;
    const std::size_t len = piece(st.recv_count, p.seg);
    if (len == 0) return;
    const std::byte* w = ws_.recv_slots + p.slot * ws_.seg_w;
    float* dst = st.recv + off;
    const bool finish = p.stage == finish_stage_;
    if (c.fold != nullptr) {  // the same steps in one pass over the segment
      // A finished segment's wire values go to a free finished slot, from which the next stage
      // sends them (progress()); with none free, that send compresses the segment again.
      std::byte* wire = nullptr;
      if (finish && !fin_free_.empty()) {
        fin_ready_.push_back({p.seg, fin_free_.back()});
        fin_free_.pop_back();
        wire = ws_.fin_slots + fin_ready_.back().slot * ws_.seg_w;
      }
      c.fold(w, st.local != nullptr ? st.local + off : nullptr, dst, len, finish ? divisor_ : 1,
             finish, wire);
      return;
    }
    if (st.local != nullptr) {
      c.decompress(w, ws_.f32_tmp, len, 1.0f);
      add_(dst, st.local + off, ws_.f32_tmp, len);
    } else {
      c.decompress(w, dst, len, 1.0f);
    }
    if (finish) {
      finish_average(dst, len, DataType::float32, divisor_);
      c.compress(dst, ws_.wire_tmp, len, 1.0f);
      c.decompress(ws_.wire_tmp, dst, len, 1.0f);
    }
  }

  TransportRef t_;
  const std::vector<WireStage>& stages_;
  std::size_t finish_stage_;
  int divisor_;
  const AlgoOptions& opt_;
  const WireSlots& ws_;
  int right_, left_;
  ReduceFn add_ = reduce_function(DataType::float32, ReduceOp::sum);
  std::vector<std::size_t> recv_off_;  // per stage: its first segment's index in recv_pos_
  std::vector<Msg> send_order_, recv_order_;
  std::vector<std::size_t> recv_pos_;  // (stage, segment) -> its position in recv_order_
  std::deque<Pending> recvs_, sends_;
  std::size_t recv_posted_ = 0, recv_done_ = 0, send_posted_ = 0;
  struct Finished {
    std::size_t seg, slot;
  };
  std::deque<Finished> fin_ready_;  // finishing stage's segments whose wire values wait, in order
  std::vector<std::size_t> fin_free_;  // finished slots not in use
};

// Runs the stages to the end (WireRingRun, waiting for the transport between steps).
inline void run_ring_wire(TransportRef t, const std::vector<WireStage>& stages,
                          std::size_t finish_stage, int divisor, const AlgoOptions& opt,
                          const WireSlots& ws) {
  WireRingRun ring(t, stages, finish_stage, divisor, opt, ws);
  while (!ring.progress()) t.wait_any_progress(opt.deadline);
}

// in/out: `count` float32 elements (may be the same buffer). `ws`: the wire conversion and its
// staging slots (WireSlots over a scratch vector). Each block's
// owner divides its finished block by `divisor` (when > 1; the rank count for ReduceOp::average,
// or the size of a larger group this ring is part of) before rounding it.
inline void allreduce_ring_wire_divided(TransportRef t, const float* in, float* out,
                                        std::size_t count, int divisor, const AlgoOptions& opt,
                                        const WireSlots& ws) {
  if (count == 0) return;
  const int n = t.size();
  const int r = t.rank();
  if (n == 1) {
    if (in != out) std::memcpy(out, in, count * sizeof(float));
    finish_average(out, count, DataType::float32, divisor);
    ws.round_trip(out, count);
    return;
  }
  run_ring_wire(t, ring_allreduce_stage_list<WireStage>(r, n, in, out, count, 1),
                static_cast<std::size_t>(n - 2), divisor, opt, ws);
}

// in/out: `count` float32 elements (may be the same buffer). `c`: the wire conversion (enabled,
// 2-byte wire type; anything else is a ConfigError). `scratch` grows to the staging slots.
// `average`: divide by the rank count (ReduceOp::average), else sum.
inline void allreduce_ring_wire(TransportRef t, const float* in, float* out, std::size_t count,
                                const CompressionPolicy& c, bool average, const AlgoOptions& opt,
                                std::vector<std::byte>& scratch) {
  const WireSlots ws(c, opt, scratch);
  allreduce_ring_wire_divided(t, in, out, count, average ? t.size() : 1, opt, ws);
}

}  // namespace kolo
