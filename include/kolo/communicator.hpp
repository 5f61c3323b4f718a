// kolo/communicator.hpp — Communicator<Transport>: blocking collectives over any Transport.
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

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <ranges>
#include <span>
#include <string>
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
#include "kolo/compression/compressor.hpp"
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

struct CommunicatorOptions {
  std::size_t segment_bytes = 256 * 1024;
  // Allreduces of at least this many bytes on Buffers the local peers map (allocate()) read
  // them in place (KOLO_ZERO_COPY_BYTES); below, three barriers cost more than the copies save.
  std::size_t zero_copy_bytes = 256 * 1024;
  // The hierarchical allreduce (several hosts) cuts a tensor of at least twice this many bytes
  // into chunks of about this size and overlaps each chunk's ring across hosts with the rings
  // inside the host of its neighbours (KOLO_HIERARCHICAL_CHUNK_BYTES; 0: no chunks). Every rank
  // must use the same value.
  std::size_t hierarchical_chunk_bytes = 4 << 20;
  // Broadcast, scatter, gather and the tree reduce begin with a zero-byte barrier, so that a
  // call refused on one rank fails on every rank, the root's included (KOLO_ROOTED_AGREEMENT;
  // false: a root or sender returns once its part is done, and a peer's error of that call
  // reaches it at its next call). The same on every rank.
  bool rooted_agreement = true;
  // Deprecated (KOLO_SMALL_ALLREDUCE_BYTES): recursive doubling up to this many bytes, ring
  // above — the fixed rule the Selector replaced. Ignored when allreduce_rules are given.
  std::optional<std::size_t> small_allreduce_bytes;
  // Per-size-range overrides of the Selector, one per collective (KOLO_ALLREDUCE,
  // KOLO_BROADCAST, KOLO_ALLGATHER, KOLO_REDUCE_SCATTER, KOLO_ALLTOALL); empty: the cost model
  // decides. Grammar and names: algorithm/selector.hpp.
  SizeRules<AllreduceAlgorithm> allreduce_rules;
  SizeRules<BroadcastAlgorithm> broadcast_rules;
  SizeRules<AllgatherAlgorithm> allgather_rules;
  SizeRules<ReduceScatterAlgorithm> reduce_scatter_rules;
  SizeRules<AlltoallAlgorithm> alltoall_rules;
  // Where the Selector's constants come from (KOLO_TUNING=probe|default|file:PATH); unset: probe
  // for transports that report their routes (shm, tcp, routed), built-in defaults otherwise.
  std::optional<TuningSource> tuning;

  static CommunicatorOptions from_env(const EnvLookup& env = process_env());

  // KOLO_<COLLECTIVE> for every collective with a registry, in one place. Set but empty means
  // unset, as for KOLO_TRANSPORT.
  static void read_algorithm_rules(const EnvLookup& env, CommunicatorOptions& o);

  // The allreduce rules in effect: explicit rules, else the deprecated threshold, else none.
  SizeRules<AllreduceAlgorithm> effective_allreduce_rules() const;
};

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
  // What the last call of each collective ran (after fallbacks; native calls are not recorded).
  AllreduceAlgorithm last_allreduce_algorithm() const { return last_allreduce_; }
  BroadcastAlgorithm last_broadcast_algorithm() const { return last_broadcast_; }
  AllgatherAlgorithm last_allgather_algorithm() const { return last_allgather_; }
  ReduceScatterAlgorithm last_reduce_scatter_algorithm() const { return last_reduce_scatter_; }
  AlltoallAlgorithm last_alltoall_algorithm() const { return last_alltoall_; }
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
                            const void* in_place);

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

  // Bootstrap (from the topology's store address, or from `store` when given) and connect.
  void connect(Topology topo, std::shared_ptr<KvStore> store,
               std::string prefix) requires Connectable<T>;

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

  static void check_cpu(const TensorView& v, const char* what);
  static void same_type(const TensorView& a, const TensorView& b, const char* what);
  void check_root(int root, const char* what) const;

  std::unique_ptr<Bootstrap> boot_;
  std::unique_ptr<T> transport_;
  Topology topo_;
  CommunicatorOptions opts_;
  std::uint64_t seq_ = 0;
  std::vector<std::byte> scratch_;
  // allreduce_compressed's path for `count` elements (the same on every rank).
  enum class WirePath : std::uint8_t { ring, hierarchical, passes };
  WirePath wire_algorithm(std::size_t count, const CompressionPolicy& wire) const {
    const auto a = selector_.select<AllreduceAlgorithm>(count * dtype_size(wire.wire));
    if (a == AllreduceAlgorithm::ring) return WirePath::ring;
    if (a == AllreduceAlgorithm::hierarchical && groups_.uniform && groups_.hosts > 1) {
      return WirePath::hierarchical;
    }
    return WirePath::passes;
  }
  std::vector<std::byte> wire_buffer_;     // allreduce_compressed off the ring: the 16-bit copy
  std::vector<std::byte> reduce_scratch_;  // a non-root's discarded result of a large reduce
  std::shared_ptr<detail::RegionRegistry> regions_;  // allocate(): this communicator's Buffers
  PieceMap pieces_;                                  // allreduce_coalesced's tensors
  std::vector<std::byte> coalesce_buf_;              // ... packed, without vectored messages
  std::vector<PieceMap::Part> parts_;                // allreduce_coalesced: their list
  std::vector<std::pair<const std::byte*, std::size_t>> spans_;  // its overlap check
  // allreduce_coalesced's tensors as this call lists them (input, output, bytes), and the last
  // list that passed the overlap check: the engine submits the same list every step, and an
  // unchanged list (the same addresses and sizes) needs no new check.
  struct CheckedSpan {
    const std::byte* in;
    const std::byte* out;
    std::size_t bytes;
    bool operator==(const CheckedSpan&) const = default;
  };
  std::vector<CheckedSpan> listed_, checked_;
  std::vector<const std::byte*> zc_in_;  // the zero-copy allreduce's peer pointers
  std::vector<std::byte*> zc_out_;
  std::vector<std::uint64_t> p2p_sent_;      // per peer: sends posted (signature sequence)
  std::vector<std::uint64_t> p2p_received_;  // per peer: receives posted
  std::uint64_t split_seq_ = 0;
  HostGroups groups_;
  std::size_t ring_overlap_lag_ = 0;  // AlgoOptions::ring_overlap_lag (setup_selector)
  Selector selector_;
  AllreduceAlgorithm last_allreduce_ = AllreduceAlgorithm::ring;
  BroadcastAlgorithm last_broadcast_ = BroadcastAlgorithm::chain;
  AllgatherAlgorithm last_allgather_ = AllgatherAlgorithm::ring;
  ReduceScatterAlgorithm last_reduce_scatter_ = ReduceScatterAlgorithm::ring;
  AlltoallAlgorithm last_alltoall_ = AlltoallAlgorithm::pairwise;
  bool last_zero_copy_ = false;
};

