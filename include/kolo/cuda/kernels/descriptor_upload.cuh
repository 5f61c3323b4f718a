// kolo/cuda/kernels/descriptor_upload.cuh — getting a large batch's descriptors to the device:
// the per-device state (stream-ordered pool, or scratch buffer and event), the host copies kept
// for captured graphs, and with_device_descriptors, which uploads, launches and releases in
// stream order.
//
// Descriptors: up to 120 travel in the kernel's parameters (nothing to upload; a captured graph
// gets a single kernel node). Larger batches are uploaded with one cudaMemcpyAsync from
// pageable memory (the driver stages it before the call returns, so the caller's item array and
// our copy may be reused at once) into memory from a stream-ordered pool owned by this file (one
// per device, created once under a mutex), freed after the kernel in stream order, so nothing
// is shared between streams or threads. Under stream capture the graph gets alloc, memcpy, kernel
// and free nodes; the host copy of the descriptors is kept for the life of the process, because
// every replay copies it again. On a device without memory pools a growable scratch buffer per
// device serves instead, guarded by a mutex and an event (the next upload, on any stream, waits for
// the last kernel that read it).
//
// Included by kolo/cuda/kernels.cuh (not a public header: include that one); self-contained.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kolo/core/error.hpp"
#include "kolo/cuda/kernels/launch_geometry.cuh"
#include "kolo/cuda/kernels/layout.cuh"

namespace kolo::cuda::kernel_detail {

// ---- host side: descriptor upload ----

struct DeviceState {
  bool probed = false;
  cudaMemPool_t pool = nullptr;  // nullptr: no memory pools on this device
  // Fallback scratch (devices without memory pools).
  void* scratch = nullptr;
  std::size_t capacity = 0;
  cudaEvent_t last_use = nullptr;
  bool recorded = false;
};

inline std::mutex& state_mutex() {
  static std::mutex m;
  return m;
}

// Per device; the caller holds state_mutex(). Never destroyed: pools and buffers live as long as
// the process (tearing them down at static destruction could race the driver's own shutdown).
inline DeviceState& device_state(int dev) {
  static auto* states = new std::map<int, DeviceState>();
  return (*states)[dev];
}

// Tests set this to exercise the scratch-buffer path on a device that has memory pools.
inline std::atomic<bool>& force_scratch_fallback() {
  static std::atomic<bool> force{false};
  return force;
}

// Host copies of descriptors uploaded under stream capture: a graph replays the memcpy from
// this memory each time it is launched, so it is never freed.
inline const BatchDesc* retain_for_graph(const std::vector<BatchDesc>& descs) {
  static std::mutex m;
  static auto* kept = new std::vector<std::unique_ptr<BatchDesc[]>>();
  auto copy = std::make_unique<BatchDesc[]>(descs.size());
  std::copy(descs.begin(), descs.end(), copy.get());
  std::lock_guard<std::mutex> lock(m);
  kept->push_back(std::move(copy));
  return kept->back().get();
}

inline cudaMemPool_t descriptor_pool(DeviceState& st, int dev, const char* who) {
  if (!st.probed) {
    int supported = 0;
    check(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, dev), who,
          "cudaDeviceGetAttribute(memoryPoolsSupported)");
    if (supported) {
      cudaMemPoolProps props{};
      props.allocType = cudaMemAllocationTypePinned;
      props.handleTypes = cudaMemHandleTypeNone;
      props.location.type = cudaMemLocationTypeDevice;
      props.location.id = dev;
      check(cudaMemPoolCreate(&st.pool, &props), who, "cudaMemPoolCreate (descriptor pool)");
      // Keep what the pool holds (a few KiB): no unmapping and remapping at every sync.
      std::uint64_t keep = std::numeric_limits<std::uint64_t>::max();
      check(cudaMemPoolSetAttribute(st.pool, cudaMemPoolAttrReleaseThreshold, &keep), who,
            "cudaMemPoolSetAttribute(releaseThreshold)");
    }
    st.probed = true;
  }
  return st.pool;
}

