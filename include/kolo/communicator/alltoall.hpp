// kolo/communicator/alltoall.hpp — the alltoall collective: its definition (signature, checks,
// native hook, the Selector's alltoall) and Communicator::alltoall, which calls it.
#pragma once

#include <string>

#include "kolo/communicator.hpp"

namespace kolo {

// Block j of in goes to rank j, block i of out comes from rank i (in.count == out.count,
// divisible by the size; not in place).
struct AlltoallCollective {
  static constexpr Collective collective = Collective::alltoall;
  using Algorithm = AlltoallAlgorithm;
  struct Args {
    TensorView in, out;
  };
  static CallShape shape(const Args& a, const CallFacts&) {
    return {a.in.dtype, ReduceOp::sum, a.in.count, -1, 0};
  }
  static void check(const Args& a, const CallFacts& f) {
    checks::check_buffer(a.in, "alltoall input", f.device_ok);
    checks::check_buffer(a.out, "alltoall output", f.device_ok);
    checks::check_same_dtype(a.in, a.out, "alltoall");
    const auto n = static_cast<std::size_t>(f.size);
    if (a.in.count != a.out.count || a.in.count % n != 0) {
      throw ConfigError("alltoall: input (" + std::to_string(a.in.count) + ") and output (" +
                        std::to_string(a.out.count) +
                        ") must have the same count, divisible by the size " +
                        std::to_string(f.size));
    }
    if (a.in.data == a.out.data && a.in.count > 0 && f.size > 1) {
      throw ConfigError("alltoall: in-place is not supported; pass distinct buffers");
    }
    checks::check_overlap("alltoall", checks::bytes_of(a.in), checks::bytes_of(a.out), nullptr);
  }
  template <class T>
  requires HasNativeAlltoall<T>
  static bool native(T& t, const Args& a, const AlgoOptions& opt) {
    return t.native_alltoall(a.in.data, a.out.data, a.in.count / static_cast<std::size_t>(t.size()),
                             a.in.dtype, opt);
  }
  static AlltoallArgs algorithm_args(const Args& a, const CallFacts& f) {
    AlltoallArgs r;
    r.in = a.in.data;
    r.out = a.out.data;
    r.block_bytes = a.in.count / static_cast<std::size_t>(f.size) * dtype_size(a.in.dtype);
    r.size = f.size;
    return r;
  }
};

template <class T>
void Communicator<T>::alltoall(TensorView in, TensorView out) {
  call<AlltoallCollective>({in, out});
}

}  // namespace kolo
