// kolo/engine/engine_options.hpp — what an Engine is configured with (EngineOptions, read from
// the KOLO_* variables), what it counts (EngineStats), and which transports take device tensors
// (DeviceFusionTransport). Included by engine.hpp; the engine's parts include it alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kolo/compression/compressor.hpp"
#include "kolo/core/config.hpp"
#include "kolo/core/env.hpp"
#include "kolo/engine/engine_config.hpp"
#include "kolo/engine/request.hpp"
#include "kolo/transport/transport.hpp"

namespace kolo {

struct EngineOptions {
  std::size_t fusion_threshold = 128ull << 20;  // KOLO_FUSION_THRESHOLD (Horovod's default)
  double cycle_time_ms = 1.0;                   // KOLO_CYCLE_TIME_MS
  double stall_warning_seconds = 60.0;          // KOLO_STALL_WARNING_SECONDS
  double stall_shutdown_seconds = 0.0;          // KOLO_STALL_SHUTDOWN_SECONDS (0: never)
  std::size_t cache_capacity = 4096;            // KOLO_CACHE_CAPACITY (0 disables the cache)
  std::string timeline;                         // KOLO_TIMELINE
  CompressionPolicy compression;                // KOLO_COMPRESSION: float32 sum/average only
  // What an average divides by while ranks have joined (KOLO_JOIN_AVERAGE=world|active): the
  // number of ranks (joined ranks count as zeros) or the number of ranks that contributed.
  JoinAverage join_average = JoinAverage::world_size;
  // KOLO_FUSION_PIECES (on, off): a fused batch that the ring carries (no scaling, no
  // compression, no rank joined) reads and writes its tensors in place through vectored messages
  // (Communicator::allreduce_coalesced) instead of a pack into the fusion buffer and an unpack.
  bool fusion_pieces = true;

  static EngineOptions from_env(const EnvLookup& env = process_env()) {
    EngineOptions o;
    if (auto v = config::get_int(env, config::vars::fusion_threshold)) {
      o.fusion_threshold = static_cast<std::size_t>(*v);
    }
    if (auto v = config::get_real(env, config::vars::cycle_time_ms)) o.cycle_time_ms = *v;
    if (auto v = config::get_real(env, config::vars::stall_warning_seconds)) {
      o.stall_warning_seconds = *v;
    }
    if (auto v = config::get_real(env, config::vars::stall_shutdown_seconds)) {
      o.stall_shutdown_seconds = *v;
    }
    if (auto v = config::get_int(env, config::vars::cache_capacity)) {
      o.cache_capacity = static_cast<std::size_t>(*v);
    }
    if (auto v = config::get_text(env, config::vars::timeline)) o.timeline = *v;
    o.compression = CompressionPolicy::from_env(env);
    // The choices as engine_config.hpp declares them (values, aliases, the error's words).
    if (auto v = config::get_choice<JoinAverage>(env, config::vars::join_average)) {
      o.join_average = *v;
    }
    if (auto v = config::get_choice<bool>(env, config::vars::fusion_pieces)) o.fusion_pieces = *v;
    return o;
  }
};

struct EngineStats {
  std::uint64_t cycles = 0;
  std::uint64_t uncached_cycles = 0;  // cycles that needed the request exchange
  std::uint64_t cached_responses = 0;
  std::uint64_t uncached_responses = 0;
  std::uint64_t fused_collectives = 0;
  std::uint64_t direct_collectives = 0;     // fused ones on the tensors' own memory (no copies)
  std::uint64_t piece_collectives = 0;      // fused ones in pieces (fusion_pieces; no copies)
  std::uint64_t zero_copy_collectives = 0;  // allreduces that read the local peers' memory in
                                            // place (the shared fusion buffer, or Buffers)
  std::uint64_t driven_cycles = 0;          // cycles run by a thread waiting in Handle::wait()
  double negotiation_seconds = 0;           // time spent agreeing, not moving tensors
};

// A transport that takes device tensors and packs fused batches of them on the GPU
// (CudaStagedTransport, NcclTransport): Engine<T> then takes device tensors too. The contract is
// transport.hpp's DeviceFusion; this name stays for code written against it.
template <class T>
concept DeviceFusionTransport = DeviceFusion<T>;

}  // namespace kolo
