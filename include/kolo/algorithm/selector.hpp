// kolo/algorithm/selector.hpp — which algorithm runs a collective: an α-β-γ cost model per
// route, overridable per size range. One place decides (NCCL's tuning.cc is the model);
// the algorithms only execute.
//
// Model (Hockney; Thakur, Rabenseifner & Gropp 2005): sending m bytes over a link costs
// α + m·β, reducing m bytes costs m·γ. Each algorithm's time is a formula in (n, S, α, β, γ)
// (below, next to each cost function, and in docs/algorithms.md); the cheapest wins. The
// constants come from a short probe at communicator creation (tuning_probe.hpp), a file, or the
// defaults here, per route: shared memory (ranks of one host) and TCP (between hosts).
//
// Overrides, per size range in bytes, same grammar for both variables:
//   KOLO_ALLREDUCE="tree:0-65536;ring:65537-max"    ring, tree, halving-doubling (rabenseifner),
//                                                    recursive-doubling, hierarchical, auto
//   KOLO_BROADCAST="binomial:0-32767;chain:32K-max"  chain, binomial (tree), auto
// A rule is NAME:LO-HI with LO, HI inclusive byte counts (K, M, G suffixes: powers of 1024;
// HI may be "max"); rules are separated by ';' and must cover 0..max exactly once. "auto" hands
// a range back to the cost model. Anything else is a ConfigError naming the fault.
//
// Every rank must select the same algorithm for the same call, so the inputs are only what all
// ranks share: the byte count, the topology, and constants that rank 0 measured and broadcast.
// The model is evaluated at the next power of two of the byte count, so ranks that disagree on a
// count by a few elements (a user error) still run the same algorithm and the Signature check
// reports the mismatch instead of a hang.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kolo/algorithm/allreduce_double_tree.hpp"
#include "kolo/core/error.hpp"