// Copies `descs` to the device, calls launch(device_descs) and releases the copy, all in stream
// order on `stream`. descs is not empty.
template <class Launch>
void with_device_descriptors(const std::vector<BatchDesc>& descs, cudaStream_t stream,
                             const char* who, Launch&& launch) {
  const std::size_t bytes = descs.size() * sizeof(BatchDesc);
  const int dev = current_device(who);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream, &capture), who, "cudaStreamIsCapturing");
  if (capture == cudaStreamCaptureStatusInvalidated) {
    throw Error(std::string(who) + ": the stream's capture has been invalidated");
  }

  // Memory from a stream-ordered allocation, freed after the kernel on the same stream.
  // From pageable memory (measured on H100: for small uploads the driver's path from pageable
  // memory delays the kernel that follows less than a copy-engine DMA from pinned memory does).
  const auto run_stream_ordered = [&](void* d, const BatchDesc* host) {
    struct Release {  // frees on error paths too (best effort: the first error is reported)
      void* p;
      cudaStream_t s;
      ~Release() {
        if (p != nullptr) (void)cudaFreeAsync(p, s);
      }
    } release{d, stream};
    check(cudaMemcpyAsync(d, host, bytes, cudaMemcpyHostToDevice, stream), who,
          "cudaMemcpyAsync (descriptor upload)");
    launch(static_cast<const BatchDesc*>(d));
    release.p = nullptr;
    check(cudaFreeAsync(d, stream), who, "cudaFreeAsync (descriptors)");
  };

  if (capture == cudaStreamCaptureStatusActive) {
    // Graph-owned memory (an alloc and a free node); the host copy outlives every replay.
    const BatchDesc* host = retain_for_graph(descs);
    void* d = nullptr;
    check(cudaMallocAsync(&d, bytes, stream), who, "cudaMallocAsync (descriptors, captured)");
    run_stream_ordered(d, host);
    return;
  }

  std::unique_lock<std::mutex> lock(state_mutex());
  DeviceState& st = device_state(dev);
  cudaMemPool_t pool = descriptor_pool(st, dev, who);
  if (pool != nullptr && !force_scratch_fallback().load()) {
    lock.unlock();
    void* d = nullptr;
    check(cudaMallocFromPoolAsync(&d, bytes, pool, stream), who,
          "cudaMallocFromPoolAsync (descriptors)");
    run_stream_ordered(d, descs.data());
    return;
  }

  // Fallback: one growable buffer per device. The lock is held until the kernel is queued and
  // the event recorded; the next upload (any stream) waits for that event on the device.
  if (st.last_use == nullptr) {
    check(cudaEventCreateWithFlags(&st.last_use, cudaEventDisableTiming), who,
          "cudaEventCreate (descriptor scratch)");
  }
  if (st.capacity < bytes) {
    if (st.recorded) {
      check(cudaEventSynchronize(st.last_use), who, "cudaEventSynchronize (descriptor scratch)");
    }
    if (st.scratch != nullptr) {
      check(cudaFree(st.scratch), who, "cudaFree (descriptor scratch)");
      st.scratch = nullptr;
      st.capacity = 0;
    }
    const std::size_t want = std::max<std::size_t>({bytes, 2 * st.capacity, 4096});
    check(cudaMalloc(&st.scratch, want), who, "cudaMalloc (descriptor scratch)");
    st.capacity = want;
  }
  if (st.recorded) {
    check(cudaStreamWaitEvent(stream, st.last_use, 0), who,
          "cudaStreamWaitEvent (descriptor scratch)");
  }
  struct Record {  // records even when the launch fails, after the copy may have been queued
    DeviceState& st;
    cudaStream_t s;
    bool armed = false;
    ~Record() {
      if (armed && cudaEventRecord(st.last_use, s) == cudaSuccess) st.recorded = true;
    }
  } record{st, stream};
  record.armed = true;
  check(cudaMemcpyAsync(st.scratch, descs.data(), bytes, cudaMemcpyHostToDevice, stream), who,
        "cudaMemcpyAsync (descriptor upload)");
  launch(static_cast<const BatchDesc*>(st.scratch));
  record.armed = false;
  check(cudaEventRecord(st.last_use, stream), who, "cudaEventRecord (descriptor scratch)");
  st.recorded = true;
}

}  // namespace kolo::cuda::kernel_detail
