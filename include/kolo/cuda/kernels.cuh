// kolo/cuda/kernels.cuh — the device fusion kernels (pack, unpack, reduce); needs nvcc.
//
// Include this header in one .cu file of a program: an inline variable registers the kernels in
// kolo::cuda::registered_kernels() at start-up, so plain C++ code (the NCCL and host-staged
// transports) finds them through the FusionKernels table of kolo/cuda/device_ops.hpp. The
// launchers are also callable directly as kolo::cuda::pack / unpack / reduce with a cudaStream_t.
//
// Semantics are the host's, bit for bit: pack/unpack scale exactly like detail::scaled_copy
// (fusion_buffer.hpp) and the Fp16/Bf16 compressors (compressor.hpp); reduce is kolo::reduce
// (16-bit floats widen to fp32, one operation, one round to nearest even; integers wrap). The only
// difference is the payload of a NaN that went through arithmetic or a conversion: it stays a
// NaN, but the device writes the canonical NaN where the host keeps the payload. Plain copies
// (scale 1, divisor 1, same type) are bitwise, NaNs included. Build without --use_fast_math
// (flushing subnormals to zero would change results).
//
// Work distribution of a batch (pack, unpack): one launch for all tensors. The host lists the
// tensors that have work as descriptors {src, dst, count, begin}, where `begin` places each
// tensor in a "work space": its elements, rounded up to a whole vector, plus a fixed overhead
// (the cost of a tensor's descriptor, head and tail, as elements), so that tiny tensors weigh
// something. The work space is cut into equal contiguous ranges, one per warp, of at least
// 4 vectors per lane: a 64 MiB tensor becomes thousands of blocks (many more than are resident,
// so the hardware block scheduler balances the load), a thousand tiny tensors a few hundred
// warps of a few tensors each. A warp finds the first tensor of its range with a 32-way search
// over `begin` (two rounds of loads for 1000 tensors) and converts its piece of each tensor with
// 16-byte vector accesses on the wider side (8 or 16 on the narrower) when source and
// destination can be aligned at the same element (a scalar head first), with scalar accesses
// otherwise; the choice is per piece and uniform across the warp.
//
// Descriptors of a batch too large for the kernel's parameters are uploaded as
// kolo/cuda/kernels/descriptor_upload.cuh describes. The parts are detail headers under
// kolo/cuda/kernels/, reached through this one: layout.cuh (what host and device agree on),
// element_ops.cuh (element arithmetic), device_kernels.cuh (the __global__ kernels),
// launch_geometry.cuh (errors and grid sizing), descriptor_upload.cuh and batch_launch.cuh (one
// batch on the host). This file holds the public launchers and their registration.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "kolo/core/dtype.hpp"
#include "kolo/core/error.hpp"
#include "kolo/core/float16.hpp"
#include "kolo/cuda/device_ops.hpp"
#include "kolo/cuda/kernels/batch_launch.cuh"
#include "kolo/cuda/kernels/device_kernels.cuh"
#include "kolo/cuda/kernels/element_ops.cuh"
#include "kolo/cuda/kernels/launch_geometry.cuh"

namespace kolo::cuda {

namespace kernel_detail {

inline bool is_half_dtype(DataType t) {
  return t == DataType::float16 || t == DataType::bfloat16;
}

inline std::string dtype_str(DataType t) {
  const std::string_view n = dtype_name(t);
  if (n == "invalid") return "invalid DataType " + std::to_string(static_cast<int>(t));
  return std::string(n);
}

}  // namespace kernel_detail

// buf[offset + i] = wire(src[i] * scale) for every item, in one launch (see FusionKernels::pack).
inline void pack(const FusionItem* items, std::size_t n, DataType in, DataType wire, void* buf,
                 double scale, cudaStream_t stream) {
  namespace kd = kernel_detail;
  constexpr const char* who = "kolo::cuda::pack";
  const bool same = in == wire && dtype_name(in) != "invalid";
  const bool compress = in == DataType::float32 && kd::is_half_dtype(wire);
  if (!same && !compress) {
    throw ConfigError(std::string(who) + ": cannot pack " + kd::dtype_str(in) + " tensors into a " +
                      kd::dtype_str(wire) +
                      " buffer (supported: the tensors' own type, or float32 into float16 or "
                      "bfloat16)");
  }
  if (!dtype_is_floating(in) && scale != 1.0) {
    throw ConfigError(std::string(who) + ": " + kd::dtype_str(in) +
                      " tensors cannot be scaled (by " + std::to_string(scale) +
                      "): scale factors need a floating type");
  }
  if (n == 0) return;
  if (items == nullptr) throw ConfigError(std::string(who) + ": items is null");
  if (compress) {
    const float f = static_cast<float>(scale);
    if (wire == DataType::float16) {
      kd::run_batch<float, kolo::float16>(items, n, true, buf, kd::CompressOp<kolo::float16>{f},
                                          stream, who);
    } else {
      kd::run_batch<float, kolo::bfloat16>(items, n, true, buf, kd::CompressOp<kolo::bfloat16>{f},
                                           stream, who);
    }
  } else if (scale == 1.0 || !dtype_is_floating(in)) {
    kd::run_copy(items, n, true, buf, in, stream, who);
  } else {
    kd::run_scale(items, n, true, buf, in, scale, stream, who);
  }
}

// dst[i] = out(buf[offset + i]) * (scale / divisor) for every item with a dst, in one launch
// (see FusionKernels::unpack); with scale 1, buf / divisor (a true division, as the host's).
// Integers: buf / divisor, truncated toward zero (scale must be 1).
inline void unpack(const FusionItem* items, std::size_t n, DataType wire, DataType out,
                   const void* buf, double scale, int divisor, cudaStream_t stream) {
  namespace kd = kernel_detail;
  constexpr const char* who = "kolo::cuda::unpack";
  const bool same = wire == out && dtype_name(out) != "invalid";
  const bool decompress = out == DataType::float32 && kd::is_half_dtype(wire);
  if (!same && !decompress) {
    throw ConfigError(std::string(who) + ": cannot unpack a " + kd::dtype_str(wire) +
                      " buffer into " + kd::dtype_str(out) +
                      " tensors (supported: the buffer's own type, or float16 or bfloat16 into "
                      "float32)");
  }
  if (!dtype_is_floating(out)) {
    if (scale != 1.0) {
      throw ConfigError(std::string(who) + ": " + kd::dtype_str(out) +
                        " tensors cannot be scaled (by " + std::to_string(scale) +
                        "): scale factors need a floating type");
    }
    if (divisor == 0) throw ConfigError(std::string(who) + ": integer division by a divisor of 0");
  }
  if (n == 0) return;
  if (items == nullptr) throw ConfigError(std::string(who) + ": items is null");
  if (decompress) {
    const float f = static_cast<float>(scale / divisor);
    if (wire == DataType::float16) {
      kd::run_batch<kolo::float16, float>(items, n, false, buf, kd::DecompressOp<kolo::float16>{f},
                                          stream, who);
    } else {
      kd::run_batch<kolo::bfloat16, float>(items, n, false, buf,
                                           kd::DecompressOp<kolo::bfloat16>{f}, stream, who);
    }
  } else if (scale == 1.0 && divisor == 1) {
    kd::run_copy(items, n, false, buf, out, stream, who);
  } else if (dtype_is_floating(out) && scale == 1.0) {
    kd::run_scale<true>(items, n, false, buf, out, divisor, stream, who);  // x / divisor
  } else if (dtype_is_floating(out)) {
    kd::run_scale(items, n, false, buf, out, scale / divisor, stream, who);
  } else {
    visit_dtype(out, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_integral_v<T>) {
        kd::run_batch<T, T>(items, n, false, buf, kd::IntDivOp<T>{divisor}, stream, who);
      }
    });
  }
}