namespace kolo {

enum class AllreduceAlgorithm : std::uint8_t {
  ring = 0,
  tree = 1,  // pipelined double binary tree
  halving_doubling = 2,
  recursive_doubling = 3,
  hierarchical = 4,
};
inline constexpr AllreduceAlgorithm all_allreduce_algorithms[] = {
    AllreduceAlgorithm::ring, AllreduceAlgorithm::tree, AllreduceAlgorithm::halving_doubling,
    AllreduceAlgorithm::recursive_doubling, AllreduceAlgorithm::hierarchical};

enum class BroadcastAlgorithm : std::uint8_t { chain = 0, binomial = 1 };
inline constexpr BroadcastAlgorithm all_broadcast_algorithms[] = {BroadcastAlgorithm::chain,
                                                                  BroadcastAlgorithm::binomial};

inline const char* algorithm_name(AllreduceAlgorithm a) {
  switch (a) {
    case AllreduceAlgorithm::ring:
      return "ring";
    case AllreduceAlgorithm::tree:
      return "tree";
    case AllreduceAlgorithm::halving_doubling:
      return "halving-doubling";
    case AllreduceAlgorithm::recursive_doubling:
      return "recursive-doubling";
    case AllreduceAlgorithm::hierarchical:
      return "hierarchical";
  }
  return "unknown";
}

inline const char* algorithm_name(BroadcastAlgorithm a) {
  return a == BroadcastAlgorithm::chain ? "chain" : "binomial";
}

namespace detail {

struct AlgoName {
  std::string_view name;
  int value;  // -1: auto
};

inline constexpr AlgoName kAllreduceNames[] = {
    {"ring", 0},
    {"tree", 1},
    {"double-tree", 1},
    {"double-binary-tree", 1},
    {"halving-doubling", 2},
    {"rabenseifner", 2},
    {"recursive-doubling", 3},
    {"hierarchical", 4},
    {"auto", -1},
};
inline constexpr const char* kAllreduceExpected =
    "ring, tree, halving-doubling (or rabenseifner), recursive-doubling, hierarchical, auto";

inline constexpr AlgoName kBroadcastNames[] = {
    {"chain", 0}, {"binomial", 1}, {"tree", 1}, {"auto", -1}};
inline constexpr const char* kBroadcastExpected = "chain, binomial (or tree), auto";

template <class Algo>
struct AlgoTraits;
template <>
struct AlgoTraits<AllreduceAlgorithm> {
  static constexpr const AlgoName* begin() { return std::begin(kAllreduceNames); }
  static constexpr const AlgoName* end() { return std::end(kAllreduceNames); }
  static constexpr const char* expected() { return kAllreduceExpected; }
};
template <>
struct AlgoTraits<BroadcastAlgorithm> {
  static constexpr const AlgoName* begin() { return std::begin(kBroadcastNames); }
  static constexpr const AlgoName* end() { return std::end(kBroadcastNames); }
  static constexpr const char* expected() { return kBroadcastExpected; }
};

inline std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

inline std::string lower(std::string_view s) {
  std::string o(s);
  for (char& c : o) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  return o;
}

}  // namespace detail

// Parses an algorithm name ("ring", "tree", "halving-doubling", ...); nullopt means "auto".
// Unknown names are a ConfigError listing the valid ones.
template <class Algo>
std::optional<Algo> parse_algorithm(std::string_view name, std::string_view what = "algorithm") {
  const std::string n = detail::lower(detail::trim(name));
  for (auto* e = detail::AlgoTraits<Algo>::begin(); e != detail::AlgoTraits<Algo>::end(); ++e) {
    if (e->name == n) {
      if (e->value < 0) return std::nullopt;
      return static_cast<Algo>(e->value);
    }
  }
  throw ConfigError(std::string(what) + ": unknown algorithm '" + std::string(detail::trim(name)) +
                    "' (expected " + detail::AlgoTraits<Algo>::expected() + ")");
}

inline std::optional<AllreduceAlgorithm> parse_allreduce_algorithm(std::string_view name) {
  return parse_algorithm<AllreduceAlgorithm>(name, "allreduce");
}
inline std::optional<BroadcastAlgorithm> parse_broadcast_algorithm(std::string_view name) {
  return parse_algorithm<BroadcastAlgorithm>(name, "broadcast");
}

// A choice of algorithm per byte range: KOLO_ALLREDUCE / KOLO_BROADCAST, or forced in code.
template <class Algo>
class SizeRules {
 public:
  static constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();
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
    const std::string where = std::string(var) + "=\"" + std::string(spec) + "\": ";
    SizeRules out;
    if (detail::trim(spec).empty()) throw ConfigError(where + "is empty");
    std::string_view rest = spec;
    while (true) {
      const auto semi = rest.find(';');
      const std::string_view item = detail::trim(rest.substr(0, semi));
      if (!item.empty())
        out.rules_.push_back(parse_rule(where, item));
      else if (semi != std::string_view::npos && semi + 1 < rest.size())
        throw ConfigError(where + "empty rule between ';'");
      if (semi == std::string_view::npos) break;
      rest.remove_prefix(semi + 1);
    }
    std::sort(out.rules_.begin(), out.rules_.end(),
              [](const Rule& a, const Rule& b) { return a.lo < b.lo; });
    std::size_t next = 0;  // the first byte count not covered yet
    bool done = false;
    for (std::size_t i = 0; i < out.rules_.size(); ++i) {
      const Rule& r = out.rules_[i];
      if (done || (i > 0 && r.lo < next)) {
        const Rule& p = out.rules_[i - 1];
        throw ConfigError(where + "ranges " + range_text(p) + " and " + range_text(r) + " overlap");
      }
      if (r.lo > next) {
        throw ConfigError(where + "does not cover sizes " + std::to_string(next) + "-" +
                          std::to_string(r.lo - 1) + " (rules must cover 0-max)");
      }
      if (r.hi == kMax) {
        done = true;
      } else {
        next = r.hi + 1;
      }
    }
    if (!done) {
      throw ConfigError(where + "does not cover sizes " + std::to_string(next) +
                        "-max (rules must cover 0-max)");
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
  static std::string bound_text(std::size_t v) {
    return v == kMax ? std::string("max") : std::to_string(v);
  }
  static std::string range_text(const Rule& r) { return bound_text(r.lo) + "-" + bound_text(r.hi); }

  static std::size_t parse_bound(const std::string& where, std::string_view rule,
                                 std::string_view text) {
    const std::string t = detail::lower(detail::trim(text));
    auto bad = [&](const std::string& why) {
      return ConfigError(where + "bad range in rule '" + std::string(rule) + "': " + why);
    };
    if (t == "max") return kMax;
    if (t.empty()) throw bad("a bound is missing");
    std::size_t i = 0;
    unsigned long long v = 0;
    while (i < t.size() && t[i] >= '0' && t[i] <= '9') {
      const unsigned d = static_cast<unsigned>(t[i] - '0');
      if (v > (std::numeric_limits<unsigned long long>::max() - d) / 10) throw bad("too large");
      v = v * 10 + d;
      ++i;
    }
    if (i == 0) throw bad("'" + std::string(detail::trim(text)) + "' is not a byte count");
    unsigned shift = 0;
    const std::string suffix = t.substr(i);
    if (suffix == "k" || suffix == "kb" || suffix == "kib") {
      shift = 10;
    } else if (suffix == "m" || suffix == "mb" || suffix == "mib") {
      shift = 20;
    } else if (suffix == "g" || suffix == "gb" || suffix == "gib") {
      shift = 30;
    } else if (!suffix.empty()) {
      throw bad("'" + std::string(detail::trim(text)) +
                "' is not a byte count (suffixes: K, M, G)");
    }
    if (shift && v > (std::numeric_limits<unsigned long long>::max() >> shift))
      throw bad("too large");
    return static_cast<std::size_t>(v << shift);
  }

  static Rule parse_rule(const std::string& where, std::string_view item) {
    const auto colon = item.find(':');
    if (colon == std::string_view::npos) {
      throw ConfigError(where + "rule '" + std::string(item) +
                        "' is not NAME:LO-HI (e.g. ring:0-max)");
    }
    const std::string_view name = item.substr(0, colon);
    const std::string_view range = detail::trim(item.substr(colon + 1));
    Rule r{};
    try {
      r.algo = parse_algorithm<Algo>(name, "rule '" + std::string(item) + "'");
    } catch (const ConfigError& e) {
      throw ConfigError(where + e.what());
    }
    const auto dash = range.find('-');
    if (dash == std::string_view::npos) {
      throw ConfigError(where + "bad range in rule '" + std::string(item) +
                        "': expected LO-HI, e.g. 0-65536 or 65537-max");
    }
    r.lo = parse_bound(where, item, range.substr(0, dash));
    r.hi = parse_bound(where, item, range.substr(dash + 1));
    if (r.lo == kMax) {
      throw ConfigError(where + "bad range in rule '" + std::string(item) +
                        "': the lower bound cannot be max");
    }
    if (r.lo > r.hi) {
      throw ConfigError(where + "bad range in rule '" + std::string(item) +
                        "': " + std::to_string(r.lo) + " is above " + bound_text(r.hi));
    }
    return r;
  }

  std::vector<Rule> rules_;
};

// ---------------------------------------------------------------- constants

// One route's Hockney parameters: a message of m bytes takes alpha + m·beta seconds.
struct LinkCost {
  double alpha = 0;  // seconds
  double beta = 0;   // seconds per byte
};

// The constants of the cost model. Defaults: what this project's 2-core CI machine measured
// (docs/algorithms.md); the probe replaces them at communicator creation unless KOLO_TUNING says
// otherwise.
struct Tuning {
  LinkCost shm{15e-6, 0.15e-9};
  LinkCost tcp{40e-6, 0.55e-9};
  double gamma = 0.1e-9;  // seconds per byte of a reduction (float32 sum, cache-resident)
  enum class Source : std::uint8_t { defaults = 0, probe = 1, file = 2 } source = Source::defaults;

