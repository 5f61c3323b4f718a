// kolo/communicator/options.hpp — CommunicatorOptions: a communicator's settings (segment and
// zero-copy sizes, the rooted agreement, the per-collective algorithm rules, the tuning source),
// read once from KOLO_* (definitions: detail/communicator_impl.hpp), the name of the
// transport's own options a constructor may take (TransportOptions<T>), and shrink's options
// and a communicator's Lineage (communicator/fault.hpp), grow's and join's options
// (communicator/grow.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "kolo/algorithm/entry.hpp"
#include "kolo/algorithm/selector.hpp"
#include "kolo/algorithm/tuning_probe.hpp"
#include "kolo/core/env.hpp"

namespace kolo {

namespace detail {
// T::Options, the transport's own options (transport.hpp, Connectable), or an empty type for a
// transport without them (the Communicator's constructors that take them then do not apply).
struct NoTransportOptions {};
template <class T>
struct TransportOptionsOf {
  using type = NoTransportOptions;
};
template <class T>
requires requires {
  typename T::Options;
}
struct TransportOptionsOf<T> {
  using type = typename T::Options;
};
}  // namespace detail
template <class T>
using TransportOptions = typename detail::TransportOptionsOf<T>::type;

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
  // The Selector's constants measured already (a communicator that replaces its parent —
  // Communicator::shrink — runs over the same links): used as they are, no probe, no tuning
  // source read. Unset: `tuning` decides.
  std::optional<Tuning> inherited_tuning;

  static CommunicatorOptions from_env(const EnvLookup& env = process_env());

  // KOLO_<COLLECTIVE> for every collective with a registry, in one place. Set but empty means
  // unset, as for KOLO_TRANSPORT.
  static void read_algorithm_rules(const EnvLookup& env, CommunicatorOptions& o);

  // The allreduce rules in effect: explicit rules, else the deprecated threshold, else none.
  SizeRules<AllreduceAlgorithm> effective_allreduce_rules() const;

  // Calls f(rules) for each collective's rules above: the one list that reading them
  // (read_algorithm_rules) and handing them to the Selector (communicator/setup.hpp) walk.
  template <class F>
  void for_each_rules(F&& f) {
    visit_rules(*this, f);
  }
  template <class F>
  void for_each_rules(F&& f) const {
    visit_rules(*this, f);
  }

 private:
  template <class Self, class F>
  static void visit_rules(Self& o, F& f) {
    f(o.allreduce_rules);
    f(o.broadcast_rules);
    f(o.allgather_rules);
    f(o.reduce_scatter_rules);
    f(o.alltoall_rules);
  }
};

// Communicator::shrink's options.
struct ShrinkOptions {
  // The whole shrink — the survivors' agreement and the new communicator's set-up — in seconds;
  // < 0: the smaller of the communicator's timeout (KOLO_TIMEOUT_SECONDS) and 10 s. A survivor
  // that has not reached the shrink when 60 % of it has passed is excluded as if it had died.
  double timeout_seconds = -1;
  // Fewer survivors than this: an Error on every survivor instead of a smaller communicator
  // (Spark's min_np, Horovod's --min-np).
  int min_size = 1;
  // For fault-injection tests only: called at each step of the shrink (1 before this rank's
  // "here" record, 2 after it, 3 after the decision, 4 after the new communicator is built).
  std::function<void(int step)> test_hook;
};

// Communicator::grow's options (the members' side; communicator/grow.hpp).
struct GrowOptions {
  // The join token the new processes pass to Communicator::join; every member passes the same,
  // and each grow needs a token of its own (a token used before is a ConfigError). Required.
  std::string token;
  // The whole grow — the joiners' arrival and the enlarged communicator's set-up — in seconds;
  // < 0: the communicator's timeout (KOLO_TIMEOUT_SECONDS). Joiners that have not come by then
  // make it a TimeoutError on every member, which keeps its communicator.
  double timeout_seconds = -1;
};

// Communicator::join's options (the new processes' side; communicator/grow.hpp).
struct JoinOptions {
  // How long to wait for the members' offer and the set-up, in seconds; < 0: KOLO_TIMEOUT_SECONDS
  // (default 30).
  double timeout_seconds = -1;
};

// Where a communicator came from: 0 and empty lists for one built from the environment or a
// store; a shrink's result records which ranks of its parent it kept and which it excluded, a
// grow's how many joined.
struct Lineage {
  std::uint64_t generation = 0;  // +1 per shrink or grow
  std::string root;              // the store prefix of the first ancestor (the shrink keys' home)
  std::vector<int> parent_rank;  // this communicator's rank i was its parent's parent_rank[i]
                                 // (-1: a process that joined in a grow)
  std::vector<int> excluded;     // the parent's ranks the survivors agreed to exclude
  int joined = 0;                // ranks that joined in the grow that made this communicator
};

}  // namespace kolo
