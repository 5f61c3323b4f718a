// kolo/engine/fusion_buffer.hpp — packs many tensors into one buffer so that one collective
// serves them all (Horovod's tensor fusion), and unpacks the result.
//
// Scaling is folded into the copies: pack multiplies by the prescale factor while copying in,
// unpack by the postscale factor (and 1/size for an average) while copying out, so a fused
// allreduce touches each byte exactly twice outside the collective: one read+write in, one
// read+write out. The buffer is allocated once and reused across cycles (grown when needed).
// On one host it lives in memory the local peers map (attach), so the allreduce of a fused
// batch reads the peers' packed tensors in place instead of sending them through channels.
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "kolo/core/dtype.hpp"
#include "kolo/core/float16.hpp"
#include "kolo/core/reduce.hpp"
#include "kolo/core/tensor.hpp"
#include "kolo/transport/shared_region.hpp"

namespace kolo {

namespace detail {

// dst[i] = src[i] / dv for float and double, 16 bytes at a time: at -O2 GCC leaves a division
// loop scalar (3-4x slower than the copy it replaces); in vector lanes it runs at memory speed.
// IEEE division in lanes gives the scalar's bits. dst may equal src.
template <class T>
void divide_copy(T* dst, const T* src, std::size_t count, T dv) noexcept {
  using V = vec16<T>;
  constexpr std::size_t lanes = sizeof(V) / sizeof(T);
  const std::size_t whole = count - count % lanes;
  std::size_t i = 0;
  for (; i < whole; i += lanes) {
    V x;
    std::memcpy(&x, src + i, sizeof(V));
    x = x / dv;
    std::memcpy(dst + i, &x, sizeof(V));
  }
  for (; i < count; ++i) dst[i] = src[i] / dv;
}

// dst[i] = src[i] * factor / divisor (factor == 1 and divisor == 1: a plain copy; integers:
// only factor 1 is allowed upstream, and an average's division truncates toward zero). With
// factor 1 the division is a true division, one rounding per element: the same bits as the
// Communicator's average (finish_average), so a fused average equals an unfused one.
inline void scaled_copy(void* dst, const void* src, std::size_t count, DataType t, double factor,
                        int divisor = 1) {
  if (factor == 1.0 && divisor == 1) {
    // count == 0 may come with null pointers, which memmove must not see (UB).
    if (dst != src && count > 0) std::memmove(dst, src, count * dtype_size(t));
    return;
  }
  visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    const T* s = static_cast<const T*>(src);
    T* d = static_cast<T*>(dst);
    if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, float16> ||
                  std::is_same_v<T, bfloat16>) {
      if (factor == 1.0) {  // an average's division alone
        if constexpr (std::is_floating_point_v<T>) {
          divide_copy(d, s, count, static_cast<T>(divisor));
        } else {
          const float dv = static_cast<float>(divisor);
          for (std::size_t i = 0; i < count; ++i) d[i] = T(static_cast<float>(s[i]) / dv);
        }
        return;
      }
    }
    if constexpr (std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>) {
      const float f = static_cast<float>(factor / divisor);
      for (std::size_t i = 0; i < count; ++i) d[i] = T(static_cast<float>(s[i]) * f);
    } else if constexpr (std::is_floating_point_v<T>) {
      const T f = static_cast<T>(factor / divisor);
      for (std::size_t i = 0; i < count; ++i) d[i] = s[i] * f;
    } else {  // integers: averages truncate toward zero, like the blocking allreduce
      const long long dv = divisor;
      for (std::size_t i = 0; i < count; ++i) {
        d[i] = static_cast<T>(static_cast<long long>(s[i]) / dv);
      }
    }
  });
}

}  // namespace detail

class FusionBuffer {
 public:
  // Reserves room for `bytes` and makes it the current storage: the attached shared region when
  // it is large enough (the zero-copy allreduce then reads the peers' fusion buffers in place),
  // else heap memory kept across cycles (grown when needed). Every rank reserves the same bytes
  // for a batch, so all pick the same kind of storage.
  std::byte* reserve(std::size_t bytes) {
    if (shared_ && bytes <= shared_->bytes) {
      cur_ = shared_->base;
      return cur_;
    }
    if (buf_.size() < bytes) buf_.resize(bytes);
    cur_ = buf_.data();
    return cur_;
  }
  std::size_t capacity() const { return buf_.size(); }

  // Storage the local peers map (Communicator::allocate_region), used for batches that fit.
  void attach(std::shared_ptr<detail::SharedRegion> region) { shared_ = std::move(region); }
  bool shared() const { return shared_ && shared_->shared; }

  // Copies `src` (times `prescale`) into the buffer at byte `offset`.
  void pack(std::size_t offset, const TensorView& src, double prescale) {
    detail::scaled_copy(cur_ + offset, src.data, src.count, src.dtype, prescale);
  }

  // Copies the reduced elements at byte `offset` out to `dst`, times postscale / divisor.
  void unpack(std::size_t offset, const TensorView& dst, double postscale, int divisor) {
    detail::scaled_copy(dst.data, cur_ + offset, dst.count, dst.dtype, postscale, divisor);
  }

  std::byte* data() { return cur_; }

 private:
  std::vector<std::byte> buf_;
  std::shared_ptr<detail::SharedRegion> shared_;
  std::byte* cur_ = nullptr;
};

}  // namespace kolo
