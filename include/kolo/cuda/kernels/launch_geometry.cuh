// kolo/cuda/kernels/launch_geometry.cuh — the host's CUDA calls around a launch: turning a
// cudaError_t into a kolo::Error, the current device, its SM count, a kernel's occupancy and the
// grid size they allow.
//
// Included by kolo/cuda/kernels.cuh (not a public header: include that one); self-contained.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <string>

#include "kolo/core/error.hpp"
#include "kolo/cuda/kernels/layout.cuh"

namespace kolo::cuda::kernel_detail {

// ---- errors ----

inline void check(cudaError_t e, const char* who, const char* what) {
  if (e == cudaSuccess) return;
  throw Error(std::string(who) + ": " + what + " failed: " + cudaGetErrorName(e) + " (" +
              cudaGetErrorString(e) + ")");
}

// ---- host side: launch geometry ----

inline int current_device(const char* who) {
  int dev = 0;
  check(cudaGetDevice(&dev), who, "cudaGetDevice");
  return dev;
}

inline int sm_count(int dev, const char* who) {
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), who,
        "cudaDeviceGetAttribute(multiProcessorCount)");
  return sms > 0 ? sms : 1;
}

// Resident blocks per SM of a kernel (asked once per kernel; a failure just means "a few").
template <class Kernel>
int blocks_per_sm(Kernel kernel) {
  int b = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, kBlockThreads, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    b = 0;
  }
  return b > 0 ? b : 4;
}

inline unsigned grid_size(std::size_t wanted, int sms, int per_sm) {
  const std::size_t cap = static_cast<std::size_t>(sms) * static_cast<std::size_t>(per_sm);
  return static_cast<unsigned>(std::max<std::size_t>(1, std::min(wanted, cap)));
}

}  // namespace kolo::cuda::kernel_detail
