// kolo/communicator/reduce_scatter.hpp — the reduce_scatter collective: its definition
// (signature, checks, native hook, the Selector's reduce-scatter) and
// Communicator::reduce_scatter, which calls it.
#pragma once

#include "kolo/communicator.hpp"

namespace kolo {

// out (count elements) = block `rank` of the reduction of every rank's in (size x count).
struct ReduceScatterCollective {
  static constexpr Collective collective = Collective::reduce_scatter;
  using Algorithm = ReduceScatterAlgorithm;
  struct Args {
    TensorView in, out;
    ReduceOp op = ReduceOp::sum;
  };
  static CallShape shape(const Args& a, const CallFacts&) {
    return {a.in.dtype, a.op, a.out.count, -1, 0};
  }
  static void check(const Args& a, const CallFacts& f) {
    checks::check_buffer(a.in, "reduce_scatter input", f.device_ok);
    checks::check_buffer(a.out, "reduce_scatter output", f.device_ok);
    checks::check_same_dtype(a.in, a.out, "reduce_scatter");
    checks::check_size_multiple(a.in.count, a.out.count, f.size, "reduce_scatter", "input",
                                "output");
    checks::check_overlap("reduce_scatter", checks::bytes_of(a.in), checks::bytes_of(a.out),
                          a.in.byte_data() + static_cast<std::size_t>(f.rank) * a.out.bytes());
  }
  template <class T>
  requires HasNativeReduceScatter<T>
  static bool native(T& t, const Args& a, const AlgoOptions& opt) {
    return t.native_reduce_scatter(a.in.data, a.out.data, a.out.count, a.in.dtype, a.op, opt);
  }
  static ReduceScatterArgs algorithm_args(const Args& a, const CallFacts& f) {
    ReduceScatterArgs r;
    r.in = a.in.data;
    r.out = a.out.data;
    r.count = a.out.count;
    r.dtype = a.in.dtype;
    r.op = a.op;
    r.size = f.size;
    return r;
  }
};

template <class T>
void Communicator<T>::reduce_scatter(TensorView in, TensorView out, ReduceOp op) {
  call<ReduceScatterCollective>({in, out, op});
}

}  // namespace kolo
