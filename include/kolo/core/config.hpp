// kolo/core/config.hpp — every KOLO_* environment variable, declared once.
//
// One table holds each variable's name, kind, accepted range, default, section and doc line.
// Everything else is derived from it: the readers below take a declaration (never a bare name),
// so a variable's bounds and parsing rules live in exactly one place; docs/environment.md is
// generated from the table (tests/docs/env_doc.cpp; CTest docs/environment fails when the page
// and the table disagree); the bad-value sweep (tests/unit/test_env_sweep.cpp) walks the table;
// and a source scan (CTest docs/env_names) fails when code names a KOLO_* variable that the
// table does not declare.
//
// To add a variable: one `Var` in namespace `vars` below, one line in `all_vars()`, and a call
// to a reader where it is used; then regenerate docs/environment.md
// (`build/tests/kolo_env_doc > docs/environment.md`).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kolo/core/env.hpp"
#include "kolo/core/error.hpp"

namespace kolo::config {

// What a value looks like (and so which bad values the sweep tries).
enum class Kind : unsigned char {
  integer,     // a decimal integer in [min, max]
  real,        // a decimal number in [min, max]
  flag,        // 0 or 1
  choice,      // one of `choices` (case-insensitive where the reader says so)
  rules,       // per-size-range algorithm rules, e.g. "tree:0-64K;ring:65537-max"
  host_port,   // host:port
  host_ports,  // host:port,host:port,... in rank order
  id_list,     // comma-separated non-negative integers
  secret,      // a key of at least 8 characters; never echoed in errors
  address,     // an IP address or host name
  text,        // free-form (a name, a path)
  fd,          // an inherited file descriptor
};

// Where the variable is documented (a table of docs/environment.md each).
enum class Section : unsigned char {
  contract,   // what every launcher exports
  transport,  // how ranks reach each other
  selection,  // algorithm selection
  engine,     // the Engine and compression
  gpu,
  mpi,
  torch,
  spark,
  launcher,  // read by kolo-run
  build,     // read when building kolo_torch (pip install backends/torch)
  internal,  // set by kolo_spark for its own processes; not for users
};

// Who reads it (the sweep calls that reader; `none` is exported by a launcher for programs,
// or read by Python code).
enum class Reader : unsigned char {
  topology,
  log_level,
  route,
  mesh,
  communicator,
  engine,
  compression,
  gpu,
  mpi,
  torch,
  spark_data,
  none,
};

struct Var {
  std::string_view name;
  Kind kind;
  Section section;
  Reader reader;
  double min = 0;  // numeric kinds: accepted range, inclusive
  double max = 0;
  std::string_view default_value = {};  // as the docs show it; empty: none
  std::string_view meaning = {};
  std::string_view aliases = {};  // names read when this one is absent
  std::string_view choices = {};  // Kind::choice: the accepted values, comma-separated
  // Set but empty means unset (launchers export variables empty rather than not at all).
  bool empty_is_unset = false;
};

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
                               "off, error, warning, info, debug",
                               true};

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
                               "shm, tcp, routed",
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
                            "probe, default, file:PATH",
                            true};
inline constexpr Var small_allreduce_bytes{"KOLO_SMALL_ALLREDUCE_BYTES",
                                           Kind::integer,
                                           Section::selection,
                                           Reader::communicator,
                                           0,
                                           1ll << 40,
                                           "-",
                                           "deprecated: `recursive-doubling:0-N;ring:N+1-max`"};

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
inline constexpr Var compression{"KOLO_COMPRESSION",
                                 Kind::choice,
                                 Section::engine,
                                 Reader::compression,
                                 0,
                                 0,
                                 "none",
                                 "wire format of float32 sum/average in the engine",
                                 {},
                                 "none, fp16, bf16",
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
                                   "on, off",
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
                                  "world, active",
                                  true};

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

// ---- PyTorch backend ----
inline constexpr Var torch_spin_us{"KOLO_TORCH_SPIN_US",
                                   Kind::integer,
                                   Section::torch,
                                   Reader::torch,
                                   0,
                                   10000000,
                                   "50",
                                   "how long a waiting Python thread, and the idle worker thread, "
                                   "spin (with `sched_yield`) before blocking"};

// ---- Spark data shards (exported by kolo_spark.run(..., df=...)) ----
inline constexpr Var data_file{"KOLO_DATA_FILE",
                               Kind::text,
                               Section::spark,
                               Reader::spark_data,
                               0,
                               0,
                               "-",
                               "path of this rank's DataFrame shard"};
inline constexpr Var data_format{"KOLO_DATA_FORMAT",
                                 Kind::choice,
                                 Section::spark,
                                 Reader::spark_data,
                                 0,
                                 0,
                                 "the file's suffix",
                                 "layout of the shard",
                                 {},
                                 "csv, f64, bin",
                                 true};
inline constexpr Var data_rows{"KOLO_DATA_ROWS",
                               Kind::integer,
                               Section::spark,
                               Reader::spark_data,
                               0,
                               1ll << 53,
                               "-",
                               "rows in the shard (checked against the file)"};
