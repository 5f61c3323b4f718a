// kolo/detail/communicator_impl.hpp — CommunicatorOptions' definitions (communicator/options.hpp):
// reading KOLO_SEGMENT_BYTES, KOLO_ROOTED_AGREEMENT, KOLO_TUNING and the per-collective algorithm
// rules.
//
// They instantiate the rule parser of every collective: header-only, communicator.hpp includes
// this file; with the compiled core only the library does (core/compiled_core.hpp,
// KOLO_IMPL_INLINE).
#pragma once

#include <string>
#include <type_traits>

#include "kolo/communicator/options.hpp"
#include "kolo/core/compiled_core.hpp"
#include "kolo/core/config.hpp"

namespace kolo {

KOLO_IMPL_INLINE CommunicatorOptions CommunicatorOptions::from_env(const EnvLookup& env) {
  CommunicatorOptions o;
  if (auto v = config::get_int(env, config::vars::small_allreduce_bytes)) {
    o.small_allreduce_bytes = static_cast<std::size_t>(*v);
  }
  if (auto v = config::get_int(env, config::vars::segment_bytes)) {
    o.segment_bytes = static_cast<std::size_t>(*v);
  }
  if (auto v = config::get_int(env, config::vars::zero_copy_bytes)) {
    o.zero_copy_bytes = static_cast<std::size_t>(*v);
  }
  if (auto v = config::get_int(env, config::vars::hierarchical_chunk_bytes)) {
    o.hierarchical_chunk_bytes = static_cast<std::size_t>(*v);
  }
  if (auto v = config::get_flag(env, config::vars::rooted_agreement)) o.rooted_agreement = *v;
  read_algorithm_rules(env, o);
  o.tuning = TuningSource::from_env(env);
  return o;
}

KOLO_IMPL_INLINE void CommunicatorOptions::read_algorithm_rules(const EnvLookup& env,
                                                                CommunicatorOptions& o) {
  auto read = [&](auto& rules) {
    using Algo = typename std::remove_reference_t<decltype(rules)>::algorithm_type;
    const char* var = AlgorithmTraits<Algo>::env;
    const config::Var* decl = config::find_var(var);  // every one is in the table
    if (auto v = config::get_text(env, *decl)) rules = SizeRules<Algo>::parse(var, *v);
  };
  o.for_each_rules(read);
}

KOLO_IMPL_INLINE SizeRules<AllreduceAlgorithm> CommunicatorOptions::effective_allreduce_rules()
    const {
  if (!allreduce_rules.empty() || !small_allreduce_bytes) return allreduce_rules;
  const std::size_t n = *small_allreduce_bytes;
  if (n == SizeRules<AllreduceAlgorithm>::kMax) {
    return SizeRules<AllreduceAlgorithm>::always(AllreduceAlgorithm::recursive_doubling);
  }
  return SizeRules<AllreduceAlgorithm>::parse(
      "KOLO_SMALL_ALLREDUCE_BYTES",
      "recursive-doubling:0-" + std::to_string(n) + ";ring:" + std::to_string(n + 1) + "-max");
}

}  // namespace kolo
