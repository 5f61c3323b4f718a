// kolo/communicator/coalesced_layout.hpp — allreduce_coalesced's argument checks and the layout
// of its tensors (the runs of memory its ring or its packed copy reads and writes), apart from
// the transport: not a template, so compiled once per file whatever the communicators.
//
// Communicator::allreduce_coalesced (communicator/coalesced.hpp) calls plan() inside the
// collective, so a refused list fails on every rank.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kolo/algorithm/ring_pipeline.hpp"
#include "kolo/core/arg_checks.hpp"
#include "kolo/core/dtype.hpp"
#include "kolo/core/error.hpp"
#include "kolo/core/tensor.hpp"

namespace kolo::detail {

class CoalescedLayout {
 public:
  // Checks the list (one dtype, host memory, in[i] and out[i] of one count, in place or
  // disjoint; no output overlapping another output or another tensor's input) and lays it out:
  // parts() are the runs of memory, tensors that follow each other in memory (inputs and
  // outputs alike) joined into one. A ConfigError names the tensor. `device_ok`: whether the
  // transport takes device buffers (it does not matter here: coalesced needs host memory).
  void plan(std::span<const TensorView> in, std::span<const TensorView> out, DataType dtype,
            bool device_ok) {
    const char* what = "allreduce_coalesced";
    if (in.size() != out.size()) {
      throw ConfigError(std::string(what) + ": " + std::to_string(in.size()) + " inputs but " +
                        std::to_string(out.size()) + " outputs");
    }
    const std::size_t es = dtype_size(dtype);
    parts_.clear();
    listed_.clear();
    for (std::size_t i = 0; i < in.size(); ++i) {
      const TensorView& a = in[i];
      const TensorView& b = out[i];
      // Checked without building a string unless one fails (the engine calls this every step).
      if (a.device != Device::cpu() || b.device != Device::cpu() || a.dtype != dtype ||
          b.dtype != dtype || a.count != b.count || (a.count > 0 && (!a.data || !b.data))) {
        refuse_tensor(i, a, b, dtype, device_ok);
      }
      checks::check_overlap(what, checks::bytes_of(a), checks::bytes_of(b), a.data);
      if (a.count == 0) continue;
      const auto* ib = static_cast<const std::byte*>(a.data);
      auto* ob = static_cast<std::byte*>(b.data);
      const std::size_t nb = a.count * es;
      if (!parts_.empty() && parts_.back().in + parts_.back().bytes == ib &&
          parts_.back().out + parts_.back().bytes == ob) {
        parts_.back().bytes += nb;
      } else {
        parts_.push_back({ib, ob, nb});
      }
      listed_.push_back({ib, ob, nb});
    }
    // No output may overlap another output, or another tensor's input: sorted, the outputs
    // must be disjoint, and an input may meet only its own output, exactly (in place).
    // (Tensors usually come in address order, and usually in place: then neither the sort nor
    // the inputs' check has anything to do.) A list equal to the last one checked passes as it
    // did then: the check depends on nothing but the addresses and sizes (sorting 1024 spans
    // was a sixth of an engine step of 1024 small tensors, a third of a coalesced one).
    if (listed_ != checked_) {
      spans_.clear();
      for (const Listed& c : listed_) spans_.emplace_back(c.out, c.bytes);
      if (!checks::disjoint(spans_)) {
        throw ConfigError(std::string(what) +
                          ": two outputs overlap; every output needs memory "
                          "of its own");
      }
      for (std::size_t i = 0; i < in.size(); ++i) {
        if (in[i].count == 0 || in[i].data == out[i].data) continue;  // in place: checked above
        if (!checks::input_meets_only_own(spans_, static_cast<const std::byte*>(in[i].data),
                                          in[i].count * es,
                                          static_cast<const std::byte*>(out[i].data))) {
          throw ConfigError(std::string(what) + ": the input of tensor " + std::to_string(i) +
                            " overlaps another tensor's output");
        }
      }
      checked_.swap(listed_);
    }
  }

  // The runs of memory of the last plan(), in order.
  std::span<const PieceMap::Part> parts() const { return parts_; }

 private:
  // The ConfigError the i-th pair deserves (one of the quick checks above failed).
  [[noreturn]] static void refuse_tensor(std::size_t i, const TensorView& a, const TensorView& b,
                                         DataType dtype, bool device_ok) {
    const std::string at = "allreduce_coalesced tensor " + std::to_string(i);
    if (a.device != Device::cpu() || b.device != Device::cpu()) {
      throw ConfigError(at + " is on a CUDA device: allreduce_coalesced needs host memory");
    }
    checks::check_buffer(a, (at + " input").c_str(), device_ok);
    checks::check_buffer(b, (at + " output").c_str(), device_ok);
    checks::check_same_dtype(a, b, at.c_str());
    if (a.dtype != dtype) {
      throw ConfigError(at + ": dtype " + std::string(dtype_name(a.dtype)) + ", but tensor 0 is " +
                        std::string(dtype_name(dtype)) + " (one dtype per call)");
    }
    checks::check_same_count(a.count, b.count, at.c_str());
    throw ConfigError(at + ": a tensor is refused");  // not reached: a check above threw
  }

  // The tensors as this call lists them (input, output, bytes), and the last list that passed
  // the overlap check: the engine submits the same list every step, and an unchanged list (the
  // same addresses and sizes) needs no new check.
  struct Listed {
    const std::byte* in;
    const std::byte* out;
    std::size_t bytes;
    bool operator==(const Listed&) const = default;
  };
  std::vector<PieceMap::Part> parts_;
  std::vector<Listed> listed_, checked_;
  std::vector<std::pair<const std::byte*, std::size_t>> spans_;  // the overlap check's outputs
};

}  // namespace kolo::detail