// ---- out of the class and not inline: under KOLO_COMPILED_CORE (core/compiled_core.hpp) the
// explicit instantiation declarations at the end of this file keep them out of the user's
// object file, and kolo::kolo_lib's compiled ones are called ----

template <class T>
Communicator<T>::Communicator(Communicator&&) noexcept = default;
template <class T>
Communicator<T>& Communicator<T>::operator=(Communicator&&) noexcept = default;
template <class T>
Communicator<T>::~Communicator() = default;

template <class T>
Communicator<T>::Communicator(Topology topo) requires Connectable<T>
    : Communicator(std::move(topo), CommunicatorOptions::from_env()) {}

template <class T>
Communicator<T>::Communicator(Topology topo, std::shared_ptr<KvStore> store,
                              std::string prefix) requires Connectable<T>
    : Communicator(std::move(topo), std::move(store), std::move(prefix),
                   CommunicatorOptions::from_env()) {}

template <class T>
Communicator<T>::Communicator(std::unique_ptr<T> transport)
    : Communicator(std::move(transport), CommunicatorOptions::from_env()) {}

template <class T>
Communicator<T>::Communicator(Topology topo, CommunicatorOptions opts) requires Connectable<T>
    : opts_(opts) {
  connect(std::move(topo), nullptr, {});
}

template <class T>
Communicator<T>::Communicator(Topology topo, std::shared_ptr<KvStore> store, std::string prefix,
                              CommunicatorOptions opts) requires Connectable<T> : opts_(opts) {
  connect(std::move(topo), std::move(store), std::move(prefix));
}

template <class T>
Communicator<T>::Communicator(std::unique_ptr<T> transport, CommunicatorOptions opts)
    : transport_(std::move(transport)), opts_(opts) {
  if constexpr (HasTopology<T>) {
    topo_ = transport_->topology();
  } else {
    topo_.rank = transport_->rank();
    topo_.size = transport_->size();
  }
  setup_selector();
}

template <class T>
void Communicator<T>::allreduce(TensorView in, TensorView out, ReduceOp op) {
  allreduce_impl(in, out, op, BlockSink{}, BlockSource{});
}

template <class T>
void Communicator<T>::allreduce_to(TensorView buf, ReduceOp op, BlockSink sink, BlockSource own) {
  allreduce_impl(buf, buf, op, sink, own);
}

template <class T>
void Communicator<T>::allreduce_impl(TensorView in, TensorView out, ReduceOp op, BlockSink sink,
                                     BlockSource own) {
  run(Collective::allreduce, in.dtype, op, in.count, -1, 0, [&](const AlgoOptions& opt) {
    check_cpu(in, "allreduce input");
    check_cpu(out, "allreduce output");
    same_type(in, out, "allreduce");
    if (in.count != out.count) {
      throw ConfigError("allreduce: input has " + std::to_string(in.count) +
                        " elements but output has " + std::to_string(out.count));
    }
    check_overlap("allreduce", in, out, in.data);
    last_zero_copy_ = false;
    if (try_zero_copy(in, out, op, opt, sink, own)) return;
    if (own) {  // the usual paths read the whole input from `in`: this rank's block goes there
      std::size_t first, count;
      zero_copy_block(in.count, rank(), size(), first, count);
      const std::size_t es = dtype_size(in.dtype);
      auto* dst = static_cast<std::byte*>(out.data) + first * es;
      own.runs(first, count, [&](std::size_t at, std::size_t m, const std::byte* src) {
        if (dst + at * es != src) std::memcpy(dst + at * es, src, m * es);
      });
    }
    if constexpr (HasNativeAllreduce<T>) {
      if (transport_->native_allreduce(in.data, out.data, in.count, in.dtype, op, opt)) return;
    }
    run_allreduce(in.data, out.data, in.count, in.dtype, op, opt);
  });
  // The zero-copy path handed the blocks already; every other path left the result in `out`.
  if (sink && !last_zero_copy_ && out.count > 0) {
    sink(0, out.count, static_cast<const std::byte*>(out.data));
  }
}

