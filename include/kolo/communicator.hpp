// kolo/communicator.hpp — Communicator<Transport>: blocking collectives over any Transport. This
// file is the facade: the class's public interface and its dispatch (run(): signature, deadline,
// error agreement); each collective's definitions live in a file of their own under
// communicator/ (allreduce.hpp, broadcast.hpp, ..., the selection setup in setup.hpp, shared
// buffers, the coalesced and the compressed paths), all included at the end of this one.
//
// The communicator validates arguments, stamps each collective with a Signature (so ranks that
// disagree are caught at the first message), gives it a deadline (KOLO_TIMEOUT_SECONDS), and
// runs an algorithm. Any error inside a collective — a local argument error included — aborts
// the transport, which hands the same error to every rank: a collective either succeeds on all
// ranks or fails on all of them, and none waits for a partner that is not coming. After an
// error the communicator is unusable (as after ncclCommAbort); build a new one.
//
// Buffers are TensorViews (pointer, count, dtype) or std::spans of the element types; in-place
// forms pass one buffer. Sizes:
//   allreduce       in.count == out.count
//   allgather       out.count == size * in.count
//   allgatherv      out.count == sum(counts), in.count == counts[rank]
//   broadcast       data.count on every rank
//   reduce_scatter  in.count == size * out.count
//   alltoall        in.count == out.count, divisible by size
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "kolo/algorithm/allreduce_hierarchical.hpp"
#include "kolo/algorithm/allreduce_zero_copy.hpp"
#include "kolo/algorithm/barrier_dissemination.hpp"
#include "kolo/algorithm/entry.hpp"
#include "kolo/algorithm/options.hpp"
#include "kolo/algorithm/registry.hpp"
#include "kolo/algorithm/ring_allreduce.hpp"
#include "kolo/algorithm/ring_allreduce_wire.hpp"
#include "kolo/algorithm/rooted.hpp"
#include "kolo/algorithm/selector.hpp"
#include "kolo/algorithm/tuning_probe.hpp"
#include "kolo/communicator/coalesced_layout.hpp"
#include "kolo/communicator/collective.hpp"
#include "kolo/communicator/options.hpp"
#include "kolo/compression/compressor.hpp"
#include "kolo/core/arg_checks.hpp"
#include "kolo/core/checked_size.hpp"
#include "kolo/core/compiled_core.hpp"
#include "kolo/core/config.hpp"
#include "kolo/core/env.hpp"
#include "kolo/core/error.hpp"
#include "kolo/core/signature.hpp"
#include "kolo/core/tensor.hpp"
#include "kolo/topology/bootstrap.hpp"
#include "kolo/transport/default.hpp"
#include "kolo/transport/route.hpp"
#include "kolo/transport/shared_region.hpp"
#include "kolo/transport/transport.hpp"
#include "kolo/transport/transport_ref.hpp"

namespace kolo {

// The transport contract (what is called on T, in layers, with the native collectives and
// device buffers as optional layers) is transport/transport.hpp; `check_transport<T>()` names
// any member T lacks.

// A buffer a collective accepts directly: any contiguous, sized range of a kolo element type
// (std::vector<float>, std::array<int32_t, N>, std::span<bfloat16>, a user type modelling
// std::ranges::contiguous_range), as KaMPIng accepts. Anything else fails this concept with a
// one-line error instead of a page of template instantiations.
template <class R>
concept ContiguousBuffer = std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
    is_kolo_element_v<std::remove_cv_t<std::ranges::range_value_t<R>>>;

// The view of such a range (elements, not bytes).
template <ContiguousBuffer R>
TensorView buffer_view(R&& r) {
  using E = std::remove_cv_t<std::ranges::range_value_t<R>>;
  return TensorView(const_cast<E*>(std::ranges::data(r)), std::ranges::size(r), dtype_of<E>());
}

// Communicator::split's color for ranks that join no new communicator (MPI_UNDEFINED).
inline constexpr int kUndefinedColor = -1;

namespace detail {
class WatchedStore;  // communicator/watched_store.hpp
}  // namespace detail

template <class T = DefaultTransport>
class Communicator {
  static_assert(check_transport<T>());  // names the member T lacks (transport/transport.hpp)

 public:
  using transport_type = T;

  // Reads the environment contract, rendezvouses, and connects the transport through its
  // factory (T::connect; transport.hpp, Connectable).
  static Communicator from_env() requires Connectable<T> {
    return Communicator(Topology::from_env());
  }