// dst[i] = dst[i] (op) src[i], exactly kolo::reduce (see FusionKernels::reduce).
inline void reduce(void* dst, const void* src, std::size_t n, DataType t, ReduceOp op,
                   cudaStream_t stream) {
  namespace kd = kernel_detail;
  constexpr const char* who = "kolo::cuda::reduce";
  if (reduce_op_name(op) == "invalid") {
    throw ConfigError(std::string(who) + ": invalid ReduceOp value " +
                      std::to_string(static_cast<int>(op)));
  }
  if (dtype_name(t) == "invalid") throw ConfigError(std::string(who) + ": " + kd::dtype_str(t));
  if (n == 0) return;
  if (dst == nullptr || src == nullptr) {
    throw ConfigError(std::string(who) + ": null pointer for " + std::to_string(n) + " elements");
  }
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    const auto launch = [&](auto opf) {
      using Op = decltype(opf);
      constexpr std::size_t L = 16 / sizeof(T);
      const auto da = reinterpret_cast<std::uintptr_t>(dst);
      const auto sa = reinterpret_cast<std::uintptr_t>(src);
      const bool vec = da % sizeof(T) == 0 && sa % sizeof(T) == 0 && da % 16 == sa % 16;
      const std::size_t head =
          vec ? std::min<std::size_t>(((16 - da % 16) % 16) / sizeof(T), n) : 0;
      const std::size_t units = vec ? (n - head) / L : n;
      const int dev = kd::current_device(who);
      static const int per_sm = kd::blocks_per_sm(kd::reduce_kernel<T, Op>);
      const std::size_t per_block = kd::kBlockThreads * kd::kUnroll;
      const unsigned grid =
          kd::grid_size((units + per_block - 1) / per_block, kd::sm_count(dev, who), per_sm);
      kd::reduce_kernel<T, Op><<<grid, kd::kBlockThreads, 0, stream>>>(
          static_cast<T*>(dst), static_cast<const T*>(src), n, head, vec, opf);
      kd::check(cudaGetLastError(), who, "launching the reduce kernel");
    };
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::average:  // the division is finish_average's
        return launch(kd::SumOp{});
      case ReduceOp::product:
        return launch(kd::ProdOp{});
      case ReduceOp::min:
        return launch(kd::MinOp{});
      case ReduceOp::max:
        return launch(kd::MaxOp{});
    }
  });
}

namespace kernel_detail {

inline void pack_erased(const FusionItem* items, std::size_t n, DataType in, DataType wire,
                        void* buf, double scale, void* stream) {
  cuda::pack(items, n, in, wire, buf, scale, static_cast<cudaStream_t>(stream));
}
inline void unpack_erased(const FusionItem* items, std::size_t n, DataType wire, DataType out,
                          const void* buf, double scale, int divisor, void* stream) {
  cuda::unpack(items, n, wire, out, buf, scale, divisor, static_cast<cudaStream_t>(stream));
}
inline void reduce_erased(void* dst, const void* src, std::size_t n, DataType t, ReduceOp op,
                          void* stream) {
  cuda::reduce(dst, src, n, t, op, static_cast<cudaStream_t>(stream));
}

inline constexpr FusionKernels kernel_table{&pack_erased, &unpack_erased, &reduce_erased};

}  // namespace kernel_detail

// Registers the table at start-up in every program that includes this header (one definition
// across translation units: an inline variable).
inline const bool kernels_registered = [] {
  registered_kernels() = &kernel_detail::kernel_table;
  return true;
}();

}  // namespace kolo::cuda