  static const char* source_name(Source s) {
    return s == Source::probe ? "probe" : s == Source::file ? "file" : "default";
  }

  // "key value" lines: microseconds for α, nanoseconds per byte for β and γ.
  std::string to_text() const {
    char buf[512];
    std::snprintf(buf, sizeof(buf),
                  "# kolo tuning: alpha in microseconds, beta and gamma in nanoseconds per byte\n"
                  "shm_alpha_us %.4f\nshm_beta_ns %.5f\ntcp_alpha_us %.4f\ntcp_beta_ns %.5f\n"
                  "gamma_ns %.5f\n",
                  shm.alpha * 1e6, shm.beta * 1e9, tcp.alpha * 1e6, tcp.beta * 1e9, gamma * 1e9);
    return buf;
  }

  // Parses to_text()'s format; keys may be missing (defaults stay), unknown keys and bad numbers
  // are ConfigErrors naming `where` and the line.
  static Tuning from_text(std::string_view text, const std::string& where) {
    Tuning t;
    std::size_t line_no = 0;
    while (!text.empty()) {
      const auto nl = text.find('\n');
      std::string_view line = detail::trim(text.substr(0, nl));
      text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty() || line.front() == '#') continue;
      const auto sp = line.find_first_of(" \t=");
      const std::string key(line.substr(0, sp));
      const std::string val(sp == std::string_view::npos ? "" : detail::trim(line.substr(sp + 1)));
      const std::string at = where + ": line " + std::to_string(line_no) + ": ";
      char* end = nullptr;
      const double v = std::strtod(val.c_str(), &end);
      if (val.empty() || end != val.c_str() + val.size() || !(v >= 0) || !std::isfinite(v)) {
        throw ConfigError(at + "'" + std::string(line) + "' needs a non-negative number");
      }
      if (key == "shm_alpha_us") {
        t.shm.alpha = v * 1e-6;
      } else if (key == "shm_beta_ns") {
        t.shm.beta = v * 1e-9;
      } else if (key == "tcp_alpha_us") {
        t.tcp.alpha = v * 1e-6;
      } else if (key == "tcp_beta_ns") {
        t.tcp.beta = v * 1e-9;
      } else if (key == "gamma_ns") {
        t.gamma = v * 1e-9;
      } else {
        throw ConfigError(at + "unknown key '" + key +
                          "' (expected shm_alpha_us, shm_beta_ns, tcp_alpha_us, tcp_beta_ns, "
                          "gamma_ns)");
      }
    }
    return t;
  }
};

// What the model needs to know about the communicator.
struct SelectionShape {
  int size = 1;
  int hosts = 1;                 // hosts in the job (1 when unknown)
  int local_size = 1;            // ranks per host (the largest host's count when uneven)
  bool hierarchical_ok = false;  // several hosts with several ranks each, equal counts, known
  LinkCost flat;   // the link every step of a flat algorithm waits on (the slowest route in use)
  LinkCost intra;  // between ranks of one host
  LinkCost inter;  // between hosts
};

// ---------------------------------------------------------------- cost formulas

namespace cost {

inline int floor_pow2(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}
inline int log2_floor(int n) {
  int k = 0;
  while ((2 << k) <= n) ++k;
  return k;
}

// Ring: reduce-scatter + allgather, each n-1 steps of S/n bytes.
//   2(n-1)·α + 2(n-1)/n·S·β + (n-1)/n·S·γ
inline double ring(int n, double S, LinkCost l, double gamma) {
  if (n <= 1) return 0;
  const double f = static_cast<double>(n - 1) / n;
  return 2.0 * (n - 1) * l.alpha + 2.0 * f * S * l.beta + f * S * gamma;
}

// Extra cost of folding n - p ranks into a power of two p and back (MPICH's pairing):
//   (α + S·β + S·γ) before, (α + S·β) after.
inline double non_pow2_fold(int n, double S, LinkCost l, double gamma) {
  return n == floor_pow2(n) ? 0.0 : 2.0 * l.alpha + 2.0 * S * l.beta + S * gamma;
}

// Recursive doubling: log2(p) rounds exchanging everything.
//   log2(p)·(α + S·β + S·γ) [+ fold]
inline double recursive_doubling(int n, double S, LinkCost l, double gamma) {
  if (n <= 1) return 0;
  return log2_floor(n) * (l.alpha + S * l.beta + S * gamma) + non_pow2_fold(n, S, l, gamma);
}

// Rabenseifner: recursive halving reduce-scatter + recursive doubling allgather.
//   2·log2(p)·α + 2(p-1)/p·S·β + (p-1)/p·S·γ [+ fold]
inline double halving_doubling(int n, double S, LinkCost l, double gamma) {
  if (n <= 1) return 0;
  const int p = floor_pow2(n);
  const double f = static_cast<double>(p - 1) / p;
  return 2.0 * log2_floor(n) * l.alpha + 2.0 * f * S * l.beta + f * S * gamma +
         non_pow2_fold(n, S, l, gamma);
}

// The double tree's shape, from the trees themselves: depth, and the most links any rank serves
// in both trees together (each link carries S/2 up and S/2 down per tree).
struct TreeShape {
  int depth = 0;
  int max_links = 0;
  int max_children = 0;  // in one tree: how many segments one rank folds per segment
};
inline TreeShape double_tree_shape(int n) {
  TreeShape s;
  if (n <= 1) return s;
  // Depth: follow parents from every rank (n is small: ranks of one job).
  for (int which = 0; which < 2; ++which) {
    for (int r = 0; r < n; ++r) {
      int d = 0;
      for (int x = r; double_tree_links(n, x, which).parent >= 0;
           x = double_tree_links(n, x, which).parent)
        ++d;
      s.depth = std::max(s.depth, d);
    }
  }
  for (int r = 0; r < n; ++r) {
    int links = 0;
    for (int which = 0; which < 2; ++which) {
      const TreeLinks l = double_tree_links(n, r, which);
      links += (l.parent >= 0) + l.children();
      s.max_children = std::max(s.max_children, l.children());
    }
    s.max_links = std::max(s.max_links, links);
  }
  return s;
}

// Pipelined double binary tree, segments of s bytes, depth D, a rank serving at most E links:
//   2·D·(α + c·s·β)  [filling and draining the pipeline, c children per segment]
//   + E·(S/2)·β      [the busiest rank's traffic: S/2 per link and direction]
//   + c/2·S·γ        [an inner node folds c segments of its tree per segment]
inline double double_tree(const TreeShape& ts, int n, double S, LinkCost l, double gamma,
                          std::size_t segment_cap) {
  if (n <= 1) return 0;
  const double half = std::ceil(S / 2);
  const double s = std::min(half, static_cast<double>(double_tree_segment(
                                      static_cast<std::size_t>(half), n,
                                      l.alpha / std::max(l.beta, 1e-15), segment_cap)));
  const double c = ts.max_children;
  return 2.0 * ts.depth * (l.alpha + c * s * l.beta) + ts.max_links * (S / 2) * l.beta +
         c / 2 * S * gamma;
}

// Hierarchical: ring reduce-scatter and allgather inside the host over the intra link, and the
// best flat allreduce of S/L bytes across the H hosts, whose L shards share the inter link.
//   2(L-1)·αi + 2(L-1)/L·S·βi + (L-1)/L·S·γ + T_cross(S/L, H, αx, βx·L)
template <class Cross>
double hierarchical(int L, int H, double S, LinkCost intra, LinkCost inter, double gamma,
                    Cross&& best_cross) {
  LinkCost shared = inter;
  shared.beta *= L;
  return ring(L, S, intra, gamma) + best_cross(H, S / L, shared);
}

// Chain broadcast, pipelined in segments of s: the last segment leaves the root after S/s
// steps and needs n-2 more hops: (n-2 + S/s)·(α + s·β).
inline double chain_broadcast(int n, double S, LinkCost l, std::size_t segment_bytes) {
  if (n <= 1) return 0;
  const double s = std::max(1.0, std::min(S, static_cast<double>(segment_bytes)));
  const double k = std::max(1.0, std::ceil(S / s));
  return (n - 2 + k) * (l.alpha + s * l.beta);
}

// Binomial broadcast, pipelined: the root sends each of the S/s segments to ceil(log2 n)
// children in turn, the largest subtree first, so the last segment is everywhere after
//   (S/s)·ceil(log2 n)·(α + s·β)
// — log2(n) latency steps for one segment, but log2(n) times the chain's bandwidth term.
inline double binomial_broadcast(int n, double S, LinkCost l, std::size_t segment_bytes) {
  if (n <= 1) return 0;
  int levels = 0;
  while ((1 << levels) < n) ++levels;
  const double s = std::max(1.0, std::min(S, static_cast<double>(segment_bytes)));
  const double k = std::max(1.0, std::ceil(S / s));
  return k * levels * (l.alpha + s * l.beta);
}

}  // namespace cost

// ---------------------------------------------------------------- the selector

class Selector {
 public:
  Selector() = default;
  Selector(Tuning tuning, SelectionShape shape, std::size_t segment_bytes = 256 * 1024)
      : tuning_(tuning),
        shape_(shape),
        segment_bytes_(segment_bytes),
        tree_(cost::double_tree_shape(shape.size)),
        cross_tree_(cost::double_tree_shape(shape.hosts)) {}

