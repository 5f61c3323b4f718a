// kolo/transport/transport_config.hpp — the transport layer's variables: the route policy
// (KOLO_TRANSPORT, with its RouteMode), the mesh's shared-memory channel and wait policy, the
// GPU transports and the MPI transports. How a variable is declared and read: core/config_var.hpp.
#pragma once

#include <cstdint>

#include "kolo/core/config_var.hpp"

namespace kolo {

// The route policy of the mesh transports (transport/route.hpp): ShmTransport (shm_only),
// TcpTransport (tcp_only), RoutedTransport (routed).
enum class RouteMode : std::uint8_t { shm_only, tcp_only, routed };

}  // namespace kolo

namespace kolo::config {

inline constexpr Choice kRouteModes[] = {choice(RouteMode::shm_only, "shm"),
                                         choice(RouteMode::tcp_only, "tcp"),
                                         choice(RouteMode::routed, "routed", "auto")};
inline constexpr Choices kRouteModeChoices{kRouteModes};

namespace vars {

// ---- transport ----
inline constexpr Var transport{"KOLO_TRANSPORT",
                               Kind::choice,
                               Section::transport,
                               Reader::route,
                               0,
                               0,
                               "routed",
                               "route policy of `Communicator<>`: shared memory only, TCP only, "
                               "or shared memory within a host and TCP across",
                               {},
                               &kRouteModeChoices,
                               true};
inline constexpr Var shm_slot_bytes{"KOLO_SHM_SLOT_BYTES",
                                    Kind::integer,
                                    Section::transport,
                                    Reader::mesh,
                                    4096,
                                    64ll << 20,
                                    "262144",
                                    "shared-memory channel: bytes per slot"};
inline constexpr Var shm_slots{"KOLO_SHM_SLOTS",
                               Kind::integer,
                               Section::transport,
                               Reader::mesh,
                               2,
                               1024,
                               "8",
                               "shared-memory channel: slots per channel"};
inline constexpr Var spin_us{
    "KOLO_SPIN_US",
    Kind::real,
    Section::transport,
    Reader::mesh,
    0,
    1e6,
    "adaptive (KOLO_SPIN_MIN_US to KOLO_SPIN_MAX_US); MpiTransport: 50 when ranks <= cores, "
    "else 2",
    "microseconds a waiting rank spins (yielding) before it sleeps; set, a fixed budget that "
    "turns the mesh's adaptive budget off (also read by MpiTransport)"};
inline constexpr Var spin_min_us{
    "KOLO_SPIN_MIN_US",
    Kind::real,
    Section::transport,
    Reader::mesh,
    0,
    1e6,
    "50 when ranks <= cores, else 20",
    "floor of the mesh's adaptive spin budget: a wait longer than KOLO_SPIN_MAX_US halves the "
    "budget, down to this"};
inline constexpr Var spin_max_us{
    "KOLO_SPIN_MAX_US",
    Kind::real,
    Section::transport,
    Reader::mesh,
    0,
    1e6,
    "1000",
    "cap and starting value of the mesh's adaptive spin budget: a wait that slept but ended "
    "within it raises the budget to twice that wait, up to this"};
inline constexpr Var yield_every{
    "KOLO_YIELD_EVERY",
    Kind::integer,
    Section::transport,
    Reader::mesh,
    1,
    1 << 20,
    "1 when ranks > cores, else 1024",
    "checks of the channels between two sched_yield calls while a mesh rank spins (1: hand the "
    "core on at every check); it yields after 20 us of spinning in any case"};
inline constexpr Var wait_spread{
    "KOLO_WAIT_SPREAD",
    Kind::flag,
    Section::transport,
    Reader::mesh,
    0,
    1,
    "1 (only acts when ranks <= cores)",
    "a spinning mesh rank that finds a local peer on its own core moves itself to another core "
    "its affinity mask allows (the mask is left as it was)"};

// ---- GPU ----
inline constexpr Var cuda_device{
    "KOLO_CUDA_DEVICE",
    Kind::integer,
    Section::gpu,
    Reader::gpu,
    -1,
    1023,
    "`KOLO_DEVICES`' first id, else local rank modulo the device count",
    "CUDA device of this rank"};
inline constexpr Var nccl{"KOLO_NCCL",
                          Kind::flag,
                          Section::gpu,
                          Reader::gpu,
                          0,
                          1,
                          "1",
                          "`0`: device buffers are staged through pinned host memory over "
                          "shm/TCP instead of NCCL"};
inline constexpr Var nccl_hierarchical{"KOLO_NCCL_HIERARCHICAL",
                                       Kind::flag,
                                       Section::gpu,
                                       Reader::gpu,
                                       0,
                                       1,
                                       "1",
                                       "`1`: NCCL inside each host and TCP across, when there are "
                                       "several hosts of equal size; `0`: one NCCL communicator"};
inline constexpr Var cuda_spin_us{"KOLO_CUDA_SPIN_US",
                                  Kind::integer,
                                  Section::gpu,
                                  Reader::gpu,
                                  0,
                                  10000000,
                                  "1000",
                                  "how long a thread waiting on the GPU yield-polls before it "
                                  "sleeps 20 us between polls"};

// ---- MPI ----
inline constexpr Var mpi_check_signatures{"KOLO_MPI_CHECK_SIGNATURES",
                                          Kind::flag,
                                          Section::mpi,
                                          Reader::mpi,
                                          0,
                                          1,
                                          "1",
                                          "`1`: native collectives first compare the calls of all "
                                          "ranks"};
inline constexpr Var mpi_inline_bytes{"KOLO_MPI_INLINE_BYTES",
                                      Kind::integer,
                                      Section::mpi,
                                      Reader::mpi,
                                      0,
                                      1 << 20,
                                      "4000",
                                      "payloads up to this size travel with their header in one "
                                      "message"};
inline constexpr Var mpi_native_blocking{"KOLO_MPI_NATIVE_BLOCKING",
                                         Kind::flag,
                                         Section::mpi,
                                         Reader::mpi,
                                         0,
                                         1,
                                         "0",
                                         "`0`: `MPI_Iallreduce` & co. under kolo's deadline; `1`: "
                                         "the blocking calls, which have none"};

}  // namespace vars

// The transport layer's variables, in documentation order (transport, GPU, MPI).
inline constexpr const Var* kTransportVars[] = {
    &vars::transport,   &vars::shm_slot_bytes, &vars::shm_slots,   &vars::spin_us,
    &vars::spin_min_us, &vars::spin_max_us,    &vars::yield_every, &vars::wait_spread,
};
inline constexpr const Var* kGpuVars[] = {&vars::cuda_device, &vars::nccl, &vars::nccl_hierarchical,
                                          &vars::cuda_spin_us};
inline constexpr const Var* kMpiVars[] = {&vars::mpi_check_signatures, &vars::mpi_inline_bytes,
                                          &vars::mpi_native_blocking};

}  // namespace kolo::config
