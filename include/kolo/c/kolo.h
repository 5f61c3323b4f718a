/* kolo/c/kolo.h — kolo's C ABI: collectives for any language that can call C.
 *
 * The surface other languages and frameworks embed (Python ctypes/cffi, Java FFM/JNA, Go cgo,
 * Rust, Julia, C#), shaped after NCCL's nccl.h: an opaque communicator built from the
 * launcher's environment or from rank, size and a store address; blocking collectives; an
 * asynchronous engine that takes tensors by name and hands back completion handles; a result
 * code from every call and a per-thread message that says what went wrong.
 *
 * Link kolo::kolo_c (libkolo_c.so) or kolo::kolo_c_static (libkolo_c_static.a; C++ runtime,
 * threads, libcrypto and librt come with it on the link line). Reference: docs/c_api.md.
 *
 * ABI rules (they hold for every 0.x release with the same KOLO_C_ABI_VERSION):
 *   - Only C types cross this boundary: opaque handles, integers, size_t, pointers, enums with
 *     fixed values. No C++ type, no struct whose layout could change.
 *   - No function lets an exception or a signal escape, and none ends the process: every
 *     failure is a kolo_result_t plus a message from kolo_get_last_error().
 *   - Functions are added, never changed or removed; enum values are never renumbered.
 *   - The library exports only symbols named kolo_*.
 *
 * Threads: a communicator is used by one thread at a time (any thread); distinct communicators
 * may be used from distinct threads at once. Engine enqueues and request calls may come from
 * any thread. kolo_get_last_error() is per thread.
 */
#ifndef KOLO_C_KOLO_H
#define KOLO_C_KOLO_H

#include <stddef.h>

/* Compile-time version of this header; kolo_get_version() gives the library's. */
#define KOLO_VERSION_MAJOR 0
#define KOLO_VERSION_MINOR 1
#define KOLO_VERSION_PATCH 0
#define KOLO_VERSION_CODE \
  (KOLO_VERSION_MAJOR * 10000 + KOLO_VERSION_MINOR * 100 + KOLO_VERSION_PATCH)
/* Bumped only if an existing function or value had to change (never so far). */
#define KOLO_C_ABI_VERSION 1

#if defined(_WIN32)
#define KOLO_C_API
#elif defined(__GNUC__) || defined(__clang__)
#define KOLO_C_API __attribute__((visibility("default")))
#else
#define KOLO_C_API
#endif

/* In C++ the enums get int as their fixed underlying type, so that any int a caller passes (an
 * unknown dtype, a code from a newer library) is a valid value to receive and check; in C they
 * are plain enums. The representation is the same: a 32-bit integer. */
#ifdef __cplusplus
#define KOLO_C_ENUM_BASE : int
#else
#define KOLO_C_ENUM_BASE
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- result codes */

typedef enum kolo_result KOLO_C_ENUM_BASE {
  KOLO_SUCCESS = 0,
  /* A bad argument: NULL handle or pointer, unknown dtype or op, counts that do not fit the
   * communicator, root out of range, overlapping buffers. From a collective: on this rank, or
   * on the rank the message names ("[reported by rank R]"). */
  KOLO_ERR_INVALID_ARGUMENT = 1,
  /* Ranks called a collective with different counts, dtypes, ops, roots or order. */
  KOLO_ERR_MISMATCH = 2,
  /* A rank died, closed its connection or aborted its communicator. */
  KOLO_ERR_PEER_LOST = 3,
  /* A deadline passed (KOLO_TIMEOUT_SECONDS, default 30): a rank that never came. */
  KOLO_ERR_TIMEOUT = 4,
  /* The environment or setup is wrong: a bad KOLO_* variable, no rendezvous address, no secret,
   * a store that cannot be reached or hosted. */
  KOLO_ERR_CONFIG = 5,
  /* Anything else: an operating-system call failed, out of memory, an unexpected failure
   * inside kolo. The message says what. */
  KOLO_ERR_INTERNAL = 6,
  /* A rank revoked the communicator (to shrink it after a failure, or on purpose): every
   * pending and later operation on it fails with this code. */
  KOLO_ERR_REVOKED = 7
} kolo_result_t;