  const Tuning& tuning() const { return tuning_; }
  const SelectionShape& shape() const { return shape_; }

  // ---- forcing: every rank must make the same calls (kolo-bench --algo, tests) ----
  void force_allreduce(AllreduceAlgorithm a) {
    allreduce_rules_ = SizeRules<AllreduceAlgorithm>::always(a);
  }
  void force_broadcast(BroadcastAlgorithm a) {
    broadcast_rules_ = SizeRules<BroadcastAlgorithm>::always(a);
  }
  // Same grammar as KOLO_ALLREDUCE / KOLO_BROADCAST; a bad spec is a ConfigError.
  void set_allreduce_rules(std::string_view spec) {
    allreduce_rules_ = SizeRules<AllreduceAlgorithm>::parse("allreduce rules", spec);
  }
  void set_broadcast_rules(std::string_view spec) {
    broadcast_rules_ = SizeRules<BroadcastAlgorithm>::parse("broadcast rules", spec);
  }
  void set_allreduce_rules(SizeRules<AllreduceAlgorithm> r) { allreduce_rules_ = std::move(r); }
  void set_broadcast_rules(SizeRules<BroadcastAlgorithm> r) { broadcast_rules_ = std::move(r); }
  // Back to the cost model for every size.
  void clear_overrides() {
    allreduce_rules_ = {};
    broadcast_rules_ = {};
  }
  const SizeRules<AllreduceAlgorithm>& allreduce_rules() const { return allreduce_rules_; }
  const SizeRules<BroadcastAlgorithm>& broadcast_rules() const { return broadcast_rules_; }

