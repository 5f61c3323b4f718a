// kolo/algorithm/selector.hpp — which algorithm runs a collective: one argmin over the
// collective's registry (algorithm/registry.hpp) of an α-β-γ cost model per route, overridable
// per size range. One place decides (NCCL's tuning.cc is the model); the algorithms only execute.
//
// Model (Hockney; Thakur, Rabenseifner & Gropp 2005): sending m bytes over a link costs
// α + m·β, reducing m bytes costs m·γ. Each algorithm's time is a formula in (n, S, α, β, γ)
// (next to the algorithm, and in docs/algorithms.md); the cheapest applicable one wins. The
// constants come from a short probe at communicator creation (tuning_probe.hpp), a file, or the
// defaults here, per route: shared memory (ranks of one host) and TCP (between hosts). On a host
// with more ranks than cores, host-local β and γ are multiplied by the ranks per core.
//
// Overrides, per size range in bytes, one variable per collective, one grammar:
//   KOLO_ALLREDUCE="tree:0-65536;ring:65537-max"    ring, tree, halving-doubling (rabenseifner),
//                                                    recursive-doubling, hierarchical,
//                                                    direct (one-shot), auto
//   KOLO_BROADCAST="binomial:0-32767;chain:32K-max"  chain, binomial (tree), auto
//   KOLO_ALLGATHER, KOLO_REDUCE_SCATTER              ring, auto
//   KOLO_ALLTOALL                                    pairwise (direct), auto
// (plus any registered algorithm's name). A rule is NAME:LO-HI with LO, HI inclusive byte counts
// (K, M, G suffixes: powers of 1024; HI may be "max"); rules are separated by ';' and must cover
// 0..max exactly once; a bare NAME alone means NAME:0-max. "auto" hands a range back to the
// cost model. Anything else is a ConfigError naming the fault. The byte count is the
// collective's: allreduce and broadcast the buffer, allgather the whole result, reduce_scatter
// and alltoall the whole input.
//
// Every rank must select the same algorithm for the same call, so the inputs are only what all
// ranks share: the byte count, the topology, and constants that rank 0 measured and broadcast.
// The model is evaluated at the next power of two of the byte count, so ranks that disagree on a
// count by a few elements (a user error) still run the same algorithm and the Signature check
// reports the mismatch instead of a hang.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "kolo/algorithm/entry.hpp"
#include "kolo/algorithm/registry.hpp"
#include "kolo/core/compiled_core.hpp"
#include "kolo/core/error.hpp"

namespace kolo {

// Parses an algorithm name or alias of collective Algo; nullopt means "auto". Unknown names are
// a ConfigError listing the valid ones.
template <AlgorithmId Algo>
std::optional<Algo> parse_algorithm(std::string_view name, std::string_view what = "algorithm") {
  return AlgorithmRegistry<Algo>::instance().parse(name, what);
}

inline std::optional<AllreduceAlgorithm> parse_allreduce_algorithm(std::string_view name) {
  return parse_algorithm<AllreduceAlgorithm>(name, "allreduce");
}
inline std::optional<BroadcastAlgorithm> parse_broadcast_algorithm(std::string_view name) {
  return parse_algorithm<BroadcastAlgorithm>(name, "broadcast");
}

namespace detail {

// A rule of KOLO_<COLLECTIVE> with its algorithm as a registry index (-1: auto). Parsing and
// checking the rules does not depend on the collective, so it is compiled once
// (detail/selector_impl.hpp), not once per collective.
struct SizeRuleSpan {
  std::size_t lo, hi;  // inclusive
  int algo;
};
inline constexpr std::size_t kSizeRuleMax = std::numeric_limits<std::size_t>::max();
// The index an algorithm name in a rule names (-1: auto); a ConfigError starting with `what`
// for an unknown one.
using RuleNameParser = int (*)(std::string_view name, std::string_view what);
// Parses "name:lo-hi;name:lo-hi;..." into rules sorted by `lo` that cover 0..max once; `var`
// names the setting in error messages.
KOLO_IMPL_INLINE std::vector<SizeRuleSpan> parse_size_rules(std::string_view var,
                                                            std::string_view spec,
                                                            RuleNameParser parse_name);
// "lo-hi", with "max" for the largest bound.
KOLO_IMPL_INLINE std::string size_range_text(std::size_t lo, std::size_t hi);

}  // namespace detail

// A choice of algorithm per byte range: KOLO_<COLLECTIVE>, or forced in code.
template <AlgorithmId Algo>
class SizeRules {
 public:
  using algorithm_type = Algo;
  static constexpr std::size_t kMax = detail::kSizeRuleMax;
  struct Rule {
    std::size_t lo, hi;        // inclusive
    std::optional<Algo> algo;  // nullopt: the cost model decides
  };

