// micro_reduce — kolo's host reduce kernels (kolo::reduce_function: dst = a op b) per dtype and
// op, next to std::memcpy, at sizes that live in L1, L2, L3 and DRAM.
//
// Counters (GB = 1e9, shown as G/s):
//   traffic  bytes the loop moves through memory: reduce reads two operands and writes one
//            (3 x size), memcpy reads one and writes one (2 x size): comparable memory work;
//   output   result bytes produced per second (size / time): the rate a ring step reduces at.
// A kernel close to memcpy's traffic rate is memory-bound, which is the goal; one far below it
// is compute-bound (16-bit floats without F16C, see micro_reduce_native).
// Each benchmark then checks its result exactly (micro_check.hpp: exit status 1 if wrong).
#include <benchmark/benchmark.h>

#include <cstring>
#include <string>
#include <vector>

#include <kolo/core/dtype.hpp>
#include <kolo/core/reduce.hpp>

#include "micro_check.hpp"

namespace {

constexpr long kSizes[] = {4096, 65536, 1L << 20, 64L << 20};

void set_rates(benchmark::State& state, std::size_t bytes, double traffic_per_byte) {
  const double done = static_cast<double>(state.iterations()) * static_cast<double>(bytes);
  state.counters["traffic"] = benchmark::Counter(
      done * traffic_per_byte, benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.counters["output"] =
      benchmark::Counter(done, benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}

void BM_Memcpy(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  std::vector<unsigned char> src(bytes, 1), dst(bytes, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  set_rates(state, bytes, 2.0);
}

void BM_Reduce(benchmark::State& state, kolo::DataType t, kolo::ReduceOp op) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  const std::size_t es = kolo::dtype_size(t);
  const std::size_t n = bytes / es;
  std::vector<unsigned char> a(n * es), b(n * es), d(n * es);
  // Small integers 1..3: every op's result (at most 9) is exact in every dtype, finite and
  // normal (no denormal slow paths); d = a op b each time, nothing accumulates.
  auto a_of = [](std::size_t i) { return static_cast<int>(i % 3) + 1; };
  auto b_of = [](std::size_t i) { return static_cast<int>((i + 1) % 3) + 1; };
  kolo::visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    for (std::size_t i = 0; i < n; ++i) {
      const T x = static_cast<T>(static_cast<float>(a_of(i)));
      const T y = static_cast<T>(static_cast<float>(b_of(i)));
      std::memcpy(a.data() + i * es, &x, es);
      std::memcpy(b.data() + i * es, &y, es);
    }
  });
  const kolo::ReduceFn fn = kolo::reduce_function(t, op);
  for (auto _ : state) {
    fn(d.data(), a.data(), b.data(), n);
    benchmark::DoNotOptimize(d.data());
    benchmark::ClobberMemory();
  }
  set_rates(state, n * es, 3.0);
  auto expect = [&](std::size_t i) {
    const int x = a_of(i), y = b_of(i);
    switch (op) {
      case kolo::ReduceOp::sum:
        return x + y;
      case kolo::ReduceOp::product:
        return x * y;
      case kolo::ReduceOp::min:
        return x < y ? x : y;
      default:
        return x > y ? x : y;  // max
    }
  };
  kolo::visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    micro_check::check_bits(
        state, "reduce", reinterpret_cast<const T*>(d.data()), n,
        [&](std::size_t i) { return static_cast<T>(static_cast<float>(expect(i))); });
  });
}

}  // namespace

int main(int argc, char** argv) {
  for (long s : kSizes) benchmark::RegisterBenchmark("memcpy", BM_Memcpy)->Arg(s);
  for (kolo::DataType t : kolo::all_dtypes) {
    for (kolo::ReduceOp op :
         {kolo::ReduceOp::sum, kolo::ReduceOp::product, kolo::ReduceOp::min, kolo::ReduceOp::max}) {
      const std::string name = "reduce/" + std::string(kolo::dtype_name(t)) + "/" +
                               std::string(kolo::reduce_op_name(op));
      for (long s : kSizes) benchmark::RegisterBenchmark(name.c_str(), BM_Reduce, t, op)->Arg(s);
    }
  }
  return micro_check::run(argc, argv);
}
