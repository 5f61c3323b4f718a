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

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "kolo/algorithm/allreduce_double_tree.hpp"
#include "kolo/algorithm/allreduce_halving_doubling.hpp"
#include "kolo/algorithm/allreduce_hierarchical.hpp"
#include "kolo/algorithm/allreduce_recursive_doubling.hpp"
#include "kolo/algorithm/alltoall_pairwise.hpp"
#include "kolo/algorithm/barrier_dissemination.hpp"
#include "kolo/algorithm/broadcast_binomial.hpp"
#include "kolo/algorithm/broadcast_chain.hpp"
#include "kolo/algorithm/group_view.hpp"
#include "kolo/algorithm/options.hpp"
#include "kolo/algorithm/ring_allgather.hpp"
#include "kolo/algorithm/ring_allreduce.hpp"
#include "kolo/algorithm/ring_reduce_scatter.hpp"
#include "kolo/algorithm/selector.hpp"
#include "kolo/algorithm/tuning_probe.hpp"
#include "kolo/core/env.hpp"
#include "kolo/core/error.hpp"
#include "kolo/core/signature.hpp"
#include "kolo/core/tensor.hpp"
#include "kolo/topology/bootstrap.hpp"
#include "kolo/transport/mesh.hpp"
#include "kolo/transport/routed.hpp"
#include "kolo/transport/transport.hpp"

namespace kolo {

// A transport that owns a native collective (MPI_Allreduce, ncclAllReduce) exposes it as
// native_<collective>(...) returning true when it took the call (dtype and op supported), false
// to fall back to kolo's own algorithms — NCCL's "native collective when available".
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

struct CommunicatorOptions {
  std::size_t segment_bytes = 256 * 1024;
  // Deprecated (KOLO_SMALL_ALLREDUCE_BYTES): recursive doubling up to this many bytes, ring
  // above — the fixed rule the Selector replaced. Ignored when allreduce_rules are given.
  std::optional<std::size_t> small_allreduce_bytes;
  // Per-size-range overrides of the Selector (KOLO_ALLREDUCE, KOLO_BROADCAST); empty: the cost
  // model decides. Grammar and names: algorithm/selector.hpp.
  SizeRules<AllreduceAlgorithm> allreduce_rules;
  SizeRules<BroadcastAlgorithm> broadcast_rules;
  // Where the Selector's constants come from (KOLO_TUNING=probe|default|file:PATH); unset: probe
  // for the mesh transports (shm, tcp, routed), built-in defaults for adopted transports.
  std::optional<TuningSource> tuning;

  static CommunicatorOptions from_env(const EnvLookup& env = process_env()) {
    CommunicatorOptions o;
    if (auto v = env_int(env, "KOLO_SMALL_ALLREDUCE_BYTES", 0, 1ll << 40)) {
      o.small_allreduce_bytes = static_cast<std::size_t>(*v);
    }
    if (auto v = env_int(env, "KOLO_SEGMENT_BYTES", 64, 1ll << 30)) {
      o.segment_bytes = static_cast<std::size_t>(*v);
    }
    // Set but empty means unset, as for KOLO_TRANSPORT.
    if (auto v = env("KOLO_ALLREDUCE"); v && !v->empty()) {
      o.allreduce_rules = SizeRules<AllreduceAlgorithm>::parse("KOLO_ALLREDUCE", *v);
    }
    if (auto v = env("KOLO_BROADCAST"); v && !v->empty()) {
      o.broadcast_rules = SizeRules<BroadcastAlgorithm>::parse("KOLO_BROADCAST", *v);
    }
    o.tuning = TuningSource::from_env(env);
    return o;
  }

  // The allreduce rules in effect: explicit rules, else the deprecated threshold, else none.
  SizeRules<AllreduceAlgorithm> effective_allreduce_rules() const {
    if (!allreduce_rules.empty() || !small_allreduce_bytes) return allreduce_rules;
    const std::size_t n = *small_allreduce_bytes;
    if (n == SizeRules<AllreduceAlgorithm>::kMax) {
      return SizeRules<AllreduceAlgorithm>::always(AllreduceAlgorithm::recursive_doubling);
    }
    return SizeRules<AllreduceAlgorithm>::parse(
        "KOLO_SMALL_ALLREDUCE_BYTES",
        "recursive-doubling:0-" + std::to_string(n) + ";ring:" + std::to_string(n + 1) + "-max");
  }
};

template <Transport T = MeshTransport>
class Communicator {
 public:
  using transport_type = T;

