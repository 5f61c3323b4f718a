// tests/common/reference_reduce.hpp — the exact reference of a reduction over ranks, shared by
// the multi-process tests (tests/mp), the soak (tests/soak) and kolo-bench's check (benchmarks).
//
// Each of them fills rank r's element i with a small integer of its own choosing (chosen so that
// every sum, product, minimum and maximum over the job is exact in every dtype, whatever order
// an algorithm combines them in) and checks the result against the fold below, written out
// independently of the library's reduce kernels. average folds as a sum: its one rounding step,
// the division, is each caller's (they differ on purpose: a tolerance, the library's own
// truncation rule, a 16-bit float division).
#pragma once

#include <algorithm>

#include <kolo/core/dtype.hpp>

namespace kolo_test {

// value(r) for r = 0 .. n-1, combined by op (average: summed), exactly.
template <class Value>
long long reduce_ranks(kolo::ReduceOp op, int n, Value&& value) {
  long long acc = value(0);
  for (int r = 1; r < n; ++r) {
    const long long v = value(r);
    switch (op) {
      case kolo::ReduceOp::sum:
      case kolo::ReduceOp::average:
        acc += v;
        break;
      case kolo::ReduceOp::product:
        acc *= v;
        break;
      case kolo::ReduceOp::min:
        acc = std::min(acc, v);
        break;
      case kolo::ReduceOp::max:
        acc = std::max(acc, v);
        break;
    }
  }
  return acc;
}

}  // namespace kolo_test
