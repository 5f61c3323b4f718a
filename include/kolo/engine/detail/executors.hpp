// kolo/engine/detail/executors.hpp — the executors: the only part of the engine that depends
// on the transport. They run a cycle's planned batches on the Communicator (one tensor in its
// own memory, fused in pieces, through the fusion buffer or the tensors' own back-to-back
// memory, compressed, on device, on one rank; allgather and broadcast), prepack the steady
// state's batch before the negotiation, and complete the handles through the tensor queue.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <mutex>
#include <span>
#include <vector>

#include "kolo/communicator.hpp"
#include "kolo/compression/compressor.hpp"
#include "kolo/core/reduce.hpp"
#include "kolo/cuda/device_ops.hpp"
#include "kolo/engine/detail/batch_plan.hpp"
#include "kolo/engine/detail/fusion_ranges.hpp"
#include "kolo/engine/detail/messages.hpp"
#include "kolo/engine/detail/records.hpp"
#include "kolo/engine/detail/tensor_queue.hpp"
#include "kolo/engine/engine_options.hpp"
#include "kolo/engine/fusion_buffer.hpp"
#include "kolo/engine/timeline.hpp"

namespace kolo::detail::engine {

// The engine's counters, under the engine's mutex (EngineCore::stats() reads them).
struct StatsSink {
  std::mutex* mu = nullptr;
  EngineStats* stats = nullptr;
  template <class F>
  void operator()(F&& f) const {
    std::lock_guard lock(*mu);
    f(*stats);
  }
};

template <class T>
class Executors {
 public:
  Executors(Communicator<T>& comm, const EngineOptions& opts, Timeline& timeline, TensorQueue& q,
            StatsSink bump)
      : comm_(comm), opts_(opts), timeline_(timeline), q_(q), bump_(bump) {}

  // Once, in the first cycle every rank reaches (allocate is collective): on one host the
  // fusion buffer moves into memory the local peers map, and fused allreduces read each
  // other's packed tensors in place. Pages are committed when touched, so the threshold's
  // size costs only what the largest batch uses.
  void attach_once() {
    if (fusion_attach_tried_) return;
    fusion_attach_tried_ = true;
    if (comm_.zero_copy_routes() && opts_.fusion_threshold > 0) {
      guarded([&] { fusion_.attach(comm_.allocate_region(opts_.fusion_threshold)); },
              [] { return std::string("allocating the shared fusion buffer"); });
      prepacked_.clear();  // packed into the old storage
    }
  }

  // Runs a cycle's responses: finds this rank's operations, completes the mismatches, plans
  // the batches (batch_plan.hpp) and runs them in order, `active` ranks contributing.
  void execute(std::vector<Response>& responses, int active) {
    const auto now = clock::now();
    std::uint64_t cached = 0;
    for (auto& r : responses) {
      r.local = q_.find_local(r);
      if (r.local) {
        r.local->ready = now;
        if (timeline_.enabled()) {
          timeline_.record(q_.track_of(r, timeline_), "NEGOTIATE", r.local->enqueued, now,
                           r.p->dtype, r.p->count * dtype_size(r.p->dtype));
        }
      }
      cached += r.cached ? 1 : 0;
    }
    bump_([&](EngineStats& s) {
      s.cached_responses += cached;
      s.uncached_responses += responses.size() - cached;
    });
    // Errors first: they need no collective.
    for (auto& r : responses) {
      if (r.error().empty()) continue;
      q_.complete(r, std::make_exception_ptr(MismatchError(r.error(), r.error_tensor())));
    }
    plan_batches(responses, opts_.fusion_threshold, plan_);
    for (const Batch& b : plan_.batches) {
      const std::span<const std::size_t> batch = plan_.of(b);
      if (b.kind == OpKind::allgather) {
        guarded([&] { run_allgather(responses[batch.front()]); },
                [&] { return failed_text(responses, batch); });
      } else if (b.kind == OpKind::broadcast) {
        guarded([&] { run_broadcast(responses[batch.front()]); },
                [&] { return failed_text(responses, batch); });
      } else {
        guarded([&] { run_allreduce(responses, batch, b.bytes, active); },
                [&] { return failed_text(responses, batch); });
        q_.notify_completed();
      }
    }
    prepacked_.clear();  // a prepack no batch matched is stale after this cycle
    q_.notify_completed();
  }