  // The options default to CommunicatorOptions::from_env(). (Overloads rather than default
  // arguments: a default argument is compiled in the caller's file, and this one reads and
  // checks every KOLO_<COLLECTIVE> rule against the algorithm registries.)
  explicit Communicator(Topology topo) requires Connectable<T>;
  explicit Communicator(Topology topo, CommunicatorOptions opts) requires Connectable<T>;

  // Rendezvous through a store that exists already (a framework's: PyTorch's c10d store via
  // kolo_torch, or any KvStore) instead of the environment's KOLO_STORE. topo needs rank and
  // size (Topology::for_rank reads the optional KOLO_* knobs); `prefix` namespaces the keys:
  // the ranks of one communicator pass the same prefix, distinct communicators distinct ones.
  Communicator(Topology topo, std::shared_ptr<KvStore> store,
               std::string prefix) requires Connectable<T>;
  Communicator(Topology topo, std::shared_ptr<KvStore> store, std::string prefix,
               CommunicatorOptions opts) requires Connectable<T>;
  // The same with the transport's own options (T::Options) instead of T::Options::from_env():
  // for a layer that sets some of them itself (kolo_torch's NCCL communicator, on the device of
  // the tensor). The rendezvous, T::connect and the selection setup (routes, host groups, the
  // tuning probe) are those of the constructors above: no layer re-implements connect().
  Communicator(Topology topo, std::shared_ptr<KvStore> store, std::string prefix,
               TransportOptions<T> transport_opts,
               CommunicatorOptions opts) requires Connectable<T>;
  Communicator(Topology topo, std::shared_ptr<KvStore> store, std::string prefix,
               TransportOptions<T> transport_opts) requires Connectable<T>;

  // Adopts a transport built elsewhere (e.g. from an MPI communicator: no store, no KOLO_*
  // variables). Its topology comes from the transport when it has one.
  explicit Communicator(std::unique_ptr<T> transport);
  explicit Communicator(std::unique_ptr<T> transport, CommunicatorOptions opts);

  // Defined out of the class (not inline), so that an explicit instantiation declaration
  // (kolo/compiled_core.hpp) keeps them out of the user's object file too.
  Communicator(Communicator&&) noexcept;
  Communicator& operator=(Communicator&&) noexcept;
  ~Communicator();

  int rank() const { return transport_->rank(); }
  int size() const { return transport_->size(); }
  int local_rank() const { return topo_.local_rank; }
  int local_size() const { return topo_.local_size; }
  int cross_rank() const { return topo_.cross_rank; }
  int cross_size() const { return topo_.cross_size; }
  const Topology& topology() const { return topo_; }
  T& transport() { return *transport_; }
  // The rendezvous this communicator was built with; nullptr when it adopted a transport.
  Bootstrap* bootstrap() { return boot_.get(); }

  // ---- algorithm selection ----
  // The Selector decides the algorithm of every allreduce, broadcast, allgather(v),
  // reduce_scatter and alltoall per call, from each collective's registry. To force one
  // (kolo-bench --algo), call the same on every rank before the collective:
  //   comm.selector().force_allreduce(AllreduceAlgorithm::tree);
  //   comm.selector().set_allreduce_rules("tree:0-64K;ring:64K-max");   // KOLO_ALLREDUCE grammar
  //   comm.selector().force(AllgatherAlgorithm::ring);                  // any collective
  //   comm.selector().clear_overrides();                                // back to the model
  Selector& selector() { return selector_; }
  const Selector& selector() const { return selector_; }
  // What the last call of each collective ran (after fallbacks; native calls are not recorded):
  // last_algorithm<AllgatherAlgorithm>() for any collective with a registry, by name below.
  template <AlgorithmId Algo>
  Algo last_algorithm() const {
    return table_.template last<Algo>();
  }
  AllreduceAlgorithm last_allreduce_algorithm() const {
    return last_algorithm<AllreduceAlgorithm>();
  }
  BroadcastAlgorithm last_broadcast_algorithm() const {
    return last_algorithm<BroadcastAlgorithm>();
  }
  AllgatherAlgorithm last_allgather_algorithm() const {
    return last_algorithm<AllgatherAlgorithm>();
  }
  ReduceScatterAlgorithm last_reduce_scatter_algorithm() const {
    return last_algorithm<ReduceScatterAlgorithm>();
  }
  AlltoallAlgorithm last_alltoall_algorithm() const { return last_algorithm<AlltoallAlgorithm>(); }
  // The last allreduce read the peers' Buffers in place (allocate(); last_allreduce_algorithm()
  // then still names what the Selector would have run).
  bool last_allreduce_zero_copy() const { return last_zero_copy_; }
  // The options this communicator was built with (its KOLO_* settings, read once).
  const CommunicatorOptions& options() const { return opts_; }
  // This rank's host and cross-host groups (hierarchical allreduce).
  const HostGroups& host_groups() const { return groups_; }

