// kolo/engine/detail/negotiator.hpp — negotiation, without a transport: the layout of the
// cycle's flag vector and what it says, the request table that files every rank's requests in
// the same order, the decisions (ready, mismatch, cacheable), the request wire format and the
// stall inspector's words. The collectives it needs come through Exchange, which the engine
// binds to its communicator; tests drive the phases for several ranks on one thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kolo/engine/detail/messages.hpp"
#include "kolo/engine/detail/records.hpp"
#include "kolo/engine/request.hpp"

namespace kolo::detail::engine {

// The two collectives of a cycle, type-erased (EngineCore binds them to its Communicator).
struct Exchange {
  virtual ~Exchange() = default;
  // Every rank's `flags` (the same length on every rank) becomes their elementwise minimum.
  virtual void min(std::vector<std::uint8_t>& flags) = 0;
  // Every rank's `mine`, in rank order, into `all`; counts[r]: rank r's bytes.
  virtual void gather(const std::string& mine, std::string& all,
                      std::vector<std::size_t>& counts) = 0;
};

// What this rank puts into a cycle's flags.
struct FlagsIn {
  bool want_shutdown = false;  // Engine::shutdown() was called here
  bool stall_stop = false;     // the stall inspector ends the engine (rank 0)
  bool has_new = false;        // names to send
  bool joined = false;         // this rank has joined
  const std::vector<std::uint8_t>* pending = nullptr;  // per cache slot (ResponseCache)
  const std::vector<std::uint8_t>* invalid = nullptr;
};

class Negotiator {
 public:
  Negotiator(int rank, int size) : rank_(rank), size_(size) {}

  int rank() const { return rank_; }
  int size() const { return size_; }

  // ---- the flags: min over [shutdown?, no new names?, no stall shutdown?, joined by rank...,
  // not shutting down by rank..., (pending, valid) per cache slot]. Min over 0/1 bytes is AND;
  // the per-rank bytes let every rank name the others.

  // This rank's flags for the cycle (kept: the exchange reduces them in place).
  std::vector<std::uint8_t>& flags(const FlagsIn& in) {
    const auto n = static_cast<std::size_t>(size_);
    const auto me = static_cast<std::size_t>(rank_);
    const std::size_t slots = in.pending ? in.pending->size() : 0;
    flags_.assign(base() + 2 * slots, 1);
    flags_[0] = (in.want_shutdown || in.stall_stop) ? 0 : 1;
    flags_[1] = in.has_new ? 0 : 1;
    flags_[2] = in.stall_stop ? 0 : 1;
    for (std::size_t r = 0; r < n; ++r) flags_[3 + r] = r == me ? (in.joined ? 1 : 0) : 1;
    flags_[3 + n + me] = in.want_shutdown ? 0 : 1;
    for (std::size_t k = 0; k < slots; ++k) {
      flags_[base() + 2 * k] = (in.joined || (*in.pending)[k]) ? 1 : 0;
      flags_[base() + 2 * k + 1] = (*in.invalid)[k] ? 0 : 1;
    }
    return flags_;
  }

  // Reads the reduced flags: who has joined, how many contribute.
  void read_flags() {
    const auto n = static_cast<std::size_t>(size_);
    joined_.assign(n, false);
    all_joined_ = true;
    active_ = 0;
    for (std::size_t r = 0; r < n; ++r) {
      const bool j = flags_[3 + r] != 0;
      joined_[r] = j;
      all_joined_ = all_joined_ && j;
      active_ += j ? 0 : 1;
    }
  }

  bool shutdown() const { return flags_[0] == 0; }   // some rank ends the engine
  bool by_stall() const { return flags_[2] == 0; }   // ... the stall inspector does
  bool new_names() const { return flags_[1] == 0; }  // some rank has requests to send
  bool slot_ready(std::size_t k) const { return flags_[base() + 2 * k] == 1; }
  bool slot_evicted(std::size_t k) const { return flags_[base() + 2 * k + 1] == 0; }
  const std::vector<bool>& joined() const { return joined_; }
  bool all_joined() const { return all_joined_; }
  int active() const { return active_; }  // ranks that have not joined
  // The ranks that asked for the shutdown.
  std::vector<int> stopped() const {
    std::vector<int> out;
    for (int r = 0; r < size_; ++r) {
      if (flags_[3 + static_cast<std::size_t>(size_ + r)] == 0) out.push_back(r);
    }
    return out;
  }

