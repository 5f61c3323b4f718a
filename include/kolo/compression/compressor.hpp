// kolo/compression/compressor.hpp — gradient compression policies: fp32 in memory, fp16 or
// bf16 on the wire, arithmetic in fp32.
//
// A Compressor turns float32 elements into its wire type while the engine packs the fusion
// buffer (scaling on the way), the collective runs on the wire type (each reduction step widens
// to fp32, adds, rounds once), and decompress restores float32 while unpacking. Half the bytes
// cross the network and shared memory; the price is the wire format's precision (float16: 11
// significant bits, range ±65504; bfloat16: 8 bits, float32's range).
//
// Users plug in their own by meeting the Compressor concept. Conversions use F16C (8 lanes per
// instruction) when the CPU has it — detected at run time, so the binary stays portable — and a
// correct scalar round-to-nearest-even path otherwise.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kolo/compression/compression_config.hpp"
#include "kolo/core/config_var.hpp"
#include "kolo/core/dtype.hpp"
#include "kolo/core/env.hpp"
#include "kolo/core/error.hpp"
#include "kolo/core/float16.hpp"
#include "kolo/core/reduce.hpp"

// The F16C/AVX2 conversions and the CPU checks are declared in core/reduce.hpp (detail::).
#ifdef KOLO_REDUCE_F16C
#define KOLO_HAVE_F16C_DISPATCH 1
#endif