template <class T>
void Communicator<T>::allreduce_coalesced(std::span<const TensorView> in,
                                          std::span<const TensorView> out, ReduceOp op) {
  const DataType dtype = in.empty() ? DataType::float32 : in.front().dtype;
  std::size_t total = 0;
  for (const TensorView& v : in) total += v.count;
  run(Collective::allreduce, dtype, op, total, -1, 0, [&](const AlgoOptions& opt) {
    const char* what = "allreduce_coalesced";
    if (in.size() != out.size()) {
      throw ConfigError(std::string(what) + ": " + std::to_string(in.size()) + " inputs but " +
                        std::to_string(out.size()) + " outputs");
    }
    const std::size_t es = dtype_size(dtype);
    parts_.clear();
    listed_.clear();
    for (std::size_t i = 0; i < in.size(); ++i) {
      const TensorView& a = in[i];
      const TensorView& b = out[i];
      // Checked without building a string unless one fails (the engine calls this every step).
      if (a.device != Device::cpu() || b.device != Device::cpu() || a.dtype != dtype ||
          b.dtype != dtype || a.count != b.count || (a.count > 0 && (!a.data || !b.data))) {
        const std::string at = std::string(what) + " tensor " + std::to_string(i);
        if (a.device != Device::cpu() || b.device != Device::cpu()) {
          throw ConfigError(at + " is on a CUDA device: allreduce_coalesced needs host memory");
        }
        check_cpu(a, (at + " input").c_str());
        check_cpu(b, (at + " output").c_str());
        same_type(a, b, at.c_str());
        if (a.dtype != dtype) {
          throw ConfigError(at + ": dtype " + std::string(dtype_name(a.dtype)) +
                            ", but tensor 0 is " + std::string(dtype_name(dtype)) +
                            " (one dtype per call)");
        }
        throw ConfigError(at + ": input has " + std::to_string(a.count) +
                          " elements but output has " + std::to_string(b.count));
      }
      check_overlap(what, a, b, a.data);
      if (in[i].count == 0) continue;
      const auto* ib = static_cast<const std::byte*>(in[i].data);
      auto* ob = static_cast<std::byte*>(out[i].data);
      const std::size_t nb = in[i].count * es;
      // Tensors that follow each other in memory, inputs and outputs alike, are one part.
      if (!parts_.empty() && parts_.back().in + parts_.back().bytes == ib &&
          parts_.back().out + parts_.back().bytes == ob) {
        parts_.back().bytes += nb;
      } else {
        parts_.push_back({ib, ob, nb});
      }
      listed_.push_back({ib, ob, nb});
    }
    // No output may overlap another output, or another tensor's input: sorted, the outputs
    // must be disjoint, and an input may meet only its own output, exactly (in place).
    // (Tensors usually come in address order, and usually in place: then neither the sort nor
    // the inputs' check has anything to do.) A list equal to the last one checked passes as it
    // did then: the check depends on nothing but the addresses and sizes (sorting 1024 spans
    // was a sixth of an engine step of 1024 small tensors, a third of a coalesced one).
    if (listed_ != checked_) {
      spans_.clear();
      for (const CheckedSpan& c : listed_) spans_.emplace_back(c.out, c.bytes);
      if (!std::is_sorted(spans_.begin(), spans_.end())) std::sort(spans_.begin(), spans_.end());
      for (std::size_t k = 1; k < spans_.size(); ++k) {
        if (spans_[k - 1].first + spans_[k - 1].second > spans_[k].first) {
          throw ConfigError(std::string(what) +
                            ": two outputs overlap; every output needs memory "
                            "of its own");
        }
      }
      for (std::size_t i = 0; i < in.size(); ++i) {
        if (in[i].count == 0 || in[i].data == out[i].data) continue;  // in place: checked above
        const auto* ib = static_cast<const std::byte*>(in[i].data);
        const std::size_t b = in[i].count * es;
        auto it =
            std::lower_bound(spans_.begin(), spans_.end(), std::make_pair(ib + b, std::size_t{0}));
        if (it == spans_.begin()) continue;
        --it;  // the last output that starts before this input ends
        const bool overlaps = it->first + it->second > ib;
        const bool own = it->first == static_cast<const std::byte*>(out[i].data) && ib == it->first;
        if (overlaps && !own) {
          throw ConfigError(std::string(what) + ": the input of tensor " + std::to_string(i) +
                            " overlaps another tensor's output");
        }
      }
      checked_.swap(listed_);
    }
    last_zero_copy_ = false;
    last_allreduce_ = AllreduceAlgorithm::ring;
    // The ring reads and writes the tensors in place when the Selector runs the ring for this
    // size anyway (the same choice on every rank); another algorithm runs on a packed copy.
    bool pieces = false;
    if constexpr (VectoredP2P<T>) {
      pieces = size() == 1 || selector_.template select<AllreduceAlgorithm>(total * es) ==
                                  AllreduceAlgorithm::ring;
    }
    if (pieces) {
      pieces_.assign(parts_);
      allreduce_ring_pieces(*transport_, pieces_, dtype, op, opt);
    } else {
      // Packed into one buffer, the usual allreduce, unpacked.
      std::vector<std::byte>& buf = coalesce_buf_;
      buf.resize(total * es);
      std::size_t off = 0;
      for (const PieceMap::Part& p : parts_) {
        std::memcpy(buf.data() + off, p.in, p.bytes);
        off += p.bytes;
      }
      if (size() > 1) {
        run_allreduce(buf.data(), buf.data(), total, dtype, op, opt);
      }
      off = 0;
      for (const PieceMap::Part& p : parts_) {
        std::memcpy(p.out, buf.data() + off, p.bytes);
        off += p.bytes;
      }
    }
  });
}