  // The steady state packs before it negotiates. Every cached operation pending here (in slot
  // order, the order the cycle's responses will have) goes into the fusion buffer now, if they
  // would all travel in one fused batch. When every rank turns out to have the same ones
  // pending — a training step, every step — the negotiated batch is exactly this one and the
  // collective starts as soon as the negotiation ends: the ranks arrive at it together instead
  // of each after its own pack, and on a busy host a rank that arrives late costs the others a
  // sleep and a wake-up. Otherwise the batch is packed again (the work here is lost).
  void prepack(bool joined) {
    prepacked_.clear();
    if (joined || q_.cache.busy < 2) return;
    const RequestParams* first = nullptr;
    std::size_t elems = 0, bytes = 0, es = 0;
    for (std::size_t k = 0; k < q_.cache.pending.size(); ++k) {
      if (!q_.cache.pending[k]) continue;
      const RequestParams& q = q_.cache[k].p;
      if (!first) {
        first = &q;
        if (q.kind != OpKind::allreduce || q.device != 0 || !q.group.empty() || !q.parts.empty()) {
          return;
        }
        es = dtype_size(compresses(q) ? opts_.compression.wire : q.dtype);
      } else if (q.kind != OpKind::allreduce || q.dtype != first->dtype || q.op != first->op ||
                 q.prescale != first->prescale || q.postscale != first->postscale ||
                 q.device != 0 || !q.group.empty() || !q.parts.empty()) {
        prepacked_.clear();
        return;
      }
      bytes += q.count * dtype_size(q.dtype);  // the threshold counts the tensors' own bytes
      if (prepacked_.size() > 0 && bytes > opts_.fusion_threshold) {
        prepacked_.clear();
        return;
      }
      prepacked_.push_back(k);
      elems += q.count;
    }
    if (prepacked_.size() < 2 || in_pieces(*first, comm_.size(), comm_.size())) {
      prepacked_.clear();  // nothing to pack: the batch travels in pieces
      return;
    }
    if (comm_.size() == 1 && !compresses(*first)) {
      prepacked_.clear();  // nothing to pack: one rank copies its tensors (run_alone)
      return;
    }
    if (first->prescale == 1.0 && !compresses(*first)) {
      locals_.clear();
      for (std::size_t k : prepacked_) locals_.push_back(&q_.cache[k].local);
      TensorView in, out;
      if (direct_ranges(locals_, first->dtype, in, out)) {  // nothing to pack
        prepacked_.clear();
        return;
      }
    }
    fusion_.reserve(elems * es);
    prepack_offsets_.clear();
    prepack_begin_ = clock::now();
    // This rank's own block is read from the tensors by the collective (own_inputs).
    prepack_skipped_own_ = skips_own_block(*first);
    std::size_t own_lo = 0, own_hi = 0;
    if (prepack_skipped_own_) own_block_bytes(elems * es, es, own_lo, own_hi);
    std::size_t off = 0;
    for (std::size_t k : prepacked_) {
      const Local& l = q_.cache[k].local;
      prepack_offsets_.push_back(off);
      const std::size_t b = l.p.count * es;
      if (!(off >= own_lo && off + b <= own_hi)) pack_one(off, l.in, *first);
      off += b;
    }
    prepack_end_ = clock::now();
  }

 private:
  // A fused batch whose collective `run` works on the tensors' own memory (no fusion buffer):
  // timed, counted as fused and in `kind`, and completed.
  template <class Run>
  void run_unpacked(std::vector<Response>& responses, std::span<const std::size_t> batch,
                    clock::time_point tq, std::uint64_t EngineStats::*kind, Run&& run) {
    const auto ta = clock::now();
    run();
    const auto tb = clock::now();
    bump_([kind](EngineStats& s) {
      ++s.fused_collectives;
      ++(s.*kind);
    });
    complete_unpacked(responses, batch, tq, ta, tb);
  }

