// micro_float16 — conversion throughput of kolo's 16-bit float types: the scalar storage types
// (kolo/core/float16.hpp: float -> float16/bfloat16, round to nearest even, and back, element by
// element as the reduce kernels convert) and the engine's Compressors
// (kolo/compression/compressor.hpp: whole buffers, F16C chosen at run time). Where the compiler
// targets F16C (micro_float16_native), the raw hardware conversion runs next to them as the
// reference.
//
// Counters (GB = 1e9, shown as G/s): elements per second, and input + output bytes per second.
// Each benchmark then checks its output bit for bit against a reference written here, apart from
// kolo's conversions (micro_check.hpp: exit status 1 if wrong).
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "micro_check.hpp"

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

// The reference conversions, for the values inputs() makes (finite; every one exact in float16:
// at most 10 significant bits, magnitudes 2^-12 .. 1023, all normal there).
std::uint32_t float_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
float bits_float(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}
// float16 bits of an exactly representable normal value (or zero): the fields re-biased.
std::uint16_t ref_half_bits(float x) {
  const std::uint32_t u = float_bits(x);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  if ((u & 0x7FFFFFFFu) == 0) return sign;
  const auto exp = static_cast<std::uint32_t>(static_cast<int>((u >> 23) & 0xFF) - 127 + 15);
  return static_cast<std::uint16_t>(sign | (exp << 10) | ((u >> 13) & 0x3FFu));
}
// bfloat16 bits: the top half of the float, rounded to nearest even.
std::uint16_t ref_bf16_bits(float x) {
  const std::uint32_t u = float_bits(x);
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
template <class H>
std::uint16_t ref_bits(float x) {
  if constexpr (std::is_same_v<H, kolo::float16>) {
    return ref_half_bits(x);
  } else {
    return ref_bf16_bits(x);
  }
}
// The float a 16-bit conversion of x gives back.
template <class H>
float ref_round(float x) {
  if constexpr (std::is_same_v<H, kolo::float16>) {
    return x;  // exact
  } else {
    return bits_float(static_cast<std::uint32_t>(ref_bf16_bits(x)) << 16);
  }
}
template <class C>
using wire_of =
    std::conditional_t<std::is_same_v<C, kolo::Fp16Compressor>, kolo::float16, kolo::bfloat16>;

void check_wire(benchmark::State& state, const char* what, const std::uint16_t* got,
                const std::vector<float>& src, std::uint16_t (*ref)(float)) {
  micro_check::check_bits(state, what, got, src.size(), [&](std::size_t i) { return ref(src[i]); });
}
void check_floats(benchmark::State& state, const char* what, const float* got,
                  const std::vector<float>& src, float (*ref)(float)) {
  micro_check::check_bits(state, what, got, src.size(), [&](std::size_t i) { return ref(src[i]); });
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
  std::vector<std::uint16_t> bits(n);
  for (std::size_t i = 0; i < n; ++i) bits[i] = dst[i].bits;
  check_wire(state, "from float", bits.data(), src, ref_bits<H>);
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
  check_floats(state, "to float", dst.data(), f, ref_round<H>);
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
  check_wire(state, "compress", wire.data(), src, ref_bits<wire_of<C>>);
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
  check_floats(state, "decompress", dst.data(), f, ref_round<wire_of<C>>);
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
  check_wire(state, "f16c from float", dst.data(), src, ref_half_bits);
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
  check_floats(state, "f16c to float", dst.data(), f, ref_round<kolo::float16>);
}
BENCHMARK(BM_F16CFromFloat)->Name("f16c_float_to_float16")->Apply(elem_args);
BENCHMARK(BM_F16CToFloat)->Name("f16c_float16_to_float")->Apply(elem_args);
#endif

}  // namespace

int main(int argc, char** argv) {
  return micro_check::run(argc, argv);
}
