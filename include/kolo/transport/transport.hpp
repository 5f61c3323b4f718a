// kolo/transport/transport.hpp — the contract between algorithms and transports.
//
// Algorithms see only this: a rank, a size, and non-blocking point-to-point operations that
// complete in the order they were posted per peer and direction (MPI's non-overtaking rule with
// one tag). Progress is made by the thread that tests or waits, so a transport needs no thread
// of its own, and every wait takes a Deadline. `irecv_reduce` lets a transport fold incoming
// bytes straight into the destination (from a shared-memory slot or a socket staging buffer)
// instead of landing them in a temporary first: one pass over memory fewer per ring step.
//
// After any error the transport is aborted: every rank receives the error (kind and message)
// and every later call throws it again, as NCCL does after ncclCommAbort. Build a new
// communicator to continue.
#pragma once

#include <concepts>
#include <cstddef>

#include "kolo/core/deadline.hpp"
#include "kolo/core/dtype.hpp"
#include "kolo/core/error.hpp"
#include "kolo/core/reduce.hpp"
#include "kolo/core/signature.hpp"

namespace kolo {

// How incoming elements are combined: dst[i] = local[i] (op) incoming[i].
struct ReduceSpec {
  ReduceFn fn = nullptr;
  std::size_t elem_size = 1;
};

template <class T>
concept Transport = requires(T& t, const T& ct, int peer, const void* src, void* dst,
                             std::size_t bytes, const Signature& sig, const ReduceSpec& rs,
                             typename T::Request r, const Deadline& dl, const Error& err) {
  { ct.rank() } -> std::convertible_to<int>;
  { ct.size() } -> std::convertible_to<int>;
  // Posts a send of `bytes` bytes; `src` must stay valid until the request completes.
  { t.isend(peer, src, bytes, sig) } -> std::same_as<typename T::Request>;
  // Posts a receive of exactly `bytes` bytes into dst.
  { t.irecv(peer, dst, bytes, sig) } -> std::same_as<typename T::Request>;
  // Posts a receive that stores dst = src (op) incoming, element by element.
  { t.irecv_reduce(peer, dst, src, bytes, rs, sig) } -> std::same_as<typename T::Request>;
  // True once r has completed (no progress is made; handles stay valid to ask forever).
  { ct.done(r) } -> std::same_as<bool>;
  // Makes progress without blocking; true when r has completed.
  { t.test(r) } -> std::same_as<bool>;
  // Blocks until r completes or the deadline passes (TimeoutError).
  t.wait(r, dl);
  // Blocks until at least one posted request completes or the deadline passes.
  t.wait_any_progress(dl);
  // Tells every rank about err; later calls on this transport throw it.
  t.abort(err);
  { ct.timeout_seconds() } -> std::convertible_to<double>;
};

}  // namespace kolo
