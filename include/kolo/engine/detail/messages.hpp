// kolo/engine/detail/messages.hpp — the engine's words: the user's operations, tensor names and
// ranks as its error messages and stall reports say them, and the rethrow that prefixes a
// collective's error with what the user asked for. Text only, no state.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kolo/core/error.hpp"
#include "kolo/engine/detail/records.hpp"

namespace kolo::detail::engine {

inline constexpr const char* kJoinHint =
    "If ranks run different numbers of steps (uneven data), a rank that has run out of data "
    "must call Engine::join() instead of stopping or skipping: it then contributes zeros until "
    "every rank has joined";

// "0, 2, 3".
inline std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

// "'a', 'b', 'c' and 47 more <noun>": the first three items and a count.
inline std::string first_few(const std::vector<std::string>& items, const char* sep,
                             const char* noun) {
  constexpr std::size_t kShown = 3;
  std::string s;
  for (std::size_t i = 0; i < items.size() && i < kShown; ++i) s += (i ? sep : "") + items[i];
  if (items.size() > kShown) {
    s += " and " + std::to_string(items.size() - kShown) + " more";
    if (*noun) s += std::string(" ") + noun;
  }
  return s;
}

// The operation as the user asked for it: "allreduce(average)", "broadcast(root 2)".
inline std::string op_text(const RequestParams& p) {
  std::string s = op_kind_name(p.kind);
  if (p.kind == OpKind::allreduce) {
    s += "(" + std::string(reduce_op_name(p.op));
    if (p.prescale != 1.0) s += ", prescale " + std::to_string(p.prescale);
    if (p.postscale != 1.0) s += ", postscale " + std::to_string(p.postscale);
    if (p.join_average == JoinAverage::active_ranks) s += ", divided by the active ranks";
    s += ")";
  } else if (p.kind == OpKind::broadcast) {
    s += "(root " + std::to_string(p.root) + ")";
  }
  return s;
}

// "tensor 'x' was submitted by rank(s) 0, 2 but not by rank(s) 1" (joined ranks are neither).
inline std::string stall_text(const TableEntry& e, const std::vector<bool>& joined) {
  std::string have, missing;
  for (std::size_t r = 0; r < e.by_rank.size(); ++r) {
    std::string& s = e.by_rank[r] ? have : missing;
    if (!e.by_rank[r] && joined[r]) continue;
    s += (s.empty() ? "" : ", ") + std::to_string(r);
  }
  return "tensor '" + e.name + "' was submitted by rank(s) " + have + " but not by rank(s) " +
         missing;
}

// "engine: allreduce(average) of 50 tensors 'a', 'b', 'c' and 47 more (24500050 x float32
// in one fused collective) failed"
inline std::string failed_text(const std::vector<Response>& rs,
                               std::span<const std::size_t> batch) {
  const RequestParams& p = *rs[batch.front()].p;
  std::vector<std::string> names;
  std::uint64_t total = 0;
  for (std::size_t j : batch) {
    names.push_back("'" + *rs[j].name + "'");
    total += rs[j].p->count;
  }
  std::string s = "engine: " + op_text(p) + " of ";
  s += batch.size() == 1 ? "tensor " : std::to_string(batch.size()) + " tensors ";
  s += first_few(names, ", ", "") + " (";
  if (p.kind == OpKind::allgather) {
    total = 0;
    for (std::size_t c : rs[batch.front()].decided->counts) total += c;
    s += std::to_string(total) + " x " + std::string(dtype_name(p.dtype)) + " from all ranks";
  } else {
    s += std::to_string(total) + " x " + std::string(dtype_name(p.dtype));
    if (batch.size() > 1) s += " in one fused collective";
  }
  return s + ") failed";
}

// An error in the cycle's own collectives (or one another rank's collective sent here through
// the abort channel while this rank was negotiating); `pending`: pending_text() of this rank.
inline std::string negotiation_text(std::size_t in_flight, const std::string& pending) {
  if (in_flight == 0) return "engine: negotiation failed with no tensor pending on this rank";
  return "engine: negotiation failed with " + std::to_string(in_flight) +
         (in_flight == 1 ? " tensor" : " tensors") + " pending on this rank (" + pending + ")";
}

// Rethrows `e` with the same kind, prefixed with `what` (the op, the first tensor names, a
// count). The engine negotiates every collective it runs, so a MismatchError from the
// Communicator means the ranks' engines differ: they fused, converted or counted cache slots
// differently.
[[noreturn]] inline void rethrow_as_engine_error(const Error& e, const std::string& what) {
  std::string msg = what + ": " + e.what();
  if (e.kind() == ErrorKind::mismatch) {
    msg +=
        " (the ranks' engines ran different collectives for the same tensors: every rank "
        "must use the same engine options, e.g. KOLO_FUSION_THRESHOLD, KOLO_COMPRESSION, "
        "KOLO_CACHE_CAPACITY)";
  }
  if (e.kind() == ErrorKind::peer_lost) {
    msg +=
        " (if that rank ended on purpose because it ran out of data, it must call "
        "Engine::join() first)";
  }
  throw_error(e.kind(), msg);
}

// Runs one of the engine's collectives; an Error it throws is rethrown by
// rethrow_as_engine_error with `what()` (built only then).
template <class Run, class What>
void guarded(Run&& run, What&& what) {
  try {
    run();
  } catch (const Error& e) {
    rethrow_as_engine_error(e, what());
  }
}

}  // namespace kolo::detail::engine