  SizeRules() = default;  // no rules: the cost model decides everywhere
  static SizeRules always(Algo a) {
    SizeRules r;
    r.rules_.push_back({0, kMax, a});
    return r;
  }

  // Parses "name:lo-hi;name:lo-hi;..."; `var` names the setting in error messages.
  static SizeRules parse(std::string_view var, std::string_view spec) {
    SizeRules out;
    for (const detail::SizeRuleSpan& r : detail::parse_size_rules(var, spec, &parse_name)) {
      out.rules_.push_back(
          {r.lo, r.hi, r.algo < 0 ? std::nullopt : std::optional<Algo>(static_cast<Algo>(r.algo))});
    }
    return out;
  }

  bool empty() const { return rules_.empty(); }
  const std::vector<Rule>& rules() const { return rules_; }

  // The forced algorithm for `bytes`, or nullopt when the cost model decides.
  std::optional<Algo> lookup(std::size_t bytes) const {
    for (const Rule& r : rules_) {
      if (bytes >= r.lo && bytes <= r.hi) return r.algo;
    }
    return std::nullopt;
  }

  std::string describe() const {
    if (rules_.empty()) return "auto";
    std::string s;
    for (const Rule& r : rules_) {
      if (!s.empty()) s += ";";
      s += std::string(r.algo ? algorithm_name(*r.algo) : "auto") + ":" + range_text(r);
    }
    return s;
  }

 private:
  static std::string range_text(const Rule& r) { return detail::size_range_text(r.lo, r.hi); }
  static int parse_name(std::string_view name, std::string_view what) {
    const std::optional<Algo> a = parse_algorithm<Algo>(name, what);
    return a ? static_cast<int>(*a) : -1;
  }

  std::vector<Rule> rules_;
};

// ---------------------------------------------------------------- constants

// The constants of the cost model. Defaults: what this project's 2-core CI machine measured
// (docs/algorithms.md); the probe replaces them at communicator creation unless KOLO_TUNING says
// otherwise.
struct Tuning {
  LinkCost shm{15e-6, 0.15e-9};
  LinkCost tcp{40e-6, 0.55e-9};
  double gamma = 0.1e-9;  // seconds per byte of a reduction (float32 sum, cache-resident)
  // Cores available to rank 0 (0: unknown). With more ranks on a host than cores, the model
  // charges host-local copies and reductions for sharing them (Selector::oversubscription()).
  int cores = 0;
  enum class Source : std::uint8_t { defaults = 0, probe = 1, file = 2 } source = Source::defaults;

  static const char* source_name(Source s) {
    return s == Source::probe ? "probe" : s == Source::file ? "file" : "default";
  }

  // "key value" lines: microseconds for α, nanoseconds per byte for β and γ, and the cores.
  std::string to_text() const;

  // Parses to_text()'s format; keys may be missing (defaults stay), unknown keys and bad numbers
  // are ConfigErrors naming `where` and the line.
  static Tuning from_text(std::string_view text, const std::string& where);
};

// ---------------------------------------------------------------- the selector

class Selector {
 public:
  Selector() : Selector(Tuning{}, SelectionShape{}) {}
  Selector(Tuning tuning, SelectionShape shape, std::size_t segment_bytes = 256 * 1024);

  const Tuning& tuning() const { return tuning_; }
  const SelectionShape& shape() const { return shape_; }
  // Ranks per core on the busiest host (1 when the cores are unknown or suffice).
  double oversubscription() const { return rho_; }

  // ---- any collective: Algo is AllreduceAlgorithm, BroadcastAlgorithm, AllgatherAlgorithm,
  //      ReduceScatterAlgorithm or AlltoallAlgorithm ----

