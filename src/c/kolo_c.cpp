// kolo_c.cpp — the C ABI (include/kolo/c/kolo.h) over kolo's public C++ API.
//
// A thin layer: each function checks what the C types cannot express (handles, enum values,
// flags), then calls Communicator<> or Engine<> and turns every exception into a kolo_result_t
// and a per-thread message. Nothing here knows about algorithms or transports, so the layer
// builds the same against the header-only library and against a compiled core.
//
// Two rules hold for every function below:
//   - no exception leaves it (each body runs inside guard(), which catches everything);
//   - an argument error inside a collective must reach the other ranks, as kolo's own argument
//     errors do: the C-side checks of a collective refuse the call through the communicator
//     with the same ConfigError, so the peers' matching call fails at once instead of waiting
//     for a deadline (and none of their earlier calls does).
#include "kolo/c/kolo.h"

#include <cstddef>
#include <exception>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kolo/communicator.hpp"
#include "kolo/core/arg_checks.hpp"
#include "kolo/core/checked_size.hpp"
#include "kolo/core/dtype.hpp"
#include "kolo/core/error.hpp"
#include "kolo/core/tensor.hpp"
#include "kolo/engine/engine.hpp"
#include "kolo/engine/handle.hpp"
#include "kolo/net/socket.hpp"
#include "kolo/topology/topology.hpp"

using Comm = kolo::Communicator<>;
using Eng = kolo::Engine<>;

struct kolo_comm {
  Comm comm;
};

struct kolo_engine {
  std::unique_ptr<Eng> engine;
};

struct kolo_request {
  kolo::Handle handle;
  bool allgather = false;
};

// The C enums are kolo's enums; a renumbering on either side must fail the build.
static_assert(static_cast<int>(kolo::DataType::float16) == KOLO_FLOAT16);
static_assert(static_cast<int>(kolo::DataType::bfloat16) == KOLO_BFLOAT16);
static_assert(static_cast<int>(kolo::DataType::float32) == KOLO_FLOAT32);
static_assert(static_cast<int>(kolo::DataType::float64) == KOLO_FLOAT64);
static_assert(static_cast<int>(kolo::DataType::int8) == KOLO_INT8);
static_assert(static_cast<int>(kolo::DataType::uint8) == KOLO_UINT8);
static_assert(static_cast<int>(kolo::DataType::int32) == KOLO_INT32);
static_assert(static_cast<int>(kolo::DataType::int64) == KOLO_INT64);
static_assert(static_cast<int>(kolo::ReduceOp::sum) == KOLO_SUM);
static_assert(static_cast<int>(kolo::ReduceOp::average) == KOLO_AVERAGE);
static_assert(static_cast<int>(kolo::ReduceOp::min) == KOLO_MIN);
static_assert(static_cast<int>(kolo::ReduceOp::max) == KOLO_MAX);
static_assert(static_cast<int>(kolo::ReduceOp::product) == KOLO_PRODUCT);

