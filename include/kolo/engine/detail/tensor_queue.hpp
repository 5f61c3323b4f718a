// kolo/engine/detail/tensor_queue.hpp — this rank's operations in flight: filed from the inbox
// into a cache slot (the steady state) or into the pending table by name (new names, changed
// parameters), found again for a cycle's responses, completed, and failed all at once. Horovod
// calls this the tensor queue; the response cache it files into is response_cache.hpp.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kolo/core/error.hpp"
#include "kolo/engine/detail/group_table.hpp"
#include "kolo/engine/detail/inbox.hpp"
#include "kolo/engine/detail/messages.hpp"
#include "kolo/engine/detail/records.hpp"
#include "kolo/engine/detail/response_cache.hpp"
#include "kolo/engine/timeline.hpp"

namespace kolo::detail::engine {

class TensorQueue {
 public:
  // Files one submission of rank `rank`: into its cache slot when the name is cached with the
  // same parameters, else into `pending` and the names to send. A joined rank, or a name
  // already in flight, fails the handle at once. `inbox`: where a replaced coalesced
  // submission's lists go back.
  void intake(std::string_view name, Local&& local, int rank, bool joined, const GroupTable& groups,
              Inbox& inbox) {
    if (joined) {
      local.handle->finish(std::make_exception_ptr(
          Error("engine: tensor '" + std::string(name) + "' was submitted on rank " +
                std::to_string(rank) +
                " while it is inside join(); submit again after join() has returned")));
      return;
    }
    const int found = cache.find(name);
    CacheSlot* slot = found >= 0 ? &cache[static_cast<std::size_t>(found)] : nullptr;
    if ((slot && slot->busy) || (!pending.empty() && pending.find(name) != pending.end()) ||
        groups.holds(name)) {
      local.handle->finish(std::make_exception_ptr(
          Error("engine: tensor '" + std::string(name) + "' is already in flight on rank " +
                std::to_string(rank) + "; wait for it before submitting the name again")));
      return;
    }
    ++since_idle;
    local.seq = ++submitted;
    if (slot) {
      const auto k = static_cast<std::size_t>(found);
      cache.last_slot = found;
      if (slot->p == local.p) {  // the steady state: no string is built, nothing allocated
        local.cache_slot = found;
        // A coalesced submission's two lists: the previous submission's go back to the spares
        // that the next allreduce_coalesced_async takes, instead of being freed.
        if (!local.parts.empty()) inbox.recycle(slot->local);
        slot->local = std::move(local);
        slot->busy = true;
        ++cache.busy;
        cache.pending[k] = 1;
        return;
      }
      cache.invalid[k] = 1;  // parameters changed: everyone drops the slot, the table decides
    }
    std::string key(name);
    to_send.push_back(key);
    local.cache_slot = -1;
    pending.emplace(std::move(key), std::move(local));
  }

  // Drops cache slot k (every rank drops the same slots). An operation waiting in it goes back
  // through the request table (unless it is a group member already agreed on, which only waits
  // for the rest of its group).
  void evict(std::size_t k, const GroupTable& groups) {
    CacheSlot& c = cache[k];
    auto it = cache.index.find(std::string_view(c.name));
    if (it != cache.index.end()) cache.index.erase(it);
    if (c.busy) {
      c.busy = false;
      --cache.busy;
      c.local.cache_slot = -1;
      if (!groups.holds(c.name)) to_send.push_back(c.name);
      pending.emplace(c.name, std::move(c.local));
    }
    cache.clear(k);
    // A stale "changed parameters" request already queued stays in to_send.
  }

  // This rank's operation for a response: in the response's slot, or found by name.
  Local* find_local(const Response& r) {
    if (r.slot >= 0) {
      CacheSlot& c = cache[static_cast<std::size_t>(r.slot)];
      return c.busy ? &c.local : nullptr;
    }
    const int k = cache.lookup(*r.name);
    if (k >= 0) {
      CacheSlot& c = cache[static_cast<std::size_t>(k)];
      if (c.busy) return &c.local;
    }
    auto pt = pending.find(std::string_view(*r.name));
    return pt != pending.end() ? &pt->second : nullptr;
  }