template <class T>
std::shared_ptr<detail::SharedRegion> Communicator<T>::allocate_region(std::size_t bytes,
                                                                       std::size_t count,
                                                                       std::size_t elem_size) {
  if (!regions_) regions_ = std::make_shared<detail::RegionRegistry>();
  auto region = std::make_shared<detail::SharedRegion>();
  region->owner = regions_.get();
  region->id = regions_->next_id();
  region->peer_base.assign(static_cast<std::size_t>(size()), nullptr);
  region->peer_mapped.assign(static_cast<std::size_t>(size()), 0);
  const bool share = zero_copy_routes();
  // Created before the collective: a failure here is this rank's, and run() hands it to all.
  // pid, descriptor (-1: not offered), bytes asked for, bytes mapped, stamp.
  constexpr std::size_t kDesc = 5;
  std::int64_t mine[kDesc] = {static_cast<std::int64_t>(::getpid()), -1,
                              static_cast<std::int64_t>(bytes), 0, 0};
  std::vector<std::int64_t> all(kDesc * static_cast<std::size_t>(size()));
  run(Collective::allgather, DataType::int64, ReduceOp::sum, kDesc, -1, 0x300,
      [&](const AlgoOptions& opt) {
        std::random_device rd;
        const std::uint64_t stamp = (static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^
                                    static_cast<std::uint64_t>(::getpid());
        if (count > 0) {
          (void)detail::checked_bytes(count, elem_size, "allocate");
        } else {
          (void)detail::checked_bytes(bytes, 1, "allocate");
        }
        region->create(bytes, stamp);
        mine[1] = share ? region->fd : -1;
        mine[3] = static_cast<std::int64_t>(region->mapped);
        mine[4] = static_cast<std::int64_t>(stamp);
        std::vector<std::size_t> counts(static_cast<std::size_t>(size()), kDesc);
        run_allgather(mine, all.data(), counts, sizeof(std::int64_t), opt);
      });
  for (int r = 0; r < size(); ++r) {
    if (all[kDesc * static_cast<std::size_t>(r) + 2] != static_cast<std::int64_t>(bytes)) {
      // Every rank sees every count: the same error everywhere, without another message.
      std::string list;
      for (int q = 0; q < size(); ++q) {
        list += (q ? ", " : "") + std::to_string(all[kDesc * static_cast<std::size_t>(q) + 2]);
      }
      throw ConfigError("allocate: the ranks asked for different sizes (bytes by rank: " + list +
                        "); every rank must allocate the same count");
    }
  }
  region->peer_base[static_cast<std::size_t>(rank())] = region->base;
  std::uint8_t ok = 1;
  for (int r = 0; r < size() && share; ++r) {
    const std::size_t i = static_cast<std::size_t>(r);
    if (r == rank()) continue;
    const std::int64_t* d = all.data() + kDesc * i;
    if (d[1] < 0 ||
        !region->map_peer(r, static_cast<long>(d[0]), static_cast<long>(d[1]),
                          static_cast<std::size_t>(d[3]), static_cast<std::uint64_t>(d[4]))) {
      ok = 0;
    }
  }
  if (share) {
    // Shared only if every rank mapped every peer: the same answer everywhere. After this
    // collective nobody opens the descriptors any more.
    allreduce(TensorView(&ok, 1, DataType::uint8), ReduceOp::min);
    region->shared = ok != 0;
    if (!region->shared) {
      region->release_peers();
      region->peer_base[static_cast<std::size_t>(rank())] = region->base;
    }
  }
  region->close_fd();
  regions_->add(region);
  return region;
}

template <class T>
void Communicator<T>::check_buffer(const std::shared_ptr<detail::SharedRegion>& r, std::size_t have,
                                   std::size_t want, const char* what) {
  std::string problem;
  if (!r) {
    problem = "the Buffer holds no memory (default-constructed or moved from)";
  } else if (!r->alive) {
    problem =
        "the Buffer was allocated by a communicator that has ended; allocate it again from "
        "the communicator in use";
  } else if (r->owner != regions_.get()) {
    problem = "the Buffer was allocated by another communicator";
  } else if (want > have) {
    problem = "the Buffer holds " + std::to_string(have) + " elements, the collective needs " +
              std::to_string(want);
  }
  if (problem.empty()) return;
  // As any argument error of a collective: the other ranks' matching call fails too instead of
  // waiting (an earlier error of this communicator is thrown instead, as run() would).
  const ConfigError err(std::string(what) + ": " + problem);
  if (transport_->aborted()) transport_->rethrow();
  refuse(err);
  throw err;
}

template <class T>
bool Communicator<T>::try_zero_copy(const TensorView& in, const TensorView& out, ReduceOp op,
                                    const AlgoOptions& opt, BlockSink sink, BlockSource own) {
  if (!regions_ || in.count == 0 || in.bytes() < opts_.zero_copy_bytes) return false;
  detail::SharedRegion* ri = regions_->find(in.data, in.bytes());
  detail::SharedRegion* ro = ri ? regions_->find(out.data, out.bytes()) : nullptr;
  if (!ri || !ro) return false;
  const std::size_t in_off =
      static_cast<std::size_t>(static_cast<const std::byte*>(in.data) - ri->base);
  const std::size_t out_off =
      static_cast<std::size_t>(static_cast<std::byte*>(out.data) - ro->base);
  const std::size_t n = static_cast<std::size_t>(size());
  zc_in_.resize(n);
  zc_out_.resize(n);
  for (std::size_t r = 0; r < n; ++r) {
    zc_in_[r] = ri->peer_base[r] + in_off;
    zc_out_[r] = ro->peer_base[r] + out_off;
  }
  // Every rank must read the same regions at the same offsets, and all must take this path:
  // the barriers' Signature carries both, so a rank that differs (or sends data through the
  // channels instead) is a MismatchError on both sides, not a wrong read.
  AlgoOptions zo = opt;
  std::uint64_t h = 0x7a65726f636f7079ull;  // "zerocopy"
  for (std::uint64_t v :
       {ri->id, ro->id, static_cast<std::uint64_t>(in_off), static_cast<std::uint64_t>(out_off)}) {
    h = (h ^ v) * 0x100000001b3ull;
  }
  zo.sig.extra = h | 1;
  ZeroCopyArgs a;
  a.in = zc_in_;
  a.out = zc_out_;
  a.count = in.count;
  a.dtype = in.dtype;
  a.op = op;
  a.sink = sink;
  a.own = own;
  allreduce_zero_copy(*transport_, a, zo);
  last_zero_copy_ = true;
  return true;
}

template <class T>
void Communicator<T>::allreduce_compressed(TensorView in, TensorView out, ReduceOp op,
                                           const CompressionPolicy& wire) {
  const std::uint64_t wire_code = 0x100u + static_cast<std::uint64_t>(wire.wire);
  run(Collective::allreduce, in.dtype, op, in.count, -1, wire_code, [&](const AlgoOptions& opt) {
    check_cpu(in, "allreduce_compressed input");
    check_cpu(out, "allreduce_compressed output");
    same_type(in, out, "allreduce_compressed");
    if (in.dtype != DataType::float32) {
      throw ConfigError("allreduce_compressed: the tensor is " + std::string(dtype_name(in.dtype)) +
                        "; compression takes float32");
    }
    if (op != ReduceOp::sum && op != ReduceOp::average) {
      throw ConfigError("allreduce_compressed: op " + std::string(reduce_op_name(op)) +
                        " (compression supports sum and average)");
    }
    if (!wire.enabled() || dtype_size(wire.wire) != 2) {
      throw ConfigError("allreduce_compressed: compression '" + std::string(wire.name) +
                        "' has no 16-bit wire type");
    }
    if (in.count != out.count) {
      throw ConfigError("allreduce_compressed: input has " + std::to_string(in.count) +
                        " elements but output has " + std::to_string(out.count));
    }
    check_overlap("allreduce_compressed", in, out, in.data);
    const auto* src = static_cast<const float*>(in.data);
    auto* dst = static_cast<float*>(out.data);
    const WirePath path = size() == 1 ? WirePath::ring : wire_algorithm(in.count, wire);
    if (path == WirePath::ring) {
      allreduce_ring_wire(*transport_, src, dst, in.count, wire, op == ReduceOp::average, opt,
                          scratch_);
      last_allreduce_ = AllreduceAlgorithm::ring;
      return;
    }
    if (path == WirePath::hierarchical) {
      allreduce_hierarchical_wire(*transport_, groups_, src, dst, in.count, wire,
                                  op == ReduceOp::average, opt, scratch_);
      last_allreduce_ = AllreduceAlgorithm::hierarchical;
      return;
    }
    wire_buffer_.resize(in.count * dtype_size(wire.wire));
    wire.compress(src, wire_buffer_.data(), in.count, 1.0f);
    // Summed on the wire type; an average divides in float32 while decompressing (dividing
    // the 16-bit sum would round once more).
    run_allreduce(wire_buffer_.data(), wire_buffer_.data(), in.count, wire.wire, ReduceOp::sum,
                  opt);
    const float post = op == ReduceOp::average ? 1.0f / static_cast<float>(size()) : 1.0f;
    wire.decompress(wire_buffer_.data(), dst, in.count, post);
  });
}

template <class T>
void Communicator<T>::allgather(TensorView in, TensorView out) {
  run(Collective::allgather, in.dtype, ReduceOp::sum, in.count, -1, 0, [&](const AlgoOptions& opt) {
    check_cpu(in, "allgather input");
    check_cpu(out, "allgather output");
    same_type(in, out, "allgather");
    if (out.count != detail::saturating_mul(in.count, static_cast<std::size_t>(size()))) {
      throw ConfigError("allgather: output has " + std::to_string(out.count) +
                        " elements, expected size x input = " + std::to_string(size()) + " x " +
                        std::to_string(in.count));
    }
    check_overlap("allgather", in, out,
                  out.byte_data() + static_cast<std::size_t>(rank()) * in.bytes());
    const std::vector<std::size_t> counts(static_cast<std::size_t>(size()), in.count);
    if constexpr (HasNativeAllgatherv<T>) {
      if (transport_->native_allgatherv(in.data, out.data, counts, in.dtype, opt)) return;
    }
    run_allgather(in.data, out.data, counts, dtype_size(in.dtype), opt);
  });
}

template <class T>
void Communicator<T>::allgatherv(TensorView in, TensorView out,
                                 std::span<const std::size_t> counts) {
  // The counts' hash travels in the signature: ranks that disagree on them are caught.
  std::uint64_t h = 1469598103934665603ull;
  std::size_t sum = 0;
  for (std::size_t c : counts) {
    h = (h ^ c) * 1099511628211ull;
    sum += c;
  }
  // Ranks contribute different counts here, so the signature carries the total.
  run(Collective::allgatherv, in.dtype, ReduceOp::sum, sum, -1, h, [&](const AlgoOptions& opt) {
    check_cpu(in, "allgatherv input");
    check_cpu(out, "allgatherv output");
    same_type(in, out, "allgatherv");
    if (counts.size() != static_cast<std::size_t>(size())) {
      throw ConfigError("allgatherv: counts has " + std::to_string(counts.size()) +
                        " entries for " + std::to_string(size()) + " ranks");
    }
    if (counts[static_cast<std::size_t>(rank())] != in.count) {
      throw ConfigError("allgatherv: counts[" + std::to_string(rank()) +
                        "] = " + std::to_string(counts[static_cast<std::size_t>(rank())]) +
                        " but this rank's input has " + std::to_string(in.count) + " elements");
    }
    std::size_t total = 0;  // saturating: counts that wrap can match no output
    for (std::size_t c : counts) total = detail::saturating_add(total, c);
    if (out.count != total) {
      throw ConfigError("allgatherv: output has " + std::to_string(out.count) +
                        " elements, the counts add up to " + std::to_string(total));
    }
    const std::size_t before =
        std::accumulate(counts.begin(), counts.begin() + rank(), std::size_t{0});
    check_overlap("allgatherv", in, out, out.byte_data() + before * dtype_size(out.dtype));
    if constexpr (HasNativeAllgatherv<T>) {
      if (transport_->native_allgatherv(in.data, out.data, counts, in.dtype, opt)) return;
    }
    run_allgather(in.data, out.data, counts, dtype_size(in.dtype), opt);
  });
}

template <class T>
void Communicator<T>::broadcast(TensorView data, int root) {
  run(Collective::broadcast, data.dtype, ReduceOp::sum, data.count, root, 0,
      [&](const AlgoOptions& opt) {
        check_cpu(data, "broadcast buffer");
        check_root(root, "broadcast");
        agree(opt);
        if constexpr (HasNativeBroadcast<T>) {
          if (transport_->native_broadcast(data.data, data.count, data.dtype, root, opt)) return;
        }
        BroadcastArgs a;
        a.data = data.data;
        a.nbytes = data.bytes();
        a.root = root;
        last_broadcast_ = selector_.run<BroadcastAlgorithm>(*transport_, a, opt, context());
      });
}

template <class T>
void Communicator<T>::reduce_scatter(TensorView in, TensorView out, ReduceOp op) {
  run(Collective::reduce_scatter, in.dtype, op, out.count, -1, 0, [&](const AlgoOptions& opt) {
    check_cpu(in, "reduce_scatter input");
    check_cpu(out, "reduce_scatter output");
    same_type(in, out, "reduce_scatter");
    if (in.count != detail::saturating_mul(out.count, static_cast<std::size_t>(size()))) {
      throw ConfigError("reduce_scatter: input has " + std::to_string(in.count) +
                        " elements, expected size x output = " + std::to_string(size()) + " x " +
                        std::to_string(out.count));
    }
    check_overlap("reduce_scatter", in, out,
                  in.byte_data() + static_cast<std::size_t>(rank()) * out.bytes());
    if constexpr (HasNativeReduceScatter<T>) {
      if (transport_->native_reduce_scatter(in.data, out.data, out.count, in.dtype, op, opt)) {
        return;
      }
    }
    ReduceScatterArgs a;
    a.in = in.data;
    a.out = out.data;
    a.count = out.count;
    a.dtype = in.dtype;
    a.op = op;
    a.size = size();
    last_reduce_scatter_ = selector_.run<ReduceScatterAlgorithm>(*transport_, a, opt, context());
  });
}

template <class T>
void Communicator<T>::alltoall(TensorView in, TensorView out) {
  run(Collective::alltoall, in.dtype, ReduceOp::sum, in.count, -1, 0, [&](const AlgoOptions& opt) {
    check_cpu(in, "alltoall input");
    check_cpu(out, "alltoall output");
    same_type(in, out, "alltoall");
    if (in.count != out.count || in.count % static_cast<std::size_t>(size()) != 0) {
      throw ConfigError("alltoall: input (" + std::to_string(in.count) + ") and output (" +
                        std::to_string(out.count) +
                        ") must have the same count, divisible by the size " +
                        std::to_string(size()));
    }
    if (in.data == out.data && in.count > 0 && size() > 1) {
      throw ConfigError("alltoall: in-place is not supported; pass distinct buffers");
    }
    check_overlap("alltoall", in, out, nullptr);
    if constexpr (HasNativeAlltoall<T>) {
      if (transport_->native_alltoall(in.data, out.data,
                                      in.count / static_cast<std::size_t>(size()), in.dtype, opt)) {
        return;
      }
    }
    AlltoallArgs a;
    a.in = in.data;
    a.out = out.data;
    a.block_bytes = in.count / static_cast<std::size_t>(size()) * dtype_size(in.dtype);
    a.size = size();
    last_alltoall_ = selector_.run<AlltoallAlgorithm>(*transport_, a, opt, context());
  });
}

template <class T>
void Communicator<T>::barrier() {
  run(Collective::barrier, DataType::uint8, ReduceOp::sum, 0, -1, 0, [&](const AlgoOptions& opt) {
    if constexpr (HasNativeBarrier<T>) {
      if (transport_->native_barrier(opt)) return;
    }
    barrier_dissemination(*transport_, opt);
  });
}

template <class T>
void Communicator<T>::reduce(TensorView in, TensorView out, ReduceOp op, int root) {
  run(Collective::reduce, in.dtype, op, in.count, root, 0, [&](const AlgoOptions& opt) {
    check_cpu(in, "reduce input");
    check_root(root, "reduce");
    const bool is_root = rank() == root;
    if (is_root) {
      check_cpu(out, "reduce output");
      same_type(in, out, "reduce");
      if (in.count != out.count) {
        throw ConfigError("reduce: input has " + std::to_string(in.count) +
                          " elements but the root's output has " + std::to_string(out.count));
      }
      check_overlap("reduce", in, out, in.data);
    }
    const std::size_t bytes = in.bytes();
    if (bytes <= kRootedTreeBytes || size() <= 2) {
      agree(opt);
      reduce_binomial(*transport_, in.data, is_root ? out.data : nullptr, in.count, in.dtype, op,
                      root, scratch_, opt);
      return;
    }
    if (is_root) {
      run_allreduce(in.data, out.data, in.count, in.dtype, op, opt);
    } else {
      if (reduce_scratch_.size() < bytes) reduce_scratch_.resize(bytes);
      run_allreduce(in.data, reduce_scratch_.data(), in.count, in.dtype, op, opt);
    }
  });
}

template <class T>
void Communicator<T>::gather(TensorView in, TensorView out, int root) {
  run(Collective::gather, in.dtype, ReduceOp::sum, in.count, root, 0, [&](const AlgoOptions& opt) {
    check_cpu(in, "gather input");
    check_root(root, "gather");
    if (rank() == root) {
      check_cpu(out, "gather output");
      same_type(in, out, "gather");
      if (out.count != detail::saturating_mul(in.count, static_cast<std::size_t>(size()))) {
        throw ConfigError("gather: the root's output has " + std::to_string(out.count) +
                          " elements, expected size x input = " + std::to_string(size()) + " x " +
                          std::to_string(in.count));
      }
      check_overlap("gather", in, out,
                    out.byte_data() + static_cast<std::size_t>(root) * in.bytes());
    }
    agree(opt);
    gather_direct(*transport_, in.data, out.data, in.bytes(), root, opt);
  });
}

template <class T>
void Communicator<T>::scatter(TensorView in, TensorView out, int root) {
  run(Collective::scatter, out.dtype, ReduceOp::sum, out.count, root, 0,
      [&](const AlgoOptions& opt) {
        check_cpu(out, "scatter output");
        check_root(root, "scatter");
        if (rank() == root) {
          check_cpu(in, "scatter input");
          same_type(in, out, "scatter");
          if (in.count != detail::saturating_mul(out.count, static_cast<std::size_t>(size()))) {
            throw ConfigError("scatter: the root's input has " + std::to_string(in.count) +
                              " elements, expected size x output = " + std::to_string(size()) +
                              " x " + std::to_string(out.count));
          }
          check_overlap("scatter", out, in,
                        in.byte_data() + static_cast<std::size_t>(root) * out.bytes());
        }
        agree(opt);
        scatter_direct(*transport_, in.data, out.data, out.bytes(), root, opt);
      });
}

template <class T>
void Communicator<T>::alltoallv(TensorView in, std::span<const std::size_t> send_counts,
                                TensorView out, std::span<const std::size_t> recv_counts) {
  std::size_t sent = 0;
  for (std::size_t c : send_counts) sent += c;
  run(Collective::alltoallv, in.dtype, ReduceOp::sum, 0, -1, 0, [&](const AlgoOptions& opt) {
    check_cpu(in, "alltoallv input");
    check_cpu(out, "alltoallv output");
    same_type(in, out, "alltoallv");
    const auto n = static_cast<std::size_t>(size());
    if (send_counts.size() != n || recv_counts.size() != n) {
      throw ConfigError("alltoallv: send_counts has " + std::to_string(send_counts.size()) +
                        " and recv_counts " + std::to_string(recv_counts.size()) + " entries for " +
                        std::to_string(n) + " ranks");
    }
    std::size_t received = 0;
    for (std::size_t c : recv_counts) received += c;
    if (sent > in.count) {
      throw ConfigError("alltoallv: send_counts add up to " + std::to_string(sent) +
                        " elements but the input has " + std::to_string(in.count));
    }
    if (received > out.count) {
      throw ConfigError("alltoallv: recv_counts add up to " + std::to_string(received) +
                        " elements but the output has " + std::to_string(out.count));
    }
    check_overlap("alltoallv", TensorView(in.data, sent, in.dtype),
                  TensorView(out.data, received, out.dtype), nullptr);
    alltoallv_pairwise(*transport_, in.data, send_counts, out.data, recv_counts,
                       dtype_size(in.dtype), opt);
  });
}

template <class T>
bool Communicator<T>::test(P2PRequest& r) {
  if (r.done_) return true;
  guard_p2p([&] {
    if (transport_->test(r.req_)) {
      r.done_ = true;
    } else if (r.deadline_.expired()) {
      throw TimeoutError("send/recv: no completion within " +
                         std::to_string(transport_->timeout_seconds()) +
                         " s (did the peer post the matching call?)");
    }
  });
  return r.done_;
}

template <class T>
void Communicator<T>::wait(P2PRequest& r) {
  if (r.done_) return;
  guard_p2p([&] { transport_->wait(r.req_, r.deadline_); });
  r.done_ = true;
}

template <class T>
std::optional<Communicator<T>> Communicator<T>::split(int color, int key) {
  std::vector<std::int64_t> all(2 * static_cast<std::size_t>(size()));
  std::int64_t mine[2] = {color, key};
  allgather(TensorView(mine, 2, DataType::int64),
            TensorView(all.data(), all.size(), DataType::int64));
  const std::uint64_t seq = ++split_seq_;
  std::vector<std::pair<std::int64_t, int>> members;  // (key, rank) of my color
  for (int q = 0; q < size(); ++q) {
    const std::int64_t c = all[2 * static_cast<std::size_t>(q)];
    if (c < 0 && c != kUndefinedColor) {
      throw ConfigError("split: rank " + std::to_string(q) + " passed color " + std::to_string(c) +
                        ": colors are >= 0, or kolo::kUndefinedColor (-1) to join no group");
    }
    if (c == color) members.emplace_back(all[2 * static_cast<std::size_t>(q) + 1], q);
  }
  if (color == kUndefinedColor) return std::nullopt;
  if constexpr (!Connectable<T>) {
    throw ConfigError(
        "split: this communicator adopted a transport that is not built through a rendezvous "
        "store (e.g. MPI); split the MPI communicator (MPI_Comm_split) and adopt the result");
  } else {
    if (!boot_) {
      throw ConfigError(
          "split: this communicator adopted a transport without a rendezvous store (e.g. "
          "MPI); split the MPI communicator (MPI_Comm_split) and adopt the result instead");
    }
    std::sort(members.begin(), members.end());
    Topology t = topo_;
    t.size = static_cast<int>(members.size());
    for (std::size_t i = 0; i < members.size(); ++i) {
      if (members[i].second == rank()) t.rank = static_cast<int>(i);
    }
    t.local_rank = t.local_size = t.cross_rank = t.cross_size = -1;
    t.listen_fd = -1;
    const std::string prefix =
        boot_->prefix() + "split/" + std::to_string(seq) + "/" + std::to_string(color) + "/";
    return Communicator(std::move(t), boot_->shared_store(), prefix, opts_);
  }
}

template <class T>
void Communicator<T>::check_overlap(const char* what, const TensorView& in, const TensorView& out,
                                    const void* in_place) {
  if (in.bytes() == 0 || out.bytes() == 0 || in.data == nullptr || out.data == nullptr) return;
  const auto a0 = reinterpret_cast<std::uintptr_t>(in.data);
  const auto b0 = reinterpret_cast<std::uintptr_t>(out.data);
  const std::uintptr_t a1 = a0 + in.bytes();
  const std::uintptr_t b1 = b0 + out.bytes();
  if (a1 <= b0 || b1 <= a0) return;
  if (in_place != nullptr && (in_place == in.data || in_place == out.data)) {
    // the allowed alias: one range starts exactly where in-place use puts it, inside the other
    const bool in_inside = a0 >= b0 && a1 <= b1;
    const bool out_inside = b0 >= a0 && b1 <= a1;
    if ((in_place == in.data && in_inside) || (in_place == out.data && out_inside)) return;
  }
  auto hex = [](std::uintptr_t v) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "0x%llx", static_cast<unsigned long long>(v));
    return std::string(buf);
  };
  throw ConfigError(std::string(what) + ": input [" + hex(a0) + ", " + hex(a1) + ") and output [" +
                    hex(b0) + ", " + hex(b1) +
                    ") overlap; pass disjoint buffers, or the documented in-place form");
}