  // ---- allreduce ----
  void allreduce(TensorView in, TensorView out, ReduceOp op = ReduceOp::sum);
  void allreduce(TensorView inout, ReduceOp op = ReduceOp::sum) { allreduce(inout, inout, op); }
  // Allreduces `buf` in place and hands the result to `sink` as disjoint ranges of elements that
  // cover it (BlockSink, algorithm/allreduce_zero_copy.hpp): for a caller that copies the result
  // elsewhere anyway, as the Engine unpacks a fused batch into its tensors. When `buf` lies in
  // memory the local peers map (a Buffer, the engine's fusion buffer) and the zero-copy path
  // runs, the ranges point into each block's owner, one copy fewer than gathering into `buf`
  // first; `buf` then holds only this rank's block of the result afterwards. Otherwise `buf`
  // holds the whole result and the sink gets it as one range. The sink must not throw.
  // With `own`, this rank's own block of the input (zero_copy_block(buf.count, rank(), size()))
  // is read through it instead of from `buf`, which then need not hold that block: on the
  // zero-copy path nobody else reads it, so the caller saves packing it; on any other path it
  // is copied into `buf` first.
  void allreduce_to(TensorView buf, ReduceOp op, BlockSink sink, BlockSource own = {});
  // Allreduces a list of tensors as one collective (torch.distributed's allreduce_coalesced,
  // what a fusion buffer is for): out[i] = the reduction of every rank's in[i]. All tensors have
  // one dtype; in[i] and out[i] have the same count and may be the same memory (in place), no
  // other two may overlap. Every rank passes the same counts in the same order. On a transport
  // with vectored messages (the default mesh: shared memory and TCP) it runs the ring allreduce
  // over the tensors laid end to end, each message reading and writing the tensors' own memory:
  // no copy into a buffer and back. Elsewhere (MPI) the tensors are packed into one buffer, the
  // usual allreduce runs on it, and the result is copied back out.
  void allreduce_coalesced(std::span<const TensorView> in, std::span<const TensorView> out,
                           ReduceOp op = ReduceOp::sum);
  // In place on any contiguous range: comm.allreduce(vec), comm.allreduce(vec, ReduceOp::max).
  // A Buffer from allocate() (its own checks first: see allocate below).
  template <ContiguousBuffer R>
  void allreduce(R&& inout, ReduceOp op = ReduceOp::sum) {
    if constexpr (detail::is_buffer_v<std::remove_cvref_t<R>>) {
      check_buffer(inout.region(), inout.size(), inout.size(), "allreduce");
    }
    allreduce(buffer_view(inout), op);
  }

