// kolo/engine/detail/submission.hpp — the checks a submission passes before it enters the
// inbox: devices, null pointers, sizes, dtypes, overlaps, scaling and roots, each failing with a
// ConfigError that names the tensor. Run on the submitting thread for every submission, so the
// passing path builds no string and allocates nothing (engine/alloc counts).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kolo/core/arg_checks.hpp"
#include "kolo/core/checked_size.hpp"
#include "kolo/core/error.hpp"
#include "kolo/core/tensor.hpp"
#include "kolo/engine/request.hpp"

namespace kolo::detail::engine {

// A single-tensor submission (allreduce, allgather, broadcast) of `size` ranks' engine: sets
// p.device for a device tensor. `device_ok`: the transport takes device tensors.
inline void check_submission(std::string_view name, const TensorView& in, const TensorView& out,
                             RequestParams& p, int size, bool device_ok) {
  const bool on_device = in.device.kind == Device::Kind::cuda;
  if (on_device != (out.device.kind == Device::Kind::cuda)) {
    throw ConfigError("engine: tensor '" + std::string(name) +
                      "': input and output must both be on a CUDA device or both in host memory");
  }
  if (on_device) {
    if (!device_ok) {
      throw ConfigError("engine: tensor '" + std::string(name) +
                        "' is on a CUDA device, but this engine's transport takes host memory "
                        "only (use Engine<NcclTransport> or Engine<CudaStagedTransport>)");
    }
    if (p.kind == OpKind::allgather) {
      throw ConfigError("engine: tensor '" + std::string(name) +
                        "': allgather of device tensors is not supported by the engine; use "
                        "Communicator::allgather on device buffers");
    }
    p.device = 1;
  }
  if (in.count > 0 && (!in.data || !out.data)) {
    throw ConfigError("engine: tensor '" + std::string(name) + "' has a null data pointer");
  }
  // The message is built only on failure: this runs for every submission, which must not
  // allocate in steady state (engine/alloc).
  if (dtype_size(in.dtype) != 0 && in.count > detail::kMaxObjectBytes / dtype_size(in.dtype)) {
    (void)detail::checked_bytes(in.count, dtype_size(in.dtype),
                                "engine: tensor '" + std::string(name) + "'");
  }
  if (out.count != in.count || out.dtype != in.dtype) {
    throw ConfigError("engine: tensor '" + std::string(name) +
                      "': output must match the input's count and dtype");
  }
  // In place (the same pointer) or disjoint: a partial overlap would be read after parts of it
  // were written (core/arg_checks.hpp, shared with the Communicator and the C ABI).
  if (in.data != out.data && in.count > 0 &&
      checks::overlaps(checks::bytes_of(in), checks::bytes_of(out))) {
    checks::throw_overlap("engine: tensor '" + std::string(name) + "'", checks::bytes_of(in),
                          checks::bytes_of(out),
                          "pass the same buffer (in place) or disjoint buffers");
  }
  if (!dtype_is_floating(p.dtype) && (p.prescale != 1.0 || p.postscale != 1.0)) {
    throw ConfigError("engine: tensor '" + std::string(name) +
                      "': prescale/postscale need a floating dtype");
  }
  if (p.kind == OpKind::broadcast && (p.root < 0 || p.root >= size)) {
    throw ConfigError("engine: tensor '" + std::string(name) + "': broadcast root " +
                      std::to_string(p.root) + " is not a rank");
  }
}

[[noreturn]] inline void coalesced_error(std::string_view name, const std::string& what) {
  throw ConfigError("engine: coalesced submission '" + std::string(name) + "': " + what);
}

// A coalesced submission's tensors (at least one): host memory, one dtype (p.dtype), no null
// data, no two overlapping; fills p.parts (cleared first, its capacity kept) and p.count.
inline void check_coalesced(std::string_view name, std::span<const TensorView> tensors,
                            RequestParams& p) {
  p.parts.clear();
  p.parts.reserve(tensors.size());
  // No tensor may overlap another (each is reduced in place). Tensors in address order (the
  // usual case) are checked as they come; otherwise their ranges are sorted afterwards.
  bool ascending = true;
  std::uintptr_t end_so_far = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorView& t = tensors[i];
    if (t.device.kind == Device::Kind::cuda) {
      coalesced_error(
          name, "tensor " + std::to_string(i) +
                    " is on a CUDA device; coalesced submissions take host tensors (submit device "
                    "tensors one by one, or as a group: grouped_allreduce_async)");
    }
    if (t.dtype != p.dtype) {
      coalesced_error(name, "tensor " + std::to_string(i) + " is " +
                                std::string(dtype_name(t.dtype)) + " but tensor 0 is " +
                                std::string(dtype_name(p.dtype)) +
                                "; all tensors of one submission have one dtype");
    }
    if (t.count > 0 && !t.data)
      coalesced_error(name, "tensor " + std::to_string(i) + " has a null data pointer");
    p.parts.push_back(t.count);
    p.count += t.count;
    if (t.count == 0) continue;
    const auto b = reinterpret_cast<std::uintptr_t>(t.data);
    ascending = ascending && b >= end_so_far;
    end_so_far = b + t.bytes();
  }
  if (!ascending) {
    // Kept per thread: a step that submits the same list every time allocates nothing here.
    // The same list as this thread's last one that passed (a training step resubmits its
    // buckets) passes again without the sort.
    thread_local std::vector<std::pair<std::uintptr_t, std::uintptr_t>> ranges, passed;
    ranges.clear();
    for (const TensorView& t : tensors) {
      const auto b = reinterpret_cast<std::uintptr_t>(t.data);
      if (t.count > 0) ranges.emplace_back(b, b + t.bytes());
    }
    if (ranges != passed) {
      passed = ranges;
      std::sort(ranges.begin(), ranges.end());
      for (std::size_t i = 1; i < ranges.size(); ++i) {
        if (ranges[i].first < ranges[i - 1].second) {
          passed.clear();
          coalesced_error(
              name,
              "two of its tensors overlap in memory; each tensor is reduced in place, so they "
              "must be disjoint");
        }
      }
    }
  }
  if (!dtype_is_floating(p.dtype) && (p.prescale != 1.0 || p.postscale != 1.0)) {
    coalesced_error(name, "prescale/postscale need a floating dtype");
  }
}

}  // namespace kolo::detail::engine