inline constexpr Var data_columns{"KOLO_DATA_COLUMNS",
                                  Kind::text,
                                  Section::spark,
                                  Reader::spark_data,
                                  0,
                                  0,
                                  "-",
                                  "comma-separated column names of the shard",
                                  {},
                                  {},
                                  true};
inline constexpr Var data_types{"KOLO_DATA_TYPES",
                                Kind::text,
                                Section::spark,
                                Reader::spark_data,
                                0,
                                0,
                                "inferred from the cells",
                                "comma-separated types of a csv shard's columns (`float64`, "
                                "`int64`, `string`, `vector:N`)",
                                {},
                                {},
                                true};

// ---- kolo-run ----
inline constexpr Var run_ssh{"KOLO_RUN_SSH",
                             Kind::text,
                             Section::launcher,
                             Reader::none,
                             0,
                             0,
                             "`ssh`",
                             "the ssh command (with options) kolo-run starts ranks on remote `-H` "
                             "hosts with, when `--ssh` is not given",
                             {},
                             {},
                             true};

// ---- building the PyTorch backend (read by backends/torch's build, not by the library) ----
inline constexpr Var include_dir{"KOLO_INCLUDE_DIR",
                                 Kind::text,
                                 Section::build,
                                 Reader::none,
                                 0,
                                 0,
                                 "the checkout's `include/`",
                                 "kolo headers to compile `kolo_torch` against (an installed kolo: "
                                 "`<prefix>/include`)",
                                 {},
                                 {},
                                 true};
inline constexpr Var torch_python{"KOLO_TORCH_PYTHON",
                                  Kind::text,
                                  Section::build,
                                  Reader::none,
                                  0,
                                  0,
                                  "the interpreter running pip",
                                  "Python whose torch `kolo_torch` is built against",
                                  {},
                                  {},
                                  true};

inline constexpr Var torch_cuda{"KOLO_TORCH_CUDA",
                                Kind::flag,
                                Section::build,
                                Reader::none,
                                0,
                                1,
                                "0",
                                "`1`: `pip install backends/torch` builds the CUDA variant (CUDA "
                                "tensors through kolo's NCCL transport; needs the CUDA toolkit)",
                                {},
                                {},
                                true};

// ---- set by kolo_spark for its function ranks (removed from the environment on start) ----
inline constexpr Var spark_fn{"KOLO_SPARK_FN",
                              Kind::text,
                              Section::internal,
                              Reader::none,
                              0,
                              0,
                              "-",
                              "path of the pickled function a function rank runs"};
inline constexpr Var spark_result{"KOLO_SPARK_RESULT",
                                  Kind::text,
                                  Section::internal,
                                  Reader::none,
                                  0,
                                  0,
                                  "-",
                                  "where a function rank writes its pickled return value"};
inline constexpr Var spark_max_result{
    "KOLO_SPARK_MAX_RESULT",
    Kind::text,
    Section::internal,
    Reader::none,
    0,
    0,
    "-",
    "the largest return value, in bytes, a function rank may send"};
inline constexpr Var spark_pickler{"KOLO_SPARK_PICKLER",
                                   Kind::text,
                                   Section::internal,
                                   Reader::none,
                                   0,
                                   0,
                                   "-",
                                   "the module the driver pickled the function with"};
inline constexpr Var spark_trace{"KOLO_SPARK_TRACE",
                                 Kind::text,
                                 Section::internal,
                                 Reader::none,
                                 0,
                                 0,
                                 "-",
                                 "where a function rank writes its timeline events"};
inline constexpr Var spark_launched{"KOLO_SPARK_LAUNCHED",
                                    Kind::text,
                                    Section::internal,
                                    Reader::none,
                                    0,
                                    0,
                                    "-",
                                    "when the task launched the rank (for the timeline)"};

}  // namespace vars

// Every variable, in documentation order.
inline std::span<const Var* const> all_vars() {
  static constexpr const Var* kAll[] = {
      &vars::rank,
      &vars::size,
      &vars::local_rank,
      &vars::local_size,
      &vars::cross_rank,
      &vars::cross_size,
      &vars::store,
      &vars::peers,
      &vars::listen_fd,
      &vars::secret,
      &vars::job_id,
      &vars::host_key,
      &vars::addr,
      &vars::devices,
      &vars::timeout_seconds,
      &vars::log_level,
      &vars::transport,
      &vars::shm_slot_bytes,
      &vars::shm_slots,
      &vars::spin_us,
      &vars::spin_min_us,
      &vars::spin_max_us,
      &vars::yield_every,
      &vars::wait_spread,
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
      &vars::fusion_threshold,
      &vars::cycle_time_ms,
      &vars::cache_capacity,
      &vars::stall_warning_seconds,
      &vars::stall_shutdown_seconds,
      &vars::timeline,
      &vars::compression,
      &vars::fusion_pieces,
      &vars::join_average,
      &vars::cuda_device,
      &vars::nccl,
      &vars::nccl_hierarchical,
      &vars::cuda_spin_us,
      &vars::mpi_check_signatures,
      &vars::mpi_inline_bytes,
      &vars::mpi_native_blocking,
      &vars::torch_spin_us,
      &vars::data_file,
      &vars::data_format,
      &vars::data_rows,
      &vars::data_columns,
      &vars::data_types,
      &vars::run_ssh,
      &vars::include_dir,
      &vars::torch_python,
      &vars::torch_cuda,
      &vars::spark_fn,
      &vars::spark_result,
      &vars::spark_max_result,
      &vars::spark_pickler,
      &vars::spark_trace,
      &vars::spark_launched,
  };
  return kAll;
}