  // Whether a fused batch of these parameters leaves its tensors that lie wholly in this rank's
  // own block unpacked: the collective reads them from the tensors (Communicator::allreduce_to
  // with a BlockSource). On the zero-copy path no peer reads this rank's block, so packing it is
  // a pass for nothing; elsewhere the Communicator copies it in, which is the same pass. Not with
  // a prescale (the tensors hold unscaled values) or compression (another path).
  bool skips_own_block(const RequestParams& p) const {
    return comm_.size() > 1 && p.prescale == 1.0 && !compresses(p) && p.device == 0;
  }
  // Bytes [lo, hi) of a fused batch of `total` bytes that form this rank's block.
  void own_block_bytes(std::size_t total, std::size_t es, std::size_t& lo, std::size_t& hi) const {
    std::size_t first = 0, count = 0;
    zero_copy_block(total / es, comm_.rank(), comm_.size(), first, count);
    lo = first * es;
    hi = (first + count) * es;
  }

  // One tensor into the fusion buffer at byte `off`: times the prescale, compressed if the
  // batch travels compressed.
  void pack_one(std::size_t off, const TensorView& in, const RequestParams& p) {
    if (compresses(p)) {
      opts_.compression.compress(static_cast<const float*>(in.data), fusion_.data() + off, in.count,
                                 static_cast<float>(p.prescale));
    } else {
      fusion_.pack(off, in, p.prescale);
    }
  }

  // True when `batch` is exactly what prepack() packed (the same slots, in order): its offsets
  // are then in offsets_ and the pack is done. Used once: the buffer is the batch's afterwards.
  bool take_prepacked(const std::vector<Response>& responses, std::span<const std::size_t> batch) {
    const bool same = [&] {
      if (batch.size() != prepacked_.size()) return false;
      for (std::size_t i = 0; i < batch.size(); ++i) {
        const Response& r = responses[batch[i]];
        if (r.slot < 0 || static_cast<std::size_t>(r.slot) != prepacked_[i] || !r.local) {
          return false;
        }
      }
      return true;
    }();
    prepacked_.clear();
    if (same) offsets_.swap(prepack_offsets_);
    return same;
  }

  // One rank: every op's allreduce of a tensor is the tensor (an average divides by 1), so a
  // batch needs no fusion buffer and no collective: each output gets its own input, scaled as
  // the collective would have scaled it (prescale, then postscale). Not for a joined rank's
  // zeros or an invalid dtype or op (the collective names those); false then, nothing done.
  bool run_alone(std::vector<Response>& responses, std::span<const std::size_t> batch,
                 clock::time_point tq) {
    const RequestParams& p = *responses[batch.front()].p;
    if (dtype_name(p.dtype) == "invalid" || reduce_op_name(p.op) == "invalid") return false;
    for (std::size_t j : batch) {
      if (!responses[j].local) return false;
    }
    const auto ta = clock::now();
    for (std::size_t j : batch) {
      const Local& l = *responses[j].local;
      if (p.prescale != 1.0 || l.out.data != l.in.data) {
        detail::scaled_copy(l.out.data, l.in.data, l.in.count, p.dtype, p.prescale);
      }
      if (p.postscale != 1.0) {
        detail::scaled_copy(l.out.data, l.out.data, l.out.count, p.dtype, p.postscale);
      }
    }
    const auto tb = clock::now();
    if (batch.size() > 1) bump_([](EngineStats& s) { ++s.fused_collectives; });
    complete_unpacked(responses, batch, tq, ta, tb);
    return true;
  }

  // Completes a batch that ran without a fusion buffer (QUEUE until `ta`, ALLREDUCE until `tb`
  // on each tensor's timeline track).
  void complete_unpacked(const std::vector<Response>& responses, std::span<const std::size_t> batch,
                         clock::time_point tq, clock::time_point ta, clock::time_point tb) {
    for (std::size_t j : batch) {
      const Response& r = responses[j];
      if (timeline_.enabled()) {
        const int tr = q_.track_of(r, timeline_);
        const std::size_t b = r.p->count * dtype_size(r.p->dtype);
        timeline_.record(tr, "QUEUE", tq, ta, r.p->dtype, b);
        timeline_.record(tr, "ALLREDUCE", ta, tb, r.p->dtype, b);
      }
      q_.complete(r, nullptr);
    }
  }

