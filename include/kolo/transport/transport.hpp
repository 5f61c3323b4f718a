// kolo/transport/transport.hpp — the contract between kolo and a transport, in layers.
//
// Everything Communicator and Engine call on a transport is named here, and nothing else is
// called. The layers (Gloo's Device → Context → Pair split, as C++20 concepts):
//
//  1. PointToPoint: a rank, a size, and non-blocking point-to-point operations that complete in
//     the order they were posted per peer and direction (MPI's non-overtaking rule with one tag).
//     Progress is made by the thread that tests or waits, so a transport needs no thread of its
//     own, and every wait takes a Deadline. `irecv_reduce` lets a transport fold incoming bytes
//     straight into the destination (from a shared-memory slot or a socket staging buffer)
//     instead of landing them in a temporary first: one pass over memory fewer per ring step.
//     A Request is a small value (trivially copyable, at most 16 bytes: TransportRef erases it).
//  2. Abortable: after any error the transport is aborted: every rank receives the error (kind
//     and message) and every later call throws it again, as NCCL does after ncclCommAbort.
//     Build a new communicator to continue. `timeout_seconds` is the deadline of every call.
//  Transport = 1 + 2: what the algorithms need, and all a Communicator needs to adopt one
//  (`Communicator(std::unique_ptr<T>)`).
//
// Optional layers, each used when present:
//  - Connectable: `T::Options::from_env(env)` (read before the rendezvous, so a bad value fails
//    every rank alike) and `T::connect(Bootstrap&, const T::Options&)` returning
//    std::unique_ptr<T>: the one factory through which Communicator(Topology) builds it.
//  - HasPeerRoutes: `Route route_between(a, b) const`, how rank a reaches rank b (shared memory,
//    TCP), the same answer on every rank: the Selector costs each route with its own constants.
//  - HasTopology: `const Topology& topology() const` for a transport built without a Bootstrap.
//  - native collectives: `native_<collective>(...)` returning true when the transport took the
//    call (MPI_Allreduce, ncclAllReduce), false to fall back to kolo's algorithms.
//  - AcceptsDeviceBuffers (`static constexpr bool accepts_device_buffers`) and DeviceFusion
//    (device fusion buffers and pack/unpack kernels, Engine's device path).
//  - VectoredP2P: `isendv`, `irecvv`, `irecv_reducev`, the three operations of layer 1 on a
//    message whose bytes lie in several runs of memory (IoPiece lists; see below). The message
//    on the wire is the same as the contiguous one: a vectored send may meet a plain receive.
//    The ring over a list of tensors (Communicator::allreduce_coalesced, the engine's fused
//    batches) needs it; without it those copy into one buffer first.
//
//  - OrderedErrors: `void begin_call(std::uint64_t seq)`. The communicator numbers its
//    collective calls (Signature::seq, from 1) and calls this as each begins; the transport
//    stamps an error with the call it belongs to and holds a peer's error of a later call until
//    this rank begins that call, so that a call that completed on one rank completes on all and
//    an error caused by call k+1 fails call k+1 everywhere (docs/reliability.md, "The error
//    contract"). Without it a peer's error fails whatever call is running.
//
// `check_transport<T>()` states each requirement as its own static_assert, so a type that misses
// one gets a one-line error naming the member, not a page of failed constraints.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>

#include "kolo/core/deadline.hpp"
#include "kolo/core/dtype.hpp"
#include "kolo/core/env.hpp"
#include "kolo/core/error.hpp"
#include "kolo/core/reduce.hpp"
#include "kolo/core/signature.hpp"
#include "kolo/transport/route.hpp"