/* ---------------------------------------------------------------- element types and ops */

/* Values equal kolo::DataType's (they travel between ranks and never change). */
typedef enum kolo_dtype KOLO_C_ENUM_BASE {
  KOLO_FLOAT16 = 0,  /* IEEE 754 binary16 (uint16_t bit pattern) */
  KOLO_BFLOAT16 = 1, /* bfloat16 (the top 16 bits of a float) */
  KOLO_FLOAT32 = 2,
  KOLO_FLOAT64 = 3,
  KOLO_INT8 = 4,
  KOLO_UINT8 = 5,
  KOLO_INT32 = 6,
  KOLO_INT64 = 7
} kolo_dtype_t;

/* Values equal kolo::ReduceOp's. average: sum, then one division by the number of ranks per
 * element (integers truncate toward zero). float16 and bfloat16 reduce in float32, one
 * rounding per step. */
typedef enum kolo_op KOLO_C_ENUM_BASE {
  KOLO_SUM = 0,
  KOLO_AVERAGE = 1,
  KOLO_MIN = 2,
  KOLO_MAX = 3,
  KOLO_PRODUCT = 4
} kolo_op_t;

/* ---------------------------------------------------------------- opaque handles */

typedef struct kolo_comm* kolo_comm_t;       /* a communicator */
typedef struct kolo_engine* kolo_engine_t;   /* an asynchronous engine over a communicator */
typedef struct kolo_request* kolo_request_t; /* one enqueued engine operation */

/* ---------------------------------------------------------------- version and errors */

/* The library's version as KOLO_VERSION_CODE computes it (major*10000 + minor*100 + patch). */
KOLO_C_API int kolo_get_version(void);

/* The library's KOLO_C_ABI_VERSION: equal to the header's for a compatible library. */
KOLO_C_API int kolo_get_abi_version(void);

/* A short static description of a result code ("invalid argument", "peer lost", ...); for a
 * value that is not a kolo_result_t, "unknown kolo result code". Never NULL. */
KOLO_C_API const char* kolo_get_error_string(kolo_result_t result);

/* The message of the last call that failed on this thread (what, which call, which ranks),
 * "" if none has. As errno: successful calls leave it alone. Valid until the next kolo_* call
 * on this thread; copy it to keep it. Never NULL. */
KOLO_C_API const char* kolo_get_last_error(void);

/* ---------------------------------------------------------------- communicators */

/* Flags of kolo_comm_init. */
#define KOLO_INIT_HOST_STORE 1u /* rank 0 hosts the rendezvous store at store_address's port */

/* Builds a communicator from the launcher's environment: kolo-run, mpirun with kolo-run's
 * variables, torchrun (MASTER_ADDR/PORT, RANK, WORLD_SIZE), horovodrun, Spark; with no launcher
 * variable at all, a single-rank communicator. A collective of all ranks (rendezvous and
 * connections). The variables: docs/environment.md.
 * Errors: KOLO_ERR_CONFIG (a bad or missing variable), KOLO_ERR_TIMEOUT (a rank never came),
 * KOLO_ERR_INVALID_ARGUMENT (comm is NULL). On failure *comm is set to NULL. */
KOLO_C_API kolo_result_t kolo_comm_init_env(kolo_comm_t* comm);

/* Builds a communicator for rank `rank` of `size` that meets its peers through the kolo store at
 * store_address ("host:port", "[v6]:port"). With KOLO_INIT_HOST_STORE rank 0 starts that store
 * (listening on all interfaces at that port) and the others connect to it, as torchrun's
 * MASTER_ADDR/MASTER_PORT; without it a store must already run there (kolo-run's KOLO_STORE).
 * `secret` (at least 8 characters, the same on every rank) authenticates every connection;
 * NULL takes KOLO_SECRET from the environment. For size 1, store_address and secret may be
 * NULL. The optional KOLO_* knobs (KOLO_TIMEOUT_SECONDS, KOLO_TRANSPORT, ...) still apply.
 * A collective of all ranks.
 * Errors: KOLO_ERR_INVALID_ARGUMENT (rank, size, address, secret or flags malformed),
 * KOLO_ERR_CONFIG, KOLO_ERR_TIMEOUT. On failure *comm is set to NULL. */