  // Completes a batch that ran through a fusion buffer of `wire` elements, counted as one fused
  // collective: on each tensor's timeline track QUEUE until `t_pack`, `pack` until `t_coll`,
  // ALLREDUCE until `t_unpack` and `unpack` until `t_end`, with its bytes on the wire.
  void complete_fused(const std::vector<Response>& responses, std::span<const std::size_t> batch,
                      DataType wire, const char* pack, const char* unpack, clock::time_point tq,
                      clock::time_point t_pack, clock::time_point t_coll,
                      clock::time_point t_unpack, clock::time_point t_end) {
    bump_([](EngineStats& s) { ++s.fused_collectives; });
    const std::size_t wes = dtype_size(wire);
    for (std::size_t j : batch) {
      const Response& r = responses[j];
      if (timeline_.enabled()) {
        const std::size_t b = r.p->count * wes;
        const int tr = q_.track_of(r, timeline_);
        timeline_.record(tr, "QUEUE", tq, t_pack, wire, b);
        timeline_.record(tr, pack, t_pack, t_coll, wire, b);
        timeline_.record(tr, "ALLREDUCE", t_coll, t_unpack, wire, b);
        timeline_.record(tr, unpack, t_unpack, t_end, wire, b);
      }
      q_.complete(r, nullptr);
    }
  }

  // The local tensor for a response, or a zero tensor when this rank has joined.
  TensorView local_input(const Response& r) {
    if (r.local) return r.local->in;
    const std::size_t b = r.p->count * dtype_size(r.p->dtype);
    zeros_.assign(b, std::byte{0});
    return TensorView(zeros_.data(), r.p->count, r.p->dtype);
  }

  // A batch with coalesced submissions runs as the batch of their tensors: each tensor a
  // response of its own (parts_), so that every path below (pieces, fusion buffer, compression,
  // one rank, a joined rank's zeros) handles it as it handles separate submissions. The parts'
  // counts were negotiated, so every rank forms the same batch. Then each submission completes
  // once.
  void run_allreduce(std::vector<Response>& responses, std::span<const std::size_t> batch,
                     std::size_t bytes, int active) {
    std::size_t rows = 0;
    bool coalesced = false;
    for (std::size_t j : batch) {
      const std::size_t k = responses[j].p->parts.size();
      coalesced = coalesced || k > 0;
      rows += k > 0 ? k : 1;
    }
    if (!coalesced) {
      run_batch(responses, batch, bytes, active);
      return;
    }
    // The common case, in pieces (see run_batch): the tensors' list straight to the collective.
    const RequestParams& p = *responses[batch.front()].p;
    const int divisor = divisor_of(p, inputs(active));
    if (rows > 1 && in_pieces(p, divisor, active)) {
      piece_in_.clear();
      piece_out_.clear();
      for (std::size_t j : batch) {
        const Local* l = responses[j].local;
        if (l->parts.empty()) {
          piece_in_.push_back(l->in);
          piece_out_.push_back(l->out);
        } else {  // in place
          piece_in_.insert(piece_in_.end(), l->parts.begin(), l->parts.end());
          piece_out_.insert(piece_out_.end(), l->parts.begin(), l->parts.end());
        }
      }
      run_unpacked(responses, batch, clock::now(), &EngineStats::piece_collectives,
                   [&] { comm_.allreduce_coalesced(piece_in_, piece_out_, p.op); });
      return;
    }
    part_responses_.clear();
    part_batch_.clear();
    if (part_locals_.size() < rows) part_locals_.resize(rows);  // pointers into them follow
    if (part_params_.size() < rows) part_params_.resize(rows);
    std::size_t at = 0;
    for (std::size_t j : batch) {
      const Response& r = responses[j];
      if (r.p->parts.empty()) {
        part_batch_.push_back(part_responses_.size());
        part_responses_.push_back(r);
        continue;
      }
      for (std::size_t i = 0; i < r.p->parts.size(); ++i, ++at) {
        RequestParams& q = part_params_[at];
        q.kind = r.p->kind;
        q.dtype = r.p->dtype;
        q.op = r.p->op;
        q.count = r.p->parts[i];
        q.prescale = r.p->prescale;
        q.postscale = r.p->postscale;
        q.device = r.p->device;
        q.join_average = r.p->join_average;
        Response e;
        e.name = r.name;
        e.p = &q;
        e.cached = r.cached;
        if (r.local) {
          Local& l = part_locals_[at];
          l.in = l.out = r.local->parts[i];
          l.cache_slot = kPart;
          e.local = &l;
        }
        part_batch_.push_back(part_responses_.size());
        part_responses_.push_back(e);
      }
    }
    run_batch(part_responses_, part_batch_, bytes, active);
    for (std::size_t j : batch) {
      if (!responses[j].p->parts.empty()) q_.complete(responses[j], nullptr);
    }
  }

