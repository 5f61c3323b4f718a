// kolo/core/arg_checks.hpp — the argument checks of a collective call, in one non-template
// place: buffers (device, null pointer, size in bytes), dtypes, counts, roots, the overlap of an
// input and an output (one pair, or a list of tensors), and the C ABI's enum codes.
//
// Shared by the Communicator (communicator/*.hpp), the Engine's submission checks and the C ABI
// (src/c/kolo_c.cpp), so each rule and its message exist once. The predicates are noexcept and
// allocate nothing (the engine calls them on every submission); a message is built only when a
// check fails, in the [[noreturn]] throw_* functions. Every error is a ConfigError (the C ABI's
// KOLO_ERR_INVALID_ARGUMENT); `what` names the call and the argument, the message starts with it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kolo/core/checked_size.hpp"
#include "kolo/core/dtype.hpp"
#include "kolo/core/error.hpp"
#include "kolo/core/tensor.hpp"

namespace kolo::checks {

// A range of bytes: what the overlap checks compare (a TensorView as bytes_of(v)).
struct ByteRange {
  const void* data = nullptr;
  std::size_t bytes = 0;
};
inline ByteRange bytes_of(const TensorView& v) noexcept {
  return {v.data, v.bytes()};
}

// The Communicator's advice when an input and an output overlap.
inline constexpr std::string_view kOverlapRemedy =
    "pass disjoint buffers, or the documented in-place form";

// True when the two ranges share a byte (an empty or null range shares none).
inline bool overlaps(ByteRange a, ByteRange b) noexcept {
  if (a.bytes == 0 || b.bytes == 0 || a.data == nullptr || b.data == nullptr) return false;
  const auto a0 = reinterpret_cast<std::uintptr_t>(a.data);
  const auto b0 = reinterpret_cast<std::uintptr_t>(b.data);
  return a0 < b0 + b.bytes && b0 < a0 + a.bytes;
}

// True when `in` and `out` may be passed to one call: disjoint, or the one alias allowed:
// `in_place` (nullptr: none) is where the in-place form puts one range inside the other (the
// whole buffer for allreduce, this rank's block of the output for allgather ...), and that range
// starts there and lies inside the other.
inline bool overlap_allowed(ByteRange in, ByteRange out, const void* in_place) noexcept {
  if (!overlaps(in, out)) return true;
  if (in_place == nullptr) return false;
  const auto a0 = reinterpret_cast<std::uintptr_t>(in.data);
  const auto b0 = reinterpret_cast<std::uintptr_t>(out.data);
  const std::uintptr_t a1 = a0 + in.bytes, b1 = b0 + out.bytes;
  if (in_place == in.data && a0 >= b0 && a1 <= b1) return true;   // in inside out
  if (in_place == out.data && b0 >= a0 && b1 <= a1) return true;  // out inside in
  return false;
}

// "<what>: input [0x.., 0x..) and output [0x.., 0x..) overlap; <remedy>".
[[noreturn]] inline void throw_overlap(std::string_view what, ByteRange in, ByteRange out,
                                       std::string_view remedy = kOverlapRemedy) {
  auto hex = [](std::uintptr_t v) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
    return std::string(buf);
  };
  const auto a0 = reinterpret_cast<std::uintptr_t>(in.data);
  const auto b0 = reinterpret_cast<std::uintptr_t>(out.data);
  throw ConfigError(std::string(what) + ": input [" + hex(a0) + ", " + hex(a0 + in.bytes) +
                    ") and output [" + hex(b0) + ", " + hex(b0 + out.bytes) + ") overlap; " +
                    std::string(remedy));
}

// Refuses an input and output that overlap other than by the allowed alias (overlap_allowed):
// a partial overlap gives wrong results silently in any algorithm that reads one while writing
// the other.
inline void check_overlap(std::string_view what, ByteRange in, ByteRange out, const void* in_place,
                          std::string_view remedy = kOverlapRemedy) {
  if (!overlap_allowed(in, out, in_place)) throw_overlap(what, in, out, remedy);
}

// A list of tensors reduced as one call (allreduce_coalesced, the engine's coalesced
// submission): true when no two of `ranges` share a byte. `ranges` are (start, bytes) pairs of
// the non-empty ones; they are sorted here unless they come sorted (the usual case: nothing to
// do). Allocates nothing.
inline bool disjoint(std::vector<std::pair<const std::byte*, std::size_t>>& ranges) noexcept {
  if (!std::is_sorted(ranges.begin(), ranges.end())) std::sort(ranges.begin(), ranges.end());
  for (std::size_t k = 1; k < ranges.size(); ++k) {
    if (ranges[k - 1].first + ranges[k - 1].second > ranges[k].first) return false;
  }
  return true;
}

