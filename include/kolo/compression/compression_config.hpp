// kolo/compression/compression_config.hpp — the compression layer's variable: KOLO_COMPRESSION,
// the engine's wire format of float32 sum/average, with its CompressionKind. Read by
// CompressionPolicy::from_env. How a variable is declared and read: core/config_var.hpp.
#pragma once

#include <cstdint>

#include "kolo/core/config_var.hpp"

namespace kolo {

// The wire formats KOLO_COMPRESSION names (CompressionPolicy::parse).
enum class CompressionKind : std::uint8_t { none, fp16, bf16 };

}  // namespace kolo

namespace kolo::config {

inline constexpr Choice kCompressionKinds[] = {choice(CompressionKind::none, "none"),
                                               choice(CompressionKind::fp16, "fp16", "float16"),
                                               choice(CompressionKind::bf16, "bf16", "bfloat16")};
inline constexpr Choices kCompressionChoices{kCompressionKinds};

namespace vars {

inline constexpr Var compression{"KOLO_COMPRESSION",
                                 Kind::choice,
                                 Section::engine,
                                 Reader::compression,
                                 0,
                                 0,
                                 "none",
                                 "wire format of float32 sum/average in the engine",
                                 {},
                                 &kCompressionChoices,
                                 true};

}  // namespace vars

// The compression layer's variables.
inline constexpr const Var* kCompressionVars[] = {&vars::compression};

}  // namespace kolo::config
