// micro_float16 — conversion throughput of kolo's 16-bit float types: the scalar storage types
// (kolo/core/float16.hpp: float -> float16/bfloat16, round to nearest even, and back, element by
// element as the reduce kernels convert) and the engine's Compressors
// (kolo/compression/compressor.hpp: whole buffers, F16C chosen at run time). Where the compiler
// targets F16C (micro_float16_native), the raw hardware conversion runs next to them as the
// reference.
//
// Counters (GB = 1e9, shown as G/s): elements per second, and input + output bytes per second.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include <kolo/compression/compressor.hpp>
#include <kolo/core/float16.hpp>

#if defined(__F16C__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#define KOLO_BENCH_F16C 1
#endif

namespace {

constexpr long kElems[] = {4096, 65536, 1L << 20, 16L << 20};

std::vector<float> inputs(std::size_t n) {
  // Ordinary gradient-like values: mixed signs and magnitudes, all finite, some that round.
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    v[i] = std::ldexp(static_cast<float>(i % 2047) - 1023.0f, -static_cast<int>(i % 13));
  }
  return v;
}

void set_rates(benchmark::State& state, std::size_t n, std::size_t bytes_per_elem) {
  const double done = static_cast<double>(state.iterations()) * static_cast<double>(n);
  state.counters["elems"] =
      benchmark::Counter(done, benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.counters["bytes"] =
      benchmark::Counter(done * static_cast<double>(bytes_per_elem), benchmark::Counter::kIsRate,
                         benchmark::Counter::kIs1000);
}

void elem_args(benchmark::internal::Benchmark* b) {
  for (long n : kElems) b->Arg(n);
}

template <class H>
void BM_FromFloat(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<float> src = inputs(n);
  std::vector<H> dst(n);
  for (auto _ : state) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = H(src[i]);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  set_rates(state, n, sizeof(float) + sizeof(H));
}

template <class H>
void BM_ToFloat(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<float> f = inputs(n);
  std::vector<H> src(n);
  for (std::size_t i = 0; i < n; ++i) src[i] = H(f[i]);
  std::vector<float> dst(n);
  for (auto _ : state) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  set_rates(state, n, sizeof(float) + sizeof(H));
}

template <class C>
void BM_Compress(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<float> src = inputs(n);
  std::vector<std::uint16_t> wire(n);
  for (auto _ : state) {
    C::compress(src.data(), wire.data(), n, 1.0f);
    benchmark::DoNotOptimize(wire.data());
    benchmark::ClobberMemory();
  }
  set_rates(state, n, 6);
}

template <class C>
void BM_Decompress(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<float> f = inputs(n);
  std::vector<std::uint16_t> wire(n);
  C::compress(f.data(), wire.data(), n, 1.0f);
  std::vector<float> dst(n);
  for (auto _ : state) {
    C::decompress(wire.data(), dst.data(), n, 1.0f);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  set_rates(state, n, 6);
}

BENCHMARK_TEMPLATE(BM_Compress, kolo::Fp16Compressor)->Name("compress_fp16")->Apply(elem_args);
BENCHMARK_TEMPLATE(BM_Decompress, kolo::Fp16Compressor)->Name("decompress_fp16")->Apply(elem_args);
BENCHMARK_TEMPLATE(BM_Compress, kolo::Bf16Compressor)->Name("compress_bf16")->Apply(elem_args);
BENCHMARK_TEMPLATE(BM_Decompress, kolo::Bf16Compressor)->Name("decompress_bf16")->Apply(elem_args);

BENCHMARK_TEMPLATE(BM_FromFloat, kolo::float16)->Name("float_to_float16")->Apply(elem_args);
BENCHMARK_TEMPLATE(BM_ToFloat, kolo::float16)->Name("float16_to_float")->Apply(elem_args);
BENCHMARK_TEMPLATE(BM_FromFloat, kolo::bfloat16)->Name("float_to_bfloat16")->Apply(elem_args);
BENCHMARK_TEMPLATE(BM_ToFloat, kolo::bfloat16)->Name("bfloat16_to_float")->Apply(elem_args);

#ifdef KOLO_BENCH_F16C
void BM_F16CFromFloat(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<float> src = inputs(n);
  std::vector<std::uint16_t> dst(n);
  for (auto _ : state) {
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src.data() + i), _MM_FROUND_TO_NEAREST_INT);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst.data() + i), h);
    }
    for (; i < n; ++i) dst[i] = kolo::float16(src[i]).bits;
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  set_rates(state, n, 6);
}
void BM_F16CToFloat(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  const std::vector<float> f = inputs(n);
  std::vector<std::uint16_t> src(n);
  for (std::size_t i = 0; i < n; ++i) src[i] = kolo::float16(f[i]).bits;
  std::vector<float> dst(n);
  for (auto _ : state) {
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src.data() + i));
      _mm256_storeu_ps(dst.data() + i, _mm256_cvtph_ps(h));
    }
    for (; i < n; ++i) dst[i] = static_cast<float>(kolo::float16::from_bits(src[i]));
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  set_rates(state, n, 6);
}
BENCHMARK(BM_F16CFromFloat)->Name("f16c_float_to_float16")->Apply(elem_args);
BENCHMARK(BM_F16CToFloat)->Name("f16c_float16_to_float")->Apply(elem_args);
#endif

}  // namespace

BENCHMARK_MAIN();