KOLO_C_API kolo_result_t kolo_comm_init(kolo_comm_t* comm, int rank, int size,
                                        const char* store_address, const char* secret,
                                        unsigned flags);

/* Closes the communicator and frees it. Not a collective; NULL is accepted. Engines created
 * from it keep working (they own their connections). */
KOLO_C_API kolo_result_t kolo_comm_destroy(kolo_comm_t comm);

/* Tells every other rank that this one is leaving (their pending and next calls fail with
 * KOLO_ERR_PEER_LOST at once instead of timing out), then frees the communicator, as
 * ncclCommAbort. NULL is accepted. */
KOLO_C_API kolo_result_t kolo_comm_abort(kolo_comm_t comm);

/* Marks comm failed on every rank (C++ Communicator::revoke): this rank's pending and later
 * calls on it return KOLO_ERR_REVOKED, and every peer's at their next look at the transport
 * (or KOLO_ERR_PEER_LOST when a peer was lost first). Not a collective, never blocks; why (may
 * be NULL) is carried in the peers' messages. comm must still be destroyed. */
KOLO_C_API kolo_result_t kolo_comm_revoke(kolo_comm_t comm, const char* why);

/* After a failure (or a revoke): the survivors' new communicator in *newcomm (C++
 * Communicator::shrink). A collective of the surviving ranks: they revoke comm, agree through
 * the rendezvous store on who is gone (every rank some survivor saw die, every rank in some
 * survivor's `excluded` list, any rank not arrived within 60 % of the time) and connect the
 * rest, renumbered in their old order. excluded may be NULL when n_excluded is 0;
 * timeout_seconds < 0: min(KOLO_TIMEOUT_SECONDS, 10). comm stays revoked; destroy it.
 * Errors: KOLO_ERR_REVOKED (this rank was excluded by the others), KOLO_ERR_INVALID_ARGUMENT
 * (a rank out of range, or this rank, in excluded), KOLO_ERR_TIMEOUT, KOLO_ERR_PEER_LOST (the
 * rendezvous store is gone: it must outlive the lost ranks, e.g. kolo-run's), KOLO_ERR_INTERNAL
 * (fewer survivors than one). On failure *newcomm is set to NULL. */
KOLO_C_API kolo_result_t kolo_comm_shrink(kolo_comm_t comm, const int* excluded, int n_excluded,
                                          double timeout_seconds, kolo_comm_t* newcomm);

/* Adds `count` new processes to the group (Communicator::grow): a collective of comm's ranks,
 * the members. Rank 0 offers `count` places in the rendezvous store under `token`; `count` new
 * processes call kolo_comm_join(token) and take them in turn. Every member and joiner gets the
 * enlarged communicator in *newcomm (members keep their ranks, joiners come after them). comm
 * stays usable but a store server rank 0 hosts moves to the new one: destroy comm and use
 * *newcomm. timeout_seconds < 0: KOLO_TIMEOUT_SECONDS. Errors: KOLO_ERR_INVALID_ARGUMENT (count
 * below 1, token NULL or empty), KOLO_ERR_CONFIG (the token was used by an earlier grow, members
 * passed different counts, a '/' in the token), KOLO_ERR_TIMEOUT (joiners that did not come: the
 * message says how many did; comm is unchanged), KOLO_ERR_PEER_LOST (a member died). On failure
 * *newcomm is set to NULL. */
KOLO_C_API kolo_result_t kolo_comm_grow(kolo_comm_t comm, int count, const char* token,
                                        double timeout_seconds, kolo_comm_t* newcomm);

/* The new process's side of kolo_comm_grow: meets the members through the store the environment
 * names (KOLO_STORE, KOLO_SECRET, KOLO_JOB_ID: a kolo-run job's ranks' environment without
 * KOLO_RANK/KOLO_SIZE), takes the next place offered under `token` and returns the enlarged
 * communicator in *comm. timeout_seconds < 0: KOLO_TIMEOUT_SECONDS. Errors:
 * KOLO_ERR_INVALID_ARGUMENT (token NULL or empty), KOLO_ERR_CONFIG (every place taken, no
 * KOLO_STORE), KOLO_ERR_TIMEOUT (no grow with that token was offered). On failure *comm is set
 * to NULL. */
