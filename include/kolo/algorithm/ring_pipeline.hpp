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

namespace detail {

inline std::size_t segment_count(std::size_t bytes, std::size_t seg) {
  return bytes == 0 ? 1 : (bytes + seg - 1) / seg;  // an empty block still sends one message
}

}  // namespace detail

// Called after each received segment lands: (context, stage, byte offset in the block, bytes).
using RingReceived = void (*)(void* ctx, std::size_t stage, std::size_t offset, std::size_t bytes);

// Runs the stages; `on_received(ctx, t, offset, bytes)` runs after each received segment lands
// (used to fold ReduceOp::average's division into the last reduce step; nullptr: nothing).
inline void run_ring(TransportRef t, const std::vector<RingStage>& stages, const ReduceSpec& rs,
                     const AlgoOptions& opt, RingReceived on_received = nullptr,
                     void* ctx = nullptr) {
  const int n = t.size();
  const int right = mod(t.rank() + 1, n);
  const int left = mod(t.rank() - 1, n);
  // Segment size: a multiple of the element size so reductions never split an element.
  const std::size_t es = rs.elem_size ? rs.elem_size : 1;
  const std::size_t seg = std::max(es, opt.segment_bytes / es * es);

  const std::size_t nst = stages.size();
  std::vector<std::size_t> recv_off(nst + 1, 0);  // flat index of stage t's first recv segment
  for (std::size_t s = 0; s < nst; ++s) {
    recv_off[s + 1] = recv_off[s] + detail::segment_count(stages[s].recv_bytes, seg);
  }
  std::vector<std::size_t> send_segs(nst);
  for (std::size_t s = 0; s < nst; ++s)
    send_segs[s] = detail::segment_count(stages[s].send_bytes, seg);

  struct Pending {
    std::size_t stage, seg;
    TransportRef::Request req;
  };
  std::deque<Pending> recvs, sends;
  std::size_t recv_posted = 0, recv_done = 0;
  std::size_t send_stage = 0, send_seg = 0;
  const std::size_t recv_total = recv_off[nst];

  auto post_recv = [&](std::size_t flat) {
    std::size_t s = 0;
    while (recv_off[s + 1] <= flat) ++s;
    const std::size_t j = flat - recv_off[s];
    const RingStage& st = stages[s];
    const std::size_t off = j * seg;
    const std::size_t len = std::min(seg, st.recv_bytes - std::min(off, st.recv_bytes));
    const TransportRef::Request r =
        st.local ? t.irecv_reduce(left, st.recv + off, st.local + off, len, rs, opt.sig)
                 : t.irecv(left, st.recv + off, len, opt.sig);
    recvs.push_back({s, j, r});
  };

  for (;;) {
    // Retire receives in order (the transport completes them in posting order).
    while (!recvs.empty() && t.done(recvs.front().req)) {
      const Pending& p = recvs.front();
      const std::size_t off = p.seg * seg;
      const std::size_t len =
          std::min(seg, stages[p.stage].recv_bytes - std::min(off, stages[p.stage].recv_bytes));
      if (on_received != nullptr) on_received(ctx, p.stage, off, len);
      recvs.pop_front();
      ++recv_done;
    }
    while (!sends.empty() && t.done(sends.front().req)) sends.pop_front();
    // Post receives ahead, within the window.
    while (recv_posted < recv_total && recv_posted - recv_done < opt.recv_window) {
      post_recv(recv_posted++);
    }
    // Post every send whose data is ready: stage 0 at once, stage t segment j once stage t-1
    // segment j has been received (its bytes are what we forward).
    while (send_stage < nst) {
      if (send_stage > 0 && recv_off[send_stage - 1] + send_seg >= recv_done) break;
      const RingStage& st = stages[send_stage];
      const std::size_t off = send_seg * seg;
      const std::size_t len = std::min(seg, st.send_bytes - std::min(off, st.send_bytes));
      sends.push_back({send_stage, send_seg, t.isend(right, st.send + off, len, opt.sig)});
      if (++send_seg == send_segs[send_stage]) {
        send_seg = 0;
        ++send_stage;
      }
    }
    if (recv_done == recv_total && send_stage == nst && sends.empty()) return;
    t.wait_any_progress(opt.deadline);
  }
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
