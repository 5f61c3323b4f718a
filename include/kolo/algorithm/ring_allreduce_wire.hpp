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

// Where a wire ring stages its messages: a few segments each way, cut from `scratch`.
class WireSlots {
 public:
  WireSlots(const CompressionPolicy& c, const AlgoOptions& opt, std::vector<std::byte>& scratch)
      : c_(c), wes_(dtype_size(c.wire)) {
    if (!c.enabled() || wes_ == 0) {
      throw ConfigError("allreduce over a wire type: no compression given");
    }
    // Segment: the pipelining unit in wire bytes, at most kWireSegmentBytes so that the staging
    // slots stay in the L2 cache (about 0.6 MiB in all); the messages are that size.
    const std::size_t segb = std::min(opt.segment_bytes, kWireSegmentBytes);
    seg = std::max<std::size_t>(1, segb / wes_);
    seg_w = seg * wes_;
    rwin = std::clamp<std::size_t>(opt.recv_window, 1, kWireWindow);
    swin = kWireWindow;
    // Layout: [send slots][recv slots][wire temp][float32 temp].
    const std::size_t need = (swin + rwin + 1) * seg_w + seg * sizeof(float);
    if (scratch.size() < need) scratch.resize(need);
    send_slots = scratch.data();
    recv_slots = send_slots + swin * seg_w;
    wire_tmp = recv_slots + rwin * seg_w;
    f32_tmp = reinterpret_cast<float*>(wire_tmp + seg_w);
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

  std::size_t seg = 0, seg_w = 0, rwin = 0, swin = 0;  // elements, wire bytes, slots each way
  std::byte* send_slots = nullptr;
  std::byte* recv_slots = nullptr;
  std::byte* wire_tmp = nullptr;
  float* f32_tmp = nullptr;

 private:
  const CompressionPolicy& c_;
  std::size_t wes_;
};

// run_ring_wire's finish_stage when no stage finishes.
inline constexpr std::size_t kNoFinish = static_cast<std::size_t>(-1);

// Runs `stages` in order around the ring of `t` (rank r sends to r+1 and receives from r-1),
// every block cut into segments and pipelined: a segment is converted into a send slot just
// before it is sent, and a received one is widened (and folded) into place while it is in cache.
// Segment j of stage s is sent once segment j of stage s-1 has landed, so a stage's send block
// must be the block the stage before received (stage 0's is ready before the call). The pieces
// of stage `finish_stage` (none: kNoFinish) are finished as they land: divided by `divisor`
// (when > 1), then rounded to the wire type and back.
inline void run_ring_wire(TransportRef t, const std::vector<WireStage>& stages,
                          std::size_t finish_stage, int divisor, const CompressionPolicy& c,
                          const AlgoOptions& opt, const WireSlots& ws) {
  const int n = t.size();
  const int r = t.rank();
  if (n == 1 || stages.empty()) return;
  const std::size_t seg = ws.seg, seg_w = ws.seg_w, rwin = ws.rwin, swin = ws.swin;
  const std::size_t wes = ws.wire_size();
  const std::size_t nst = stages.size();
  auto segs = [&](std::size_t elems) {
    return elems == 0 ? std::size_t{1} : (elems + seg - 1) / seg;
  };
  auto piece = [&](std::size_t elems, std::size_t j) {
    const std::size_t off = j * seg;
    return std::min(seg, elems - std::min(off, elems));
  };
  std::vector<std::size_t> recv_off(nst + 1, 0);
  for (std::size_t s = 0; s < nst; ++s) recv_off[s + 1] = recv_off[s] + segs(stages[s].recv_count);
  const std::size_t recv_total = recv_off[nst];

  const ReduceFn add = reduce_function(DataType::float32, ReduceOp::sum);
  const int right = mod(r + 1, n);
  const int left = mod(r - 1, n);
  struct Pending {
    std::size_t stage, seg, slot;
    TransportRef::Request req;
  };
  std::deque<Pending> recvs, sends;
  std::size_t recv_posted = 0, recv_done = 0, send_posted = 0;
  std::size_t send_stage = 0, send_seg = 0, recv_stage = 0;

  // A received segment, still in its slot: widen it into place (adding to the accumulator where
  // the stage folds), then finish it if its stage is the finishing one.
  auto land = [&](const Pending& p) {
    const WireStage& st = stages[p.stage];
    const std::size_t off = p.seg * seg;
    const std::size_t len = piece(st.recv_count, p.seg);
    if (len == 0) return;
    const std::byte* w = ws.recv_slots + p.slot * seg_w;
    float* dst = st.recv + off;
    if (st.local != nullptr) {
      c.decompress(w, ws.f32_tmp, len, 1.0f);
      add(dst, st.local + off, ws.f32_tmp, len);
    } else {
      c.decompress(w, dst, len, 1.0f);
    }
    if (p.stage == finish_stage) {
      finish_average(dst, len, DataType::float32, divisor);
      c.compress(dst, ws.wire_tmp, len, 1.0f);
      c.decompress(ws.wire_tmp, dst, len, 1.0f);
    }
  };

  for (;;) {
    // Retire receives in posting order (the transport completes them in that order).
    while (!recvs.empty() && t.done(recvs.front().req)) {
      land(recvs.front());
      recvs.pop_front();
      ++recv_done;
    }
    while (!sends.empty() && t.done(sends.front().req)) sends.pop_front();
    while (recv_posted < recv_total && recv_posted - recv_done < rwin) {
      while (recv_off[recv_stage + 1] <= recv_posted) ++recv_stage;
      const std::size_t j = recv_posted - recv_off[recv_stage];
      const std::size_t slot = recv_posted % rwin;
      const std::size_t len = piece(stages[recv_stage].recv_count, j);
      recvs.push_back(
          {recv_stage, j, slot, t.irecv(left, ws.recv_slots + slot * seg_w, len * wes, opt.sig)});
      ++recv_posted;
    }
    // Post the sends whose data is ready (stage 0 at once; stage t segment j once stage t-1
    // segment j has landed) while a staging slot is free.
    while (send_stage < nst && sends.size() < swin) {
      if (send_stage > 0 && recv_off[send_stage - 1] + send_seg >= recv_done) break;
      const WireStage& st = stages[send_stage];
      const std::size_t len = piece(st.send_count, send_seg);
      std::byte* slot = ws.send_slots + (send_posted % swin) * seg_w;
      if (len > 0) c.compress(st.send + send_seg * seg, slot, len, 1.0f);
      sends.push_back({send_stage, send_seg, 0, t.isend(right, slot, len * wes, opt.sig)});
      ++send_posted;
      if (++send_seg == segs(st.send_count)) {
        send_seg = 0;
        ++send_stage;
      }
    }
    if (recv_done == recv_total && send_stage == nst && sends.empty()) return;
    t.wait_any_progress(opt.deadline);
  }
}

// in/out: `count` float32 elements (may be the same buffer). `c`: the wire conversion (enabled,
// 2-byte wire type). Each block's owner divides its finished block by `divisor` (when > 1; the
// rank count for ReduceOp::average, or the size of a larger group this ring is part of) before
// rounding it. `ws`: the staging slots (WireSlots over a scratch vector, 2 · kWireWindow + 3
// segments).
inline void allreduce_ring_wire_divided(TransportRef t, const float* in, float* out,
                                        std::size_t count, const CompressionPolicy& c, int divisor,
                                        const AlgoOptions& opt, const WireSlots& ws) {
  if (count == 0) return;
  const int n = t.size();
  const int r = t.rank();
  if (n == 1) {
    if (in != out) std::memcpy(out, in, count * sizeof(float));
    finish_average(out, count, DataType::float32, divisor);
    ws.round_trip(out, count);
    return;
  }
  // The stages in elements: reduce-scatter (send block r-s, fold block r-s-1 into out), then
  // allgather (send block r+1-u, receive block r-u), as in allreduce_ring.
  std::vector<WireStage> stages;
  stages.reserve(static_cast<std::size_t>(2 * (n - 1)));
  auto block = [&](int b) { return even_block(count, n, mod(b, n)); };
  for (int s = 0; s < n - 1; ++s) {
    const BlockRange sb = block(r - s), rb = block(r - s - 1);
    stages.push_back(
        {(s == 0 ? in : out) + sb.begin, sb.count, out + rb.begin, in + rb.begin, rb.count});
  }
  for (int u = 0; u < n - 1; ++u) {
    const BlockRange sb = block(r + 1 - u), rb = block(r - u);
    stages.push_back({out + sb.begin, sb.count, out + rb.begin, nullptr, rb.count});
  }
  run_ring_wire(t, stages, static_cast<std::size_t>(n - 2), divisor, c, opt, ws);
}

// in/out: `count` float32 elements (may be the same buffer). `c`: the wire conversion (enabled,
// 2-byte wire type; anything else is a ConfigError). `scratch` grows to the staging slots.
// `average`: divide by the rank count (ReduceOp::average), else sum.
inline void allreduce_ring_wire(TransportRef t, const float* in, float* out, std::size_t count,
                                const CompressionPolicy& c, bool average, const AlgoOptions& opt,
                                std::vector<std::byte>& scratch) {
  const WireSlots ws(c, opt, scratch);
  allreduce_ring_wire_divided(t, in, out, count, c, average ? t.size() : 1, opt, ws);
}

}  // namespace kolo