  // The algorithm for `bytes`: the override for that size if it can run here, else the model.
  template <AlgorithmId Algo>
  Algo select(std::size_t bytes) const {
    const auto& t = table<Algo>();
    if (auto a = t.rules.lookup(bytes); a && runnable(*a)) return *a;
    return model<Algo>(bytes);
  }
  // The model's choice alone (overrides ignored), at the next power of two of `bytes`.
  template <AlgorithmId Algo>
  Algo model(std::size_t bytes) const {
    auto& t = table<Algo>();
    const std::size_t b = bucket_index(bytes);
    const int cached = t.cache[b].load(std::memory_order_relaxed);
    if (cached >= 0) return static_cast<Algo>(cached);
    const Algo best = argmin<Algo>(bucket(bytes));
    t.cache[b].store(static_cast<int>(best), std::memory_order_relaxed);
    return best;
  }
  // Modelled seconds for exactly `bytes`; +infinity when the algorithm cannot run here or the
  // model never picks it on this topology.
  template <AlgorithmId Algo>
  double cost(Algo a, std::size_t bytes) const {
    return cost_at(a, static_cast<double>(bytes));
  }
  // True when `a` is registered (as of this Selector's creation) and can run here.
  template <AlgorithmId Algo>
  bool runnable(Algo a) const {
    const auto* e = entry(a);
    return e != nullptr && (e->applies == nullptr || e->applies(shape_));
  }
  // Every rank must make the same calls (kolo-bench --algo, tests).
  template <AlgorithmId Algo>
  void force(Algo a) {
    table<Algo>().rules = SizeRules<Algo>::always(a);
  }
  template <AlgorithmId Algo>
  void set_rules(SizeRules<Algo> r) {
    table<Algo>().rules = std::move(r);
  }
  // KOLO_<COLLECTIVE>'s grammar; a bad spec is a ConfigError.
  template <AlgorithmId Algo>
  void set_rules(std::string_view spec) {
    table<Algo>().rules =
        SizeRules<Algo>::parse(std::string(AlgorithmTraits<Algo>::name) + " rules", spec);
  }
  template <AlgorithmId Algo>
  const SizeRules<Algo>& rules() const {
    return table<Algo>().rules;
  }
  // The entries this Selector chooses from (the registry when it was created).
  template <AlgorithmId Algo>
  const std::vector<const AlgorithmEntry<Algo>*>& entries() const {
    return table<Algo>().entries;
  }
  // Where the model's choice changes between `lo` and `hi` bytes (powers of two): {first size,
  // algorithm} pairs, for docs and logs.
  template <AlgorithmId Algo>
  std::vector<std::pair<std::size_t, Algo>> switch_points(std::size_t lo = 8,
                                                          std::size_t hi = std::size_t{1}
                                                                           << 30) const {
    std::vector<std::pair<std::size_t, Algo>> out;
    for (std::size_t b = lo; b <= hi; b *= 2) {
      const Algo a = model<Algo>(b);
      if (out.empty() || out.back().second != a) out.emplace_back(b, a);
    }
    return out;
  }

  // Runs the selected algorithm of `a` on `t` and returns which ran. `ctx` brings the scratch
  // buffer and the host layout; the link and segment cap are filled in here.
  template <AlgorithmId Algo>
  Algo run(TransportRef t, const typename AlgorithmTraits<Algo>::Args& a, const AlgoOptions& opt,
           AlgoContext ctx) const {
    const Algo id = select<Algo>(a.bytes());
    ctx.link = shape_.flat;
    ctx.segment_cap = segment_bytes_;
    if constexpr (std::is_same_v<Algo, AllreduceAlgorithm>) {
      ctx.sub_allreduce = &Selector::run_cross;
      ctx.self = this;
    }
    entry(id)->run(t, a, opt, ctx);
    return id;
  }

