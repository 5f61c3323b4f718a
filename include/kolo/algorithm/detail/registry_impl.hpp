// kolo/algorithm/detail/registry_impl.hpp — the algorithm registry's definitions
// (algorithm/registry.hpp): the built-in lists, lookups, the list of valid names, the checks of
// a new entry.
//
// The same for every collective, so compiled once rather than once per collective: header-only,
// registry.hpp includes this file; with the compiled core only the library does
// (core/compiled_core.hpp, KOLO_IMPL_INLINE).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kolo/algorithm/allreduce_direct.hpp"
#include "kolo/algorithm/allreduce_double_tree.hpp"
#include "kolo/algorithm/allreduce_halving_doubling.hpp"
#include "kolo/algorithm/allreduce_hierarchical.hpp"
#include "kolo/algorithm/allreduce_recursive_doubling.hpp"
#include "kolo/algorithm/alltoall_pairwise.hpp"
#include "kolo/algorithm/broadcast_binomial.hpp"
#include "kolo/algorithm/broadcast_chain.hpp"
#include "kolo/algorithm/registry.hpp"
#include "kolo/algorithm/ring_allgather.hpp"
#include "kolo/algorithm/ring_allreduce.hpp"
#include "kolo/algorithm/ring_reduce_scatter.hpp"
#include "kolo/core/compiled_core.hpp"
#include "kolo/core/error.hpp"

namespace kolo {

// ---------------------------------------------------------------- the built-ins

template <>
KOLO_IMPL_INLINE std::vector<AlgorithmEntry<AllreduceAlgorithm>>
builtin_algorithms<AllreduceAlgorithm>() {
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
KOLO_IMPL_INLINE std::vector<AlgorithmEntry<BroadcastAlgorithm>>
builtin_algorithms<BroadcastAlgorithm>() {
  return {
      chain_broadcast_algorithm(),     // BroadcastAlgorithm::chain
      binomial_broadcast_algorithm(),  // ::binomial
  };
}
template <>
KOLO_IMPL_INLINE std::vector<AlgorithmEntry<AllgatherAlgorithm>>
builtin_algorithms<AllgatherAlgorithm>() {
  return {
      ring_allgather_algorithm(),  // AllgatherAlgorithm::ring
  };
}
template <>
KOLO_IMPL_INLINE std::vector<AlgorithmEntry<ReduceScatterAlgorithm>>
builtin_algorithms<ReduceScatterAlgorithm>() {
  return {
      ring_reduce_scatter_algorithm(),  // ReduceScatterAlgorithm::ring
  };
}
template <>
KOLO_IMPL_INLINE std::vector<AlgorithmEntry<AlltoallAlgorithm>>
builtin_algorithms<AlltoallAlgorithm>() {
  return {
      pairwise_alltoall_algorithm(),  // AlltoallAlgorithm::pairwise
  };
}

}  // namespace kolo

namespace kolo::detail {

KOLO_IMPL_INLINE int find_algorithm_name(const std::vector<AlgorithmNames>& names,
                                         std::string_view n) {
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (*names[i].name == n) return static_cast<int>(i);
    for (const std::string& a : *names[i].aliases) {
      if (a == n) return static_cast<int>(i);
    }
  }
  return -1;
}

KOLO_IMPL_INLINE std::string expected_algorithm_names(const std::vector<AlgorithmNames>& names) {
  std::string s;
  for (const AlgorithmNames& e : names) {
    if (!s.empty()) s += ", ";
    s += *e.name;
    if (!e.aliases->empty()) {
      s += " (or ";
      for (std::size_t i = 0; i < e.aliases->size(); ++i) {
        if (i) s += ", ";
        s += (*e.aliases)[i];
      }
      s += ")";
    }
  }
  return s + ", auto";
}

KOLO_IMPL_INLINE int parse_algorithm_name(const std::vector<AlgorithmNames>& names,
                                          std::string_view name, std::string_view what) {
  const std::string n = lower(trim(name));
  if (n == "auto") return -1;
  const int i = find_algorithm_name(names, n);
  if (i >= 0) return i;
  throw ConfigError(std::string(what) + ": unknown algorithm '" + std::string(trim(name)) +
                    "' (expected " + expected_algorithm_names(names) + ")");
}

KOLO_IMPL_INLINE void check_algorithm_entry(const char* collective,
                                            const std::vector<AlgorithmNames>& names,
                                            const std::string& name,
                                            const std::vector<std::string>& aliases, bool has_run,
                                            std::size_t max_entries) {
  const std::string what = std::string(collective) + " algorithm '" + name + "'";
  auto check_name = [&](const std::string& n) {
    if (n.empty()) throw ConfigError(what + ": empty name");
    for (char c : n) {
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) {
        throw ConfigError(what + ": name '" + n + "' must be lower case letters, digits and '-'");
      }
    }
    if (n == "auto") throw ConfigError(what + ": 'auto' is reserved (the cost model's choice)");
    if (find_algorithm_name(names, n) >= 0)
      throw ConfigError(what + ": the name '" + n + "' is taken");
  };
  check_name(name);
  for (const std::string& a : aliases) check_name(a);
  if (!has_run) throw ConfigError(what + ": no entry point (run)");
  if (names.size() >= max_entries) throw ConfigError(what + ": the registry is full");
}

}  // namespace kolo::detail
