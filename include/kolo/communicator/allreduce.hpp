// kolo/communicator/allreduce.hpp — Communicator::allreduce and allreduce_to: checks, the
// zero-copy path, the native hook, and the one place that runs the Selector's allreduce.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kolo/communicator.hpp"

namespace kolo {

template <class T>
void Communicator<T>::allreduce(TensorView in, TensorView out, ReduceOp op) {
  allreduce_impl(in, out, op, BlockSink{}, BlockSource{});
}

template <class T>
void Communicator<T>::allreduce_to(TensorView buf, ReduceOp op, BlockSink sink, BlockSource own) {
  allreduce_impl(buf, buf, op, sink, own);
}

template <class T>
void Communicator<T>::allreduce_impl(TensorView in, TensorView out, ReduceOp op, BlockSink sink,
                                     BlockSource own) {
  run(Collective::allreduce, in.dtype, op, in.count, -1, 0, [&](const AlgoOptions& opt) {
    check_cpu(in, "allreduce input");
    check_cpu(out, "allreduce output");
    same_type(in, out, "allreduce");
    checks::check_same_count(in.count, out.count, "allreduce");
    check_overlap("allreduce", in, out, in.data);
    last_zero_copy_ = false;
    if (try_zero_copy(in, out, op, opt, sink, own)) return;
    if (own) {  // the usual paths read the whole input from `in`: this rank's block goes there
      std::size_t first, count;
      zero_copy_block(in.count, rank(), size(), first, count);
      const std::size_t es = dtype_size(in.dtype);
      auto* dst = static_cast<std::byte*>(out.data) + first * es;
      own.runs(first, count, [&](std::size_t at, std::size_t m, const std::byte* src) {
        if (dst + at * es != src) std::memcpy(dst + at * es, src, m * es);
      });
    }
    if constexpr (HasNativeAllreduce<T>) {
      if (transport_->native_allreduce(in.data, out.data, in.count, in.dtype, op, opt)) return;
    }
    run_allreduce(in.data, out.data, in.count, in.dtype, op, opt);
  });
  // The zero-copy path handed the blocks already; every other path left the result in `out`.
  if (sink && !last_zero_copy_ && out.count > 0) {
    sink(0, out.count, static_cast<const std::byte*>(out.data));
  }
}

template <class T>
void Communicator<T>::run_allreduce(const void* in, void* out, std::size_t count, DataType dtype,
                                    ReduceOp op, const AlgoOptions& opt) {
  AllreduceArgs a;
  a.in = in;
  a.out = out;
  a.count = count;
  a.dtype = dtype;
  a.op = op;
  select_run<AllreduceAlgorithm>(a, opt);
}

}  // namespace kolo