  // Float32 allreduce (sum or average) whose messages carry `wire`'s 16-bit type (float16 or
  // bfloat16): half the bytes cross the transport. Where the Selector runs the ring, the values
  // are converted segment by segment as they are sent and received (no pass over the tensor of
  // its own); otherwise the tensor is compressed, allreduced on the wire type and decompressed.
  // Every rank gets the same values: the result rounded to the wire type. Every rank must pass
  // the same compression.
  void allreduce_compressed(TensorView in, TensorView out, ReduceOp op,
                            const CompressionPolicy& wire);
  // ---- buffers the local peers map (zero copy) ----
  // Collective: every rank allocates `count` elements of E at the same point. Where every rank
  // of this communicator is on one host and reached through shared memory, each rank's Buffer
  // is mapped by all the others, and an allreduce whose input and output lie in such Buffers
  // (at the same offsets on every rank) of at least CommunicatorOptions::zero_copy_bytes reads
  // the peers' memory in place: no data passes through the channels (Buffer::shared() says
  // whether it is). Elsewhere — TCP, several hosts, MPI, a system that refuses the mapping —
  // the Buffer is ordinary memory and collectives on it take the usual path. Counts differing
  // between ranks are a ConfigError on every rank. The memory lives as long as the Buffer.
  template <class E>
  Buffer<E> allocate(std::size_t count) {
    static_assert(is_kolo_element_v<E> || std::is_same_v<E, std::byte>,
                  "kolo::Communicator::allocate: E must be a kolo element type or std::byte");
    // A count whose bytes wrap is refused inside allocate_region's collective, on every rank.
    return Buffer<E>(allocate_region(detail::saturating_mul(count, sizeof(E)), count, sizeof(E)),
                     count);
  }
  // The same, untyped: `bytes` bytes (what the engine's fusion buffer uses). A size beyond any
  // buffer (PTRDIFF_MAX) is a ConfigError on every rank; `count` x `elem_size` (when count > 0)
  // is what it names then.
  std::shared_ptr<detail::SharedRegion> allocate_region(std::size_t bytes, std::size_t count = 0,
                                                        std::size_t elem_size = 1);
  // Whether Buffers of this communicator can be shared at all: more than one rank, and every
  // peer reached through shared memory. The same answer on every rank.
  bool zero_copy_routes() const {
    if constexpr (requires(const T& t) { t.route(0); }) {
      if (size() < 2) return false;
      for (int p = 0; p < size(); ++p) {
        if (p != rank() && transport_->route(p) != Route::shm) return false;
      }
      return true;
    } else {
      return false;
    }
  }
  // Allreduce on Buffers, out of place (in place: allreduce(buf) above, or buf.first(count)).
  // A Buffer must come from this communicator (one whose communicator has ended, or another
  // communicator's, is a ConfigError), and `out` must hold in.size() elements.
  template <class E>
  void allreduce(const Buffer<E>& in, Buffer<E>& out, ReduceOp op = ReduceOp::sum) {
    check_buffer(in.region(), in.size(), in.size(), "allreduce input");
    check_buffer(out.region(), out.size(), in.size(), "allreduce output");
    allreduce(TensorView(in.data(), in.size(), dtype_of<E>()),
              TensorView(out.data(), in.size(), dtype_of<E>()), op);
  }

  // Whether allreduce_compressed of `count` elements converts on the wire (the ring, the
  // hierarchical allreduce across hosts of equal rank counts, or one rank's round trip) on this
  // communicator; false: it takes the compress / allreduce / decompress passes.
  bool compresses_on_wire(std::size_t count, const CompressionPolicy& wire) const {
    return size() == 1 || wire_algorithm(count, wire) != WirePath::passes;
  }

  // ---- allgather / allgatherv ----
  void allgather(TensorView in, TensorView out);

  void allgatherv(TensorView in, TensorView out, std::span<const std::size_t> counts);

  // ---- broadcast ----
  void broadcast(TensorView data, int root = 0);
  template <ContiguousBuffer R>
  void broadcast(R&& data, int root = 0) {
    broadcast(buffer_view(data), root);
  }

  // ---- reduce_scatter ----
  void reduce_scatter(TensorView in, TensorView out, ReduceOp op = ReduceOp::sum);

  // ---- alltoall ----
  void alltoall(TensorView in, TensorView out);

  // ---- barrier ----
  void barrier();

  // ---- reduce (to one root) ----
  // The root's `out` receives the reduction of every rank's `in` (in.count elements); on other
  // ranks `out` is ignored (pass TensorView{}). In place on the root: out.data == in.data.
  // Small messages go up a binomial tree (log2 n steps); large ones run the selected allreduce,
  // whose result non-roots discard (the same bandwidth term as reduce-scatter + gather).
  void reduce(TensorView in, TensorView out, ReduceOp op, int root);
  template <ContiguousBuffer R>
  void reduce(R&& inout, ReduceOp op, int root) {
    const TensorView v = buffer_view(inout);
    reduce(v, v, op, root);
  }

  // ---- gather / scatter ----
  // gather: the root's `out` (size * in.count elements) receives rank p's `in` as block p;
  // `out` is ignored elsewhere. In place on the root: in.data == out's block `root`.
  void gather(TensorView in, TensorView out, int root);
  // scatter: rank p's `out` receives block p of the root's `in` (size * out.count elements);
  // `in` is ignored elsewhere. In place on the root: out.data == in's block `root`.
  void scatter(TensorView in, TensorView out, int root);

