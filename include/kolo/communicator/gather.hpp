// kolo/communicator/gather.hpp — Communicator::gather: every rank's block to the root.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kolo/communicator.hpp"

namespace kolo {

template <class T>
void Communicator<T>::gather(TensorView in, TensorView out, int root) {
  run(Collective::gather, in.dtype, ReduceOp::sum, in.count, root, 0, [&](const AlgoOptions& opt) {
    check_cpu(in, "gather input");
    check_root(root, "gather");
    if (rank() == root) {
      check_cpu(out, "gather output");
      same_type(in, out, "gather");
      checks::check_size_multiple(out.count, in.count, size(), "gather", "the root's output",
                                  "input");
      check_overlap("gather", in, out,
                    out.byte_data() + static_cast<std::size_t>(root) * in.bytes());
    }
    agree(opt);
    gather_direct(*transport_, in.data, out.data, in.bytes(), root, opt);
  });
}

}  // namespace kolo
