// kolo/engine/engine_config.hpp — the engine layer's variables: fusion, the cycle, the response
// cache, the stall inspector, the timeline, in-place fused pieces (KOLO_FUSION_PIECES, read as a
// bool) and what an average divides by (KOLO_JOIN_AVERAGE, read as JoinAverage). Read by
// EngineOptions::from_env. How a variable is declared and read: core/config_var.hpp.
#pragma once

#include "kolo/core/config_var.hpp"
#include "kolo/engine/request.hpp"

namespace kolo::config {

// KOLO_FUSION_PIECES reads as a bool: true for `on`.
inline constexpr Choice kFusionPiecesValues[] = {
    choice(true, "on", {}, "fused batches in pieces, no fusion-buffer copies"),
    choice(false, "off", {}, "through the fusion buffer")};
inline constexpr Choices kFusionPiecesChoices{kFusionPiecesValues};

inline constexpr Choice kJoinAverages[] = {
    choice(JoinAverage::world_size, "world", "world_size", "divide by the number of ranks"),
    choice(JoinAverage::active_ranks, "active", "active_ranks",
           "divide by the ranks that have not joined")};
inline constexpr Choices kJoinAverageChoices{kJoinAverages};

namespace vars {

// ---- engine and compression ----
inline constexpr Var fusion_threshold{"KOLO_FUSION_THRESHOLD",
                                      Kind::integer,
                                      Section::engine,
                                      Reader::engine,
                                      0,
                                      1ll << 40,
                                      "134217728",
                                      "fusion buffer bytes"};
inline constexpr Var cycle_time_ms{
    "KOLO_CYCLE_TIME_MS",          Kind::real, Section::engine, Reader::engine, 0, 10000, "1",
    "engine cycle in milliseconds"};
inline constexpr Var cache_capacity{"KOLO_CACHE_CAPACITY",
                                    Kind::integer,
                                    Section::engine,
                                    Reader::engine,
                                    0,
                                    1 << 24,
                                    "4096",
                                    "response-cache entries (0 disables the cache)"};
inline constexpr Var stall_warning_seconds{"KOLO_STALL_WARNING_SECONDS",
                                           Kind::real,
                                           Section::engine,
                                           Reader::engine,
                                           0,
                                           1e7,
                                           "60",
                                           "stall inspector: warn when a tensor waits this long "
                                           "for other ranks"};
inline constexpr Var stall_shutdown_seconds{"KOLO_STALL_SHUTDOWN_SECONDS",
                                            Kind::real,
                                            Section::engine,
                                            Reader::engine,
                                            0,
                                            1e7,
                                            "off",
                                            "stall inspector: abort the job after this long"};
inline constexpr Var timeline{"KOLO_TIMELINE",
                              Kind::text,
                              Section::engine,
                              Reader::engine,
                              0,
                              0,
                              "off",
                              "path of the Chrome-trace JSON timeline written by rank 0",
                              {},
                              {},
                              true};
inline constexpr Var fusion_pieces{"KOLO_FUSION_PIECES",
                                   Kind::choice,
                                   Section::engine,
                                   Reader::engine,
                                   0,
                                   0,
                                   "on",
                                   "fused batches that the ring carries read and write the "
                                   "tensors in place, in pieces (`on`), or go through the "
                                   "fusion buffer (`off`: pack, allreduce, unpack)",
                                   {},
                                   &kFusionPiecesChoices,
                                   true};

inline constexpr Var join_average{"KOLO_JOIN_AVERAGE",
                                  Kind::choice,
                                  Section::engine,
                                  Reader::engine,
                                  0,
                                  0,
                                  "world",
                                  "what an average divides by while ranks have joined: the "
                                  "number of ranks (`world`, as Horovod and DDP's default) or "
                                  "the ranks that contributed (`active`)",
                                  {},
                                  &kJoinAverageChoices,
                                  true};

}  // namespace vars

// The engine layer's variables, in documentation order.
inline constexpr const Var* kEngineVars[] = {
    &vars::fusion_threshold,      &vars::cycle_time_ms,          &vars::cache_capacity,
    &vars::stall_warning_seconds, &vars::stall_shutdown_seconds, &vars::timeline,
    &vars::fusion_pieces,         &vars::join_average,
};

}  // namespace kolo::config