KOLO_C_API kolo_result_t kolo_comm_join(const char* token, double timeout_seconds,
                                        kolo_comm_t* comm);

/* This rank (0..size-1), the number of ranks, and this rank's index among / the number of the
 * ranks on its host. */
KOLO_C_API kolo_result_t kolo_comm_rank(kolo_comm_t comm, int* rank);
KOLO_C_API kolo_result_t kolo_comm_size(kolo_comm_t comm, int* size);
KOLO_C_API kolo_result_t kolo_comm_local_rank(kolo_comm_t comm, int* local_rank);
KOLO_C_API kolo_result_t kolo_comm_local_size(kolo_comm_t comm, int* local_size);

/* ---------------------------------------------------------------- collectives
 *
 * Every rank of the communicator calls each collective, in the same order, with matching
 * counts, dtype, op and root. Counts are in elements. Buffers are host memory. A call returns
 * when this rank's part is done.
 *
 * Errors: any failure fails the call on every rank (a bad argument on one rank reaches the
 * others as KOLO_ERR_INVALID_ARGUMENT naming that rank, instead of leaving them to time out),
 * and afterwards the communicator is unusable — every later call returns the same error, as
 * after ncclCommAbort. Destroy it and build a new one. */

/* recvbuf[i] = op over ranks of sendbuf[i], on every rank. In place: sendbuf == recvbuf. */
KOLO_C_API kolo_result_t kolo_allreduce(const void* sendbuf, void* recvbuf, size_t count,
                                        kolo_dtype_t dtype, kolo_op_t op, kolo_comm_t comm);

/* recvbuf (size * sendcount elements) holds rank p's sendbuf as block p. In place: sendbuf ==
 * recvbuf + rank * sendcount elements. */
KOLO_C_API kolo_result_t kolo_allgather(const void* sendbuf, void* recvbuf, size_t sendcount,
                                        kolo_dtype_t dtype, kolo_comm_t comm);

/* Rank p contributes recvcounts[p] elements (sendcount == recvcounts[rank]); recvbuf holds the
 * blocks back to back (sum of recvcounts elements). recvcounts has `size` entries and is the
 * same on every rank. In place: sendbuf == recvbuf + (recvcounts[0] + ... + recvcounts[rank-1])
 * elements. */
KOLO_C_API kolo_result_t kolo_allgatherv(const void* sendbuf, size_t sendcount, void* recvbuf,
                                         const size_t* recvcounts, kolo_dtype_t dtype,
                                         kolo_comm_t comm);

/* Copies root's buf (count elements) into every rank's buf (in place, as ncclBcast). */
KOLO_C_API kolo_result_t kolo_broadcast(void* buf, size_t count, kolo_dtype_t dtype, int root,
                                        kolo_comm_t comm);

/* sendbuf has size * recvcount elements; rank p's recvbuf receives block p of the elementwise
 * reduction. In place: recvbuf == sendbuf + rank * recvcount elements. */
KOLO_C_API kolo_result_t kolo_reduce_scatter(const void* sendbuf, void* recvbuf, size_t recvcount,
                                             kolo_dtype_t dtype, kolo_op_t op, kolo_comm_t comm);

/* sendbuf and recvbuf hold size * count elements each; block j of sendbuf goes to rank j, where
 * it lands as block `rank` of recvbuf. Not in place (the buffers must not overlap). */
KOLO_C_API kolo_result_t kolo_alltoall(const void* sendbuf, void* recvbuf, size_t count,
                                       kolo_dtype_t dtype, kolo_comm_t comm);

/* Returns once every rank has entered it. */
KOLO_C_API kolo_result_t kolo_barrier(kolo_comm_t comm);

/* ---------------------------------------------------------------- the asynchronous engine
 *
 * Horovod's model: operations are enqueued by tensor name from any thread and complete in the
 * background; a progress thread negotiates which names every rank has submitted, fuses small
 * allreduces and runs them. Names identify the same tensor on every rank; a name may be in
 * flight once at a time. Buffers must stay valid and unchanged until the request completes.
 * Engine variables (KOLO_FUSION_THRESHOLD, KOLO_CYCLE_TIME_MS, ...): docs/engine.md. */