  // ---- alltoallv ----
  // Block j of `in` (send_counts[j] elements, blocks back to back) goes to rank j; block i of
  // `out` (recv_counts[i] elements) comes from rank i. send_counts[j] on this rank must equal
  // recv_counts[this rank] on rank j: a disagreement is a MismatchError on both. in and out must
  // not overlap.
  void alltoallv(TensorView in, std::span<const std::size_t> send_counts, TensorView out,
                 std::span<const std::size_t> recv_counts);

  // ---- any collective given by its definition (communicator/collective.hpp) ----
  // Runs D on every rank as the collectives above run: its signature stamped on every message,
  // the deadline, D's argument checks inside the call (a refused argument fails every rank),
  // D's native hook on a transport that has one, then D's algorithm (from its registry through
  // the Selector, or D::run). broadcast, reduce_scatter, alltoall and barrier are such calls;
  // a collective defined outside kolo is run the same way (tests/inproc/test_toy_collective.cpp).
  template <CollectiveDefinition D>
  void call(const typename D::Args& a);

  // ---- point to point ----
  // Messages between two ranks travel on the same ordered connection as the collectives: a
  // send matches the peer's next receive from this rank, and the two must agree on element
  // count, dtype and tag (else a MismatchError on both). Sends and receives may be outstanding
  // at once, to different peers and to the same one; they progress whenever this rank waits or
  // tests any of them, or runs a collective. Complete them before a collective with the same
  // peer: a receive still pending would match the collective's first message instead.
  class P2PRequest {
   public:
    P2PRequest() = default;
    bool done() const { return done_; }

   private:
    friend class Communicator;
    typename T::Request req_{};
    Deadline deadline_ = Deadline::after(0);
    bool done_ = true;
  };

  // Posts a send of `data` (which must stay valid and unchanged until the request completes).
  P2PRequest isend(TensorView data, int peer, int tag = 0) { return post(true, data, peer, tag); }
  // Posts a receive into `data` (valid until the request completes).
  P2PRequest irecv(TensorView data, int peer, int tag = 0) { return post(false, data, peer, tag); }
  // Makes progress without blocking; true once the request completed. Errors (the peer lost,
  // a mismatch, the deadline passed) are thrown here and reach every rank.
  bool test(P2PRequest& r);
  // Blocks until the request completes (deadline: KOLO_TIMEOUT_SECONDS from posting).
  void wait(P2PRequest& r);
  void send(TensorView data, int peer, int tag = 0) {
    auto r = isend(data, peer, tag);
    wait(r);
  }
  void recv(TensorView data, int peer, int tag = 0) {
    auto r = irecv(data, peer, tag);
    wait(r);
  }

  // ---- split ----
  // MPI_Comm_split: a collective over this communicator. Ranks passing the same color form a
  // new communicator, ranked by (key, rank here); kUndefinedColor joins none (nullopt). The
  // children have their own connections, made through this communicator's rendezvous store
  // under a key prefix of their own, so they are independent of each other and of the parent
  // (their collectives need no common order; a mismatch fails only the group it happened in,
  // and a dead peer fails every group that contains it). The parent may be destroyed first.
  std::optional<Communicator> split(int color, int key);

  // ---- surviving a lost rank (communicator/fault.hpp; docs/reliability.md) ----