  // ---- decisions ----
  // The algorithm for an allreduce of `bytes`: the override for that size, else the model.
  AllreduceAlgorithm allreduce(std::size_t bytes) const {
    if (auto a = allreduce_rules_.lookup(bytes)) return *a;
    return model_allreduce(bytes);
  }
  BroadcastAlgorithm broadcast(std::size_t bytes) const {
    if (auto a = broadcast_rules_.lookup(bytes)) return *a;
    return model_broadcast(bytes);
  }

  // The model's choice alone (overrides ignored), at the next power of two of `bytes`.
  AllreduceAlgorithm model_allreduce(std::size_t bytes) const {
    const double S = bucket(bytes);
    AllreduceAlgorithm best = AllreduceAlgorithm::ring;
    double best_t = std::numeric_limits<double>::infinity();
    for (AllreduceAlgorithm a : all_allreduce_algorithms) {
      const double t = cost_at(a, S);
      if (t < best_t) {
        best_t = t;
        best = a;
      }
    }
    return best;
  }
  BroadcastAlgorithm model_broadcast(std::size_t bytes) const {
    const double S = bucket(bytes);
    return cost_at(BroadcastAlgorithm::binomial, S) < cost_at(BroadcastAlgorithm::chain, S)
               ? BroadcastAlgorithm::binomial
               : BroadcastAlgorithm::chain;
  }

