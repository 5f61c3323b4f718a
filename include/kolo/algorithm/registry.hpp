// kolo/algorithm/registry.hpp — one registry of algorithms per collective.
//
// An entry (algorithm/entry.hpp) is a name and aliases, an applicability test, a cost function
// and an entry point; the Selector (selector.hpp) runs the override for the size when there is
// one, else the cheapest applicable entry. The built-ins are listed in detail/registry_impl.hpp,
// one line each, in the order of their enumerators (AllreduceAlgorithm::ring is entry 0 ...).
// Adding an algorithm:
//   1. a header under algorithm/ with the function and `inline AlgorithmEntry<...> x_algorithm()`
//      (name, aliases, cost, run; see ring_allreduce.hpp for the shortest one),
//   2. its line in builtin_algorithms<...>() in detail/registry_impl.hpp (and its #include).
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

#include "kolo/algorithm/entry.hpp"
#include "kolo/core/compiled_core.hpp"
#include "kolo/core/error.hpp"

namespace kolo {

// ---------------------------------------------------------------- the built-ins

template <AlgorithmId Algo>
std::vector<AlgorithmEntry<Algo>> builtin_algorithms();

// The lists, one per collective, are in detail/registry_impl.hpp with the algorithms' headers
// (header-only, this file includes it; with the compiled core only the library does, so a
// user's file parses no algorithm it does not call itself).
template <>
KOLO_IMPL_INLINE std::vector<AlgorithmEntry<AllreduceAlgorithm>>
builtin_algorithms<AllreduceAlgorithm>();
template <>
KOLO_IMPL_INLINE std::vector<AlgorithmEntry<BroadcastAlgorithm>>
builtin_algorithms<BroadcastAlgorithm>();
template <>
KOLO_IMPL_INLINE std::vector<AlgorithmEntry<AllgatherAlgorithm>>
builtin_algorithms<AllgatherAlgorithm>();
template <>
KOLO_IMPL_INLINE std::vector<AlgorithmEntry<ReduceScatterAlgorithm>>
builtin_algorithms<ReduceScatterAlgorithm>();
template <>
KOLO_IMPL_INLINE std::vector<AlgorithmEntry<AlltoallAlgorithm>>
builtin_algorithms<AlltoallAlgorithm>();

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

// The names of one registered entry. The lookups by name, the list of names in error messages
// and the checks of a new entry do not depend on the collective: they work on these and are
// compiled once (detail/registry_impl.hpp), not once per collective.
struct AlgorithmNames {
  const std::string* name;
  const std::vector<std::string>* aliases;
};
// The index of lower-cased name `n` (a name or an alias); -1: unknown.
KOLO_IMPL_INLINE int find_algorithm_name(const std::vector<AlgorithmNames>& names,
                                         std::string_view n);
// "ring, tree (or double-tree, ...), ..., auto".
KOLO_IMPL_INLINE std::string expected_algorithm_names(const std::vector<AlgorithmNames>& names);
// The index that `name` (any case, blanks around it ignored) names, -1 for "auto"; an unknown
// name is a ConfigError "<what>: unknown algorithm '...' (expected ...)".
KOLO_IMPL_INLINE int parse_algorithm_name(const std::vector<AlgorithmNames>& names,
                                          std::string_view name, std::string_view what);
// Throws the ConfigError that adding this entry to `names` deserves, if any.
KOLO_IMPL_INLINE void check_algorithm_entry(const char* collective,
                                            const std::vector<AlgorithmNames>& names,
                                            const std::string& name,
                                            const std::vector<std::string>& aliases, bool has_run,
                                            std::size_t max_entries);

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
    const int i = detail::find_algorithm_name(names_, n);
    return i < 0 ? std::nullopt : std::optional<Algo>(static_cast<Algo>(i));
  }

  // The identity `name` names, nullopt for "auto"; unknown names are a ConfigError that starts
  // with `what` and lists the valid ones.
  std::optional<Algo> parse(std::string_view name, std::string_view what) const {
    std::lock_guard<std::mutex> lk(mu_);
    const int i = detail::parse_algorithm_name(names_, name, what);
    return i < 0 ? std::nullopt : std::optional<Algo>(static_cast<Algo>(i));
  }

  // "ring, tree (or double-tree, double-binary-tree), ..., auto": the names an override takes.
  std::string expected() const {
    std::lock_guard<std::mutex> lk(mu_);
    return detail::expected_algorithm_names(names_);
  }

 private:
  AlgorithmRegistry() {
    for (Entry& e : builtin_algorithms<Algo>()) add_locked(std::move(e));
  }

  Algo add_locked(Entry e) {
    detail::check_algorithm_entry(AlgorithmTraits<Algo>::name, names_, e.name, e.aliases,
                                  e.run != nullptr, kMaxEntries);
    names_.reserve(entries_.size() + 1);  // then nothing below throws after the push
    entries_.push_back(std::move(e));
    names_.push_back({&entries_.back().name, &entries_.back().aliases});
    return static_cast<Algo>(entries_.size() - 1);
  }

  mutable std::mutex mu_;
  std::deque<Entry> entries_;                  // stable addresses: names_ points into them
  std::vector<detail::AlgorithmNames> names_;  // entries_' names, same order
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

// Header-only: the definitions of the functions above, inline (compiled core: in the library,
// src/lib/core_impl.cpp).
#if !KOLO_USE_COMPILED_CORE
#include "kolo/algorithm/detail/registry_impl.hpp"
#endif