// The declaration of `name`, or nullptr.
inline const Var* find_var(std::string_view name) {
  for (const Var* v : all_vars()) {
    if (v->name == name) return v;
  }
  return nullptr;
}

// The variable's name followed by its aliases, in the order they are read.
inline std::vector<std::string> names_of(const Var& v) {
  std::vector<std::string> out{std::string(v.name)};
  std::string_view rest = v.aliases;
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (!item.empty()) out.emplace_back(item);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return out;
}

namespace detail {

inline std::string range_text(const Var& v) {
  auto num = [](double d) {
    if (d == static_cast<double>(static_cast<long long>(d))) {
      return std::to_string(static_cast<long long>(d));
    }
    std::string s = std::to_string(d);
    while (!s.empty() && s.back() == '0') s.pop_back();
    return s;
  };
  // Appended piece by piece: GCC 12 at -O3 reports a false -Wrestrict on `"[" + std::string&&`.
  std::string out = "[";
  out += num(v.min);
  out += ", ";
  out += num(v.max);
  out += ']';
  return out;
}

[[noreturn]] inline void out_of_range(const Var& v, const std::string& value) {
  throw ConfigError(std::string(v.name) + "=" + value + " is out of range " + range_text(v));
}

// The raw value: nullopt when unset, or set-but-empty for variables where that means unset.
inline std::optional<std::string> raw(const EnvLookup& env, const Var& v) {
  auto s = env(std::string(v.name));
  if (s && s->empty() && v.empty_is_unset) return std::nullopt;
  return s;
}

}  // namespace detail

// Readers. Each takes the declaration, so the name, range and empty-means-unset rule come from
// the table; errors name the variable and its value (`KOLO_SHM_SLOTS=1 is out of range [2,
// 1024]`). Surrounding spaces are trimmed alike for every numeric kind.
inline std::optional<long long> get_int(const EnvLookup& env, const Var& v) {
  const auto s = detail::raw(env, v);
  if (!s) return std::nullopt;
  const long long x = parse_env_int(v.name, *s);
  if (static_cast<double>(x) < v.min || static_cast<double>(x) > v.max) {
    detail::out_of_range(v, *s);
  }
  return x;
}

inline std::optional<double> get_real(const EnvLookup& env, const Var& v) {
  const auto s = detail::raw(env, v);
  if (!s) return std::nullopt;
  const double x = parse_env_double(v.name, *s);
  if (!(x >= v.min && x <= v.max)) detail::out_of_range(v, *s);
  return x;
}

inline std::optional<bool> get_flag(const EnvLookup& env, const Var& v) {
  const auto x = get_int(env, v);
  if (!x) return std::nullopt;
  return *x != 0;
}

// The value as given (no parsing); the caller validates what "text" means for it.
inline std::optional<std::string> get_text(const EnvLookup& env, const Var& v) {
  return detail::raw(env, v);
}

// A Kind::choice value, lower-cased, checked against the declared choices.
inline std::optional<std::string> get_choice(const EnvLookup& env, const Var& v) {
  const auto s = detail::raw(env, v);
  if (!s) return std::nullopt;
  std::string l;
  for (char c : *s) l.push_back(c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c);
  std::string_view rest = v.choices;
  while (!rest.empty()) {
    const auto comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    if (item == l) return l;
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  throw ConfigError(std::string(v.name) + "=" + *s + " is not one of " + std::string(v.choices));
}

}  // namespace kolo::config

namespace kolo {

// KOLO_LOG_LEVEL: off (or none), error, warning (or warn), info, debug, in any case; unset or
// empty means the default (warning). Only `debug` changes anything today (the store logs the
// connections it refuses), but a misspelt level is an error rather than silently ignored.
enum class LogLevel { off, error, warning, info, debug };

inline LogLevel log_level_from_env(const EnvLookup& env = process_env()) {
  const auto v = config::get_text(env, config::vars::log_level);
  if (!v) return LogLevel::warning;
  std::string l;
  for (char c : *v) l.push_back(c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c);
  if (l == "off" || l == "none") return LogLevel::off;
  if (l == "error") return LogLevel::error;
  if (l == "warning" || l == "warn") return LogLevel::warning;
  if (l == "info") return LogLevel::info;
  if (l == "debug") return LogLevel::debug;
  throw ConfigError("KOLO_LOG_LEVEL=" + *v + " is not one of off, error, warning, info, debug");
}

}  // namespace kolo
