// Shared helpers for the multi-process tests: one Communicator per process, built from the
// environment contract that kolo-run exports, with KOLO_TRANSPORT choosing shm, tcp or routed.
// Built with KOLO_TEST_MPI=1 (tests/mpi) the same tests run under mpirun on MPI_COMM_WORLD
// instead: through kolo's algorithms over MPI point-to-point (MpiTransport), or through MPI's own
// collectives when KOLO_TEST_MPI_NATIVE=1 is defined as well (MpiNativeTransport).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <kolo/kolo.hpp>

#include "../common/reference_reduce.hpp"

#if defined(KOLO_TEST_MPI)
#include <kolo/transport/mpi.hpp>
#endif

namespace kolo_test {

#if defined(KOLO_TEST_MPI)
#if defined(KOLO_TEST_MPI_NATIVE)
using TestTransport = kolo::MpiNativeTransport;
#else
using TestTransport = kolo::MpiTransport;
#endif
inline kolo::Communicator<TestTransport>& comm() {
  static std::unique_ptr<kolo::Communicator<TestTransport>> c;
  if (!c) {
    c = std::make_unique<kolo::Communicator<TestTransport>>(
        std::make_unique<TestTransport>(MPI_COMM_WORLD));
  }
  return *c;
}
#else
inline kolo::Communicator<>& comm() {
  static std::unique_ptr<kolo::Communicator<>> c;
  if (!c) c = std::make_unique<kolo::Communicator<>>(kolo::Topology::from_env());
  return *c;
}
#endif

// Called by mp_main.cpp before the first test case; each program's test file defines it once
// with KOLO_TEST_DEFINE_CONNECT (mp_main.cpp itself stays free of the communicator).
void connect_before_tests();
#define KOLO_TEST_DEFINE_CONNECT           \
  void kolo_test::connect_before_tests() { \
    static_cast<void>(kolo_test::comm());  \
  }

template <class T>
constexpr bool is_half_v = std::is_same_v<T, kolo::float16> || std::is_same_v<T, kolo::bfloat16>;

template <class T>
T from_double(double v) {
  if constexpr (is_half_v<T>) {
    return T(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

template <class T>
double to_double(T v) {
  if constexpr (is_half_v<T>) {
    return static_cast<double>(static_cast<float>(v));
  } else {
    return static_cast<double>(v);
  }
}

template <class T>
constexpr bool is_signed_elem() {
  return is_half_v<T> || std::is_floating_point_v<T> || std::is_signed_v<T>;
}

// Relative tolerance for results that are not exact (averages of floating types): one unit in
// the last place of the type, since the only inexact step is a single rounded division.
template <class T>
double ulp_tolerance() {
  if constexpr (std::is_same_v<T, kolo::float16>) return 1.0 / 1024;
  if constexpr (std::is_same_v<T, kolo::bfloat16>) return 1.0 / 128;
  if constexpr (std::is_same_v<T, float>) return 1.2e-7;
  if constexpr (std::is_same_v<T, double>) return 2.3e-16;
  return 0;
}

// The reference the collectives are checked against: rank r's element i for op, and the exact
// result of reducing n ranks' elements (integer-valued, so every dtype represents it exactly).
template <class T>
double input_value(kolo::ReduceOp op, int rank, std::size_t i) {
  const auto k = static_cast<long long>(i);
  if (op == kolo::ReduceOp::product) {
    if ((k + rank) % 3 == 0) return 2;
    if (is_signed_elem<T>() && (k + rank) % 5 == 0) return -1;
    return 1;
  }
  if (is_signed_elem<T>()) return static_cast<double>((k * 7 + rank * 3) % 9 - 4);
  return static_cast<double>((k * 7 + rank * 3) % 5);
}

template <class T>
double expected_value(kolo::ReduceOp op, int n, std::size_t i) {
  const long long acc =
      reduce_ranks(op, n, [&](int r) { return static_cast<long long>(input_value<T>(op, r, i)); });
  if (op == kolo::ReduceOp::average) {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<double>(acc / n);  // truncates toward zero
    } else {
      return static_cast<double>(acc) / n;
    }
  }
  return static_cast<double>(acc);
}

template <class T>
bool close(T got, double want, kolo::ReduceOp op) {
  const double g = to_double(got);
  if (op == kolo::ReduceOp::average && !std::is_integral_v<T>) {
    return std::fabs(g - want) <= ulp_tolerance<T>() * std::max(1.0, std::fabs(want));
  }
  return g == want;
}

}  // namespace kolo_test