namespace {

thread_local std::string last_error;

// What a ConfigError means depends on where it came from: while building a communicator or an
// engine it is the environment or setup (KOLO_ERR_CONFIG); from a collective or an enqueue it is
// an argument (this rank's, or the one the message names).
enum class Phase { setup, call };

// An argument error found by the C layer itself, before anything was sent.
struct InvalidArgument {
  std::string what;
};

kolo_result_t fail(kolo_result_t code, const char* fn, const char* what) noexcept {
  try {
    last_error.assign(fn);
    last_error.append(": ");
    last_error.append(what);
  } catch (...) {
    // Out of memory for the message itself: keep the code and as much text as there is.
  }
  return code;
}

kolo_result_t code_of(const kolo::Error& e, Phase phase) noexcept {
  switch (e.kind()) {
    case kolo::ErrorKind::timeout:
      return KOLO_ERR_TIMEOUT;
    case kolo::ErrorKind::peer_lost:
      return KOLO_ERR_PEER_LOST;
    case kolo::ErrorKind::mismatch:
      return KOLO_ERR_MISMATCH;
    case kolo::ErrorKind::config:
      return phase == Phase::setup ? KOLO_ERR_CONFIG : KOLO_ERR_INVALID_ARGUMENT;
    case kolo::ErrorKind::revoked:
      return KOLO_ERR_REVOKED;
    case kolo::ErrorKind::generic:
      break;
  }
  return KOLO_ERR_INTERNAL;
}

// Runs body; every exception becomes a code and this thread's last error.
template <class Body>
kolo_result_t guard(const char* fn, Phase phase, Body&& body) noexcept {
  try {
    body();
    return KOLO_SUCCESS;
  } catch (const InvalidArgument& e) {
    return fail(KOLO_ERR_INVALID_ARGUMENT, fn, e.what.c_str());
  } catch (const kolo::Error& e) {
    return fail(code_of(e, phase), fn, e.what());
  } catch (const std::bad_alloc&) {
    return fail(KOLO_ERR_INTERNAL, fn, "out of memory");
  } catch (const std::exception& e) {
    return fail(KOLO_ERR_INTERNAL, fn, e.what());
  } catch (...) {
    return fail(KOLO_ERR_INTERNAL, fn, "unknown exception");
  }
}

// The enum codes' checks and messages are kolo's (core/arg_checks.hpp), shared with the C++ API.
bool valid_dtype(kolo_dtype_t d) {
  return kolo::checks::valid_dtype_code(static_cast<int>(d));
}
bool valid_op(kolo_op_t op) {
  return kolo::checks::valid_op_code(static_cast<int>(op));
}
static_assert(KOLO_FLOAT16 == 0 && KOLO_INT64 == 7 && KOLO_SUM == 0 && KOLO_PRODUCT == 4,
              "kolo::checks' code ranges and messages name these values");

Comm& comm_of(kolo_comm_t c) {
  if (c == nullptr) throw InvalidArgument{"comm is NULL"};
  return c->comm;
}

// The C-side checks of a collective's arguments. A failure is refused through the communicator
// (Communicator::refuse) with the same message, so that the other ranks' matching call fails
// too (KOLO_ERR_INVALID_ARGUMENT naming this rank) instead of waiting for this one until the
// deadline, while their earlier calls still complete.
void check_collective(Comm& comm, const char* fn, std::optional<kolo_dtype_t> dtype,
                      std::optional<kolo_op_t> op) {
  std::string why;
  if (dtype && !valid_dtype(*dtype)) {
    why = kolo::checks::dtype_code_problem(static_cast<int>(*dtype));
  } else if (op && !valid_op(*op)) {
    why = kolo::checks::op_code_problem(static_cast<int>(*op));
  }
  if (why.empty()) return;
  const std::string what =
      why + " (passed to " + fn + " on rank " + std::to_string(comm.rank()) + ")";
  comm.refuse(kolo::ConfigError(what));  // the peers' matching call fails, not an earlier one
  throw InvalidArgument{why};
}

kolo::DataType dt(kolo_dtype_t d) {
  return static_cast<kolo::DataType>(d);
}
kolo::ReduceOp rop(kolo_op_t op) {
  return static_cast<kolo::ReduceOp>(op);
}

kolo::TensorView view(const void* p, std::size_t n, kolo_dtype_t d) {
  return kolo::TensorView(const_cast<void*>(p), n, dt(d));
}

template <class T>
T* out_param(T* p, const char* name) {
  if (p == nullptr) throw InvalidArgument{std::string(name) + " is NULL"};
  return p;
}

Eng& engine_of(kolo_engine_t e) {
  if (e == nullptr) throw InvalidArgument{"engine is NULL"};
  return *e->engine;
}

// Checks an enqueue's arguments on this rank (an engine's errors at enqueue are local: the
// others see the name as not submitted, which the stall inspector reports).
std::string name_of(const char* name, kolo_dtype_t dtype, kolo_request_t* request) {
  if (name == nullptr) throw InvalidArgument{"name is NULL"};
  if (request == nullptr) throw InvalidArgument{"request is NULL"};
  if (!valid_dtype(dtype)) {
    throw InvalidArgument{kolo::checks::dtype_code_problem(static_cast<int>(dtype))};
  }
  return std::string(name);
}

kolo_request& request_of(kolo_request_t r) {
  if (r == nullptr) throw InvalidArgument{"request is NULL"};
  return *r;
}

}  // namespace