  // Reads the environment contract, rendezvouses, and connects the transport.
  static Communicator from_env() { return Communicator(Topology::from_env()); }

  explicit Communicator(Topology topo, CommunicatorOptions opts = CommunicatorOptions::from_env())
      : opts_(opts) {
    connect(std::move(topo), nullptr, {});
  }

  // Rendezvous through a store that exists already (a framework's: PyTorch's c10d store via
  // kolo_torch, or any KvStore) instead of the environment's KOLO_STORE. topo needs rank and
  // size (Topology::for_rank reads the optional KOLO_* knobs); `prefix` namespaces the keys:
  // the ranks of one communicator pass the same prefix, distinct communicators distinct ones.
  Communicator(Topology topo, std::shared_ptr<KvStore> store, std::string prefix,
               CommunicatorOptions opts = CommunicatorOptions::from_env())
      : opts_(opts) {
    connect(std::move(topo), std::move(store), std::move(prefix));
  }

  // Adopts a transport built elsewhere (e.g. from an MPI communicator: no store, no KOLO_*
  // variables). Its topology comes from the transport when it has one.
  explicit Communicator(std::unique_ptr<T> transport,
                        CommunicatorOptions opts = CommunicatorOptions::from_env())
      : transport_(std::move(transport)), opts_(opts) {
    if constexpr (requires(const T& t) {
                    { t.topology() } -> std::convertible_to<const Topology&>;
                  }) {
      topo_ = transport_->topology();
    } else {
      topo_.rank = transport_->rank();
      topo_.size = transport_->size();
    }
    setup_selector();
  }

  Communicator(Communicator&&) noexcept = default;
  Communicator& operator=(Communicator&&) noexcept = default;

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
  // The Selector decides allreduce and broadcast algorithms per call. To force one (kolo-bench
  // --algo), call the same on every rank before the collective:
  //   comm.selector().force_allreduce(AllreduceAlgorithm::tree);
  //   comm.selector().set_allreduce_rules("tree:0-64K;ring:64K-max");   // KOLO_ALLREDUCE grammar
  //   comm.selector().clear_overrides();                                // back to the model
  Selector& selector() { return selector_; }
  const Selector& selector() const { return selector_; }
  // What the last allreduce / broadcast ran (after fallbacks; native calls are not recorded).
  AllreduceAlgorithm last_allreduce_algorithm() const { return last_allreduce_; }
  BroadcastAlgorithm last_broadcast_algorithm() const { return last_broadcast_; }
  // This rank's host and cross-host groups (hierarchical allreduce).
  const HostGroups& host_groups() const { return groups_; }

  // ---- allreduce ----
  void allreduce(TensorView in, TensorView out, ReduceOp op = ReduceOp::sum) {
    run(Collective::allreduce, in.dtype, op, in.count, -1, 0, [&](const AlgoOptions& opt) {
      check_cpu(in, "allreduce input");
      check_cpu(out, "allreduce output");
      same_type(in, out, "allreduce");
      if (in.count != out.count) {
        throw ConfigError("allreduce: input has " + std::to_string(in.count) +
                          " elements but output has " + std::to_string(out.count));
      }
      if constexpr (HasNativeAllreduce<T>) {
        if (transport_->native_allreduce(in.data, out.data, in.count, in.dtype, op, opt)) return;
      }
      run_allreduce(in.data, out.data, in.count, in.dtype, op, opt);
    });
  }
  void allreduce(TensorView inout, ReduceOp op = ReduceOp::sum) { allreduce(inout, inout, op); }
  template <class E>
  requires is_kolo_element_v<E>
  void allreduce(std::span<E> inout, ReduceOp op = ReduceOp::sum) {
    allreduce(TensorView(inout), op);
  }