namespace kolo {

class Bootstrap;
struct Topology;
struct AlgoOptions;
namespace cuda {
struct FusionItem;
}

// How incoming elements are combined: dst[i] = local[i] (op) incoming[i].
struct ReduceSpec {
  ReduceFn fn = nullptr;
  std::size_t elem_size = 1;
};

// One run of a vectored message (VectoredP2P): `bytes` bytes at `src` (a send's data, a
// reduce's local operand) and/or at `dst` (where a receive lands). A message is the
// concatenation of its runs, in order; a reduce's runs are whole elements.
struct IoPiece {
  std::byte* dst = nullptr;
  const std::byte* src = nullptr;
  std::size_t bytes = 0;
};

// The largest Request a transport may use (TransportRef carries it by value).
inline constexpr std::size_t kMaxRequestBytes = 16;

// ---------------------------------------------------------------- 1. point to point

template <class T>
concept PointToPoint = std::is_trivially_copyable_v<typename T::Request> &&
                       sizeof(typename T::Request) <=
                       kMaxRequestBytes&& requires(T& t, const T& ct, int peer, const void* src,
                                                   void* dst, std::size_t bytes,
                                                   const Signature& sig, const ReduceSpec& rs,
                                                   typename T::Request r, const Deadline& dl) {
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
};

// Optional: the same three operations on messages in pieces. `pieces[0..count)` cover `bytes`
// and must stay valid, like the memory they name, until the request completes.
template <class T>
concept VectoredP2P = requires(T& t, int peer, const IoPiece* pieces, std::size_t count,
                               std::size_t bytes, const Signature& sig, const ReduceSpec& rs) {
  { t.isendv(peer, pieces, count, bytes, sig) } -> std::same_as<typename T::Request>;
  { t.irecvv(peer, pieces, count, bytes, sig) } -> std::same_as<typename T::Request>;
  { t.irecv_reducev(peer, pieces, count, bytes, rs, sig) } -> std::same_as<typename T::Request>;
};

// ---------------------------------------------------------------- 2. errors

template <class T>
concept Abortable = requires(T& t, const T& ct, const Error& err) {
  // Tells every rank about err; later calls on this transport throw it.
  t.abort(err);
  // True once aborted (here, or by a peer whose error has arrived).
  { ct.aborted() } -> std::same_as<bool>;
  // Throws the stored error (only after aborted()).
  ct.rethrow();
  { ct.timeout_seconds() } -> std::convertible_to<double>;
};

template <class T>
concept Transport = PointToPoint<T> && Abortable<T>;

// ---------------------------------------------------------------- optional layers

// Errors ordered by collective call (see the list above).
template <class T>
concept OrderedErrors = requires(T& t, std::uint64_t seq) {
  t.begin_call(seq);
};

template <class T>
concept Connectable = requires(Bootstrap& boot, const typename T::Options& o,
                               const EnvLookup& env) {
  { T::Options::from_env(env) } -> std::same_as<typename T::Options>;
  { T::connect(boot, o) } -> std::same_as<std::unique_ptr<T>>;
};

template <class T>
concept HasPeerRoutes = requires(const T& t, int a, int b) {
  { t.route_between(a, b) } -> std::same_as<Route>;
};

template <class T>
concept HasTopology = requires(const T& t) {
  { t.topology() } -> std::convertible_to<const Topology&>;
};

template <class T>
concept HasNativeAllreduce = requires(T& t, const void* in, void* out, std::size_t n, DataType d,
                                      ReduceOp op, const AlgoOptions& o) {
  { t.native_allreduce(in, out, n, d, op, o) } -> std::same_as<bool>;
};
template <class T>
concept HasNativeAllgatherv = requires(T& t, const void* in, void* out,
                                       std::span<const std::size_t> counts, DataType d,
                                       const AlgoOptions& o) {
  { t.native_allgatherv(in, out, counts, d, o) } -> std::same_as<bool>;
};
template <class T>
concept HasNativeBroadcast = requires(T& t, void* data, std::size_t n, DataType d, int root,
                                      const AlgoOptions& o) {
  { t.native_broadcast(data, n, d, root, o) } -> std::same_as<bool>;
};
template <class T>
concept HasNativeReduceScatter = requires(T& t, const void* in, void* out, std::size_t n,
                                          DataType d, ReduceOp op, const AlgoOptions& o) {
  { t.native_reduce_scatter(in, out, n, d, op, o) } -> std::same_as<bool>;
};
template <class T>
concept HasNativeAlltoall = requires(T& t, const void* in, void* out, std::size_t n, DataType d,
                                     const AlgoOptions& o) {
  { t.native_alltoall(in, out, n, d, o) } -> std::same_as<bool>;
};
template <class T>
concept HasNativeBarrier = requires(T& t, const AlgoOptions& o) {
  { t.native_barrier(o) } -> std::same_as<bool>;
};

// Device buffers reach only transports that declare they take them (NcclTransport,
// CudaStagedTransport); those decide by the pointer itself.
template <class T>
concept AcceptsDeviceBuffers = requires {
  { T::accepts_device_buffers } -> std::convertible_to<bool>;
}
&&T::accepts_device_buffers;

// A transport that takes device tensors and packs fused batches of them on the GPU
// (CudaStagedTransport, NcclTransport): Engine<T> then takes device tensors too.
template <class T>
concept DeviceFusion = requires(T& t, const cuda::FusionItem* items, std::size_t n, DataType d,
                                void* buf, const void* cbuf, double s, int div,
                                const Deadline& dl) {
  { t.device_fusion_buffer(n) } -> std::same_as<std::byte*>;
  t.device_pack(items, n, d, d, buf, s);
  t.device_unpack(items, n, d, d, cbuf, s, div);
  t.device_synchronize(dl, "device work");
  { t.device() } -> std::convertible_to<int>;
};

// ---------------------------------------------------------------- the check

// Every requirement as its own static_assert: `static_assert(check_transport<T>())` (Communicator
// and Engine do) reports the first member T lacks by name. An optional member that exists with
// the wrong signature is reported too (it would otherwise be ignored in silence).
template <class T>
consteval bool check_transport() {
  static_assert(
      requires { typename T::Request; }, "kolo transport: T::Request type is missing");
  static_assert(std::is_trivially_copyable_v<typename T::Request> &&
                    sizeof(typename T::Request) <= kMaxRequestBytes,
                "kolo transport: T::Request must be trivially copyable and at most 16 bytes");
  static_assert(
      requires(const T& t) {
        { t.rank() } -> std::convertible_to<int>;
      },
      "kolo transport: missing `int rank() const`");
  static_assert(
      requires(const T& t) {
        { t.size() } -> std::convertible_to<int>;
      },
      "kolo transport: missing `int size() const`");
  static_assert(
      requires(T & t, const void* s, const Signature& g) {
        { t.isend(0, s, std::size_t{0}, g) } -> std::same_as<typename T::Request>;
      },
      "kolo transport: missing `Request isend(int peer, const void*, size_t, const Signature&)`");
  static_assert(
      requires(T & t, void* d, const Signature& g) {
        { t.irecv(0, d, std::size_t{0}, g) } -> std::same_as<typename T::Request>;
      },
      "kolo transport: missing `Request irecv(int peer, void*, size_t, const Signature&)`");
  static_assert(
      requires(T & t, void* d, const void* s, const ReduceSpec& rs, const Signature& g) {
        { t.irecv_reduce(0, d, s, std::size_t{0}, rs, g) } -> std::same_as<typename T::Request>;
      },
      "kolo transport: missing `Request irecv_reduce(int peer, void* dst, const void* local, "
      "size_t, const ReduceSpec&, const Signature&)`");
  static_assert(
      requires(const T& t, typename T::Request r) {
        { t.done(r) } -> std::same_as<bool>;
      },
      "kolo transport: missing `bool done(Request) const`");
  static_assert(
      requires(T & t, typename T::Request r) {
        { t.test(r) } -> std::same_as<bool>;
      },
      "kolo transport: missing `bool test(Request)`");
  static_assert(
      requires(T & t, typename T::Request r, const Deadline& dl) { t.wait(r, dl); },
      "kolo transport: missing `void wait(Request, const Deadline&)`");
  static_assert(
      requires(T & t, const Deadline& dl) { t.wait_any_progress(dl); },
      "kolo transport: missing `void wait_any_progress(const Deadline&)`");
  static_assert(
      requires(T & t, const Error& e) { t.abort(e); },
      "kolo transport: missing `void abort(const Error&)`");
  static_assert(
      requires(const T& t) {
        { t.aborted() } -> std::same_as<bool>;
      },
      "kolo transport: missing `bool aborted() const`");
  static_assert(
      requires(const T& t) { t.rethrow(); },
      "kolo transport: missing `[[noreturn]] void rethrow() const`");
  static_assert(
      requires(const T& t) {
        { t.timeout_seconds() } -> std::convertible_to<double>;
      },
      "kolo transport: missing `double timeout_seconds() const`");
  // Optional members: present means used, so a wrong signature must not pass unnoticed.
  if constexpr (requires { &T::native_allreduce; }) {
    static_assert(HasNativeAllreduce<T>,
                  "kolo transport: native_allreduce must be `bool native_allreduce(const void* "
                  "in, void* out, size_t n, DataType, ReduceOp, const AlgoOptions&)`");
  }
  if constexpr (requires { &T::native_allgatherv; }) {
    static_assert(HasNativeAllgatherv<T>,
                  "kolo transport: native_allgatherv must be `bool native_allgatherv(const void*, "
                  "void*, std::span<const size_t> counts, DataType, const AlgoOptions&)`");
  }
  if constexpr (requires { &T::native_broadcast; }) {
    static_assert(HasNativeBroadcast<T>,
                  "kolo transport: native_broadcast must be `bool native_broadcast(void* data, "
                  "size_t n, DataType, int root, const AlgoOptions&)`");
  }
  if constexpr (requires { &T::native_reduce_scatter; }) {
    static_assert(HasNativeReduceScatter<T>,
                  "kolo transport: native_reduce_scatter must be `bool native_reduce_scatter("
                  "const void* in, void* out, size_t n, DataType, ReduceOp, const AlgoOptions&)`");
  }
  if constexpr (requires { &T::native_alltoall; }) {
    static_assert(HasNativeAlltoall<T>,
                  "kolo transport: native_alltoall must be `bool native_alltoall(const void* in, "
                  "void* out, size_t n, DataType, const AlgoOptions&)`");
  }
  if constexpr (requires { &T::native_barrier; }) {
    static_assert(HasNativeBarrier<T>,
                  "kolo transport: native_barrier must be `bool native_barrier(const "
                  "AlgoOptions&)`");
  }
  if constexpr (
      requires { &T::isendv; } || requires { &T::irecvv; } || requires { &T::irecv_reducev; }) {
    static_assert(VectoredP2P<T>,
                  "kolo transport: vectored messages need all three of `Request isendv(int peer, "
                  "const IoPiece*, size_t count, size_t bytes, const Signature&)`, irecvv (the "
                  "same) and `irecv_reducev(int, const IoPiece*, size_t, size_t, const "
                  "ReduceSpec&, const Signature&)`");
  }
  if constexpr (requires { &T::route_between; }) {
    static_assert(HasPeerRoutes<T>,
                  "kolo transport: route_between must be `Route route_between(int a, int b) "
                  "const`");
  }
  if constexpr (requires { &T::connect; }) {
    static_assert(
        requires { typename T::Options; }, "kolo transport: T::connect needs a T::Options type");
    static_assert(
        requires(const EnvLookup& env) {
          { T::Options::from_env(env) } -> std::same_as<typename T::Options>;
        },
        "kolo transport: missing `static Options Options::from_env(const EnvLookup&)`");
    static_assert(Connectable<T>,
                  "kolo transport: connect must be `static std::unique_ptr<T> "
                  "connect(Bootstrap&, const Options&)`");
  }
  return true;
}

}  // namespace kolo