extern "C" {

// ---------------------------------------------------------------- version and errors

int kolo_get_version(void) {
  return KOLO_VERSION_CODE;
}

int kolo_get_abi_version(void) {
  return KOLO_C_ABI_VERSION;
}

const char* kolo_get_error_string(kolo_result_t result) {
  switch (result) {
    case KOLO_SUCCESS:
      return "success";
    case KOLO_ERR_INVALID_ARGUMENT:
      return "invalid argument";
    case KOLO_ERR_MISMATCH:
      return "ranks called the collective with different arguments";
    case KOLO_ERR_PEER_LOST:
      return "peer lost";
    case KOLO_ERR_TIMEOUT:
      return "timeout";
    case KOLO_ERR_CONFIG:
      return "configuration error";
    case KOLO_ERR_INTERNAL:
      return "internal error";
    case KOLO_ERR_REVOKED:
      return "communicator revoked";
  }
  return "unknown kolo result code";
}

const char* kolo_get_last_error(void) {
  return last_error.c_str();
}

// ---------------------------------------------------------------- communicators

kolo_result_t kolo_comm_init_env(kolo_comm_t* comm) {
  if (comm == nullptr) return fail(KOLO_ERR_INVALID_ARGUMENT, "kolo_comm_init_env", "comm is NULL");
  *comm = nullptr;
  return guard("kolo_comm_init_env", Phase::setup,
               [&] { *comm = new kolo_comm{Comm::from_env()}; });
}

kolo_result_t kolo_comm_init(kolo_comm_t* comm, int rank, int size, const char* store_address,
                             const char* secret, unsigned flags) {
  if (comm == nullptr) return fail(KOLO_ERR_INVALID_ARGUMENT, "kolo_comm_init", "comm is NULL");
  *comm = nullptr;
  kolo::Topology topo;
  // The arguments first: what is wrong with them is the caller's, not the environment's.
  const kolo_result_t checked = guard("kolo_comm_init", Phase::call, [&] {
    if (size < 1) throw InvalidArgument{"size " + std::to_string(size) + " is below 1"};
    if (rank < 0 || rank >= size) {
      throw InvalidArgument{"rank " + std::to_string(rank) + " is not in 0.." +
                            std::to_string(size - 1)};
    }
    if ((flags & ~KOLO_INIT_HOST_STORE) != 0) {
      throw InvalidArgument{"flags " + std::to_string(flags) +
                            " has bits other than KOLO_INIT_HOST_STORE"};
    }
    if (store_address == nullptr && size > 1) {
      throw InvalidArgument{"store_address is NULL: " + std::to_string(size) +
                            " ranks need a rendezvous address (\"host:port\")"};
    }
    if (secret != nullptr && std::string(secret).size() < 8 && size > 1) {
      throw InvalidArgument{
          "secret is too short (use at least 8 characters, the same on every "
          "rank, e.g. 32 random hex digits)"};
    }
    if (store_address != nullptr) {
      topo.store = kolo::net::parse_host_port(store_address, "store_address");
    }
  });
  if (checked != KOLO_SUCCESS) return checked;
  return guard("kolo_comm_init", Phase::setup, [&] {
    auto store = topo.store;
    topo = kolo::Topology::for_rank(rank, size);  // KOLO_SECRET and the optional knobs
    topo.store = store;
    if (secret != nullptr) topo.secret = secret;
    if (size > 1 && topo.secret.empty()) {
      throw kolo::ConfigError(
          "no secret: pass one (at least 8 characters, the same on every rank) or set "
          "KOLO_SECRET");
    }
    topo.host_store = (flags & KOLO_INIT_HOST_STORE) != 0 && rank == 0 && store.has_value();
    *comm = new kolo_comm{Comm(std::move(topo))};
  });
}

kolo_result_t kolo_comm_destroy(kolo_comm_t comm) {
  return guard("kolo_comm_destroy", Phase::call, [&] { delete comm; });
}

kolo_result_t kolo_comm_abort(kolo_comm_t comm) {
  return guard("kolo_comm_abort", Phase::call, [&] {
    if (comm == nullptr) return;
    std::unique_ptr<kolo_comm> owned(comm);
    auto& t = owned->comm.transport();
    if (!t.aborted()) {
      t.abort(kolo::PeerLostError("rank " + std::to_string(owned->comm.rank()) +
                                  " aborted the communicator (kolo_comm_abort)"));
    }
  });
}

kolo_result_t kolo_comm_revoke(kolo_comm_t comm, const char* why) {
  return guard("kolo_comm_revoke", Phase::call,
               [&] { comm_of(comm).revoke(why == nullptr ? "" : why); });
}

kolo_result_t kolo_comm_shrink(kolo_comm_t comm, const int* excluded, int n_excluded,
                               double timeout_seconds, kolo_comm_t* newcomm) {
  if (newcomm == nullptr)
    return fail(KOLO_ERR_INVALID_ARGUMENT, "kolo_comm_shrink", "newcomm is NULL");
  *newcomm = nullptr;
  return guard("kolo_comm_shrink", Phase::call, [&] {
    Comm& c = comm_of(comm);
    if (n_excluded < 0)
      throw InvalidArgument{"n_excluded " + std::to_string(n_excluded) + " is below 0"};
    if (n_excluded > 0 && excluded == nullptr) {
      throw InvalidArgument{"excluded is NULL with n_excluded " + std::to_string(n_excluded)};
    }
    std::vector<int> ex;
    if (n_excluded > 0) ex.assign(excluded, excluded + n_excluded);
    kolo::ShrinkOptions so;
    so.timeout_seconds = timeout_seconds;
    *newcomm = new kolo_comm{c.shrink(ex, so)};
  });
}

kolo_result_t kolo_comm_grow(kolo_comm_t comm, int count, const char* token, double timeout_seconds,
                             kolo_comm_t* newcomm) {
  if (newcomm == nullptr)
    return fail(KOLO_ERR_INVALID_ARGUMENT, "kolo_comm_grow", "newcomm is NULL");
  *newcomm = nullptr;
  const kolo_result_t checked = guard("kolo_comm_grow", Phase::call, [&] {
    (void)comm_of(comm);
    if (count < 1) throw InvalidArgument{"count " + std::to_string(count) + " is below 1"};
    if (token == nullptr || *token == '\0') throw InvalidArgument{"token is NULL or empty"};
  });
  if (checked != KOLO_SUCCESS) return checked;
  // Setup errors (a used token, members that disagree) are KOLO_ERR_CONFIG.
  return guard("kolo_comm_grow", Phase::setup, [&] {
    kolo::GrowOptions go;
    go.token = token;
    go.timeout_seconds = timeout_seconds;
    *newcomm = new kolo_comm{comm->comm.grow(count, go)};
  });
}

kolo_result_t kolo_comm_join(const char* token, double timeout_seconds, kolo_comm_t* comm) {
  if (comm == nullptr) return fail(KOLO_ERR_INVALID_ARGUMENT, "kolo_comm_join", "comm is NULL");
  *comm = nullptr;
  if (token == nullptr || *token == '\0') {
    return fail(KOLO_ERR_INVALID_ARGUMENT, "kolo_comm_join", "token is NULL or empty");
  }
  return guard("kolo_comm_join", Phase::setup, [&] {
    kolo::JoinOptions jo;
    jo.timeout_seconds = timeout_seconds;
    *comm = new kolo_comm{Comm::join(token, jo)};
  });
}

kolo_result_t kolo_comm_rank(kolo_comm_t comm, int* rank) {
  return guard("kolo_comm_rank", Phase::call,
               [&] { *out_param(rank, "rank") = comm_of(comm).rank(); });
}

kolo_result_t kolo_comm_size(kolo_comm_t comm, int* size) {
  return guard("kolo_comm_size", Phase::call,
               [&] { *out_param(size, "size") = comm_of(comm).size(); });
}

kolo_result_t kolo_comm_local_rank(kolo_comm_t comm, int* local_rank) {
  return guard("kolo_comm_local_rank", Phase::call,
               [&] { *out_param(local_rank, "local_rank") = comm_of(comm).local_rank(); });
}

kolo_result_t kolo_comm_local_size(kolo_comm_t comm, int* local_size) {
  return guard("kolo_comm_local_size", Phase::call,
               [&] { *out_param(local_size, "local_size") = comm_of(comm).local_size(); });
}

// ---------------------------------------------------------------- collectives

kolo_result_t kolo_allreduce(const void* sendbuf, void* recvbuf, size_t count, kolo_dtype_t dtype,
                             kolo_op_t op, kolo_comm_t comm) {
  return guard("kolo_allreduce", Phase::call, [&] {
    Comm& c = comm_of(comm);
    check_collective(c, "kolo_allreduce", dtype, op);
    c.allreduce(view(sendbuf, count, dtype), view(recvbuf, count, dtype), rop(op));
  });
}

kolo_result_t kolo_allgather(const void* sendbuf, void* recvbuf, size_t sendcount,
                             kolo_dtype_t dtype, kolo_comm_t comm) {
  return guard("kolo_allgather", Phase::call, [&] {
    Comm& c = comm_of(comm);
    check_collective(c, "kolo_allgather", dtype, std::nullopt);
    c.allgather(
        view(sendbuf, sendcount, dtype),
        view(recvbuf, kolo::detail::saturating_mul(sendcount, static_cast<std::size_t>(c.size())),
             dtype));
  });
}

kolo_result_t kolo_allgatherv(const void* sendbuf, size_t sendcount, void* recvbuf,
                              const size_t* recvcounts, kolo_dtype_t dtype, kolo_comm_t comm) {
  return guard("kolo_allgatherv", Phase::call, [&] {
    Comm& c = comm_of(comm);
    check_collective(c, "kolo_allgatherv", dtype, std::nullopt);
    if (recvcounts == nullptr) {
      // Through the communicator, so that the other ranks fail too (an empty counts array has
      // the wrong length on every communicator).
      c.allgatherv(view(sendbuf, sendcount, dtype), view(recvbuf, 0, dtype), {});
      return;
    }
    const std::span<const std::size_t> counts(recvcounts, static_cast<std::size_t>(c.size()));
    std::size_t total = 0;
    for (std::size_t n : counts) total = kolo::detail::saturating_add(total, n);
    c.allgatherv(view(sendbuf, sendcount, dtype), view(recvbuf, total, dtype), counts);
  });
}

kolo_result_t kolo_broadcast(void* buf, size_t count, kolo_dtype_t dtype, int root,
                             kolo_comm_t comm) {
  return guard("kolo_broadcast", Phase::call, [&] {
    Comm& c = comm_of(comm);
    check_collective(c, "kolo_broadcast", dtype, std::nullopt);
    c.broadcast(view(buf, count, dtype), root);
  });
}

kolo_result_t kolo_reduce_scatter(const void* sendbuf, void* recvbuf, size_t recvcount,
                                  kolo_dtype_t dtype, kolo_op_t op, kolo_comm_t comm) {
  return guard("kolo_reduce_scatter", Phase::call, [&] {
    Comm& c = comm_of(comm);
    check_collective(c, "kolo_reduce_scatter", dtype, op);
    c.reduce_scatter(
        view(sendbuf, kolo::detail::saturating_mul(recvcount, static_cast<std::size_t>(c.size())),
             dtype),
        view(recvbuf, recvcount, dtype), rop(op));
  });
}

kolo_result_t kolo_alltoall(const void* sendbuf, void* recvbuf, size_t count, kolo_dtype_t dtype,
                            kolo_comm_t comm) {
  return guard("kolo_alltoall", Phase::call, [&] {
    Comm& c = comm_of(comm);
    check_collective(c, "kolo_alltoall", dtype, std::nullopt);
    // Saturating: a wrapped product would pass as a small buffer; SIZE_MAX is refused.
    const std::size_t total =
        kolo::detail::saturating_mul(count, static_cast<std::size_t>(c.size()));
    c.alltoall(view(sendbuf, total, dtype), view(recvbuf, total, dtype));
  });
}

kolo_result_t kolo_barrier(kolo_comm_t comm) {
  return guard("kolo_barrier", Phase::call, [&] { comm_of(comm).barrier(); });
}

// ---------------------------------------------------------------- the asynchronous engine

kolo_result_t kolo_engine_create(kolo_engine_t* engine, kolo_comm_t comm) {
  if (engine == nullptr) {
    return fail(KOLO_ERR_INVALID_ARGUMENT, "kolo_engine_create", "engine is NULL");
  }
  *engine = nullptr;
  return guard("kolo_engine_create", Phase::setup, [&] {
    Comm& c = comm_of(comm);
    // A communicator of its own (color 0 for every rank, same order): the engine's progress
    // thread then never shares connections with the caller's blocking collectives.
    std::optional<Comm> own = c.split(0, c.rank());
    auto e = std::make_unique<kolo_engine>();
    e->engine = std::make_unique<Eng>(std::move(*own));
    *engine = e.release();
  });
}

kolo_result_t kolo_engine_destroy(kolo_engine_t engine) {
  return guard("kolo_engine_destroy", Phase::call, [&] {
    std::unique_ptr<kolo_engine> owned(engine);
    if (owned) owned->engine->shutdown();
  });
}

kolo_result_t kolo_engine_allreduce(kolo_engine_t engine, const char* name, const void* sendbuf,
                                    void* recvbuf, size_t count, kolo_dtype_t dtype, kolo_op_t op,
                                    kolo_request_t* request) {
  if (request != nullptr) *request = nullptr;
  return guard("kolo_engine_allreduce", Phase::call, [&] {
    Eng& e = engine_of(engine);
    std::string n = name_of(name, dtype, request);
    if (!valid_op(op)) throw InvalidArgument{kolo::checks::op_code_problem(static_cast<int>(op))};
    auto r = std::make_unique<kolo_request>();
    r->handle = e.allreduce_async(std::move(n), view(sendbuf, count, dtype), rop(op), 1.0, 1.0,
                                  view(recvbuf, count, dtype));
    *request = r.release();
  });
}

kolo_result_t kolo_engine_allreduce_coalesced(kolo_engine_t engine, const char* name,
                                              void* const* bufs, const size_t* counts, size_t n,
                                              kolo_dtype_t dtype, kolo_op_t op,
                                              kolo_request_t* request) {
  if (request != nullptr) *request = nullptr;
  return guard("kolo_engine_allreduce_coalesced", Phase::call, [&] {
    Eng& e = engine_of(engine);
    std::string nm = name_of(name, dtype, request);
    if (!valid_op(op)) throw InvalidArgument{kolo::checks::op_code_problem(static_cast<int>(op))};
    if (n == 0) throw InvalidArgument{"n is 0: a coalesced allreduce needs at least one buffer"};
    if (bufs == nullptr) throw InvalidArgument{"bufs is NULL"};
    if (counts == nullptr) throw InvalidArgument{"counts is NULL"};
    std::vector<kolo::TensorView> views;
    views.reserve(n);
    for (size_t i = 0; i < n; ++i) views.push_back(view(bufs[i], counts[i], dtype));
    auto r = std::make_unique<kolo_request>();
    r->handle = e.allreduce_coalesced_async(nm, views, rop(op));
    *request = r.release();
  });
}

kolo_result_t kolo_engine_allgather(kolo_engine_t engine, const char* name, const void* sendbuf,
                                    size_t count, kolo_dtype_t dtype, kolo_request_t* request) {
  if (request != nullptr) *request = nullptr;
  return guard("kolo_engine_allgather", Phase::call, [&] {
    Eng& e = engine_of(engine);
    std::string n = name_of(name, dtype, request);
    auto r = std::make_unique<kolo_request>();
    r->allgather = true;
    r->handle = e.allgather_async(std::move(n), view(sendbuf, count, dtype));
    *request = r.release();
  });
}

kolo_result_t kolo_engine_broadcast(kolo_engine_t engine, const char* name, void* buf, size_t count,
                                    kolo_dtype_t dtype, int root, kolo_request_t* request) {
  if (request != nullptr) *request = nullptr;
  return guard("kolo_engine_broadcast", Phase::call, [&] {
    Eng& e = engine_of(engine);
    std::string n = name_of(name, dtype, request);
    auto r = std::make_unique<kolo_request>();
    r->handle = e.broadcast_async(std::move(n), view(buf, count, dtype), root);
    *request = r.release();
  });
}

kolo_result_t kolo_request_test(kolo_request_t request, int* done) {
  return guard("kolo_request_test", Phase::call, [&] {
    kolo_request& r = request_of(request);
    int* d = out_param(done, "done");
    *d = 0;
    if (!r.handle.ready()) return;
    *d = 1;
    r.handle.wait();  // finished: returns at once, or rethrows the operation's error
  });
}

kolo_result_t kolo_request_wait(kolo_request_t request) {
  return guard("kolo_request_wait", Phase::call, [&] { request_of(request).handle.wait(); });
}

kolo_result_t kolo_request_output(kolo_request_t request, const void** data, size_t* count) {
  return guard("kolo_request_output", Phase::call, [&] {
    kolo_request& r = request_of(request);
    out_param(data, "data");
    out_param(count, "count");
    const kolo::TensorView v = r.handle.output();
    *data = v.data;
    *count = v.count;
  });
}

kolo_result_t kolo_request_counts(kolo_request_t request, size_t* counts, size_t n) {
  return guard("kolo_request_counts", Phase::call, [&] {
    kolo_request& r = request_of(request);
    out_param(counts, "counts");
    if (!r.allgather) throw InvalidArgument{"the request is not an allgather"};
    const std::vector<std::size_t>& c = r.handle.counts();
    if (n < c.size()) {
      throw InvalidArgument{"counts has room for " + std::to_string(n) + " entries, the job has " +
                            std::to_string(c.size()) + " ranks"};
    }
    for (std::size_t i = 0; i < c.size(); ++i) counts[i] = c[i];
  });
}

void kolo_request_free(kolo_request_t request) {
  (void)guard("kolo_request_free", Phase::call, [&] { delete request; });
}

}  // extern "C"