  void run_batch(std::vector<Response>& responses, std::span<const std::size_t> batch,
                 std::size_t bytes, int active) {
    const RequestParams& p = *responses[batch.front()].p;
    const int n = comm_.size();
    const ReduceOp wire_op = p.op == ReduceOp::average ? ReduceOp::sum : p.op;
    // An average divides by the number of ranks, or (join_average = active_ranks) by the ranks
    // that contributed, i.e. had not joined.
    const PathInputs pin = inputs(active);
    const int divisor = divisor_of(p, pin);
    const auto tq = clock::now();
    Path path = allreduce_path(p, batch.size(), pin);
    if (path == Path::device) {
      run_device_allreduce(responses, batch, divisor, tq);
      return;
    }
    if (path == Path::compressed) {
      run_compressed_allreduce(responses, batch, divisor, tq);
      return;
    }
    if (path == Path::alone) {
      if (run_alone(responses, batch, tq)) return;
      path = allreduce_path(p, batch.size(), pin, false);
    }
    // The Communicator's average divides by n (each block by its owner, count/n divisions per
    // rank, the same bits as dividing while unpacking); another divisor is applied here.
    const bool comm_divides = p.op != ReduceOp::average || divisor == n;
    if (path == Path::single) {
      // One tensor: reduce in the caller's output buffer, no fusion copies.
      const Response& r = responses[batch.front()];
      TensorView in = local_input(r);
      TensorView out = r.local ? r.local->out : in;
      const auto ta = clock::now();
      if (p.prescale == 1.0 && p.postscale == 1.0 && comm_divides) {
        // Out of place straight from the input: the collective reads `in` in its first steps
        // anyway, so a copy into `out` first would be a whole extra pass over the tensor.
        comm_.allreduce(in, out, p.op);  // the algorithm folds an average's division in
      } else if (p.postscale == 1.0 && comm_divides) {
        detail::scaled_copy(out.data, in.data, in.count, in.dtype, p.prescale);
        comm_.allreduce(out, p.op);
      } else {
        if (p.prescale != 1.0 || out.data != in.data) {
          detail::scaled_copy(out.data, in.data, in.count, in.dtype, p.prescale);
        }
        comm_.allreduce(out, wire_op);
        detail::scaled_copy(out.data, out.data, out.count, out.dtype, p.postscale, divisor);
      }
      // A tensor in a Buffer from communicator().allocate: read in place by the peers.
      if (comm_.last_allreduce_zero_copy())
        bump_([](EngineStats& s) { ++s.zero_copy_collectives; });
      const auto tb = clock::now();
      if (timeline_.enabled()) {
        const int tr = q_.track_of(r, timeline_);
        timeline_.record(tr, "QUEUE", tq, ta, p.dtype, bytes);
        timeline_.record(tr, "ALLREDUCE", ta, tb, p.dtype, bytes);
      }
      q_.complete(r, nullptr);
      return;
    }
    // Fused, in pieces: the ring reads the inputs and writes the outputs where they lie.
    if (path == Path::pieces) {
      piece_in_.clear();
      piece_out_.clear();
      for (std::size_t j : batch) {
        const Local* l = responses[j].local;
        piece_in_.push_back(l->in);
        piece_out_.push_back(l->out);
      }
      run_unpacked(responses, batch, tq, &EngineStats::piece_collectives,
                   [&] { comm_.allreduce_coalesced(piece_in_, piece_out_, p.op); });
      return;
    }
    // Fused: one pass in (copy, times the prescale), the collective on the fusion buffer, one
    // pass out straight into each tensor's output (times the postscale and an average's
    // 1/divisor, unless the collective already divided).
    const std::size_t es = dtype_size(p.dtype);
    const bool post = p.postscale != 1.0 || !comm_divides;
    if (p.prescale == 1.0) {
      locals_.clear();
      for (std::size_t j : batch) locals_.push_back(responses[j].local);
      TensorView in, out;
      if (direct_ranges(locals_, p.dtype, in, out)) {
        run_unpacked(responses, batch, tq, &EngineStats::direct_collectives, [&] {
          comm_.allreduce(in, out, post ? wire_op : p.op);
          if (post) {
            detail::scaled_copy(out.data, out.data, out.count, p.dtype, p.postscale, divisor);
          }
        });
        return;
      }
    }
    auto t_pack = clock::now();
    auto t_coll = t_pack;
    bool skipped_own = false;
    if (take_prepacked(responses, batch)) {
      t_pack = prepack_begin_;
      t_coll = prepack_end_;
      skipped_own = prepack_skipped_own_;
    } else {
      fusion_.reserve(bytes);
      offsets_.clear();
      skipped_own = skips_own_block(p) &&
                    std::all_of(batch.begin(), batch.end(),
                                [&](std::size_t j) { return responses[j].local != nullptr; });
      std::size_t own_lo = 0, own_hi = 0;
      if (skipped_own) own_block_bytes(bytes, es, own_lo, own_hi);
      std::size_t off = 0;
      for (std::size_t j : batch) {
        const Response& r = responses[j];
        offsets_.push_back(off);
        const std::size_t b = r.p->count * es;
        if (skipped_own && off >= own_lo && off + b <= own_hi) {
          // read in place by the collective (own_inputs)
        } else if (r.local) {
          fusion_.pack(off, r.local->in, p.prescale);
        } else if (b > 0) {
          std::memset(fusion_.data() + off, 0, b);  // joined: zeros
        }
        off += b;
      }
      t_coll = clock::now();
    }
    // The collective hands the result over block by block: on the zero-copy path straight from
    // the owners' fusion buffers into the tensors, with no gather into this rank's buffer first.
    UnpackRanges u{
        &responses,         batch, offsets_.data(), es, p.dtype, post ? p.postscale : 1.0,
        post ? divisor : 1, {}};
    OwnInputs own{&responses, batch, offsets_.data(), es};
    comm_.allreduce_to(TensorView(fusion_.data(), bytes / es, p.dtype), post ? wire_op : p.op,
                       BlockSink{&u, &UnpackRanges::call},
                       skipped_own ? BlockSource{&own, &OwnInputs::call} : BlockSource{});
    if (comm_.last_allreduce_zero_copy()) bump_([](EngineStats& s) { ++s.zero_copy_collectives; });
    const auto t_end = clock::now();
    const auto t_unpack = u.first == clock::time_point{} ? t_end : u.first;
    complete_fused(responses, batch, p.dtype, "PACK", "UNPACK", tq, t_pack, t_coll, t_unpack,
                   t_end);
  }

