// kolo/cuda/kernels/layout.cuh — what the host and the device agree on about a batch: block
// size, the per-type vector geometry of the work space, the batch descriptor, the vector type
// and the block of descriptors that travels in a kernel's parameters.
//
// Included by kolo/cuda/kernels.cuh (not a public header: include that one); self-contained.
#pragma once

#include <cstddef>
#include <type_traits>

namespace kolo::cuda::kernel_detail {

constexpr unsigned kBlockThreads = 256;
constexpr unsigned kWarpsPerBlock = kBlockThreads / 32;
constexpr std::size_t kUnroll = 4;  // vector loads in flight per lane (fewer for narrow types)
constexpr int kMaxWaves = 32;       // batch kernel: at most this many waves of resident blocks

struct CopyOp;

template <class In, class Out>
struct Geometry {
  static constexpr std::size_t max_size = sizeof(In) < sizeof(Out) ? sizeof(Out) : sizeof(In);
  // Elements per vector step: 16 bytes of the wider type (the narrower side moves 8 or 16), so
  // that every vector load and store of a warp covers one contiguous span.
  static constexpr std::size_t lanes = 16 / max_size;
  // The weight a tensor adds to the work space on top of its elements (its descriptor, head and
  // tail cost about as much as streaming two vectors per lane), and the least work of a warp.
  static constexpr std::size_t overhead = 32 * lanes * 2;
  static constexpr std::size_t min_task = 32 * lanes * 4;
  // Vectors in flight per lane: narrow elements are unpacked into one register each, so fewer of
  // them keep the kernel near 64 registers (copies move whole vectors: 4).
  template <class Cvt>
  static constexpr std::size_t unroll = std::is_same_v<Cvt, CopyOp> || lanes <= 4
                                            ? kUnroll
                                            : (lanes == 8 ? 2 : 1);
};

// One tensor of a batch, as the kernel sees it (pointers already offset into the buffer).
struct BatchDesc {
  const void* src;  // nullptr: the source is zeros
  void* dst;
  std::size_t count;  // elements (> 0)
  std::size_t begin;  // position in the work space, strictly increasing
};

template <class T, std::size_t N>
struct alignas(sizeof(T) * N) VecN {
  T e[N];
};

// Batches of at most this many tensors travel in the kernel's parameters: no upload. 120
// descriptors (3840 bytes) keep all parameters within the 4 KiB every driver accepts; measured
// on H100, a launch with them costs the host ~1 us more than one with 32, while an upload delays
// the kernel by ~3-10 us.
constexpr std::size_t kInlineDescs = 120;
struct InlineDescs {
  BatchDesc d[kInlineDescs];
};

}  // namespace kolo::cuda::kernel_detail