  // ---- allgather / allgatherv ----
  void allgather(TensorView in, TensorView out) {
    run(Collective::allgather, in.dtype, ReduceOp::sum, in.count, -1, 0,
        [&](const AlgoOptions& opt) {
          check_cpu(in, "allgather input");
          check_cpu(out, "allgather output");
          same_type(in, out, "allgather");
          if (out.count != in.count * static_cast<std::size_t>(size())) {
            throw ConfigError("allgather: output has " + std::to_string(out.count) +
                              " elements, expected size x input = " + std::to_string(size()) +
                              " x " + std::to_string(in.count));
          }
          if constexpr (HasNativeAllgatherv<T>) {
            const std::vector<std::size_t> counts(static_cast<std::size_t>(size()), in.count);
            if (transport_->native_allgatherv(in.data, out.data, counts, in.dtype, opt)) return;
          }
          allgather_ring(*transport_, in.data, out.data, in.count, dtype_size(in.dtype), opt);
        });
  }

  void allgatherv(TensorView in, TensorView out, std::span<const std::size_t> counts) {
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
      const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
      if (out.count != total) {
        throw ConfigError("allgatherv: output has " + std::to_string(out.count) +
                          " elements, the counts add up to " + std::to_string(total));
      }
      if constexpr (HasNativeAllgatherv<T>) {
        if (transport_->native_allgatherv(in.data, out.data, counts, in.dtype, opt)) return;
      }
      allgatherv_ring(*transport_, in.data, out.data, counts, dtype_size(in.dtype), opt);
    });
  }

  // ---- broadcast ----
  void broadcast(TensorView data, int root = 0) {
    run(Collective::broadcast, data.dtype, ReduceOp::sum, data.count, root, 0,
        [&](const AlgoOptions& opt) {
          check_cpu(data, "broadcast buffer");
          check_root(root, "broadcast");
          if constexpr (HasNativeBroadcast<T>) {
            if (transport_->native_broadcast(data.data, data.count, data.dtype, root, opt)) return;
          }
          last_broadcast_ = selector_.broadcast(data.bytes());
          if (last_broadcast_ == BroadcastAlgorithm::binomial) {
            broadcast_binomial(*transport_, data.data, data.bytes(), root, opt);
          } else {
            broadcast_chain(*transport_, data.data, data.bytes(), root, opt);
          }
        });
  }
  template <class E>
  requires is_kolo_element_v<E>
  void broadcast(std::span<E> data, int root = 0) { broadcast(TensorView(data), root); }

  // ---- reduce_scatter ----
  void reduce_scatter(TensorView in, TensorView out, ReduceOp op = ReduceOp::sum) {
    run(Collective::reduce_scatter, in.dtype, op, out.count, -1, 0, [&](const AlgoOptions& opt) {
      check_cpu(in, "reduce_scatter input");
      check_cpu(out, "reduce_scatter output");
      same_type(in, out, "reduce_scatter");
      if (in.count != out.count * static_cast<std::size_t>(size())) {
        throw ConfigError("reduce_scatter: input has " + std::to_string(in.count) +
                          " elements, expected size x output = " + std::to_string(size()) + " x " +
                          std::to_string(out.count));
      }
      if constexpr (HasNativeReduceScatter<T>) {
        if (transport_->native_reduce_scatter(in.data, out.data, out.count, in.dtype, op, opt)) {
          return;
        }
      }
      reduce_scatter_ring(*transport_, in.data, out.data, out.count, in.dtype, op, scratch_, opt);
    });
  }

  // ---- alltoall ----
  void alltoall(TensorView in, TensorView out) {
    run(Collective::alltoall, in.dtype, ReduceOp::sum, in.count, -1, 0,
        [&](const AlgoOptions& opt) {
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
          if constexpr (HasNativeAlltoall<T>) {
            if (transport_->native_alltoall(in.data, out.data,
                                            in.count / static_cast<std::size_t>(size()), in.dtype,
                                            opt)) {
              return;
            }
          }
          alltoall_pairwise(*transport_, in.data, out.data,
                            in.count / static_cast<std::size_t>(size()) * dtype_size(in.dtype),
                            opt);
        });
  }

  // ---- barrier ----
  void barrier() {
    run(Collective::barrier, DataType::uint8, ReduceOp::sum, 0, -1, 0, [&](const AlgoOptions& opt) {
      if constexpr (HasNativeBarrier<T>) {
        if (transport_->native_barrier(opt)) return;
      }
      barrier_dissemination(*transport_, opt);
    });
  }

 private:
  // Bootstrap (from the topology's store address, or from `store` when given) and connect.
  void connect(Topology topo, std::shared_ptr<KvStore> store, std::string prefix) {
    auto make_boot = [&] {
      return store || !prefix.empty()
                 ? std::make_unique<Bootstrap>(std::move(topo), std::move(store), std::move(prefix))
                 : std::make_unique<Bootstrap>(std::move(topo));
    };
    if constexpr (std::is_base_of_v<MeshTransport, T>) {
      // The transport's variables are read before the rendezvous, like the Topology's: a bad
      // value then fails every rank alike. Read after it, rank 0 (which may host the store)
      // would throw and take the store down while the others are still using it, and they
      // would report "store lost" instead of the bad variable.
      const RouteMode mode = route_mode_from_env();
      const MeshOptions mesh = MeshOptions::from_env();
      boot_ = make_boot();
      transport_ = std::make_unique<T>(*boot_, mode, mesh);
    } else {
      boot_ = make_boot();
      transport_ = std::make_unique<T>(*boot_);
    }
    topo_ = boot_->topology();
    setup_selector();
  }

  // Host groups, route constants and overrides; the tuning probe is a collective (every rank
  // constructs its communicator at the same point), and its errors reach every rank.
  void setup_selector() {
    const int n = size();
    const int r = rank();
    SelectionShape shape;
    shape.size = n;
    ProbePartners partners;
    std::optional<TuningSource> source = opts_.tuning;
    bool mesh = false;
    if constexpr (std::is_base_of_v<MeshTransport, T>) mesh = boot_ != nullptr;
    if (mesh) {
      const auto& keys = boot_->host_keys();
      groups_ = HostGroups::from_host_keys(keys, r);
      const RouteMode mode = mesh_mode();
      // Routes as rank 0 sees them (the probe is rank 0's), derived the same way on every rank.
      for (int q = 1; q < n; ++q) {
        const bool shm =
            mode != RouteMode::tcp_only && keys[static_cast<std::size_t>(q)] == keys[0];
        int& partner = shm ? partners.shm : partners.tcp;
        if (partner < 0) partner = q;
      }
      if (!source) source = TuningSource{};  // probe
    } else {
      groups_ = HostGroups::single_host(n, r);
      partners.tcp = n > 1 ? 1 : -1;  // one generic route, kept in the tcp slot
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
    shape.hierarchical_ok =
        groups_.known && groups_.uniform && groups_.hosts > 1 && groups_.local_size() > 1;
    if (mesh) {
      const RouteMode mode = mesh_mode();
      shape.intra = mode == RouteMode::tcp_only ? tuning.tcp : tuning.shm;
      shape.inter = mode == RouteMode::shm_only ? tuning.shm : tuning.tcp;
      shape.flat = groups_.hosts > 1 ? shape.inter : shape.intra;
    } else {
      shape.flat = shape.intra = shape.inter = tuning.tcp;
    }
    selector_ = Selector(tuning, shape, opts_.segment_bytes);
    selector_.set_allreduce_rules(opts_.effective_allreduce_rules());
    selector_.set_broadcast_rules(opts_.broadcast_rules);
  }

  RouteMode mesh_mode() const {
    if constexpr (std::is_base_of_v<MeshTransport, T>) {
      return transport_->mode();
    } else {
      return RouteMode::tcp_only;
    }
  }

  // One place that runs what the Selector chose.
  void run_allreduce(const void* in, void* out, std::size_t count, DataType dtype, ReduceOp op,
                     const AlgoOptions& opt) {
    const std::size_t bytes = count * dtype_size(dtype);
    AllreduceAlgorithm a = selector_.allreduce(bytes);
    if (a == AllreduceAlgorithm::hierarchical && !groups_.uniform) {
      a = selector_.model_allreduce(bytes);  // uneven hosts: the best flat algorithm instead
    }
    last_allreduce_ = a;
    const std::size_t es = dtype_size(dtype);
    if (a != AllreduceAlgorithm::hierarchical) {
      AlgoOptions o = opt;
      if (a == AllreduceAlgorithm::tree)
        o.tree_segment_bytes = selector_.tree_segment((count + 1) / 2 * es);
      run_flat_allreduce(*transport_, a, in, out, count, dtype, op, o);
      return;
    }
    const AllreduceAlgorithm cross = selector_.cross_allreduce(bytes);
    allreduce_hierarchical(
        *transport_, groups_, in, out, count, dtype, op,
        [&](GroupView<T>& g, void* block, std::size_t n, ReduceOp inner) {
          AlgoOptions o = opt;
          if (cross == AllreduceAlgorithm::tree) {
            o.tree_segment_bytes = selector_.tree_segment((n + 1) / 2 * es, true);
          }
          run_flat_allreduce(g, cross, block, block, n, dtype, inner, o);
        },
        opt);
  }

  template <Transport U>
  void run_flat_allreduce(U& t, AllreduceAlgorithm a, const void* in, void* out, std::size_t count,
                          DataType dtype, ReduceOp op, const AlgoOptions& opt) {
    switch (a) {
      case AllreduceAlgorithm::tree:
        allreduce_double_tree(t, in, out, count, dtype, op, opt);
        return;
      case AllreduceAlgorithm::halving_doubling:
        allreduce_halving_doubling(t, in, out, count, dtype, op, opt);
        return;
      case AllreduceAlgorithm::recursive_doubling:
        allreduce_recursive_doubling(t, in, out, count, dtype, op, scratch_, opt);
        return;
      case AllreduceAlgorithm::ring:
      case AllreduceAlgorithm::hierarchical:
        break;
    }
    allreduce_ring(t, in, out, count, dtype, op, opt);
  }

  template <class Body>
  void run(Collective c, DataType dtype, ReduceOp op, std::size_t count, int root,
           std::uint64_t extra, Body&& body) {
    if (transport_->aborted()) transport_->rethrow();
    AlgoOptions opt;
    opt.sig.collective = c;
    opt.sig.dtype = dtype;
    opt.sig.op = op;
    opt.sig.root = root;
    opt.sig.count = count;
    opt.sig.seq = ++seq_;
    opt.sig.extra = extra;
    opt.deadline = Deadline::after(transport_->timeout_seconds());
    opt.segment_bytes = opts_.segment_bytes;
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

  // Device buffers reach only transports that take them (NcclTransport, CudaStagedTransport
  // declare accepts_device_buffers); those decide by the pointer itself.
  static constexpr bool accepts_device() {
    if constexpr (requires { T::accepts_device_buffers; }) {
      return T::accepts_device_buffers;
    } else {
      return false;
    }
  }
  static void check_cpu(const TensorView& v, const char* what) {
    if (v.device != Device::cpu() && !accepts_device()) {
      throw ConfigError(std::string(what) +
                        " is on a CUDA device: host transports need host memory (use the NCCL "
                        "transport for device buffers)");
    }
    if (v.data == nullptr && v.count > 0) {
      throw ConfigError(std::string(what) + " is a null pointer with " + std::to_string(v.count) +
                        " elements");
    }
  }
  static void same_type(const TensorView& a, const TensorView& b, const char* what) {
    if (a.dtype != b.dtype) {
      throw ConfigError(std::string(what) + ": input is " + std::string(dtype_name(a.dtype)) +
                        " but output is " + std::string(dtype_name(b.dtype)));
    }
  }
  void check_root(int root, const char* what) const {
    if (root < 0 || root >= size()) {
      throw ConfigError(std::string(what) + ": root " + std::to_string(root) +
                        " is not a rank of this communicator (size " + std::to_string(size()) +
                        ")");
    }
  }

  std::unique_ptr<Bootstrap> boot_;
  std::unique_ptr<T> transport_;
  Topology topo_;
  CommunicatorOptions opts_;
  std::uint64_t seq_ = 0;
  std::vector<std::byte> scratch_;
  HostGroups groups_;
  Selector selector_;
  AllreduceAlgorithm last_allreduce_ = AllreduceAlgorithm::ring;
  BroadcastAlgorithm last_broadcast_ = BroadcastAlgorithm::chain;
};

}  // namespace kolo
