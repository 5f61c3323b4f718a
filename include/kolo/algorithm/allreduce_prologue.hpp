// kolo/algorithm/allreduce_prologue.hpp — the start every flat allreduce shares: nothing to do
// for no elements, a copy for one rank, and otherwise the frame the algorithm works in (ranks,
// element size, byte views of the buffers, the reduction).
#pragma once

#include <cstddef>
#include <cstring>
#include <optional>

#include "kolo/core/dtype.hpp"
#include "kolo/core/reduce.hpp"
#include "kolo/transport/transport_ref.hpp"

namespace kolo {

struct AllreduceFrame {
  int n = 1;           // ranks
  int r = 0;           // this rank
  std::size_t es = 1;  // element size
  std::size_t bytes = 0;
  const std::byte* src = nullptr;
  std::byte* dst = nullptr;
  ReduceSpec rs;  // dst = local (op) incoming, for `op` itself (average: a sum)
};

// nullopt: the call is complete already (count 0; or one rank, whose input is now its output).
inline std::optional<AllreduceFrame> allreduce_prologue(const TransportRef& t, const void* in,
                                                        void* out, std::size_t count,
                                                        DataType dtype, ReduceOp op) {
  AllreduceFrame f;
  f.n = t.size();
  f.r = t.rank();
  f.es = dtype_size(dtype);
  f.bytes = count * f.es;
  f.src = static_cast<const std::byte*>(in);
  f.dst = static_cast<std::byte*>(out);
  if (count == 0) return std::nullopt;
  if (f.n == 1) {
    if (f.src != f.dst) std::memcpy(f.dst, f.src, f.bytes);
    return std::nullopt;
  }
  f.rs = ReduceSpec{reduce_function(dtype, op), f.es};
  return f;
}

}  // namespace kolo