/* Starts an engine over comm. A collective of comm's ranks: the engine gets its own
 * connections (a split of comm), so comm stays usable for blocking collectives, from another
 * thread too, and may be destroyed before the engine. */
KOLO_C_API kolo_result_t kolo_engine_create(kolo_engine_t* engine, kolo_comm_t comm);

/* Shuts the engine down on every rank (any rank's shutdown ends it for all, as in Horovod):
 * operations still pending fail. Frees the engine; requests stay valid until freed. NULL is
 * accepted. */
KOLO_C_API kolo_result_t kolo_engine_destroy(kolo_engine_t engine);

/* Enqueues an allreduce of `count` elements under `name`: recvbuf = op over ranks of sendbuf.
 * In place: sendbuf == recvbuf. *request receives the completion handle. */
KOLO_C_API kolo_result_t kolo_engine_allreduce(kolo_engine_t engine, const char* name,
                                               const void* sendbuf, void* recvbuf, size_t count,
                                               kolo_dtype_t dtype, kolo_op_t op,
                                               kolo_request_t* request);

/* Enqueues one in-place allreduce of `n` buffers under one `name`, with one request for all of
 * them (a bucket of gradients; Horovod's grouped allreduce): bufs[i] holds counts[i] elements of
 * `dtype`. Every rank passes the same n and counts, in the same order (else the request fails with
 * KOLO_ERR_MISMATCH on every rank); the buffers must not overlap. Cheaper than n enqueues of
 * small tensors: the engine's per-operation work is done once. */
KOLO_C_API kolo_result_t kolo_engine_allreduce_coalesced(kolo_engine_t engine, const char* name,
                                                         void* const* bufs, const size_t* counts,
                                                         size_t n, kolo_dtype_t dtype, kolo_op_t op,
                                                         kolo_request_t* request);

/* Enqueues an allgather under `name`: counts may differ between ranks. The result (every rank's
 * elements in rank order) is owned by the request: kolo_request_output, kolo_request_counts. */
KOLO_C_API kolo_result_t kolo_engine_allgather(kolo_engine_t engine, const char* name,
                                               const void* sendbuf, size_t count,
                                               kolo_dtype_t dtype, kolo_request_t* request);

/* Enqueues a broadcast of root's buf into every rank's buf (in place) under `name`. */
KOLO_C_API kolo_result_t kolo_engine_broadcast(kolo_engine_t engine, const char* name, void* buf,
                                               size_t count, kolo_dtype_t dtype, int root,
                                               kolo_request_t* request);

/* Never blocks. *done = 1 once the operation has finished, else 0. Returns the operation's
 * result once it has finished with an error (and sets the last error), else KOLO_SUCCESS. */
KOLO_C_API kolo_result_t kolo_request_test(kolo_request_t request, int* done);

/* Blocks until the operation finishes; returns its result (KOLO_ERR_MISMATCH when ranks
 * submitted the name with different parameters, KOLO_ERR_PEER_LOST, KOLO_ERR_TIMEOUT, ...). */
KOLO_C_API kolo_result_t kolo_request_wait(kolo_request_t request);

/* After a successful wait: the output buffer and its element count (allreduce, broadcast: the
 * caller's recvbuf/buf; allgather: memory owned by the request, valid until kolo_request_free;
 * a coalesced allreduce: NULL and 0, its results are in its buffers).
 * Blocks until the operation finishes. */
KOLO_C_API kolo_result_t kolo_request_output(kolo_request_t request, const void** data,
                                             size_t* count);

/* Allgather: the element count each rank contributed. `counts` has room for `n` entries; n must
 * be at least the communicator's size. Blocks until the operation finishes. */
KOLO_C_API kolo_result_t kolo_request_counts(kolo_request_t request, size_t* counts, size_t n);

/* Frees a request (finished or not: an unfinished operation still runs to completion). NULL is
 * accepted. */
KOLO_C_API void kolo_request_free(kolo_request_t request);

#ifdef __cplusplus
}
#endif

#endif /* KOLO_C_KOLO_H */