  // Marks this communicator failed on every rank: this rank's pending and later operations
  // throw RevokedError, and every peer's fail at their next look at the transport (whatever
  // call they are in), never a hang. After an earlier failure it changes nothing: the error
  // that caused it (a PeerLostError) stays the one every operation rethrows. Never throws; from
  // the thread that uses the communicator (another thread: transport().interrupt()).
  void revoke(std::string_view why = {});
  // Whether this communicator has failed or been revoked, as this rank sees it.
  bool revoked() const { return transport_->aborted(); }
  // The ranks this rank's failure detector holds for gone now (their process exited, or their
  // connection was closed); empty for transports that cannot tell.
  std::vector<int> lost_ranks();
  // After a failure (or on purpose), the survivors' new communicator: revokes this one, agrees
  // through the rendezvous store — without the dead ranks' help — on who is gone (every rank
  // some survivor's detector saw die, every rank in some survivor's `excluded`, and any rank that
  // has not reached its shrink when 60 % of the timeout has passed), and connects the rest,
  // renumbered in their old order, with this communicator's transport options and tuning (MPI
  // ULFM's MPIX_Comm_shrink; ncclCommShrink's explicit list, here agreed rather than trusted).
  // Collective over the survivors; this communicator stays revoked: `comm = comm.shrink();`.
  // A rank the others excluded gets RevokedError; fewer than `min_size` survivors an Error on
  // each. A rank dying during the shrink makes the survivors retry without it. The store must
  // outlive the lost ranks (kolo-run's, torchrun's agent store, the Spark driver's; not the one
  // rank 0 hosts under MASTER_ADDR or KOLO_PEERS when rank 0 is the one lost).
  Communicator shrink(const std::vector<int>& excluded = {}, const ShrinkOptions& so = {});
  // The members' side of adding processes (communicator/grow.hpp; NCCL's ncclCommGrow): every
  // member calls grow(count, {token}) and `count` new processes call join(token); all of them
  // get a communicator of size() + count, the members keeping their ranks, the joiners ranked
  // after them in the order they arrived, with this communicator's transport options and
  // tuning. Collective over the members. This communicator stays usable (a failed grow —
  // joiners that do not come, a member lost — throws on every member and changes nothing), but
  // a store server rank 0 hosts moves to the new one: `comm = comm.grow(1, {"t1"});`.
  Communicator grow(int count, const GrowOptions& go);
  // The new processes' side of grow: waits in `store` for the offer the members of a grow with
  // this `token` publish, takes the next place in it, and returns the enlarged communicator.
  // A ConfigError when every place is taken; a TimeoutError when no grow with that token comes.
  // The transport options and communicator options are this process's own (KOLO_*), the
  // tuning the members'.
  static Communicator join(std::shared_ptr<KvStore> store, const std::string& token,
                           const JoinOptions& jo = {}) requires Connectable<T>;
  // The same through the store the environment names: KOLO_STORE, with KOLO_SECRET and
  // KOLO_JOB_ID as the job's ranks got them (a process started beside a kolo-run job).
  static Communicator join(const std::string& token,
                           const JoinOptions& jo = {}) requires Connectable<T>;
  // Where this communicator came from: generation, its parent's ranks, who was excluded.
  const Lineage& lineage() const { return lineage_; }

  // ---- errors of the layers above ----
  // Refuses this rank's next collective call with `e` (a ConfigError for an argument the
  // caller checked itself, say), as if the call had failed inside the communicator: every call
  // before it completes on every rank with its result, and each peer's matching call (the same
  // collective call number) fails with `e` — at once when the peer is already in it, when it
  // begins it otherwise; the peers name this rank as the origin. Does not throw: the caller
  // throws its own error after it. For layers that check a call's arguments before handing it
  // over (the C ABI, kolo_torch). Nothing happens when the communicator has already failed.
  void refuse(const Error& e) {
    begin_call(seq_ + 1);
    if (!transport_->aborted()) transport_->abort(e);
  }

 private:
  // Partially overlapping input and output give wrong results silently in any algorithm that
  // reads one while writing the other: refuse them, naming both ranges. `in_place` is the one
  // alias allowed (the input sitting exactly where the operation reads or writes it in place:
  // the whole buffer for allreduce, this rank's block for allgather...), nullptr for none.
  static void check_overlap(const char* what, const TensorView& in, const TensorView& out,
                            const void* in_place) {
    checks::check_overlap(what, checks::bytes_of(in), checks::bytes_of(out), in_place);
  }

  template <class F>
  void guard_p2p(F&& f) {
    if (transport_->aborted()) transport_->rethrow();
    try {
      f();
    } catch (const Error& e) {
      transport_->abort(e);
      if (transport_->aborted()) transport_->rethrow();
      throw;
    }
  }

  P2PRequest post(bool is_send, TensorView data, int peer, int tag);

  // A Buffer handed to a collective: from this communicator, still alive, large enough.
  void check_buffer(const std::shared_ptr<detail::SharedRegion>& r, std::size_t have,
                    std::size_t want, const char* what);
  // Runs the zero-copy allreduce when in and out lie in shared regions (and the tensor is large
  // enough); false: the caller takes the usual path.
  bool try_zero_copy(const TensorView& in, const TensorView& out, ReduceOp op,
                     const AlgoOptions& opt, BlockSink sink, BlockSource own);
  // allreduce and allreduce_to: `sink` and `own` empty, or allreduce_to's.
  void allreduce_impl(TensorView in, TensorView out, ReduceOp op, BlockSink sink, BlockSource own);

  // Up to this many bytes reduce() climbs a binomial tree; above, it runs the allreduce.
  static constexpr std::size_t kRootedTreeBytes = 64 * 1024;

