// kolo/communicator/compressed.hpp — Communicator::allreduce_compressed: float32 allreduces
// whose messages carry a 16-bit wire type, and the choice of its path (ring, hierarchical, or
// compress / allreduce / decompress).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kolo/communicator.hpp"

namespace kolo {

template <class T>
void Communicator<T>::allreduce_compressed(TensorView in, TensorView out, ReduceOp op,
                                           const CompressionPolicy& wire) {
  const std::uint64_t wire_code = 0x100u + static_cast<std::uint64_t>(wire.wire);
  run(Collective::allreduce, in.dtype, op, in.count, -1, wire_code, [&](const AlgoOptions& opt) {
    check_cpu(in, "allreduce_compressed input");
    check_cpu(out, "allreduce_compressed output");
    same_type(in, out, "allreduce_compressed");
    if (in.dtype != DataType::float32) {
      throw ConfigError("allreduce_compressed: the tensor is " + std::string(dtype_name(in.dtype)) +
                        "; compression takes float32");
    }
    if (op != ReduceOp::sum && op != ReduceOp::average) {
      throw ConfigError("allreduce_compressed: op " + std::string(reduce_op_name(op)) +
                        " (compression supports sum and average)");
    }
    if (!wire.enabled() || dtype_size(wire.wire) != 2) {
      throw ConfigError("allreduce_compressed: compression '" + std::string(wire.name) +
                        "' has no 16-bit wire type");
    }
    checks::check_same_count(in.count, out.count, "allreduce_compressed");
    check_overlap("allreduce_compressed", in, out, in.data);
    const auto* src = static_cast<const float*>(in.data);
    auto* dst = static_cast<float*>(out.data);
    const WirePath path = size() == 1 ? WirePath::ring : wire_algorithm(in.count, wire);
    if (path == WirePath::ring) {
      allreduce_ring_wire(*transport_, src, dst, in.count, wire, op == ReduceOp::average, opt,
                          scratch_);
      table_.record(AllreduceAlgorithm::ring);
      return;
    }
    if (path == WirePath::hierarchical) {
      allreduce_hierarchical_wire(*transport_, groups_, src, dst, in.count, wire,
                                  op == ReduceOp::average, opt, scratch_);
      table_.record(AllreduceAlgorithm::hierarchical);
      return;
    }
    wire_buffer_.resize(in.count * dtype_size(wire.wire));
    wire.compress(src, wire_buffer_.data(), in.count, 1.0f);
    // Summed on the wire type; an average divides in float32 while decompressing (dividing
    // the 16-bit sum would round once more).
    run_allreduce(wire_buffer_.data(), wire_buffer_.data(), in.count, wire.wire, ReduceOp::sum,
                  opt);
    const float post = op == ReduceOp::average ? 1.0f / static_cast<float>(size()) : 1.0f;
    wire.decompress(wire_buffer_.data(), dst, in.count, post);
  });
}

template <class T>
typename Communicator<T>::WirePath Communicator<T>::wire_algorithm(
    std::size_t count, const CompressionPolicy& wire) const {
  const auto a = selector_.template select<AllreduceAlgorithm>(count * dtype_size(wire.wire));
  if (a == AllreduceAlgorithm::ring) return WirePath::ring;
  if (a == AllreduceAlgorithm::hierarchical && groups_.uniform && groups_.hosts > 1) {
    return WirePath::hierarchical;
  }
  return WirePath::passes;
}

}  // namespace kolo
