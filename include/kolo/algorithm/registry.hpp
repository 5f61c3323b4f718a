// kolo/algorithm/registry.hpp — one registry of algorithms per collective.
//
// An entry (algorithm/entry.hpp) is a name and aliases, an applicability test, a cost function
// and an entry point; the Selector (selector.hpp) runs the override for the size when there is
// one, else the cheapest applicable entry. The built-ins are listed below, one line each, in the
// order of their enumerators (AllreduceAlgorithm::ring is entry 0 ...). Adding an algorithm:
//   1. a header under algorithm/ with the function and `inline AlgorithmEntry<...> x_algorithm()`
//      (name, aliases, cost, run; see ring_allreduce.hpp for the shortest one),
//   2. its line in builtin_algorithms<...>() below (and its #include).
// It is then selectable by name in KOLO_<COLLECTIVE>, costed by the model, listed by
// `algorithm_entries<...>()` and run by every test that iterates the registry
// (tests/inproc). Code outside kolo adds one at run time with register_algorithm() before it
// creates its communicators (tests/inproc/test_toy_algorithm.cpp does, in one file).
#pragma once

#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kolo/algorithm/allreduce_direct.hpp"
#include "kolo/algorithm/allreduce_double_tree.hpp"
#include "kolo/algorithm/allreduce_halving_doubling.hpp"
#include "kolo/algorithm/allreduce_hierarchical.hpp"
#include "kolo/algorithm/allreduce_recursive_doubling.hpp"
#include "kolo/algorithm/alltoall_pairwise.hpp"
#include "kolo/algorithm/broadcast_binomial.hpp"
#include "kolo/algorithm/broadcast_chain.hpp"
#include "kolo/algorithm/entry.hpp"
#include "kolo/algorithm/ring_allgather.hpp"
#include "kolo/algorithm/ring_allreduce.hpp"
#include "kolo/algorithm/ring_reduce_scatter.hpp"
#include "kolo/core/error.hpp"

namespace kolo {

// ---------------------------------------------------------------- the built-ins

template <AlgorithmId Algo>
std::vector<AlgorithmEntry<Algo>> builtin_algorithms();

template <>
inline std::vector<AlgorithmEntry<AllreduceAlgorithm>> builtin_algorithms<AllreduceAlgorithm>() {
  return {
      ring_allreduce_algorithm(),                // AllreduceAlgorithm::ring
      double_tree_allreduce_algorithm(),         // ::tree
      halving_doubling_allreduce_algorithm(),    // ::halving_doubling
      recursive_doubling_allreduce_algorithm(),  // ::recursive_doubling
      hierarchical_allreduce_algorithm(),        // ::hierarchical
      direct_allreduce_algorithm(),              // ::direct
  };
}
template <>
inline std::vector<AlgorithmEntry<BroadcastAlgorithm>> builtin_algorithms<BroadcastAlgorithm>() {
  return {
      chain_broadcast_algorithm(),     // BroadcastAlgorithm::chain
      binomial_broadcast_algorithm(),  // ::binomial
  };
}
template <>
inline std::vector<AlgorithmEntry<AllgatherAlgorithm>> builtin_algorithms<AllgatherAlgorithm>() {
  return {
      ring_allgather_algorithm(),  // AllgatherAlgorithm::ring
  };
}
template <>
inline std::vector<AlgorithmEntry<ReduceScatterAlgorithm>>
builtin_algorithms<ReduceScatterAlgorithm>() {
  return {
      ring_reduce_scatter_algorithm(),  // ReduceScatterAlgorithm::ring
  };
}
template <>
inline std::vector<AlgorithmEntry<AlltoallAlgorithm>> builtin_algorithms<AlltoallAlgorithm>() {
  return {
      pairwise_alltoall_algorithm(),  // AlltoallAlgorithm::pairwise
  };
}

// ---------------------------------------------------------------- the registry

namespace detail {

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

template <AlgorithmId Algo>
class AlgorithmRegistry {
 public:
  using Entry = AlgorithmEntry<Algo>;
  static constexpr std::size_t kMaxEntries = 255;

  // The registry of this collective: the built-ins, then whatever was registered.
  static AlgorithmRegistry& instance() {
    static AlgorithmRegistry r;
    return r;
  }

