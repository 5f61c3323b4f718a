// kolo/communicator/scatter.hpp — Communicator::scatter: the root's blocks to every rank.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kolo/communicator.hpp"

namespace kolo {

template <class T>
void Communicator<T>::scatter(TensorView in, TensorView out, int root) {
  run(Collective::scatter, out.dtype, ReduceOp::sum, out.count, root, 0,
      [&](const AlgoOptions& opt) {
        check_cpu(out, "scatter output");
        check_root(root, "scatter");
        if (rank() == root) {
          check_cpu(in, "scatter input");
          same_type(in, out, "scatter");
          checks::check_size_multiple(in.count, out.count, size(), "scatter", "the root's input",
                                      "output");
          check_overlap("scatter", out, in,
                        in.byte_data() + static_cast<std::size_t>(root) * out.bytes());
        }
        agree(opt);
        scatter_direct(*transport_, in.data, out.data, out.bytes(), root, opt);
      });
}

}  // namespace kolo