  // ---- allreduce and broadcast by name (the API before the registry) ----
  void force_allreduce(AllreduceAlgorithm a) { force(a); }
  void force_broadcast(BroadcastAlgorithm a) { force(a); }
  // Same grammar as KOLO_ALLREDUCE / KOLO_BROADCAST; a bad spec is a ConfigError.
  void set_allreduce_rules(std::string_view spec);
  void set_broadcast_rules(std::string_view spec);
  void set_allreduce_rules(SizeRules<AllreduceAlgorithm> r) { set_rules(std::move(r)); }
  void set_broadcast_rules(SizeRules<BroadcastAlgorithm> r) { set_rules(std::move(r)); }
  // Back to the cost model for every size and collective.
  void clear_overrides();
  const SizeRules<AllreduceAlgorithm>& allreduce_rules() const {
    return rules<AllreduceAlgorithm>();
  }
  const SizeRules<BroadcastAlgorithm>& broadcast_rules() const {
    return rules<BroadcastAlgorithm>();
  }
  AllreduceAlgorithm allreduce(std::size_t bytes) const {
    return select<AllreduceAlgorithm>(bytes);
  }
  BroadcastAlgorithm broadcast(std::size_t bytes) const {
    return select<BroadcastAlgorithm>(bytes);
  }
  AllreduceAlgorithm model_allreduce(std::size_t bytes) const {
    return model<AllreduceAlgorithm>(bytes);
  }
  BroadcastAlgorithm model_broadcast(std::size_t bytes) const {
    return model<BroadcastAlgorithm>(bytes);
  }
  std::vector<std::pair<std::size_t, AllreduceAlgorithm>> allreduce_switch_points(
      std::size_t lo = 8, std::size_t hi = std::size_t{1} << 30) const {
    return switch_points<AllreduceAlgorithm>(lo, hi);
  }

  // The algorithm for the cross-host step of a hierarchical allreduce whose shards carry
  // `shard_bytes` each (one rank per host takes part).
  AllreduceAlgorithm cross_allreduce_for_shard(std::size_t shard_bytes) const {
    const std::size_t b = bucket_index(shard_bytes);
    const int cached = cross_cache_[b].load(std::memory_order_relaxed);
    if (cached >= 0) return static_cast<AllreduceAlgorithm>(cached);
    const int L = std::max(1, shape_.local_size);
    LinkCost shared = shape_.inter;
    shared.beta *= L;
    const AllreduceAlgorithm a = best_flat(shape_.hosts, bucket(shard_bytes), shared).first;
    cross_cache_[b].store(static_cast<int>(a), std::memory_order_relaxed);
    return a;
  }
  // The same for an allreduce of `bytes` in total (each shard carries bytes / local_size).
  AllreduceAlgorithm cross_allreduce(std::size_t bytes) const {
    return cross_allreduce_for_shard(bytes /
                                     static_cast<std::size_t>(std::max(1, shape_.local_size)));
  }

  // The double tree's segment for a tree carrying `half_bytes` (identical on every rank: the
  // constants are rank 0's). `cross`: for the cross-host step of a hierarchical allreduce.
  KOLO_IMPL_INLINE std::size_t tree_segment(std::size_t half_bytes, bool cross = false) const;

  std::string describe() const;

 private:
  static constexpr std::size_t kBuckets = 66;  // 0, 1, 2^1 .. 2^64

  // One collective's state: the registry's entries at creation, the overrides, and the model's
  // choice per power-of-two bucket (computed once; -1: not yet).
  template <class Algo>
  struct Table {
    std::vector<const AlgorithmEntry<Algo>*> entries;
    SizeRules<Algo> rules;
    mutable std::array<std::atomic<int>, kBuckets> cache;

    Table() { clear_cache(); }
    Table(const Table& o) : entries(o.entries), rules(o.rules) { clear_cache(); }
    Table& operator=(const Table& o) {
      entries = o.entries;
      rules = o.rules;
      clear_cache();
      return *this;
    }
    void snapshot() {
      entries = algorithm_entries<Algo>();
      clear_cache();
    }
    void clear_cache() {
      for (auto& c : cache) c.store(-1, std::memory_order_relaxed);
    }
  };
  struct CrossCache {
    mutable std::array<std::atomic<int>, kBuckets> v;
    CrossCache() { clear(); }
    CrossCache(const CrossCache&) { clear(); }
    CrossCache& operator=(const CrossCache&) {
      clear();
      return *this;
    }
    void clear() {
      for (auto& c : v) c.store(-1, std::memory_order_relaxed);
    }
    std::atomic<int>& operator[](std::size_t i) const { return v[i]; }
  };

  template <class Algo>
  Table<Algo>& table() {
    return std::get<Table<Algo>>(tables_);
  }
  template <class Algo>
  const Table<Algo>& table() const {
    return std::get<Table<Algo>>(tables_);
  }
  template <class Algo>
  const AlgorithmEntry<Algo>* entry(Algo a) const {
    const auto& e = table<Algo>().entries;
    const auto i = static_cast<std::size_t>(a);
    return i < e.size() ? e[i] : nullptr;
  }