namespace kolo {

// compress: dst[i] = wire(src[i] * scale); decompress: dst[i] = float(src[i]) * scale.
template <class C>
concept Compressor = requires(const float* src, void* wire, const void* cwire, float* dst,
                              std::size_t n, float scale) {
  { C::wire_dtype } -> std::convertible_to<DataType>;
  { C::name } -> std::convertible_to<std::string_view>;
  C::compress(src, wire, n, scale);
  C::decompress(cwire, dst, n, scale);
};

struct NoCompression {
  static constexpr DataType wire_dtype = DataType::float32;
  static constexpr std::string_view name = "none";
  static void compress(const float* s, void* d, std::size_t n, float scale) {
    auto* o = static_cast<float*>(d);
    for (std::size_t i = 0; i < n; ++i) o[i] = s[i] * scale;
  }
  static void decompress(const void* s, float* d, std::size_t n, float scale) {
    const auto* in = static_cast<const float*>(s);
    for (std::size_t i = 0; i < n; ++i) d[i] = in[i] * scale;
  }
};

struct Fp16Compressor {
  static constexpr DataType wire_dtype = DataType::float16;
  static constexpr std::string_view name = "fp16";
  static void compress(const float* s, void* d, std::size_t n, float scale) {
    auto* o = static_cast<std::uint16_t*>(d);
#ifdef KOLO_HAVE_F16C_DISPATCH
    if (detail::cpu_has_f16c()) return detail::f32_to_f16_f16c(s, o, n, scale);
#endif
    for (std::size_t i = 0; i < n; ++i) o[i] = detail::float_to_half_bits(s[i] * scale);
  }
  static void decompress(const void* s, float* d, std::size_t n, float scale) {
    const auto* in = static_cast<const std::uint16_t*>(s);
#ifdef KOLO_HAVE_F16C_DISPATCH
    if (detail::cpu_has_f16c()) return detail::f16_to_f32_f16c(in, d, n, scale);
#endif
    for (std::size_t i = 0; i < n; ++i) d[i] = detail::half_bits_to_float(in[i]) * scale;
  }
  // The compressed ring's step on a received segment `w` of n wire values, in one pass: v =
  // float(w[i]), plus local[i] when local is not null, divided by divisor when it is > 1, rounded
  // to float16 and back when round is set; dst[i] = v. The same bits as decompress, an fp32 add,
  // the division and a compress/decompress round trip done one after the other. dst may be
  // local (in place). When round is set and `wire` is not null, the rounded values are also
  // stored there in the wire type (n values): what compress(dst) would give, without its pass.
  static void fold(const void* w, const float* local, float* dst, std::size_t n, int divisor,
                   bool round, void* wire) {
    const auto* in = static_cast<const std::uint16_t*>(w);
    auto* out = static_cast<std::uint16_t*>(wire);
#ifdef KOLO_HAVE_F16C_DISPATCH
    if (detail::cpu_has_f16c()) {
      return detail::fold_f16_f16c(in, local, dst, n, divisor, round, out);
    }
#endif
    detail::fold_scalar<detail::half_bits_to_float, detail::float_to_half_bits>(
        in, local, dst, n, divisor, round, out);
  }
};

struct Bf16Compressor {
  static constexpr DataType wire_dtype = DataType::bfloat16;
  static constexpr std::string_view name = "bf16";
  // bfloat16 is float32's top half; GCC does not vectorise the rounding loop at -O2, so AVX2
  // (when the CPU has it) does it 8 lanes at a time, bit for bit the scalar rounding.
  static void compress(const float* s, void* d, std::size_t n, float scale) {
    auto* o = static_cast<std::uint16_t*>(d);
#ifdef KOLO_HAVE_F16C_DISPATCH
    if (detail::cpu_has_avx2()) return detail::f32_to_bf16_avx2(s, o, n, scale);
#endif
    for (std::size_t i = 0; i < n; ++i) o[i] = detail::float_to_bfloat16_bits(s[i] * scale);
  }
  static void decompress(const void* s, float* d, std::size_t n, float scale) {
    const auto* in = static_cast<const std::uint16_t*>(s);
#ifdef KOLO_HAVE_F16C_DISPATCH
    if (detail::cpu_has_avx2()) return detail::bf16_to_f32_avx2(in, d, n, scale);
#endif
    for (std::size_t i = 0; i < n; ++i) d[i] = detail::bfloat16_bits_to_float(in[i]) * scale;
  }
  // As Fp16Compressor::fold, rounding to bfloat16.
  static void fold(const void* w, const float* local, float* dst, std::size_t n, int divisor,
                   bool round, void* wire) {
    const auto* in = static_cast<const std::uint16_t*>(w);
    auto* out = static_cast<std::uint16_t*>(wire);
#ifdef KOLO_HAVE_F16C_DISPATCH
    if (detail::cpu_has_avx2()) {
      return detail::fold_bf16_avx2(in, local, dst, n, divisor, round, out);
    }
#endif
    detail::fold_scalar<detail::bfloat16_bits_to_float, detail::float_to_bfloat16_bits>(
        in, local, dst, n, divisor, round, out);
  }
};

static_assert(Compressor<NoCompression> && Compressor<Fp16Compressor> &&
              Compressor<Bf16Compressor>);

// A compressor chosen at run time (KOLO_COMPRESSION): the engine's type-erased handle.
struct CompressionPolicy {
  std::string_view name = "none";
  DataType wire = DataType::float32;
  void (*compress)(const float*, void*, std::size_t, float) = nullptr;
  void (*decompress)(const void*, float*, std::size_t, float) = nullptr;
  // Optional: the compressor's one-pass fold of a received segment (Fp16Compressor::fold), which
  // the compressed ring uses instead of decompress, an add and a round trip done in turn (and
  // instead of compressing a finished segment again before sending it on). A compressor without
  // a static fold leaves it null and gets those passes.
  void (*fold)(const void*, const float*, float*, std::size_t, int, bool, void*) = nullptr;

  bool enabled() const { return compress != nullptr; }

  template <Compressor C>
  static CompressionPolicy of() {
    if constexpr (std::is_same_v<C, NoCompression>) {
      return {};
    } else {
      CompressionPolicy p;
      p.name = C::name;
      p.wire = C::wire_dtype;
      p.compress = &C::compress;
      p.decompress = &C::decompress;
      if constexpr (requires { &C::fold; }) p.fold = &C::fold;
      return p;
    }
  }

  // "none" (or empty), "fp16" (or "float16"), "bf16" (or "bfloat16"): KOLO_COMPRESSION's
  // declared values (compression_config.hpp); anything else is a ConfigError naming them.
  static CompressionPolicy parse(std::string_view s) {
    if (s.empty()) return {};
    switch (config::parse_choice<CompressionKind>(config::vars::compression, s)) {
      case CompressionKind::fp16:
        return of<Fp16Compressor>();
      case CompressionKind::bf16:
        return of<Bf16Compressor>();
      case CompressionKind::none:
        break;
    }
    return {};
  }

  static CompressionPolicy from_env(const EnvLookup& env = process_env()) {
    auto v = config::get_text(env, config::vars::compression);
    return v ? parse(*v) : CompressionPolicy{};
  }
};

}  // namespace kolo
