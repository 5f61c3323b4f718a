// kolo/core/core_config.hpp — the core layer's variables: the launcher contract every launcher
// exports to each rank (read by Topology::from_env) and KOLO_LOG_LEVEL, with its LogLevel.
// How a variable is declared and read: core/config_var.hpp.
#pragma once

#include "kolo/core/config_var.hpp"
#include "kolo/core/env.hpp"

namespace kolo {

// KOLO_LOG_LEVEL: off (or none), error, warning (or warn), info, debug, in any case; unset or
// empty means the default (warning). Only `debug` changes anything today (the store logs the
// connections it refuses), but a misspelt level is an error rather than silently ignored.
enum class LogLevel { off, error, warning, info, debug };

}  // namespace kolo

namespace kolo::config {

inline constexpr Choice kLogLevels[] = {
    choice(LogLevel::off, "off", "none"), choice(LogLevel::error, "error"),
    choice(LogLevel::warning, "warning", "warn"), choice(LogLevel::info, "info"),
    choice(LogLevel::debug, "debug")};
inline constexpr Choices kLogLevelChoices{kLogLevels, /*ignore_case=*/true};

namespace vars {

// ---- the launcher contract ----
inline constexpr Var rank{"KOLO_RANK",
                          Kind::integer,
                          Section::contract,
                          Reader::topology,
                          0,
                          (1 << 20) - 1,
                          "required with a launcher",
                          "global rank, 0..size-1",
                          "RANK, OMPI_COMM_WORLD_RANK, HOROVOD_RANK, PMI_RANK"};
inline constexpr Var size{
    "KOLO_SIZE",
    Kind::integer,
    Section::contract,
    Reader::topology,
    1,
    1 << 20,
    "required with a launcher; with no launcher variable at all (no size, no rank) the program is "
    "a single-rank job, as an MPI singleton",
    "number of ranks",
    "WORLD_SIZE, OMPI_COMM_WORLD_SIZE, HOROVOD_SIZE, PMI_SIZE"};
inline constexpr Var local_rank{"KOLO_LOCAL_RANK",
                                Kind::integer,
                                Section::contract,
                                Reader::topology,
                                0,
                                (1 << 20) - 1,
                                "derived from host keys through the store",
                                "index among this host's ranks",
                                "LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, HOROVOD_LOCAL_RANK"};
inline constexpr Var local_size{"KOLO_LOCAL_SIZE",
                                Kind::integer,
                                Section::contract,
                                Reader::topology,
                                1,
                                1 << 20,
                                "derived",
                                "number of ranks on this host",
                                "LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE, HOROVOD_LOCAL_SIZE"};
inline constexpr Var cross_rank{"KOLO_CROSS_RANK",
                                Kind::integer,
                                Section::contract,
                                Reader::topology,
                                0,
                                (1 << 20) - 1,
                                "derived",
                                "index of this host among the hosts",
                                "HOROVOD_CROSS_RANK, GROUP_RANK"};
inline constexpr Var cross_size{
    "KOLO_CROSS_SIZE", Kind::integer, Section::contract, Reader::topology,    1,
    1 << 20,           "derived",     "number of hosts", "HOROVOD_CROSS_SIZE"};
inline constexpr Var store{"KOLO_STORE",
                           Kind::host_port,
                           Section::contract,
                           Reader::topology,
                           0,
                           0,
                           "-",
                           "`host:port` of the rendezvous store hosted by the launcher; without "
                           "it, torchrun's `MASTER_ADDR` and `MASTER_PORT` (rank 0 then hosts "
                           "the store there, or on `MASTER_PORT + 1` when torchrun's agent "
                           "serves its own store on `MASTER_PORT`)"};
inline constexpr Var peers{"KOLO_PEERS",
                           Kind::host_ports,
                           Section::contract,
                           Reader::topology,
                           0,
                           0,
                           "-",
                           "`host:port,...` in rank order; rank 0 hosts the store at the first"};
inline constexpr Var listen_fd{"KOLO_LISTEN_FD",
                               Kind::fd,
                               Section::contract,
                               Reader::topology,
                               0,
                               1 << 20,
                               "-",
                               "an inherited, already listening socket (no bind race): the store "
                               "on rank 0 with `KOLO_PEERS`, else the rank's TCP data listener"};
inline constexpr Var secret{"KOLO_SECRET",
                            Kind::secret,
                            Section::contract,
                            Reader::topology,
                            0,
                            0,
                            "required when size > 1 (kolo-run and the Spark backend generate one)",
                            "per-job key of at least 8 characters; every TCP connection proves it "
                            "with HMAC-SHA256"};
inline constexpr Var job_id{"KOLO_JOB_ID",
                            Kind::text,
                            Section::contract,
                            Reader::topology,
                            0,
                            0,
                            "torchrun's `TORCHELASTIC_RUN_ID`, else none",
                            "the same on every rank of a job, different per job: bound into the "
                            "store's handshakes, so jobs sharing `KOLO_SECRET` cannot join each "
                            "other's store"};
inline constexpr Var host_key{"KOLO_HOST_KEY",
                              Kind::text,
                              Section::contract,
                              Reader::topology,
                              0,
                              0,
                              "hostname + network-namespace inode",
                              "ranks with equal keys share a host (and memory)",
                              {},
                              {},
                              true};
inline constexpr Var addr{"KOLO_ADDR",
                          Kind::address,
                          Section::contract,
                          Reader::topology,
                          0,
                          0,
                          "the interface that routes to the store",
                          "address other ranks use to reach this rank",
                          {},
                          {},
                          true};
inline constexpr Var devices{"KOLO_DEVICES",
                             Kind::id_list,
                             Section::contract,
                             Reader::topology,
                             0,
                             2147483647,
                             "-",
                             "GPU ids assigned to this rank (e.g. Spark's `resources()['gpu']`)",
                             {},
                             {},
                             true};
inline constexpr Var timeout_seconds{"KOLO_TIMEOUT_SECONDS",
                                     Kind::real,
                                     Section::contract,
                                     Reader::topology,
                                     0.001,
                                     1.0e6,
                                     "30",
                                     "deadline for connecting and for every collective"};
inline constexpr Var log_level{"KOLO_LOG_LEVEL",
                               Kind::choice,
                               Section::contract,
                               Reader::log_level,
                               0,
                               0,
                               "warning",
                               "`debug` logs refused store connections; anything else is a "
                               "`ConfigError`",
                               {},
                               &kLogLevelChoices,
                               true};

}  // namespace vars

// The core layer's variables, in documentation order.
inline constexpr const Var* kCoreVars[] = {
    &vars::rank,       &vars::size,       &vars::local_rank,      &vars::local_size,
    &vars::cross_rank, &vars::cross_size, &vars::store,           &vars::peers,
    &vars::listen_fd,  &vars::secret,     &vars::job_id,          &vars::host_key,
    &vars::addr,       &vars::devices,    &vars::timeout_seconds, &vars::log_level,
};

}  // namespace kolo::config

namespace kolo {

// The level KOLO_LOG_LEVEL names (default warning); a ConfigError for an undeclared one.
inline LogLevel log_level_from_env(const EnvLookup& env = process_env()) {
  return config::get_choice<LogLevel>(env, config::vars::log_level).value_or(LogLevel::warning);
}

}  // namespace kolo
