// kolo/engine/detail/response_cache.hpp — the response cache: the names every rank has
// negotiated before, by slot number, with the per-slot "pending here" and "invalid" bytes that
// the cycle's flags carry (Horovod's response cache, one byte per slot instead of one bit).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include "kolo/engine/detail/records.hpp"

namespace kolo::detail::engine {

class ResponseCache {
 public:
  // Cache slots by number: a deque (responses point into slots while others are added) and the
  // slots' addresses, so that a slot number is one load away (a deque's indexing, many times
  // per tensor and cycle, was a visible cost).
  struct SlotTable {
    std::deque<CacheSlot> items;
    std::vector<CacheSlot*> at;
    CacheSlot& operator[](std::size_t k) { return *at[k]; }
    const CacheSlot& operator[](std::size_t k) const { return *at[k]; }
    std::size_t size() const { return at.size(); }
    void emplace_back() {
      at.push_back(nullptr);  // first: if the slot's allocation throws, nothing points past it
      try {
        items.emplace_back();
      } catch (...) {
        at.pop_back();
        throw;
      }
      at.back() = &items.back();
    }
    auto begin() { return items.begin(); }
    auto end() { return items.end(); }
    auto begin() const { return items.begin(); }
    auto end() const { return items.end(); }
  };

  CacheSlot& operator[](std::size_t k) { return slots[k]; }
  const CacheSlot& operator[](std::size_t k) const { return slots[k]; }
  std::size_t size() const { return slots.size(); }

  // The slot of `name` (-1: not cached). A training step submits its names in the same order
  // every step: the slot that followed the last one filed, last time, is checked first (one
  // comparison of the name), and the hash lookup runs only when that guess is wrong.
  int find(std::string_view name) {
    const int guess = last_slot >= 0 ? next_slot[static_cast<std::size_t>(last_slot)] : -1;
    if (guess >= 0 && slots[static_cast<std::size_t>(guess)].used &&
        std::string_view(slots[static_cast<std::size_t>(guess)].name) == name) {
      return guess;
    }
    auto it = index.find(name);
    if (it == index.end()) return -1;
    if (last_slot >= 0) next_slot[static_cast<std::size_t>(last_slot)] = it->second;
    return it->second;
  }

  // The slot of `name` by its index alone (-1: not cached).
  int lookup(std::string_view name) const {
    auto it = index.find(name);
    return it == index.end() ? -1 : it->second;
  }

  // Gives `name` a slot (the same one on every rank: every rank inserts the same names in the
  // same order). A full cache (capacity slots) takes no more; rank 0 says so once.
  void insert(const std::string& name, const RequestParams& p, std::size_t capacity, int rank) {
    if (capacity == 0 || index.count(name)) return;
    std::size_t k = free_hint;  // every slot below it is in use
    while (k < slots.size() && slots[k].used) ++k;
    free_hint = k;
    if (k == slots.size()) {
      if (slots.size() >= capacity) {
        // Full: this name goes through the request exchange every time (about 0.3-0.6 us per
        // name and step more). Said once, on rank 0, with the remedy.
        if (!full_said && rank == 0) {
          full_said = true;
          std::fprintf(stderr,
                       "[kolo] engine: the response cache is full (%zu names); tensor '%s' and "
                       "any further names are negotiated in full every step. Raise "
                       "KOLO_CACHE_CAPACITY (EngineOptions::cache_capacity) above the number of "
                       "names a step submits.\n",
                       capacity, name.c_str());
        }
        return;
      }
      slots.emplace_back();  // a deque: the slots responses point at stay where they are
      pending.push_back(0);
      invalid.push_back(0);
      next_slot.push_back(-1);
    }
    CacheSlot& c = slots[k];
    c.used = true;
    c.name = name;
    c.p = p;
    c.track = -1;
    index[name] = static_cast<int>(k);
    free_hint = k + 1;
  }

  // Empties slot k (its name leaves the index); the caller has taken its operation.
  void clear(std::size_t k) {
    slots[k] = CacheSlot{};
    free_hint = std::min(free_hint, k);
    pending[k] = 0;
    invalid[k] = 0;
  }

  // Marks invalid every pending slot whose operation was submitted before `limit`: stuck in
  // negotiation, it leaves the cache so that the request table can say who is missing it.
  void invalidate_older(clock::time_point limit) {
    for (std::size_t k = 0; k < slots.size(); ++k) {
      if (pending[k] && slots[k].local.enqueued < limit) invalid[k] = 1;
    }
  }

  SlotTable slots;
  NameMap<int> index;
  // By slot: the slot filed after it last time (-1: none yet), and the slot filed last (find's
  // guess; checked against the name, so a stale entry only costs the lookup it would have run).
  std::vector<int> next_slot;
  int last_slot = -1;
  std::size_t busy = 0;       // slots with an operation in flight
  std::size_t free_hint = 0;  // no free slot below this one
  bool full_said = false;     // the "cache is full" note was printed (rank 0, once)
  // By slot, as the cycle's flags carry them: this rank's operation waits there; this rank
  // wants the slot dropped (changed parameters, a stall).
  std::vector<std::uint8_t> pending, invalid;
};

}  // namespace kolo::detail::engine