// With `outputs` sorted and disjoint (after disjoint()): true when the input [in, in + bytes)
// meets no output but possibly `own` exactly (the same start and the input inside it: in place).
inline bool input_meets_only_own(
    const std::vector<std::pair<const std::byte*, std::size_t>>& outputs, const std::byte* in,
    std::size_t bytes, const std::byte* own) noexcept {
  if (bytes == 0) return true;
  auto it =
      std::lower_bound(outputs.begin(), outputs.end(), std::make_pair(in + bytes, std::size_t{0}));
  if (it == outputs.begin()) return true;
  --it;  // the last output that starts before this input ends
  const bool meets = it->first + it->second > in;
  return !meets || (it->first == own && in == it->first);
}

// ---- one buffer ----

// "<what> is on a CUDA device: host transports need host memory (...)".
[[noreturn]] inline void throw_device(std::string_view what) {
  throw ConfigError(std::string(what) +
                    " is on a CUDA device: host transports need host memory (use the NCCL "
                    "transport for device buffers)");
}

// A buffer a collective reads or writes: on the host unless `device_ok` (a transport that takes
// device buffers), not a null pointer with elements, and a size in bytes that fits an object.
inline void check_buffer(const TensorView& v, const char* what, bool device_ok) {
  if (v.device != Device::cpu() && !device_ok) throw_device(what);
  if (v.data == nullptr && v.count > 0) {
    throw ConfigError(std::string(what) + " is a null pointer with " + std::to_string(v.count) +
                      " elements");
  }
  const std::size_t es = dtype_size(v.dtype);
  if (es != 0 && v.count > detail::kMaxObjectBytes / es) {
    (void)detail::checked_bytes(v.count, es, what);
  }
}

// "<what>: input is X but output is Y" unless both have one dtype.
inline void check_same_dtype(const TensorView& in, const TensorView& out, const char* what) {
  if (in.dtype != out.dtype) {
    throw ConfigError(std::string(what) + ": input is " + std::string(dtype_name(in.dtype)) +
                      " but output is " + std::string(dtype_name(out.dtype)));
  }
}

// "<what>: input has N elements but <output> has M" unless the counts are equal. `output` names
// the output ("output", "the root's output").
inline void check_same_count(std::size_t in, std::size_t out, const char* what,
                             const char* output = "output") {
  if (in != out) {
    throw ConfigError(std::string(what) + ": input has " + std::to_string(in) + " elements but " +
                      output + " has " + std::to_string(out));
  }
}

// "<what>: <side> has N elements, expected size x <per> = S x M" unless `have` = size x `per`
// (saturating: a product that wraps matches no count). side: "output", "the root's input" ...
inline void check_size_multiple(std::size_t have, std::size_t per, int size, const char* what,
                                const char* side, const char* per_name) {
  if (have != detail::saturating_mul(per, static_cast<std::size_t>(size))) {
    throw ConfigError(std::string(what) + ": " + side + " has " + std::to_string(have) +
                      " elements, expected size x " + per_name + " = " + std::to_string(size) +
                      " x " + std::to_string(per));
  }
}

// "<what>: root R is not a rank of this communicator (size N)".
inline void check_root(int root, int size, const char* what) {
  if (root < 0 || root >= size) {
    throw ConfigError(std::string(what) + ": root " + std::to_string(root) +
                      " is not a rank of this communicator (size " + std::to_string(size) + ")");
  }
}

// ---- the C ABI's enum codes (kolo.h's kolo_dtype_t and kolo_op_t are kolo's enums) ----

inline bool valid_dtype_code(int v) noexcept {
  return v >= static_cast<int>(DataType::float16) && v <= static_cast<int>(DataType::int64);
}
inline bool valid_op_code(int v) noexcept {
  return v >= static_cast<int>(ReduceOp::sum) && v <= static_cast<int>(ReduceOp::product);
}
// Why a code is refused ("" when valid): "dtype 9 is not a kolo_dtype_t (...)".
inline std::string dtype_code_problem(int v) {
  if (valid_dtype_code(v)) return {};
  return "dtype " + std::to_string(v) +
         " is not a kolo_dtype_t (KOLO_FLOAT16 = 0 ... KOLO_INT64 = 7)";
}
inline std::string op_code_problem(int v) {
  if (valid_op_code(v)) return {};
  return "op " + std::to_string(v) + " is not a kolo_op_t (KOLO_SUM = 0 ... KOLO_PRODUCT = 4)";
}

}  // namespace kolo::checks