  // ---- the request exchange

  // Appends one request in the wire format (request.hpp).
  static void encode(std::string& out, const std::string& name, const RequestParams& p) {
    serialize(out, WireRequest{name, p});
  }

  // Files every rank's requests (`all`, counts[r] bytes of rank r, in rank order) in the table;
  // throws Error on a malformed message. `now`: when names seen first were first seen.
  void file(const std::string& all, const std::vector<std::size_t>& counts, clock::time_point now) {
    std::size_t off = 0;
    for (int r = 0; r < size_; ++r) {
      const auto c = counts[static_cast<std::size_t>(r)];
      const auto reqs = deserialize_requests(all.substr(off, c));
      off += c;
      for (const auto& req : reqs) {
        auto it = table_index_.find(req.name);
        if (it == table_index_.end()) {
          it = table_index_.emplace(req.name, table_.size()).first;
          table_.push_back(TableEntry{
              req.name, std::vector<std::optional<RequestParams>>(static_cast<std::size_t>(size_)),
              now, false, false});
        }
        table_[it->second].by_rank[static_cast<std::size_t>(r)] = req.p;
      }
    }
  }

  // Decides, in table order (the same on every rank), every name that every rank not joined
  // has submitted: appended to `out`, and removed from the table.
  void decide_ready(std::deque<Decided>& out) {
    for (auto& e : table_) {
      bool ready = true, any = false;
      for (std::size_t r = 0; r < e.by_rank.size(); ++r) {
        any = any || e.by_rank[r].has_value();
        ready = ready && (e.by_rank[r].has_value() || joined_[r]);
      }
      if (!ready || !any) continue;
      e.done = true;
      out.push_back(decide(e));
    }
    std::erase_if(table_, [](const TableEntry& e) { return e.done; });
    table_index_.clear();
    for (std::size_t i = 0; i < table_.size(); ++i) table_index_[table_[i].name] = i;
  }

  // A ready entry's response: the first rank's parameters, or the mismatch that every rank
  // reports in the same words.
  Decided decide(const TableEntry& e) const {
    const int n = size_;
    Decided resp;
    resp.name = e.name;
    int first = -1;
    for (int r = 0; r < n; ++r) {
      if (e.by_rank[static_cast<std::size_t>(r)]) {
        first = r;
        break;
      }
    }
    resp.p = *e.by_rank[static_cast<std::size_t>(first)];
    for (int r = first + 1; r < n; ++r) {
      const auto& q = e.by_rank[static_cast<std::size_t>(r)];
      if (!q) continue;
      RequestParams a = resp.p, b = *q;
      if (a.kind == OpKind::allgather) a.count = b.count = 0;  // allgather counts may differ
      if (!(a == b) && a.parts.size() == b.parts.size() && !a.parts.empty()) {
        std::size_t i = 0;
        while (i < a.parts.size() && a.parts[i] == b.parts[i]) ++i;
        if (i < a.parts.size()) {
          resp.error = "tensor '" + e.name + "' mismatch: rank " + std::to_string(first) +
                       "'s tensor " + std::to_string(i) + " has " + std::to_string(a.parts[i]) +
                       " elements but rank " + std::to_string(r) + "'s has " +
                       std::to_string(b.parts[i]) + " (coalesced submissions: every rank passes " +
                       "the same tensor counts, in the same order)";
          resp.error_tensor = static_cast<long>(i);
          return resp;
        }
      }
      if (!(a == b)) {
        resp.error = "tensor '" + e.name + "' mismatch: rank " + std::to_string(first) +
                     " submitted " + resp.p.describe() + " but rank " + std::to_string(r) +
                     " submitted " + q->describe();
        return resp;
      }
    }
    if (resp.p.kind == OpKind::broadcast && resp.p.root >= 0 && resp.p.root < n &&
        joined_[static_cast<std::size_t>(resp.p.root)]) {
      resp.error = "tensor '" + e.name + "': broadcast root " + std::to_string(resp.p.root) +
                   " has joined and has no data to send";
      return resp;
    }
    if (resp.p.kind == OpKind::allgather) {
      for (int r = 0; r < n; ++r) {
        const auto& q = e.by_rank[static_cast<std::size_t>(r)];
        resp.counts.push_back(q ? static_cast<std::size_t>(q->count) : 0);
      }
    }
    return resp;
  }

