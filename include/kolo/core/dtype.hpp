// kolo/core/dtype.hpp — element types and reduction operations, as runtime tags.
//
// Runtime tags (not only template parameters) because they cross process boundaries: ranks
// compare them to detect mismatched calls, and the engine groups tensors by them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "kolo/core/error.hpp"
#include "kolo/core/float16.hpp"

namespace kolo {

enum class DataType : std::uint8_t {
  float16 = 0,
  bfloat16 = 1,
  float32 = 2,
  float64 = 3,
  int8 = 4,
  uint8 = 5,
  int32 = 6,
  int64 = 7,
};

inline constexpr DataType all_dtypes[] = {DataType::float16, DataType::bfloat16, DataType::float32,
                                          DataType::float64, DataType::int8,     DataType::uint8,
                                          DataType::int32,   DataType::int64};

enum class ReduceOp : std::uint8_t { sum = 0, average = 1, min = 2, max = 3, product = 4 };

inline constexpr ReduceOp all_reduce_ops[] = {ReduceOp::sum, ReduceOp::average, ReduceOp::min,
                                              ReduceOp::max, ReduceOp::product};

constexpr std::size_t dtype_size(DataType t) noexcept {
  switch (t) {
    case DataType::float16:
    case DataType::bfloat16:
      return 2;
    case DataType::float32:
    case DataType::int32:
      return 4;
    case DataType::float64:
    case DataType::int64:
      return 8;
    case DataType::int8:
    case DataType::uint8:
      return 1;
  }
  return 0;
}

constexpr bool dtype_is_floating(DataType t) noexcept {
  return t == DataType::float16 || t == DataType::bfloat16 || t == DataType::float32 ||
         t == DataType::float64;
}

constexpr std::string_view dtype_name(DataType t) noexcept {
  switch (t) {
    case DataType::float16:
      return "float16";
    case DataType::bfloat16:
      return "bfloat16";
    case DataType::float32:
      return "float32";
    case DataType::float64:
      return "float64";
    case DataType::int8:
      return "int8";
    case DataType::uint8:
      return "uint8";
    case DataType::int32:
      return "int32";
    case DataType::int64:
      return "int64";
  }
  return "invalid";
}

constexpr std::string_view reduce_op_name(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::average:
      return "average";
    case ReduceOp::min:
      return "min";
    case ReduceOp::max:
      return "max";
    case ReduceOp::product:
      return "product";
  }
  return "invalid";
}

// Accepts the names above plus the short forms people type (fp16, bf16, f32, float, double,
// half, avg, mean, prod): used by benchmarks and environment variables.
inline DataType parse_dtype(std::string_view s) {
  if (s == "float16" || s == "fp16" || s == "half" || s == "f16") return DataType::float16;
  if (s == "bfloat16" || s == "bf16") return DataType::bfloat16;
  if (s == "float32" || s == "fp32" || s == "float" || s == "f32") return DataType::float32;
  if (s == "float64" || s == "fp64" || s == "double" || s == "f64") return DataType::float64;
  if (s == "int8" || s == "i8") return DataType::int8;
  if (s == "uint8" || s == "u8") return DataType::uint8;
  if (s == "int32" || s == "i32" || s == "int") return DataType::int32;
  if (s == "int64" || s == "i64") return DataType::int64;
  throw ConfigError("unknown data type '" + std::string(s) +
                    "' (expected float16, bfloat16, float32, float64, int8, uint8, int32, int64)");
}

inline ReduceOp parse_reduce_op(std::string_view s) {
  if (s == "sum") return ReduceOp::sum;
  if (s == "average" || s == "avg" || s == "mean") return ReduceOp::average;
  if (s == "min") return ReduceOp::min;
  if (s == "max") return ReduceOp::max;
  if (s == "product" || s == "prod") return ReduceOp::product;
  throw ConfigError("unknown reduce op '" + std::string(s) +
                    "' (expected sum, average, min, max, product)");
}

// The DataType tag of a C++ element type, for typed convenience overloads.
template <class T>
constexpr DataType dtype_of() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float16>)
    return DataType::float16;
  else if constexpr (std::is_same_v<U, bfloat16>)
    return DataType::bfloat16;
  else if constexpr (std::is_same_v<U, float>)
    return DataType::float32;
  else if constexpr (std::is_same_v<U, double>)
    return DataType::float64;
  else if constexpr (std::is_same_v<U, std::int8_t>)
    return DataType::int8;
  else if constexpr (std::is_same_v<U, std::uint8_t>)
    return DataType::uint8;
  else if constexpr (std::is_same_v<U, std::int32_t>)
    return DataType::int32;
  else if constexpr (std::is_same_v<U, std::int64_t>)
    return DataType::int64;
  else
    static_assert(sizeof(U) == 0, "kolo: unsupported element type");
}

template <class T>
inline constexpr bool is_kolo_element_v =
    std::is_same_v<std::remove_cv_t<T>, float16> || std::is_same_v<std::remove_cv_t<T>, bfloat16> ||
    std::is_same_v<std::remove_cv_t<T>, float> || std::is_same_v<std::remove_cv_t<T>, double> ||
    std::is_same_v<std::remove_cv_t<T>, std::int8_t> ||
    std::is_same_v<std::remove_cv_t<T>, std::uint8_t> ||
    std::is_same_v<std::remove_cv_t<T>, std::int32_t> ||
    std::is_same_v<std::remove_cv_t<T>, std::int64_t>;

// Calls f(T{}) with T the C++ type of `t`: the one place a runtime tag becomes a template.
template <class F>
decltype(auto) visit_dtype(DataType t, F&& f) {
  switch (t) {
    case DataType::float16:
      return f(float16{});
    case DataType::bfloat16:
      return f(bfloat16{});
    case DataType::float32:
      return f(float{});
    case DataType::float64:
      return f(double{});
    case DataType::int8:
      return f(std::int8_t{});
    case DataType::uint8:
      return f(std::uint8_t{});
    case DataType::int32:
      return f(std::int32_t{});
    case DataType::int64:
      return f(std::int64_t{});
  }
  throw ConfigError("invalid DataType value " + std::to_string(static_cast<int>(t)));
}

}  // namespace kolo