  // Adds an entry and returns its identity. Names are lower case letters, digits and '-'; a
  // name or alias already taken, "auto", a missing entry point or a full registry is a
  // ConfigError naming it.
  Algo add(Entry e) {
    std::lock_guard<std::mutex> lk(mu_);
    return add_locked(std::move(e));
  }

  // The entries in identity order (stable pointers: entries are never removed).
  std::vector<const Entry*> entries() const {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<const Entry*> out;
    out.reserve(entries_.size());
    for (const Entry& e : entries_) out.push_back(&e);
    return out;
  }

  const Entry* find(Algo a) const {
    std::lock_guard<std::mutex> lk(mu_);
    const auto i = static_cast<std::size_t>(a);
    return i < entries_.size() ? &entries_[i] : nullptr;
  }

  // The identity of a name or alias (case and surrounding blanks ignored); nullopt: unknown.
  std::optional<Algo> find(std::string_view name) const {
    const std::string n = detail::lower(detail::trim(name));
    std::lock_guard<std::mutex> lk(mu_);
    return find_locked(n);
  }

  // "ring, tree (or double-tree, double-binary-tree), ..., auto": the names an override takes.
  std::string expected() const {
    std::lock_guard<std::mutex> lk(mu_);
    std::string s;
    for (const Entry& e : entries_) {
      if (!s.empty()) s += ", ";
      s += e.name;
      if (!e.aliases.empty()) {
        s += " (or ";
        for (std::size_t i = 0; i < e.aliases.size(); ++i) s += (i ? ", " : "") + e.aliases[i];
        s += ")";
      }
    }
    return s + ", auto";
  }

 private:
  AlgorithmRegistry() {
    for (Entry& e : builtin_algorithms<Algo>()) add_locked(std::move(e));
  }

  std::optional<Algo> find_locked(const std::string& n) const {
    for (std::size_t i = 0; i < entries_.size(); ++i) {
      const Entry& e = entries_[i];
      if (e.name == n) return static_cast<Algo>(i);
      for (const std::string& a : e.aliases) {
        if (a == n) return static_cast<Algo>(i);
      }
    }
    return std::nullopt;
  }

  Algo add_locked(Entry e) {
    const std::string what =
        std::string(AlgorithmTraits<Algo>::name) + " algorithm '" + e.name + "'";
    auto check_name = [&](const std::string& n) {
      if (n.empty()) throw ConfigError(what + ": empty name");
      for (char c : n) {
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) {
          throw ConfigError(what + ": name '" + n + "' must be lower case letters, digits and '-'");
        }
      }
      if (n == "auto") throw ConfigError(what + ": 'auto' is reserved (the cost model's choice)");
      if (find_locked(n)) throw ConfigError(what + ": the name '" + n + "' is taken");
    };
    check_name(e.name);
    for (const std::string& a : e.aliases) check_name(a);
    if (e.run == nullptr) throw ConfigError(what + ": no entry point (run)");
    if (entries_.size() >= kMaxEntries) throw ConfigError(what + ": the registry is full");
    entries_.push_back(std::move(e));
    return static_cast<Algo>(entries_.size() - 1);
  }

  mutable std::mutex mu_;
  std::deque<Entry> entries_;
};

// Registers an algorithm (before the communicators that should see it are created: each takes
// the registry as it is at its creation) and returns its identity, which forces it
// (`comm.selector().force(id)`) and names it in last_*_algorithm(). Every rank must register
// the same algorithms in the same order.
template <AlgorithmId Algo>
Algo register_algorithm(AlgorithmEntry<Algo> e) {
  return AlgorithmRegistry<Algo>::instance().add(std::move(e));
}

// The registered algorithms of a collective, in identity order.
template <AlgorithmId Algo>
std::vector<const AlgorithmEntry<Algo>*> algorithm_entries() {
  return AlgorithmRegistry<Algo>::instance().entries();
}

// The name of an algorithm ("unknown" for an identity nobody registered).
template <AlgorithmId Algo>
const char* algorithm_name(Algo a) {
  const AlgorithmEntry<Algo>* e = AlgorithmRegistry<Algo>::instance().find(a);
  return e != nullptr ? e->name.c_str() : "unknown";
}

}  // namespace kolo
