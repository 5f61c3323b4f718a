// kolo/communicator/coalesced.hpp — Communicator::allreduce_coalesced: a list of tensors
// allreduced as one collective, by the ring over the tensors' own memory (vectored messages) or
// on a packed copy. Its checks and layout: communicator/coalesced_layout.hpp.
#pragma once

#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

#include "kolo/communicator.hpp"

namespace kolo {

template <class T>
void Communicator<T>::allreduce_coalesced(std::span<const TensorView> in,
                                          std::span<const TensorView> out, ReduceOp op) {
  const DataType dtype = in.empty() ? DataType::float32 : in.front().dtype;
  std::size_t total = 0;
  for (const TensorView& v : in) total += v.count;
  run(Collective::allreduce, dtype, op, total, -1, 0, [&](const AlgoOptions& opt) {
    coalesced_.plan(in, out, dtype, AcceptsDeviceBuffers<T>);
    const std::span<const PieceMap::Part> parts = coalesced_.parts();
    const std::size_t es = dtype_size(dtype);
    last_zero_copy_ = false;
    table_.record(AllreduceAlgorithm::ring);
    // The ring reads and writes the tensors in place when the Selector runs the ring for this
    // size anyway (the same choice on every rank); another algorithm runs on a packed copy.
    bool pieces = false;
    if constexpr (VectoredP2P<T>) {
      pieces = size() == 1 || selector_.template select<AllreduceAlgorithm>(total * es) ==
                                  AllreduceAlgorithm::ring;
    }
    if (pieces) {
      pieces_.assign(parts);
      allreduce_ring_pieces(*transport_, pieces_, dtype, op, opt);
    } else {
      // Packed into one buffer, the usual allreduce, unpacked.
      std::vector<std::byte>& buf = coalesce_buf_;
      buf.resize(total * es);
      std::size_t off = 0;
      for (const PieceMap::Part& p : parts) {
        std::memcpy(buf.data() + off, p.in, p.bytes);
        off += p.bytes;
      }
      if (size() > 1) {
        run_allreduce(buf.data(), buf.data(), total, dtype, op, opt);
      }
      off = 0;
      for (const PieceMap::Part& p : parts) {
        std::memcpy(p.out, buf.data() + off, p.bytes);
        off += p.bytes;
      }
    }
  });
}

}  // namespace kolo