  // Float32 gradients on a 16-bit wire: compress while packing (with the prescale), reduce on
  // the wire type (each step widens to fp32, adds, rounds once), decompress while unpacking
  // (with the postscale and an average's 1/size): the conversion costs no pass of its own.
  void run_compressed_allreduce(std::vector<Response>& responses,
                                std::span<const std::size_t> batch, int divisor,
                                clock::time_point tq) {
    const RequestParams& p = *responses[batch.front()].p;
    const CompressionPolicy& c = opts_.compression;
    const std::size_t wes = dtype_size(c.wire);
    std::size_t total = 0;
    for (std::size_t j : batch) total += responses[j].p->count;
    auto t_pack = clock::now();
    auto t_coll = t_pack;
    const bool prepacked = take_prepacked(responses, batch);
    const Response& r0 = responses[batch.front()];
    // The same choice on every rank (prepack() never takes a single tensor, and a rank that
    // has joined reduces zeros in place).
    if (batch.size() == 1 && p.prescale == 1.0 && p.postscale == 1.0 &&
        (divisor == 1 || divisor == comm_.size()) && comm_.compresses_on_wire(total, c)) {
      // One unscaled tensor where the ring runs: converted on the wire, segment by segment,
      // straight from the input into the output; no 16-bit copy of the tensor.
      const TensorView in = local_input(r0);
      comm_.allreduce_compressed(in, r0.local ? r0.local->out : in,
                                 divisor == 1 ? ReduceOp::sum : ReduceOp::average, c);
      const auto t_end = clock::now();
      if (timeline_.enabled()) {
        const int tr = q_.track_of(r0, timeline_);
        timeline_.record(tr, "QUEUE", tq, t_pack, c.wire, total * wes);
        timeline_.record(tr, "ALLREDUCE_WIRE", t_pack, t_end, c.wire, total * wes);
      }
      q_.complete(r0, nullptr);
      return;
    }
    if (prepacked) {
      t_pack = prepack_begin_;
      t_coll = prepack_end_;
    } else {
      fusion_.reserve(total * wes);
      offsets_.clear();
      std::size_t off = 0;
      for (std::size_t j : batch) {
        const Response& r = responses[j];
        offsets_.push_back(off);
        pack_one(off, local_input(r), p);
        off += r.p->count * wes;
      }
      t_coll = clock::now();
    }
    comm_.allreduce(TensorView(fusion_.data(), total, c.wire), ReduceOp::sum);
    if (comm_.last_allreduce_zero_copy()) bump_([](EngineStats& s) { ++s.zero_copy_collectives; });
    const auto t_unpack = clock::now();
    const float post = static_cast<float>(p.postscale / divisor);
    for (std::size_t k = 0; k < batch.size(); ++k) {
      const Response& r = responses[batch[k]];
      if (!r.local) continue;
      c.decompress(fusion_.data() + offsets_[k], static_cast<float*>(r.local->out.data),
                   r.local->out.count, post);
    }
    const auto t_end = clock::now();
    complete_fused(responses, batch, c.wire, "PACK_COMPRESS", "UNPACK_DECOMPRESS", tq, t_pack,
                   t_coll, t_unpack, t_end);
  }