  // The algorithm for the cross-host step of a hierarchical allreduce of `bytes` in total
  // (each shard carries bytes / local_size).
  AllreduceAlgorithm cross_allreduce(std::size_t bytes) const {
    const int L = std::max(1, shape_.local_size);
    LinkCost shared = shape_.inter;
    shared.beta *= L;
    return best_flat(shape_.hosts, cross_tree_, bucket(bytes) / L, shared).first;
  }

  // The double tree's segment for a tree carrying `half_bytes` (identical on every rank: the
  // constants are rank 0's). `cross`: for the cross-host step of a hierarchical allreduce.
  std::size_t tree_segment(std::size_t half_bytes, bool cross = false) const {
    const LinkCost l = cross ? shape_.inter : shape_.flat;
    return double_tree_segment(half_bytes, cross ? shape_.hosts : shape_.size,
                               l.alpha / std::max(l.beta, 1e-15), segment_bytes_);
  }

  // Modelled seconds; +infinity when the algorithm does not apply to this topology.
  double cost(AllreduceAlgorithm a, std::size_t bytes) const {
    return cost_at(a, static_cast<double>(bytes));
  }
  double cost(BroadcastAlgorithm a, std::size_t bytes) const {
    return cost_at(a, static_cast<double>(bytes));
  }

