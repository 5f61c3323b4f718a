// kolo/engine/engine.hpp — asynchronous named collectives with negotiation and tensor fusion:
// what Horovod's C++ core does, on top of a kolo Communicator.
//
// The caller enqueues named tensors (allreduce_async, allgather_async, broadcast_async,
// grouped_allreduce_async) from any thread and gets a Handle. A progress thread owns the
// communicator and runs cycles; in each cycle all ranks agree which names are ready on every
// rank, fuse ready allreduces of one dtype/op/scaling into the FusionBuffer, run one collective
// per fused buffer, and complete the handles. Ranks may submit names in any order.
//
// Negotiation is replicated rather than centralised: every rank runs the same deterministic
// coordinator over the same data, so no rank has to broadcast decisions.
//  * Steady state (every name seen before): one min-allreduce over a byte vector — per cached
//    tensor a "pending here" byte (min = AND across ranks: ready everywhere) and a "still valid"
//    byte, plus flags (shutdown, someone has new names, per-rank joined). This is Horovod's
//    response cache with its bitwise-AND fast path, one byte per tensor instead of one bit
//    because kolo's reduce ops are arithmetic.
//  * New names (or changed parameters): ranks allgatherv their serialized requests; each rank
//    files them in an identical table; a name is ready when every non-joined rank submitted it,
//    and parameters that differ across ranks become a MismatchError on every rank, naming the
//    ranks and what each submitted. Ready names get cache slots, in table order, on every rank.
//  * Stalls: a name waiting longer than KOLO_STALL_WARNING_SECONDS is logged by rank 0 with the
//    ranks that have not submitted it (cached names are first evicted so that the table can name
//    them); past KOLO_STALL_SHUTDOWN_SECONDS (if set) rank 0 shuts the engine down on all ranks.
//  * join(): once its own submissions have completed, a joined rank reports every cached name as
//    pending and counts as having submitted every new one, contributing zeros, until all ranks
//    joined. Zeros are the identity of sum, not of average: an average divides by the number of
//    ranks (EngineOptions::join_average = world_size, Horovod's and DDP's default) or by the
//    ranks that have not joined (active_ranks). Zeros are real values for min/max/product.
//  * Any collective error (dead peer, timeout) fails every pending handle on every rank; the
//    error names what the user asked for (the op, the first tensor names and their count).
//  * Shutdown: each rank's "shutting down" flag travels in the cycle's collective, so every rank
//    can say which rank ended the engine (and that join() is the way to end early).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "kolo/communicator.hpp"
#include "kolo/core/compiled_core.hpp"
#include "kolo/core/env.hpp"
#include "kolo/core/tensor.hpp"
#include "kolo/engine/engine_config.hpp"
#include "kolo/engine/engine_options.hpp"
#include "kolo/engine/handle.hpp"
#include "kolo/engine/request.hpp"
#include "kolo/transport/routed.hpp"
#include "kolo/transport/shm.hpp"
#include "kolo/transport/tcp.hpp"
#include "kolo/transport/transport.hpp"

namespace kolo {

// A range the engine may read (and write) after the call returns, until the handle completes:
// a ContiguousBuffer (contiguous, sized, of a kolo element type) that outlives the call, i.e. an
// lvalue or a borrowed range such as std::span. A temporary std::vector would be destroyed
// before the engine reads it, so it does not satisfy the concept.
template <class R>
concept AsyncBuffer = ContiguousBuffer<R> &&
    (std::is_lvalue_reference_v<R> || std::ranges::borrowed_range<R>);

// An AsyncBuffer the engine writes in place (allreduce, broadcast): its elements are not const.
template <class R>
concept AsyncInOutBuffer =
    AsyncBuffer<R> && !std::is_const_v<std::remove_reference_t<std::ranges::range_reference_t<R>>>;

// The engine's machinery (negotiation, fusion, the progress thread), internal: engine_impl.hpp.
template <class T>
class EngineCore;

namespace detail {
// True where a file sees engine_impl.hpp (its partial specialization), so that Engine<T> can say
// what to include instead of leaving an undefined reference to the linker.
template <class T, class = void>
struct engine_defined : std::false_type {};
// The transports whose Engine the compiled core holds (src/lib).
template <class T>
inline constexpr bool engine_in_library =
    std::is_same_v<T, MeshTransport> || std::is_same_v<T, RoutedTransport> ||
    std::is_same_v<T, ShmTransport> || std::is_same_v<T, TcpTransport>;
}  // namespace detail

// The engine a training loop holds: a handle on its progress thread and the state it owns
// (EngineCore, held by pointer, so that a file using the compiled core parses only this
// class). Not copyable; destroying it shuts it down (shutdown()).
template <class T = DefaultTransport>
class Engine {
  static_assert(check_transport<T>());  // names the member T lacks (transport/transport.hpp)
  // (std::disjunction names engine_defined<T> only where it is needed, so that a file may still
  // include engine_impl.hpp after an Engine of a library transport was instantiated.)
  static_assert(std::disjunction_v<
                    std::bool_constant<!KOLO_USE_COMPILED_CORE || detail::engine_in_library<T>>,
                    detail::engine_defined<T>>,
                "kolo::Engine<T>: the compiled core (KOLO_COMPILED_CORE) holds the Engine of "
                "MeshTransport, RoutedTransport, ShmTransport and TcpTransport; for another "
                "transport, #include <kolo/engine/engine_impl.hpp> in this file");

