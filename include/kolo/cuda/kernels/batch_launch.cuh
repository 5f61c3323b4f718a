// kolo/cuda/kernels/batch_launch.cuh — one batch on the host: the items as descriptors in the
// work space, the grid and each warp's task, the launch of the batch kernel (descriptors inline
// or uploaded), and the element operation chosen for a copy or a same-type scaling.
//
// Included by kolo/cuda/kernels.cuh (not a public header: include that one); self-contained.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kolo/core/dtype.hpp"
#include "kolo/core/error.hpp"
#include "kolo/core/float16.hpp"
#include "kolo/cuda/device_ops.hpp"
#include "kolo/cuda/kernels/descriptor_upload.cuh"
#include "kolo/cuda/kernels/device_kernels.cuh"
#include "kolo/cuda/kernels/element_ops.cuh"
#include "kolo/cuda/kernels/launch_geometry.cuh"
#include "kolo/cuda/kernels/layout.cuh"

namespace kolo::cuda::kernel_detail {

// ---- host side: one batch ----

// This thread's descriptor vector, reused from call to call: allocating and first touching
// 32 KB for 1000 tensors cost the host ~10 us per call (measured on H100 hosts).
inline std::vector<BatchDesc>& descriptor_scratch() {
  thread_local std::vector<BatchDesc> descs;
  return descs;
}

// The batch as descriptors: pack reads items' src and writes buf; unpack reads buf and writes
// items' dst (items without one are skipped). Items without elements are dropped.
template <class In, class Out>
void make_descriptors(const FusionItem* items, std::size_t n, bool packing, const void* buf,
                      std::size_t* end, const char* who, std::vector<BatchDesc>& descs) {
  using G = Geometry<In, Out>;
  descs.clear();
  if (descs.capacity() > (std::size_t{1} << 16) && n < (std::size_t{1} << 16)) {
    std::vector<BatchDesc>().swap(descs);  // do not keep megabytes after one huge batch
  }
  descs.reserve(n);
  std::size_t begin = 0;
  *end = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const FusionItem& it = items[i];
    if (it.count == 0 || (!packing && it.dst == nullptr)) continue;
    if (buf == nullptr) throw ConfigError(std::string(who) + ": the fusion buffer is null");
    BatchDesc d{};
    if (packing) {
      d.src = it.src;
      d.dst = static_cast<Out*>(const_cast<void*>(buf)) + it.offset;
    } else {
      d.src = static_cast<const In*>(buf) + it.offset;
      d.dst = it.dst;
    }
    d.count = it.count;
    d.begin = begin;
    *end = begin + it.count;
    descs.push_back(d);
    begin += (it.count + G::lanes - 1) / G::lanes * G::lanes + G::overhead;
  }
}

template <class In, class Out, class Cvt>
void run_batch(const FusionItem* items, std::size_t n, bool packing, const void* buf, Cvt cvt,
               cudaStream_t stream, const char* who) {
  using G = Geometry<In, Out>;
  std::size_t end = 0;
  std::vector<BatchDesc>& descs = descriptor_scratch();
  make_descriptors<In, Out>(items, n, packing, buf, &end, who, descs);
  if (descs.empty()) return;
  // One contiguous range of the work space per warp, all of the same size: min_task each, so
  // that there are many more blocks than the GPU holds at once and its block scheduler balances
  // the load (measured on H100, 64 MiB: one resident wave of persistent warps reached 89% of a
  // D2D copy's bandwidth, this 98%); ranges grow only past kMaxWaves waves (huge batches).
  const int dev = current_device(who);
  static const int per_sm = blocks_per_sm(batch_kernel<In, Out, Cvt>);
  const std::size_t warps_wanted = (end + G::min_task - 1) / G::min_task;
  const unsigned grid = grid_size((warps_wanted + kWarpsPerBlock - 1) / kWarpsPerBlock,
                                  sm_count(dev, who), per_sm * kMaxWaves);
  const std::size_t warps = static_cast<std::size_t>(grid) * kWarpsPerBlock;
  const std::size_t task = ((end + warps - 1) / warps + G::lanes - 1) / G::lanes * G::lanes;
  const auto launch = [&](const BatchDesc* d, const InlineDescs& inl) {
    batch_kernel<In, Out, Cvt>
        <<<grid, kBlockThreads, 0, stream>>>(d, descs.size(), task, end, cvt, inl);
    check(cudaGetLastError(), who, "launching the batch kernel");
  };
  if (descs.size() <= kInlineDescs) {
    InlineDescs inl{};
    std::copy(descs.begin(), descs.end(), inl.d);
    launch(nullptr, inl);
    return;
  }
  with_device_descriptors(descs, stream, who,
                          [&](const BatchDesc* d) { launch(d, InlineDescs{}); });
}

// Same-type copies by element size: one kernel per size, whatever the dtype.
inline void run_copy(const FusionItem* items, std::size_t n, bool packing, const void* buf,
                     DataType t, cudaStream_t stream, const char* who) {
  switch (dtype_size(t)) {
    case 1:
      return run_batch<std::uint8_t, std::uint8_t>(items, n, packing, buf, CopyOp{}, stream, who);
    case 2:
      return run_batch<std::uint16_t, std::uint16_t>(items, n, packing, buf, CopyOp{}, stream, who);
    case 4:
      return run_batch<std::uint32_t, std::uint32_t>(items, n, packing, buf, CopyOp{}, stream, who);
    case 8:
      return run_batch<std::uint64_t, std::uint64_t>(items, n, packing, buf, CopyOp{}, stream, who);
    default:
      throw ConfigError(std::string(who) + ": invalid DataType value " +
                        std::to_string(static_cast<int>(t)));
  }
}

// Same-type scaling (floating types; the factor is computed like detail::scaled_copy's): by
// `factor`, or with Divide divided by it (an average's divisor, scale 1).
template <bool Divide = false>
inline void run_scale(const FusionItem* items, std::size_t n, bool packing, const void* buf,
                      DataType t, double factor, cudaStream_t stream, const char* who) {
  const auto f = static_cast<float>(factor);
  switch (t) {
    case DataType::float16:
      return run_batch<kolo::float16, kolo::float16>(
          items, n, packing, buf, HalfScaleOp<kolo::float16, Divide>{f}, stream, who);
    case DataType::bfloat16:
      return run_batch<kolo::bfloat16, kolo::bfloat16>(
          items, n, packing, buf, HalfScaleOp<kolo::bfloat16, Divide>{f}, stream, who);
    case DataType::float32:
      return run_batch<float, float>(items, n, packing, buf, FloatScaleOp<Divide>{f}, stream, who);
    case DataType::float64:
      return run_batch<double, double>(items, n, packing, buf, DoubleScaleOp<Divide>{factor},
                                       stream, who);
    default:
      throw ConfigError(std::string(who) + ": cannot scale " + std::string(dtype_name(t)));
  }
}

}  // namespace kolo::cuda::kernel_detail