  // Bootstrap (from the topology's store address, or from `store` when given) and connect with
  // the transport's options (read before the rendezvous: communicator/setup.hpp).
  void connect(Topology topo, std::shared_ptr<KvStore> store, std::string prefix,
               const TransportOptions<T>& topts) requires Connectable<T>;

  // Host groups, route constants and overrides; the tuning probe is a collective (every rank
  // constructs its communicator at the same point), and its errors reach every rank.
  void setup_selector();

  // What every algorithm may use besides its arguments (AlgoContext; the Selector adds the link).
  AlgoContext context() {
    AlgoContext ctx;
    ctx.scratch = &scratch_;
    ctx.groups = &groups_;
    return ctx;
  }

  // One place that runs what the Selector chose, per collective.
  void run_allreduce(const void* in, void* out, std::size_t count, DataType dtype, ReduceOp op,
                     const AlgoOptions& opt);
  void run_allgather(const void* in, void* out, std::span<const std::size_t> counts,
                     std::size_t elem_size, const AlgoOptions& opt);

  // The rooted collectives' entry agreement (broadcast, scatter, gather, the tree reduce). In
  // them a rank can finish without hearing from every other rank (a broadcast's root only sends,
  // a gather's senders only send), so a call refused on one rank could complete on another. A
  // zero-byte dissemination barrier stamped with the call's own signature, run before any data
  // moves, makes every rank's return depend on every rank having accepted the call (and catches
  // a different count or root at the first exchange): ceil(log2 N) zero-byte rounds, which make
  // these calls synchronizing (measured in docs/reliability.md; KOLO_ROOTED_AGREEMENT=0 turns
  // it off). Only on transports that order errors by call (the mesh, MPI point-to-point).
  void agree(const AlgoOptions& opt) {
    if constexpr (OrderedErrors<T>) {
      if (opts_.rooted_agreement && size() > 1) barrier_dissemination(*transport_, opt);
    }
  }

  // Tells the transport that this rank begins collective call `seq` (transport.hpp,
  // OrderedErrors): a peer's error of a later call is held until then.
  void begin_call(std::uint64_t seq) {
    if constexpr (OrderedErrors<T>) transport_->begin_call(seq);
  }

  template <class Body>
  void run(Collective c, DataType dtype, ReduceOp op, std::size_t count, int root,
           std::uint64_t extra, Body&& body) {
    AlgoOptions opt;
    opt.sig.seq = ++seq_;
    begin_call(opt.sig.seq);
    if (transport_->aborted()) transport_->rethrow();
    opt.sig.collective = c;
    opt.sig.dtype = dtype;
    opt.sig.op = op;
    opt.sig.root = root;
    opt.sig.count = count;
    opt.sig.extra = extra;
    opt.deadline = Deadline::lazy(transport_->timeout_seconds());  // no clock read unless it waits
    opt.segment_bytes = opts_.segment_bytes;
    opt.hierarchical_chunk_bytes = opts_.hierarchical_chunk_bytes;
    opt.ring_overlap_lag = ring_overlap_lag_;
    if (size() == 1 || c == Collective::barrier) {
      try {
        body(opt);
      } catch (const Error& e) {
        transport_->abort(e);
        throw;
      }
      return;
    }
    try {
      body(opt);
    } catch (const Error& e) {
      // Local argument errors reach the other ranks too, instead of leaving them to time out.
      transport_->abort(e);
      if (transport_->aborted()) transport_->rethrow();
      throw;
    }
  }

  // The argument checks every collective shares (core/arg_checks.hpp).
  static void check_cpu(const TensorView& v, const char* what) {
    checks::check_buffer(v, what, AcceptsDeviceBuffers<T>);
  }
  static void same_type(const TensorView& a, const TensorView& b, const char* what) {
    checks::check_same_dtype(a, b, what);
  }
  void check_root(int root, const char* what) const { checks::check_root(root, size(), what); }
  CallFacts facts() const { return {rank(), size(), AcceptsDeviceBuffers<T>}; }
  // Runs the Selector's choice for Algo's collective and records it in the table.
  template <AlgorithmId Algo>
  void select_run(const typename AlgorithmTraits<Algo>::Args& a, const AlgoOptions& opt) {
    table_.record(selector_.template run<Algo>(*transport_, a, opt, context()));
  }