  // The timeline track of a response's tensor (cached: remembered in the slot).
  int track_of(const Response& r, Timeline& timeline) {
    if (r.slot >= 0) {
      CacheSlot& c = cache[static_cast<std::size_t>(r.slot)];
      if (c.track < 0) c.track = timeline.track(c.name);
      return c.track;
    }
    return timeline.track(*r.name);
  }

  // Operations of this rank in flight: waiting in a cache slot or in pending.
  std::size_t in_flight() const { return pending.size() + cache.busy; }

  // Marks the handle done and frees its slot (or pending entry); its waiters are woken by
  // notify_completed(), once per batch. r.local must not be used afterwards.
  void complete(const Response& r, std::exception_ptr err) {
    Local* l = r.local;
    if (!l || l->cache_slot == kPart) return;  // a part: its submission completes as a whole
    StateRef h = std::move(l->handle);
    if (l->cache_slot >= 0) {
      const auto k = static_cast<std::size_t>(l->cache_slot);
      cache[k].busy = false;
      --cache.busy;
      cache.pending[k] = 0;
    } else {
      auto it = pending.find(std::string_view(*r.name));
      if (it != pending.end()) pending.erase(it);
    }
    h->mark(std::move(err));
    completed.push_back(std::move(h));
    if (in_flight() == 0) {  // idle: what was submitted since the last idle moment is a step
      step_size = since_idle;
      since_idle = 0;
      step_driven = driven;
    }
  }
  void notify_completed() {
    if (completed.empty()) return;
    std::atomic_thread_fence(std::memory_order_seq_cst);  // after every mark() (handle.hpp)
    for (auto& h : completed) h->notify();
    completed.clear();
  }

  // Fails every operation in flight with `err`.
  void fail_all(const std::exception_ptr& err) {
    for (auto& [name, l] : pending) l.handle->finish(err);
    pending.clear();
    for (CacheSlot& c : cache.slots) {
      if (!c.busy) continue;
      c.local.handle->finish(err);
      c.local = Local{};
      c.busy = false;
    }
    cache.busy = 0;
  }

  // This rank's pending tensors, oldest first, and the ops asked for:
  // "'a', 'b', 'c' and 47 more; allreduce(average)".
  std::string pending_text() const {
    std::vector<std::pair<std::uint64_t, std::string>> byage;
    std::set<std::string> ops;
    for (const auto& [name, l] : pending) {
      byage.emplace_back(l.seq, name);
      ops.insert(op_text(l.p));
    }
    for (const CacheSlot& c : cache.slots) {
      if (!c.busy) continue;
      byage.emplace_back(c.local.seq, c.name);
      ops.insert(op_text(c.local.p));
    }
    std::sort(byage.begin(), byage.end());
    std::vector<std::string> names;
    for (const auto& [t, name] : byage) names.push_back("'" + name + "'");
    std::string s = first_few(names, ", ", "") + ";";
    for (const auto& op : ops) s += " " + op;
    return s;
  }

  ResponseCache cache;
  NameMap<Local> pending;  // in flight without a cache slot (new names, changed parameters)
  std::vector<std::string> to_send;  // names whose requests the next exchange sends
  std::vector<StateRef> completed;   // marked done, not yet woken
  std::size_t since_idle = 0;        // operations submitted since nothing was in flight
  std::uint64_t submitted = 0;       // operations filed, ever
  std::size_t step_size = 0;         // ... and over the stretch before (wake_threshold)
  bool driven = false;               // this cycle runs on a waiting thread
  bool step_driven = false;          // the last step was completed by a waiting thread
};

}  // namespace kolo::detail::engine
