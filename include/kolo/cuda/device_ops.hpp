// kolo/cuda/device_ops.hpp — what the engine needs from GPU kernels, declared without CUDA.
//
// The kernels themselves live in kolo/cuda/kernels.cuh, which needs nvcc. A program that
// includes kernels.cuh in one of its .cu files registers them here at start-up; the NCCL and
// host-staged transports (plain C++, compiled by any host compiler) then pack a fused batch of
// device tensors in one launch. Without them, device tensors still work: unscaled, uncompressed
// batches are packed with one cudaMemcpyAsync per tensor, and anything that needs arithmetic on
// the device (pre/post-scaling, fp16/bf16 compression) is refused with a ConfigError that says
// to include kernels.cuh.
#pragma once

#include <cstddef>

#include "kolo/core/dtype.hpp"

namespace kolo::cuda {

// One tensor of a fused batch. `offset` counts elements of the fusion buffer's (wire) type.
struct FusionItem {
  const void* src = nullptr;  // device; nullptr packs zeros (a rank that has joined)
  void* dst = nullptr;        // device; where unpack writes (nullptr: skipped)
  std::size_t count = 0;      // elements
  std::size_t offset = 0;     // elements into the fusion buffer
};

// Function table of the registered kernels. `stream` is a cudaStream_t. Every function only
// enqueues work on the stream (the item array is read before it returns) and throws
// kolo::Error on a CUDA error.
struct FusionKernels {
  // buf[offset + i] = wire(src[i] * scale) for every item, in one launch. `in` is the tensors'
  // dtype; `wire` is `in`, or float16/bfloat16 when `in` is float32 (compression). Rounding and
  // the order of operations are the host FusionBuffer's and Compressor's (round to nearest even).
  void (*pack)(const FusionItem* items, std::size_t n, DataType in, DataType wire, void* buf,
               double scale, void* stream) = nullptr;
  // dst[i] = out(buf[offset + i]) * (scale / divisor) for every item with a dst, in one launch
  // (with scale 1: out(buf[offset + i]) / divisor, the host's true division).
  // Integers: divided by `divisor` with truncation toward zero (scale must be 1).
  void (*unpack)(const FusionItem* items, std::size_t n, DataType wire, DataType out,
                 const void* buf, double scale, int divisor, void* stream) = nullptr;
  // dst[i] = dst[i] (op) src[i]; 16-bit floats widen to float32 and round once, like
  // kolo::reduce on the host. ReduceOp::average adds (the division is finish_average's).
  void (*reduce)(void* dst, const void* src, std::size_t n, DataType t, ReduceOp op,
                 void* stream) = nullptr;
};

// The kernels registered by kernels.cuh, or nullptr when no translation unit included it.
inline const FusionKernels*& registered_kernels() noexcept {
  static const FusionKernels* k = nullptr;
  return k;
}

}  // namespace kolo::cuda