  std::unique_ptr<Bootstrap> boot_;
  std::unique_ptr<T> transport_;
  Topology topo_;
  CommunicatorOptions opts_;
  std::uint64_t seq_ = 0;
  std::vector<std::byte> scratch_;
  // allreduce_compressed's path for `count` elements (the same on every rank).
  enum class WirePath : std::uint8_t { ring, hierarchical, passes };
  WirePath wire_algorithm(std::size_t count, const CompressionPolicy& wire) const;
  std::vector<std::byte> wire_buffer_;     // allreduce_compressed off the ring: the 16-bit copy
  std::vector<std::byte> reduce_scratch_;  // a non-root's discarded result of a large reduce
  std::shared_ptr<detail::RegionRegistry> regions_;  // allocate(): this communicator's Buffers
  detail::CoalescedLayout coalesced_;                // allreduce_coalesced's checks and runs
  PieceMap pieces_;                                  // ... its ring's tensors
  std::vector<std::byte> coalesce_buf_;              // ... packed, without vectored messages
  std::vector<const std::byte*> zc_in_;              // the zero-copy allreduce's peer pointers
  std::vector<std::byte*> zc_out_;
  std::vector<std::uint64_t> p2p_sent_;      // per peer: sends posted (signature sequence)
  std::vector<std::uint64_t> p2p_received_;  // per peer: receives posted
  std::uint64_t split_seq_ = 0;
  // shrink's and grow's new communicator: this one's topology knobs, options, transport options
  // and tuning, as rank `rank` of `size`, built on `watched` under `prefix` (communicator/
  // fault.hpp); `watched` is disarmed once the build is over, whichever way it ended.
  Communicator build_child(int rank, int size, const std::shared_ptr<detail::WatchedStore>& watched,
                           const std::string& prefix);
  Lineage lineage_;                           // shrink's and grow's record
  std::optional<TransportOptions<T>> topts_;  // connect()'s, for shrink
  HostGroups groups_;
  std::size_t ring_overlap_lag_ = 0;  // AlgoOptions::ring_overlap_lag (setup_selector)
  Selector selector_;
  CollectiveTable table_;        // per collective: what its last call ran
  bool last_zero_copy_ = false;  // the last allreduce took the zero-copy path
};

}  // namespace kolo

// ---- the definitions, one file per job. Out of the class and not inline: under
// KOLO_COMPILED_CORE (core/compiled_core.hpp) the explicit instantiation declarations below keep
// them out of the user's object file, and kolo::kolo_lib's compiled ones are called ----
#include "kolo/communicator/allgather.hpp"  // allgather, allgatherv
#include "kolo/communicator/allreduce.hpp"  // allreduce, allreduce_to
#include "kolo/communicator/alltoall.hpp"
#include "kolo/communicator/alltoallv.hpp"
#include "kolo/communicator/barrier.hpp"
#include "kolo/communicator/broadcast.hpp"
#include "kolo/communicator/call.hpp"        // call<D>(): a collective by its definition
#include "kolo/communicator/coalesced.hpp"   // allreduce_coalesced
#include "kolo/communicator/compressed.hpp"  // allreduce_compressed
#include "kolo/communicator/fault.hpp"       // revoke, lost_ranks, shrink
#include "kolo/communicator/gather.hpp"
#include "kolo/communicator/grow.hpp"  // grow, join
#include "kolo/communicator/p2p.hpp"   // send, recv, test, wait
#include "kolo/communicator/reduce.hpp"
#include "kolo/communicator/reduce_scatter.hpp"
#include "kolo/communicator/scatter.hpp"
#include "kolo/communicator/setup.hpp"           // constructors, connect, the selection setup
#include "kolo/communicator/shared_buffers.hpp"  // allocate, Buffers, the zero-copy allreduce
#include "kolo/communicator/split.hpp"

#if KOLO_USE_COMPILED_CORE
// The standard transports' communicators are compiled in kolo::kolo_lib (src/lib).
#include "kolo/transport/routed.hpp"
#include "kolo/transport/shm.hpp"
#include "kolo/transport/tcp.hpp"

namespace kolo {
extern template class Communicator<MeshTransport>;
extern template class Communicator<RoutedTransport>;
extern template class Communicator<ShmTransport>;
extern template class Communicator<TcpTransport>;
}  // namespace kolo
#endif

// Header-only: CommunicatorOptions' definitions, inline (compiled core: in the library,
// src/lib/core_impl.cpp).
#if !KOLO_USE_COMPILED_CORE
#include "kolo/detail/communicator_impl.hpp"
#endif
