// kolo/algorithm/selection_config.hpp — the selection layer's variables: the ring's and the
// hierarchical allreduce's units, the per-collective algorithm rules, the cost model's constants
// (KOLO_TUNING, with its TuningKind) and the rooted collectives' agreement. Read by
// CommunicatorOptions::from_env and TuningSource. How a variable is declared and read:
// core/config_var.hpp.
#pragma once

#include <cstdint>

#include "kolo/core/config_var.hpp"

namespace kolo {

// Where the cost model's constants come from (KOLO_TUNING; TuningSource::Kind).
enum class TuningKind : std::uint8_t { probe, defaults, file };

}  // namespace kolo

namespace kolo::config {

inline constexpr Choice kTuningKinds[] = {choice(TuningKind::probe, "probe"),
                                          choice(TuningKind::defaults, "default", "defaults"),
                                          choice_with_argument(TuningKind::file, "file:PATH")};
inline constexpr Choices kTuningChoices{kTuningKinds, /*ignore_case=*/false, /*trim=*/true};

namespace vars {

// ---- algorithm selection ----
inline constexpr Var segment_bytes{"KOLO_SEGMENT_BYTES",
                                   Kind::integer,
                                   Section::selection,
                                   Reader::communicator,
                                   64,
                                   1 << 30,
                                   "262144",
                                   "ring pipelining unit in bytes"};
inline constexpr Var zero_copy_bytes{"KOLO_ZERO_COPY_BYTES",
                                     Kind::integer,
                                     Section::selection,
                                     Reader::communicator,
                                     0,
                                     1ll << 62,
                                     "262144",
                                     "smallest allreduce (bytes) on Buffers from "
                                     "Communicator::allocate that reads the local peers' memory "
                                     "in place"};
inline constexpr Var hierarchical_chunk_bytes{
    "KOLO_HIERARCHICAL_CHUNK_BYTES",
    Kind::integer,
    Section::selection,
    Reader::communicator,
    0,
    1ll << 62,
    "4194304",
    "the hierarchical allreduce's pipelining unit in bytes: a tensor of at least twice this is cut "
    "into chunks whose ring across hosts overlaps the rings inside the host (0: no chunks)"};
inline constexpr Var rooted_agreement{
    "KOLO_ROOTED_AGREEMENT",
    Kind::flag,
    Section::selection,
    Reader::communicator,
    0,
    1,
    "1",
    "rooted collectives (broadcast, scatter, gather, the tree reduce) begin with a zero-byte "
    "barrier, so that a call refused on one rank fails on every rank (0: a root or a sender "
    "returns once its own part is done, as in NCCL and Gloo, and gets such an error at its next "
    "call); the same on every rank"};
inline constexpr Var allreduce{"KOLO_ALLREDUCE",
                               Kind::rules,
                               Section::selection,
                               Reader::communicator,
                               0,
                               0,
                               "the Selector's cost model",
                               "per-size-range allreduce algorithm, e.g. `tree:0-64K;ring:65537-"
                               "max` (`ring`, `tree`, `halving-doubling`, `recursive-doubling`, "
                               "`hierarchical`, `direct`, `auto`)",
                               {},
                               {},
                               true};
inline constexpr Var broadcast{"KOLO_BROADCAST",
                               Kind::rules,
                               Section::selection,
                               Reader::communicator,
                               0,
                               0,
                               "the Selector's cost model",
                               "the same for broadcast (`chain`, `binomial`, `auto`)",
                               {},
                               {},
                               true};
inline constexpr Var allgather{
    "KOLO_ALLGATHER",
    Kind::rules,
    Section::selection,
    Reader::communicator,
    0,
    0,
    "the Selector's cost model",
    "the same for allgather and allgatherv, by the bytes of the whole result (`ring`, `auto`)",
    {},
    {},
    true};
inline constexpr Var reduce_scatter{
    "KOLO_REDUCE_SCATTER",
    Kind::rules,
    Section::selection,
    Reader::communicator,
    0,
    0,
    "the Selector's cost model",
    "the same for reduce_scatter, by the bytes of the whole input (`ring`, `auto`)",
    {},
    {},
    true};
inline constexpr Var alltoall{
    "KOLO_ALLTOALL",
    Kind::rules,
    Section::selection,
    Reader::communicator,
    0,
    0,
    "the Selector's cost model",
    "the same for alltoall, by the bytes of the whole input (`pairwise`, `auto`)",
    {},
    {},
    true};
inline constexpr Var tuning{"KOLO_TUNING",
                            Kind::choice,
                            Section::selection,
                            Reader::communicator,
                            0,
                            0,
                            "`probe` for shm/tcp/routed",
                            "the cost model's constants: `probe` (measured at creation), "
                            "`default`, `file:PATH` (read; probed and written when missing)",
                            {},
                            &kTuningChoices,
                            true};
inline constexpr Var small_allreduce_bytes{"KOLO_SMALL_ALLREDUCE_BYTES",
                                           Kind::integer,
                                           Section::selection,
                                           Reader::communicator,
                                           0,
                                           1ll << 40,
                                           "-",
                                           "deprecated: `recursive-doubling:0-N;ring:N+1-max`"};

}  // namespace vars

// The selection layer's variables, in documentation order.
inline constexpr const Var* kSelectionVars[] = {
    &vars::segment_bytes,
    &vars::zero_copy_bytes,
    &vars::hierarchical_chunk_bytes,
    &vars::rooted_agreement,
    &vars::allreduce,
    &vars::broadcast,
    &vars::allgather,
    &vars::reduce_scatter,
    &vars::alltoall,
    &vars::tuning,
    &vars::small_allreduce_bytes,
};

}  // namespace kolo::config
