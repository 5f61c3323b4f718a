// kolo/engine/detail/fusion_ranges.hpp — where a fused batch's bytes lie in its tensors: the
// unpack by ranges of the fusion buffer (a BlockSink), this rank's own block read from the
// inputs (a BlockSource), and whether a batch's tensors already lie back to back. Layout
// arithmetic only, no transport.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

#include "kolo/core/reduce.hpp"
#include "kolo/core/tensor.hpp"
#include "kolo/engine/detail/records.hpp"
#include "kolo/engine/fusion_buffer.hpp"

namespace kolo::detail::engine {

// Whether these operations' tensors lie back to back in memory, in this order, inputs and
// outputs alike (as views into one flat gradient buffer do); then `in` and `out` span them.
// Such a batch needs no fusion buffer: this rank's memory already is the packed layout, and
// the collective runs on it in place (or from the inputs into the outputs). Other ranks may
// pack theirs: the collective is the same (count, dtype, op), so the choice is local.
inline bool direct_ranges(const std::vector<const Local*>& ls, DataType dtype, TensorView& in,
                          TensorView& out) {
  if (ls.empty() || !ls.front()) return false;
  const auto* in0 = static_cast<const std::byte*>(ls.front()->in.data);
  auto* out0 = static_cast<std::byte*>(ls.front()->out.data);
  const std::byte* in_end = in0;
  std::byte* out_end = out0;
  std::size_t count = 0;
  for (const Local* l : ls) {
    if (!l) return false;  // joined here: zeros
    if (l->in.count == 0) continue;
    if (l->in.data != in_end || l->out.data != out_end) return false;
    in_end += l->in.bytes();
    out_end += l->out.bytes();
    count += l->in.count;
  }
  if (count == 0) return false;
  // One range, or two disjoint ones (each tensor's own are, but not necessarily the spans).
  if (in0 != out0 && in0 < out_end && out0 < in_end) return false;
  in = TensorView(const_cast<std::byte*>(in0), count, dtype);
  out = TensorView(out0, count, dtype);
  return true;
}

// The unpack of a fused batch by ranges of the fusion buffer (BlockSink): the part of each
// tensor inside [first, first + count) elements, copied from `src` into its output.
struct UnpackRanges {
  const std::vector<Response>* responses;
  std::span<const std::size_t> batch;
  const std::size_t* offsets;  // bytes, by position in the batch, ascending
  std::size_t es;
  DataType dtype;
  double postscale;
  int divisor;
  clock::time_point first;  // when the first range came: the timeline's UNPACK starts there

  static void call(void* ctx, std::size_t first, std::size_t count, const std::byte* src) {
    auto& u = *static_cast<UnpackRanges*>(ctx);
    if (u.first == clock::time_point{}) u.first = clock::now();
    const std::size_t lo = first * u.es, hi = (first + count) * u.es;
    const std::size_t nb = u.batch.size();
    // The last tensor starting at or before `lo` (zero-length ones share its offset).
    std::size_t k =
        static_cast<std::size_t>(std::upper_bound(u.offsets, u.offsets + nb, lo) - u.offsets);
    k = k > 0 ? k - 1 : 0;
    for (; k < nb && u.offsets[k] < hi; ++k) {
      const Response& r = (*u.responses)[u.batch[k]];
      if (!r.local) continue;  // joined: nothing to write
      const std::size_t tb = u.offsets[k], te = tb + r.p->count * u.es;
      const std::size_t b = std::max(tb, lo), e = std::min(te, hi);
      if (b >= e) continue;
      detail::scaled_copy(static_cast<std::byte*>(r.local->out.data) + (b - tb), src + (b - lo),
                          (e - b) / u.es, u.dtype, u.postscale, u.divisor);
    }
  }
};

// Where element `first` of a fused batch lies in its tensor's input (BlockSource), and how
// many elements follow it there: the collective reads this rank's own block through it.
struct OwnInputs {
  const std::vector<Response>* responses;
  std::span<const std::size_t> batch;
  const std::size_t* offsets;
  std::size_t es;

  static const std::byte* call(void* ctx, std::size_t first, std::size_t& count) {
    auto& o = *static_cast<OwnInputs*>(ctx);
    const std::size_t at = first * o.es, nb = o.batch.size();
    // The last tensor starting at or before `at`: it holds `at` (a zero-length tensor there
    // is followed by one that starts there too).
    const std::size_t k =
        static_cast<std::size_t>(std::upper_bound(o.offsets, o.offsets + nb, at) - o.offsets) - 1;
    const Response& r = (*o.responses)[o.batch[k]];
    const std::size_t end = o.offsets[k] + r.p->count * o.es;
    count = std::min(count, (end - at) / o.es);
    return static_cast<const std::byte*>(r.local->in.data) + (at - o.offsets[k]);
  }
};

}  // namespace kolo::detail::engine
