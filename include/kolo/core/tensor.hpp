// kolo/core/tensor.hpp — a non-owning view of a contiguous tensor: pointer, count, dtype, device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kolo/core/dtype.hpp"

namespace kolo {

struct Device {
  enum class Kind : std::uint8_t { cpu = 0, cuda = 1 };
  Kind kind = Kind::cpu;
  int index = 0;
  static constexpr Device cpu() { return {}; }
  static constexpr Device cuda(int i) { return {Kind::cuda, i}; }
  friend constexpr bool operator==(Device, Device) = default;
};

struct TensorView {
  void* data = nullptr;
  std::size_t count = 0;  // elements, not bytes
  DataType dtype = DataType::float32;
  Device device = Device::cpu();

  TensorView() = default;
  TensorView(void* d, std::size_t n, DataType t, Device dev = Device::cpu())
      : data(d), count(n), dtype(t), device(dev) {}
  template <class T>
  requires is_kolo_element_v<T> TensorView(
      std::span<T> s)  // NOLINT(google-explicit-constructor): spans convert naturally
      : data(const_cast<std::remove_cv_t<T>*>(s.data())), count(s.size()), dtype(dtype_of<T>()) {}

  std::size_t bytes() const noexcept { return count * dtype_size(dtype); }
  std::byte* byte_data() const noexcept { return static_cast<std::byte*>(data); }
};

}  // namespace kolo
