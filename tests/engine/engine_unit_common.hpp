// tests/engine/engine_unit_common.hpp — what the engine's transport-free unit tests
// (test_negotiator.cpp, test_batch_plan.cpp) share: the names they use and the RequestParams of
// an allreduce, the request both build their cycles from.
#pragma once

#include <cstdint>

#include "kolo/engine/request.hpp"

namespace engine_unit {

using kolo::DataType;
using kolo::OpKind;
using kolo::ReduceOp;
using kolo::RequestParams;

// An allreduce of `count` elements of `dtype` with `op`, no scaling.
inline RequestParams allreduce(std::uint64_t count, DataType dtype = DataType::float32,
                               ReduceOp op = ReduceOp::sum) {
  RequestParams p;
  p.kind = OpKind::allreduce;
  p.dtype = dtype;
  p.op = op;
  p.count = count;
  return p;
}

}  // namespace engine_unit
