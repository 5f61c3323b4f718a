// kolo/communicator/reduce.hpp — Communicator::reduce (to one root): a binomial tree for small
// messages, the selected allreduce for large ones.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kolo/communicator.hpp"

namespace kolo {

template <class T>
void Communicator<T>::reduce(TensorView in, TensorView out, ReduceOp op, int root) {
  run(Collective::reduce, in.dtype, op, in.count, root, 0, [&](const AlgoOptions& opt) {
    check_cpu(in, "reduce input");
    check_root(root, "reduce");
    const bool is_root = rank() == root;
    if (is_root) {
      check_cpu(out, "reduce output");
      same_type(in, out, "reduce");
      checks::check_same_count(in.count, out.count, "reduce", "the root's output");
      check_overlap("reduce", in, out, in.data);
    }
    const std::size_t bytes = in.bytes();
    if (bytes <= kRootedTreeBytes || size() <= 2) {
      agree(opt);
      reduce_binomial(*transport_, in.data, is_root ? out.data : nullptr, in.count, in.dtype, op,
                      root, scratch_, opt);
      return;
    }
    if (is_root) {
      run_allreduce(in.data, out.data, in.count, in.dtype, op, opt);
    } else {
      if (reduce_scratch_.size() < bytes) reduce_scratch_.resize(bytes);
      run_allreduce(in.data, reduce_scratch_.data(), in.count, in.dtype, op, opt);
    }
  });
}

}  // namespace kolo