  // Device tensors: one pack launch into the device fusion buffer (compressing and prescaling),
  // the collective on the device buffer (NCCL, or staged), one unpack launch (decompressing,
  // postscaling, dividing an average). A single unscaled tensor goes straight through.
  void run_device_allreduce(std::vector<Response>& responses, std::span<const std::size_t> batch,
                            int divisor, clock::time_point tq) {
    if constexpr (DeviceFusionTransport<T>) {
      auto& t = comm_.transport();
      const RequestParams& p = *responses[batch.front()].p;
      const CompressionPolicy& c = opts_.compression;
      const bool compress = c.enabled() && p.dtype == DataType::float32 &&
                            (p.op == ReduceOp::sum || p.op == ReduceOp::average);
      const DataType wire = compress ? c.wire : p.dtype;
      const Device dev = Device::cuda(t.device());
      if (batch.size() == 1 && !compress && p.prescale == 1.0 && p.postscale == 1.0 &&
          (p.op != ReduceOp::average ||
           divisor == comm_.size())) {  // the Communicator's average divides by size
        // The same decision on every rank (it must be: one collective, one op). A rank that has
        // joined reduces zeros from the fusion buffer and keeps nothing.
        const Response& r = responses[batch.front()];
        TensorView in, out;
        if (r.local != nullptr) {
          in = r.local->in;
          out = r.local->out;
        } else {
          cuda::FusionItem zero;
          zero.count = p.count;
          std::byte* z = t.device_fusion_buffer(p.count * dtype_size(p.dtype));
          t.device_pack(&zero, 1, p.dtype, p.dtype, z, 1.0);
          in = out = TensorView(z, p.count, p.dtype, dev);
        }
        const auto ta = clock::now();
        comm_.allreduce(in, out, p.op);
        if (timeline_.enabled()) {
          const std::size_t b = p.count * dtype_size(p.dtype);
          const int tr = q_.track_of(r, timeline_);
          timeline_.record(tr, "QUEUE", tq, ta, p.dtype, b);
          timeline_.record(tr, "ALLREDUCE", ta, clock::now(), p.dtype, b);
        }
        q_.complete(r, nullptr);
        return;
      }
      device_items_.clear();
      std::size_t total = 0;
      // Each tensor starts on a 16-byte boundary of the buffer, so the kernels' 16-byte vector
      // path applies to every tensor whose own pointer allows it (+6-8 points of copy bandwidth
      // for 1000 tensors on an H100). The gaps are reduced along and never read back.
      const std::size_t align = std::max<std::size_t>(1, 16 / dtype_size(wire));
      for (std::size_t j : batch) {
        const Response& r = responses[j];
        cuda::FusionItem it;
        it.src = r.local ? r.local->in.data : nullptr;  // joined: zeros
        it.dst = r.local ? r.local->out.data : nullptr;
        it.count = r.p->count;
        it.offset = total;
        device_items_.push_back(it);
        total += (r.p->count + align - 1) / align * align;
      }
      std::byte* buf = t.device_fusion_buffer(total * dtype_size(wire));
      const auto t_pack = clock::now();
      t.device_pack(device_items_.data(), device_items_.size(), p.dtype, wire, buf, p.prescale);
      const auto t_coll = clock::now();
      comm_.allreduce(TensorView(buf, total, wire, dev),
                      p.op == ReduceOp::average ? ReduceOp::sum : p.op);
      const auto t_unpack = clock::now();
      t.device_unpack(device_items_.data(), device_items_.size(), wire, p.dtype, buf, p.postscale,
                      divisor);
      t.device_synchronize(Deadline::after(t.timeout_seconds()), "the fusion unpack");
      const auto t_end = clock::now();
      complete_fused(responses, batch, wire, compress ? "PACK_COMPRESS" : "PACK",
                     compress ? "UNPACK_DECOMPRESS" : "UNPACK", tq, t_pack, t_coll, t_unpack,
                     t_end);
    } else {
      (void)responses;
      (void)batch;
      (void)divisor;
      (void)tq;
      throw Error("engine: a device tensor reached a host-only engine");  // enqueue refuses
    }
  }