template <class T>
typename Communicator<T>::P2PRequest Communicator<T>::post(bool is_send, TensorView data, int peer,
                                                           int tag) {
  const char* what = is_send ? "send" : "recv";
  P2PRequest r;
  guard_p2p([&] {
    check_cpu(data, what);
    if (peer < 0 || peer >= size()) {
      throw ConfigError(std::string(what) + ": peer " + std::to_string(peer) +
                        " is not a rank of this communicator (size " + std::to_string(size()) +
                        ")");
    }
    if (peer == rank()) {
      throw ConfigError(std::string(what) + ": peer " + std::to_string(peer) +
                        " is this rank; copy the data locally instead");
    }
    Signature sig;
    sig.collective = Collective::send_recv;
    sig.dtype = data.dtype;
    sig.count = data.count;
    sig.extra = static_cast<std::uint64_t>(static_cast<std::uint32_t>(tag));
    auto& seq = is_send ? p2p_sent_ : p2p_received_;
    if (seq.size() < static_cast<std::size_t>(size())) seq.resize(static_cast<std::size_t>(size()));
    sig.seq = ++seq[static_cast<std::size_t>(peer)];
    r.deadline_ = Deadline::after(transport_->timeout_seconds());
    r.req_ = is_send ? transport_->isend(peer, data.data, data.bytes(), sig)
                     : transport_->irecv(peer, data.data, data.bytes(), sig);
    r.done_ = false;
  });
  return r;
}

