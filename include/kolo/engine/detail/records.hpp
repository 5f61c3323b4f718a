// kolo/engine/detail/records.hpp — the records the engine's parts hand each other: a submitted
// operation (Local), a cache slot, a table entry, a decided response and a cycle's Response.
// Plain data, no transport: every part of the engine (inbox, tensor queue, negotiator, batch
// plan, executors) reads and writes these.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kolo/core/tensor.hpp"
#include "kolo/engine/handle.hpp"
#include "kolo/engine/request.hpp"

namespace kolo::detail::engine {

using clock = std::chrono::steady_clock;
using kolo::OpKind;  // not detail::OpKind (the collectives' enum)

// Names are looked up by std::string_view (no std::string is built to find one).
struct NameHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const noexcept {
    return std::hash<std::string_view>{}(s);
  }
};
template <class V>
using NameMap = std::unordered_map<std::string, V, NameHash, std::equal_to<>>;

// cache_slot of one tensor of a coalesced submission, while it executes.
inline constexpr int kPart = -2;

// One operation this rank submitted, from enqueue until its handle completes.
struct Local {
  StateRef handle;
  TensorView in, out;
  RequestParams p;
  clock::time_point enqueued, ready;
  std::uint64_t seq = 0;          // submission order on this rank (oldest first in messages)
  int cache_slot = -1;            // >= 0: it waits in that cache slot; -1: in pending, by name;
                                  // kPart: one tensor of a coalesced submission, while it executes
  std::vector<TensorView> parts;  // a coalesced submission: its tensors (in, out: unused)
};

// A name every rank has negotiated before, with the parameters they agreed on. A steady-state
// submission finds its slot with one hash lookup at intake and is a slot number from then on:
// it waits in the slot, the cycle's flags carry the slot, the response is the slot.
struct CacheSlot {
  bool used = false;
  std::string name;
  RequestParams p;
  int track = -1;     // the name's timeline track, once the timeline has seen it
  bool busy = false;  // `local` holds this rank's operation of this name, in flight
  Local local;
};

// A name in the request table: what each rank asked for, since when.
struct TableEntry {
  std::string name;
  std::vector<std::optional<RequestParams>> by_rank;
  clock::time_point first_seen;
  bool warned = false;
  bool done = false;
};

// A response the request table decided (rather than a cache slot), or one held for its group.
struct Decided {
  std::string name;
  RequestParams p;
  std::vector<std::size_t> counts;  // allgather
  std::string error;                // non-empty: a mismatch, delivered to the handle
  long error_tensor = -1;           // a list's first tensor whose count differs (else -1)
};

// What a cycle runs: a name every rank agreed on. It points into its cache slot or Decided.
struct Response {
  const std::string* name = nullptr;
  const RequestParams* p = nullptr;
  const Decided* decided = nullptr;  // table responses: counts, error
  int slot = -1;                     // cached responses: the slot
  bool cached = false;
  Local* local = nullptr;  // this rank's request (nullptr: joined, contributes zeros)

  const std::string& error() const {
    static const std::string none;
    return decided ? decided->error : none;
  }
  long error_tensor() const { return decided ? decided->error_tensor : -1; }
};

}  // namespace kolo::detail::engine