  void run_allgather(const Response& r) {
    const std::vector<std::size_t>& counts = r.decided->counts;  // never cached
    std::size_t total = 0;
    for (auto c : counts) total += c;
    const RequestParams& p = *r.p;
    const std::size_t es = dtype_size(p.dtype);
    std::vector<std::byte> owned(total * es);
    TensorView in(nullptr, 0, p.dtype);
    if (r.local) in = r.local->in;
    const auto ta = clock::now();
    comm_.allgatherv(in, TensorView(owned.data(), total, p.dtype), counts);
    if (timeline_.enabled())
      timeline_.record(q_.track_of(r, timeline_), "ALLGATHER", ta, clock::now(), p.dtype,
                       total * es);
    if (r.local) {
      auto& h = *r.local->handle;
      h.owned = std::move(owned);
      h.counts = counts;
      h.output = TensorView(h.owned.data(), total, p.dtype);
      q_.complete(r, nullptr);
    }
  }

  void run_broadcast(const Response& r) {
    const RequestParams& p = *r.p;
    TensorView buf = local_input(r);
    if constexpr (DeviceFusionTransport<T>) {
      if (p.device != 0 && r.local == nullptr) {  // joined: a device buffer to receive into
        auto& t = comm_.transport();
        buf = TensorView(t.device_fusion_buffer(p.count * dtype_size(p.dtype)), p.count, p.dtype,
                         Device::cuda(t.device()));
      }
    }
    const auto ta = clock::now();
    comm_.broadcast(buf, p.root);
    if (timeline_.enabled()) {
      timeline_.record(q_.track_of(r, timeline_), "BROADCAST", ta, clock::now(), p.dtype,
                       p.count * dtype_size(p.dtype));
    }
    q_.complete(r, nullptr);
  }

  // Whether a fused batch converts float32 to the 16-bit wire (KOLO_COMPRESSION).
  bool compresses(const RequestParams& p) const {
    return engine::compresses(p, opts_.compression.enabled());
  }
  PathInputs inputs(int active) const {
    return PathInputs{comm_.size(), active, opts_.compression.enabled(), VectoredP2P<T>,
                      opts_.fusion_pieces};
  }
  bool in_pieces(const RequestParams& p, int divisor, int active) const {
    return engine::in_pieces(p, divisor, inputs(active));
  }

  Communicator<T>& comm_;
  const EngineOptions& opts_;
  Timeline& timeline_;
  TensorQueue& q_;
  StatsSink bump_;
  FusionBuffer fusion_;
  bool fusion_attach_tried_ = false;
  BatchPlan plan_;
  std::vector<std::size_t> offsets_;
  std::vector<const Local*> locals_;
  std::vector<TensorView> piece_in_, piece_out_;  // a batch in pieces: its tensors
  // A batch with coalesced submissions, one response per tensor (run_allreduce).
  std::vector<Response> part_responses_;
  std::vector<std::size_t> part_batch_;
  std::vector<Local> part_locals_;
  std::vector<RequestParams> part_params_;
  std::vector<std::size_t> prepacked_, prepack_offsets_;  // prepack(): slots and their offsets
  clock::time_point prepack_begin_, prepack_end_;
  bool prepack_skipped_own_ = false;  // prepack() left this rank's own block to the tensors
  std::vector<std::byte> zeros_;
  std::vector<cuda::FusionItem> device_items_;
};

}  // namespace kolo::detail::engine