  std::string describe() const {
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  "tuning %s: shm a=%.2fus b=%.3fns/B, tcp a=%.2fus b=%.3fns/B, g=%.3fns/B; ",
                  Tuning::source_name(tuning_.source), tuning_.shm.alpha * 1e6,
                  tuning_.shm.beta * 1e9, tuning_.tcp.alpha * 1e6, tuning_.tcp.beta * 1e9,
                  tuning_.gamma * 1e9);
    return std::string(buf) + "allreduce " + allreduce_rules_.describe() + ", broadcast " +
           broadcast_rules_.describe();
  }

  // Where the model's allreduce choice changes between `lo` and `hi` bytes (powers of two):
  // {first size, algorithm} pairs, for docs and logs.
  std::vector<std::pair<std::size_t, AllreduceAlgorithm>> allreduce_switch_points(
      std::size_t lo = 8, std::size_t hi = std::size_t{1} << 30) const {
    std::vector<std::pair<std::size_t, AllreduceAlgorithm>> out;
    for (std::size_t b = lo; b <= hi; b *= 2) {
      const AllreduceAlgorithm a = model_allreduce(b);
      if (out.empty() || out.back().second != a) out.emplace_back(b, a);
    }
    return out;
  }

 private:
  static double bucket(std::size_t bytes) {
    std::size_t p = 1;
    while (p < bytes && p < (std::size_t{1} << 62)) p <<= 1;
    return static_cast<double>(bytes <= 1 ? bytes : p);
  }

  std::pair<AllreduceAlgorithm, double> best_flat(int n, const cost::TreeShape& ts, double S,
                                                  LinkCost l) const {
    const AllreduceAlgorithm flat[] = {AllreduceAlgorithm::ring, AllreduceAlgorithm::tree,
                                       AllreduceAlgorithm::halving_doubling,
                                       AllreduceAlgorithm::recursive_doubling};
    std::pair<AllreduceAlgorithm, double> best{AllreduceAlgorithm::ring,
                                               std::numeric_limits<double>::infinity()};
    for (AllreduceAlgorithm a : flat) {
      const double t = flat_cost(a, n, ts, S, l);
      if (t < best.second) best = {a, t};
    }
    return best;
  }

  double flat_cost(AllreduceAlgorithm a, int n, const cost::TreeShape& ts, double S,
                   LinkCost l) const {
    const double g = tuning_.gamma;
    switch (a) {
      case AllreduceAlgorithm::ring:
        return cost::ring(n, S, l, g);
      case AllreduceAlgorithm::tree:
        return cost::double_tree(ts, n, S, l, g, segment_bytes_);
      case AllreduceAlgorithm::halving_doubling:
        return cost::halving_doubling(n, S, l, g);
      case AllreduceAlgorithm::recursive_doubling:
        return cost::recursive_doubling(n, S, l, g);
      case AllreduceAlgorithm::hierarchical:
        break;
    }
    return std::numeric_limits<double>::infinity();
  }

  double cost_at(AllreduceAlgorithm a, double S) const {
    const int n = shape_.size;
    if (a != AllreduceAlgorithm::hierarchical) {
      LinkCost l = shape_.flat;
      // Across hosts, every algorithm but the ring has all ranks of a host talking to other
      // hosts at once in some round: they share the inter-host link.
      if (shape_.hosts > 1 && a != AllreduceAlgorithm::ring)
        l.beta *= std::max(1, shape_.local_size);
      return flat_cost(a, n, tree_, S, l);
    }
    if (!shape_.hierarchical_ok) return std::numeric_limits<double>::infinity();
    return cost::hierarchical(
        shape_.local_size, shape_.hosts, S, shape_.intra, shape_.inter, tuning_.gamma,
        [&](int H, double s, LinkCost l) { return best_flat(H, cross_tree_, s, l).second; });
  }

  double cost_at(BroadcastAlgorithm a, double S) const {
    return a == BroadcastAlgorithm::chain
               ? cost::chain_broadcast(shape_.size, S, shape_.flat, segment_bytes_)
               : cost::binomial_broadcast(shape_.size, S, shape_.flat, segment_bytes_);
  }

  Tuning tuning_;
  SelectionShape shape_;
  std::size_t segment_bytes_ = 256 * 1024;
  cost::TreeShape tree_, cross_tree_;
  SizeRules<AllreduceAlgorithm> allreduce_rules_;
  SizeRules<BroadcastAlgorithm> broadcast_rules_;
};

}  // namespace kolo
