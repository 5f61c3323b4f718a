// size_arg.hpp — "4096", "4K", "64M": a byte count with an optional binary suffix, for the
// benchmarks' command lines (kolo-fusion-bench, kolo-zero-copy-bench).
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace kolo::bench {

inline std::size_t parse_bytes(const std::string& s) {
  std::size_t pos = 0;
  const unsigned long long v = std::stoull(s, &pos);
  const std::string suf = s.substr(pos);
  if (suf.empty()) return v;
  if (suf == "K" || suf == "k") return v << 10;
  if (suf == "M" || suf == "m") return v << 20;
  throw std::invalid_argument("size suffix '" + suf + "' (expected none, K or M)");
}

}  // namespace kolo::bench