  // The next power of two of `bytes` (0 and 1 themselves), and its bucket: 0, 1, 2 + log2.
  static double bucket(std::size_t bytes) {
    if (bytes <= 1) return static_cast<double>(bytes);
    const auto k = std::min<std::size_t>(62, static_cast<std::size_t>(std::bit_width(bytes - 1)));
    return static_cast<double>(std::size_t{1} << k);
  }
  static std::size_t bucket_index(std::size_t bytes) {
    if (bytes <= 1) return bytes;
    return 1 + static_cast<std::size_t>(std::bit_width(bytes - 1));
  }

  CostQuery query(double S) const {
    CostQuery q;
    q.n = shape_.size;
    q.bytes = S;
    q.link = eff_flat_;
    q.gamma = eff_gamma_;
    q.segment_bytes = segment_bytes_;
    q.contention = shape_.hosts > 1 ? std::max(1, shape_.local_size) : 1;
    q.oversubscription = rho_;
    q.shape = &shape_;
    q.best_flat_allreduce = [](const void* self, int n, double bytes, LinkCost l) {
      return static_cast<const Selector*>(self)->best_flat(n, bytes, l).second;
    };
    q.self = this;
    return q;
  }

  template <class Algo>
  double cost_at(Algo a, double S) const {
    const auto* e = entry(a);
    if (e == nullptr || e->cost == nullptr || !runnable(a)) {
      return std::numeric_limits<double>::infinity();
    }
    return e->cost(query(S));
  }

  template <class Algo>
  Algo argmin(double S) const {
    const auto& es = table<Algo>().entries;
    const CostQuery q = query(S);
    Algo best = static_cast<Algo>(0);
    double best_t = std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < es.size(); ++i) {
      const auto* e = es[i];
      if (e->cost == nullptr || (e->applies != nullptr && !e->applies(shape_))) continue;
      const double t = e->cost(q);
      if (t < best_t) {  // ties: the earlier entry
        best_t = t;
        best = static_cast<Algo>(i);
      }
    }
    return best;
  }

  // The cheapest flat allreduce over n ranks (hierarchical's cross step: one rank per host, the
  // link as given, no further sharing).
  std::pair<AllreduceAlgorithm, double> best_flat(int n, double S, LinkCost l) const {
    CostQuery q;
    q.n = n;
    q.bytes = S;
    q.link = l;
    q.gamma = eff_gamma_;
    q.segment_bytes = segment_bytes_;
    const auto& es = table<AllreduceAlgorithm>().entries;
    std::pair<AllreduceAlgorithm, double> best{AllreduceAlgorithm::ring,
                                               std::numeric_limits<double>::infinity()};
    for (std::size_t i = 0; i < es.size(); ++i) {
      if (!es[i]->flat || es[i]->cost == nullptr) continue;
      const double t = es[i]->cost(q);
      if (t < best.second) best = {static_cast<AllreduceAlgorithm>(i), t};
    }
    return best;
  }

  // AlgoContext::sub_allreduce: the cross-host step of hierarchical, on the inter-host link.
  static void run_cross(const void* self, TransportRef group, const AllreduceArgs& a,
                        const AlgoOptions& opt) {
    const auto& s = *static_cast<const Selector*>(self);
    const AllreduceAlgorithm id = s.cross_allreduce_for_shard(a.bytes());
    AlgoContext ctx;
    ctx.link = s.shape_.inter;
    ctx.segment_cap = s.segment_bytes_;
    std::vector<std::byte> scratch;
    ctx.scratch = &scratch;
    s.entry(id)->run(group, a, opt, ctx);
  }

  Tuning tuning_;
  SelectionShape shape_;
  std::size_t segment_bytes_ = 256 * 1024;
  double rho_ = 1;
  LinkCost eff_flat_;
  double eff_gamma_ = 0;
  std::tuple<Table<AllreduceAlgorithm>, Table<BroadcastAlgorithm>, Table<AllgatherAlgorithm>,
             Table<ReduceScatterAlgorithm>, Table<AlltoallAlgorithm>>
      tables_;
  CrossCache cross_cache_;
};

}  // namespace kolo

// Header-only: the definitions of the non-template members, inline (compiled core: in the
// library, src/lib/core_impl.cpp).
#if !KOLO_USE_COMPILED_CORE
#include "kolo/algorithm/detail/selector_impl.hpp"
#endif