template <class T>
void Communicator<T>::connect(Topology topo, std::shared_ptr<KvStore> store,
                              std::string prefix) requires Connectable<T> {
  // The transport's variables are read before the rendezvous, like the Topology's: a bad
  // value then fails every rank alike. Read after it, rank 0 (which may host the store)
  // would throw and take the store down while the others are still using it, and they
  // would report "store lost" instead of the bad variable.
  const typename T::Options topts = T::Options::from_env(process_env());
  boot_ = store || !prefix.empty()
              ? std::make_unique<Bootstrap>(std::move(topo), std::move(store), std::move(prefix))
              : std::make_unique<Bootstrap>(std::move(topo));
  transport_ = T::connect(*boot_, topts);
  if (!transport_) throw Error("Communicator: the transport's connect() returned nothing");
  topo_ = boot_->topology();
  setup_selector();
}

template <class T>
void Communicator<T>::setup_selector() {
  const int n = size();
  const int r = rank();
  SelectionShape shape;
  shape.size = n;
  ProbePartners partners;
  std::optional<TuningSource> source = opts_.tuning;
  // Routes are known when the transport reports them and the host keys were gathered (a
  // communicator built through its Bootstrap): ask "how does rank 0 reach q" for every q.
  // Otherwise one generic route, kept in the tcp slot, and built-in constants by default.
  bool routes = false;
  Route intra = Route::shm, inter = Route::tcp;
  if constexpr (HasPeerRoutes<T>) {
    if (boot_ != nullptr) {
      routes = true;
      const auto& keys = boot_->host_keys();
      groups_ = HostGroups::from_host_keys(keys, r);
      bool seen_intra = false, seen_inter = false;
      // Routes as rank 0 sees them (the probe is rank 0's), derived the same way on every rank.
      for (int q = 1; q < n; ++q) {
        const Route route = transport_->route_between(0, q);
        const bool same_host = keys[static_cast<std::size_t>(q)] == keys[0];
        if (same_host && !seen_intra) {
          intra = route;
          seen_intra = true;
        }
        if (!same_host && !seen_inter) {
          inter = route;
          seen_inter = true;
        }
        int& partner = route == Route::shm ? partners.shm : partners.tcp;
        if (partner < 0) partner = q;
      }
      if (!seen_inter) inter = intra;        // one host: the flat link is the host's own
      if (!source) source = TuningSource{};  // probe
    }
  }
  if (!routes) {
    groups_ = HostGroups::single_host(n, r);
    partners.tcp = n > 1 ? 1 : -1;
    intra = inter = Route::tcp;
  }
  Tuning tuning;
  if (source) {
    try {
      tuning = negotiate_tuning(*transport_, *source, partners,
                                Deadline::after(transport_->timeout_seconds()));
    } catch (const Error& e) {
      transport_->abort(e);
      throw;
    }
  }
  shape.hosts = groups_.hosts;
  // Inputs of the model must be the same on every rank: with uneven hosts this rank's own
  // host size is not, the largest one is.
  shape.local_size = groups_.max_local_size;
  shape.uniform = groups_.uniform;
  shape.hierarchical_ok =
      groups_.known && groups_.uniform && groups_.hosts > 1 && groups_.local_size() > 1;
  auto link = [&](Route route) { return route == Route::shm ? tuning.shm : tuning.tcp; };
  shape.intra = link(intra);
  shape.inter = link(inter);
  shape.flat = groups_.hosts > 1 ? shape.inter : shape.intra;
  selector_ = Selector(tuning, shape, opts_.segment_bytes);
  // The ring allreduce's interleaved allgather (AlgoOptions::ring_overlap_lag) pays where the
  // kernel copies each sent segment out of the sender's memory and every rank has a core: over
  // TCP loopback at N = 2 it took 0.7 x the time in the median (bimodal across fresh runs, level
  // with ranks pinned one per core); through shared memory, or with more ranks than cores, it
  // was slower. Decided from the routes as rank 0 sees them and the negotiated
  // tuning, so every rank decides the same.
  ring_overlap_lag_ =
      routes && intra == Route::tcp && inter == Route::tcp && selector_.oversubscription() <= 1.0
          ? kRingOverlapLag
          : 0;
  selector_.set_allreduce_rules(opts_.effective_allreduce_rules());
  selector_.set_rules(opts_.broadcast_rules);
  selector_.set_rules(opts_.allgather_rules);
  selector_.set_rules(opts_.reduce_scatter_rules);
  selector_.set_rules(opts_.alltoall_rules);
}