 public:
  // The options default to EngineOptions::from_env() (an overload: see Communicator's).
  explicit Engine(Communicator<T> comm);
  explicit Engine(Communicator<T> comm, EngineOptions opts);

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  ~Engine();

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Reduces `tensor` across ranks under `name`: output (default: in place) =
  // postscale · op_r(prescale · tensor_r); average divides by the number of ranks (or, while
  // ranks have joined, as EngineOptions::join_average says).
  Handle allreduce_async(std::string_view name, const TensorView& tensor,
                         ReduceOp op = ReduceOp::sum, double prescale = 1.0, double postscale = 1.0,
                         const TensorView& output = {});
  // The same, in place on any contiguous range that outlives the handle (std::vector<float>&,
  // std::array, std::span, a user type modelling std::ranges::contiguous_range).
  template <AsyncInOutBuffer R>
  Handle allreduce_async(std::string_view name, R&& tensor, ReduceOp op = ReduceOp::sum,
                         double prescale = 1.0, double postscale = 1.0) {
    return allreduce_async(name, buffer_view(tensor), op, prescale, postscale);
  }

  // All members execute in the same fused collective, or fail together.
  std::vector<Handle> grouped_allreduce_async(
      const std::string& group, const std::vector<std::pair<std::string, TensorView>>& tensors,
      ReduceOp op = ReduceOp::sum, double prescale = 1.0, double postscale = 1.0);

  // One submission, one handle for many host tensors (DDP's bucket, Horovod's grouped
  // allreduce): each tensor is reduced in place as by allreduce_async, all in the same fused
  // batch, negotiated under `name` as one entry. Every rank passes the same name and the same
  // counts in the same order; the tensors share one dtype and must not overlap. The handle
  // completes when every tensor holds its result (Handle::output() is empty). The cheapest way
  // to submit many small tensors: the per-tensor bookkeeping of the engine is done once.
  Handle allreduce_coalesced_async(std::string_view name, std::span<const TensorView> tensors,
                                   ReduceOp op = ReduceOp::sum, double prescale = 1.0,
                                   double postscale = 1.0);

  // Concatenates every rank's tensor (counts may differ) in rank order; Handle::output().
  Handle allgather_async(std::string_view name, const TensorView& tensor);
  template <AsyncBuffer R>
  Handle allgather_async(std::string_view name, R&& tensor) {
    return allgather_async(name, buffer_view(tensor));
  }

  // Copies root's tensor into every rank's tensor (in place).
  Handle broadcast_async(std::string_view name, const TensorView& tensor, int root = 0);
  template <AsyncInOutBuffer R>
  Handle broadcast_async(std::string_view name, R&& tensor, int root = 0) {
    return broadcast_async(name, buffer_view(tensor), root);
  }

  // For uneven data: this rank stops submitting and, once its own submissions have completed,
  // contributes zeros to the others' operations until every rank has joined; then all return.
  // Do not submit from other threads until it returns.
  void join();

  // Stops the engine on every rank (any rank's shutdown ends it for all, as in Horovod):
  // pending operations fail. Also called by the destructor.
  void shutdown();

  EngineStats stats() const;

  // After a failure, the survivors' engine: the next engine over Communicator::shrink(excluded,
  // so) — collective over the survivors, as shrink is; every survivor calls it. The handles of
  // the failed engine stay failed (their tensors may hold partial results: "drop and continue"
  // means the caller restores what it committed and submits again, as ElasticState and
  // run_elastic do); names are negotiated once more, the options stay (a timeline file gets
  // ".g<generation>" appended). rank() and size() are the new communicator's afterwards. Called
  // on a healthy engine (to exclude a live rank on purpose), it revokes the engine's
  // communicator first, which fails every rank's engine (transports that can be interrupted
  // from another thread: MeshTransport, the default; others: ConfigError). Not concurrent with
  // any other call on this engine. If the shrink fails (this rank was excluded, too few
  // survivors), its error is thrown and the engine stays failed.
  void recover(const std::vector<int>& excluded = {}, const ShrinkOptions& so = {});

  // Adds `count` processes that call Communicator::join(go.token) (Communicator::grow): shuts
  // this engine down cleanly — collective over the members, at a point where none of them has a
  // submission pending (every handle waited for) — grows its communicator and builds the next
  // engine over the enlarged one, with the same options (a timeline file gets ".g<generation>").
  // The joiners build their own Engine over the communicator join() returned. If the grow fails
  // (joiners that did not come, a member lost), its error is thrown and the engine goes on over
  // the unchanged communicator.
  void grow(int count, const GrowOptions& go);

  // How many recoveries (shrinks) and grows this engine's communicator descends from: 0 until the
  // first recover() or grow(); Communicator::lineage() has the rest.
  std::uint64_t generation();

  // The communicator, for blocking collectives while the engine is idle (not thread-safe
  // against the engine's own cycles: use the engine or the communicator, not both at once).
  Communicator<T>& communicator();

 private:
  std::unique_ptr<EngineCore<T>> core_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace kolo

#if KOLO_USE_COMPILED_CORE
// The standard transports' engines are compiled in kolo::kolo_lib (src/lib): a file built with
// the compiled core parses only the class above and calls the library. An Engine of another
// transport needs the definitions: include <kolo/engine/engine_impl.hpp> too.
namespace kolo {
extern template class Engine<MeshTransport>;
extern template class Engine<RoutedTransport>;
extern template class Engine<ShmTransport>;
extern template class Engine<TcpTransport>;
}  // namespace kolo
#else
#include "kolo/engine/engine_impl.hpp"
#endif