  // Whether a decided response gets a cache slot (every rank decides the same).
  static bool cacheable(const Decided& d) {
    return d.error.empty() && d.p.kind != OpKind::allgather;
  }

  // One negotiation round's request part over `ex`: this rank's requests out (encoded by the
  // caller into `mine`), every rank's in, filed and decided into `out`.
  void exchange(Exchange& ex, const std::string& mine, std::deque<Decided>& out) {
    ex.gather(mine, all_, counts_);
    file(all_, counts_, clock::now());
    decide_ready(out);
  }

  // ---- the stall inspector (rank 0) and the shutdown's words

  // Logs each name waiting `warning` seconds or more (once) with the ranks that have not
  // submitted it; true when one has waited `shutdown_after` (> 0) seconds.
  bool inspect_stalls(double warning, double shutdown_after, clock::time_point now) {
    if (warning <= 0) return false;
    bool stop = false;
    for (auto& e : table_) {
      const double age = std::chrono::duration<double>(now - e.first_seen).count();
      if (age >= warning && !e.warned) {
        e.warned = true;
        std::fprintf(stderr, "[kolo] stall inspector: %s for %.0f s. %s\n",
                     stall_text(e, joined_).c_str(), age, kJoinHint);
      }
      if (shutdown_after > 0 && age >= shutdown_after) stop = true;
    }
    return stop;
  }

  // Why the engine ends, the same text on every rank from the same flags and table, plus what
  // is pending here (`in_flight` operations; `pending`: TensorQueue::pending_text()).
  std::string shutdown_reason(std::size_t in_flight, const std::string& pending) const {
    const std::vector<int> stopped_ranks = stopped();
    std::string s;
    if (by_stall()) {
      s = "engine shut down by the stall inspector (rank 0, KOLO_STALL_SHUTDOWN_SECONDS)";
    } else {
      s = "engine shut down by rank" + std::string(stopped_ranks.size() > 1 ? "s " : " ") +
          rank_list(stopped_ranks) +
          (std::find(stopped_ranks.begin(), stopped_ranks.end(), rank_) != stopped_ranks.end()
               ? " (this rank)"
               : "") +
          ", which called Engine::shutdown() or destroyed its Engine";
    }
    std::vector<std::string> waiting;
    for (const auto& e : table_) waiting.push_back(stall_text(e, joined_));
    if (!waiting.empty()) s += ", while " + first_few(waiting, "; ", "tensors");
    if (in_flight > 0) {
      s += "; this rank was still waiting for " + std::to_string(in_flight) +
           (in_flight == 1 ? " tensor (" : " tensors (") + pending + ")";
    }
    return s + ". " + kJoinHint + ".";
  }

  const std::vector<TableEntry>& table() const { return table_; }

 private:
  std::size_t base() const { return 3 + 2 * static_cast<std::size_t>(size_); }

  int rank_, size_;
  std::vector<std::uint8_t> flags_;
  std::vector<bool> joined_;
  bool all_joined_ = true;
  int active_ = 0;
  std::vector<TableEntry> table_;
  std::unordered_map<std::string, std::size_t> table_index_;
  std::string all_;
  std::vector<std::size_t> counts_;
};

}  // namespace kolo::detail::engine