template <class T>
void Communicator<T>::run_allreduce(const void* in, void* out, std::size_t count, DataType dtype,
                                    ReduceOp op, const AlgoOptions& opt) {
  AllreduceArgs a;
  a.in = in;
  a.out = out;
  a.count = count;
  a.dtype = dtype;
  a.op = op;
  last_allreduce_ = selector_.run<AllreduceAlgorithm>(*transport_, a, opt, context());
}

template <class T>
void Communicator<T>::run_allgather(const void* in, void* out, std::span<const std::size_t> counts,
                                    std::size_t elem_size, const AlgoOptions& opt) {
  AllgatherArgs a;
  a.in = in;
  a.out = out;
  a.counts = counts;
  a.elem_size = elem_size;
  last_allgather_ = selector_.run<AllgatherAlgorithm>(*transport_, a, opt, context());
}

template <class T>
void Communicator<T>::check_cpu(const TensorView& v, const char* what) {
  if (v.device != Device::cpu() && !AcceptsDeviceBuffers<T>) {
    throw ConfigError(std::string(what) +
                      " is on a CUDA device: host transports need host memory (use the NCCL "
                      "transport for device buffers)");
  }
  if (v.data == nullptr && v.count > 0) {
    throw ConfigError(std::string(what) + " is a null pointer with " + std::to_string(v.count) +
                      " elements");
  }
  (void)detail::checked_bytes(v.count, dtype_size(v.dtype), what);
}

template <class T>
void Communicator<T>::same_type(const TensorView& a, const TensorView& b, const char* what) {
  if (a.dtype != b.dtype) {
    throw ConfigError(std::string(what) + ": input is " + std::string(dtype_name(a.dtype)) +
                      " but output is " + std::string(dtype_name(b.dtype)));
  }
}

template <class T>
void Communicator<T>::check_root(int root, const char* what) const {
  if (root < 0 || root >= size()) {
    throw ConfigError(std::string(what) + ": root " + std::to_string(root) +
                      " is not a rank of this communicator (size " + std::to_string(size()) + ")");
  }
}

}  // namespace kolo

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
