// kolo/core/checked_size.hpp — sizes from counts, checked for overflow before anything is
// allocated or copied: count * element size, count * ranks, sums of counts.
//
// A product that wraps would make a buffer (or a check against one) silently small; these turn it
// into a ConfigError naming the count and the element size (the error of any other bad argument,
// KOLO_ERR_INVALID_ARGUMENT in the C ABI). No object can exceed PTRDIFF_MAX bytes, so that is the
// bound.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include "kolo/core/error.hpp"

namespace kolo::detail {

inline constexpr std::size_t kMaxObjectBytes =
    static_cast<std::size_t>(std::numeric_limits<std::ptrdiff_t>::max());

// a * b, or SIZE_MAX when it wraps (a count no buffer can have: every later check refuses it).
constexpr std::size_t saturating_mul(std::size_t a, std::size_t b) {
  if (b != 0 && a > std::numeric_limits<std::size_t>::max() / b) {
    return std::numeric_limits<std::size_t>::max();
  }
  return a * b;
}

// a + b, or SIZE_MAX when it wraps.
constexpr std::size_t saturating_add(std::size_t a, std::size_t b) {
  return a > std::numeric_limits<std::size_t>::max() - b ? std::numeric_limits<std::size_t>::max()
                                                         : a + b;
}

// The bytes of `count` elements of `elem_size` bytes; ConfigError when that is beyond any
// buffer (wraps size_t, or exceeds PTRDIFF_MAX).
inline std::size_t checked_bytes(std::size_t count, std::size_t elem_size, std::string_view what) {
  if (elem_size != 0 && count > kMaxObjectBytes / elem_size) {
    throw ConfigError(std::string(what) + ": " + std::to_string(count) + " elements of " +
                      std::to_string(elem_size) + " bytes overflow the largest possible buffer (" +
                      std::to_string(kMaxObjectBytes) + " bytes)");
  }
  return count * elem_size;
}

}  // namespace kolo::detail
