// kolo/communicator/fault.hpp — surviving a lost rank: Communicator::revoke, lost_ranks and
// shrink (the survivors agree through the rendezvous store and build a smaller communicator).
//
// The agreement is a write-once register in the store. Round r of shrinking generation g uses the
// keys under B = <root>g<g>/shrink/<r>/ (root: the first ancestor's store prefix):
//   here/<i>   survivor i has arrived; its value is the ranks it holds for gone ("x:1,3")
//   decision   the excluded ranks: the first compare_set wins, every survivor adopts it
//   built/<j>  new rank j finished its constructor (the commit barrier)
//   failed     a member's build failed: everyone goes to round r + 1 without the dead
// A survivor proposes once every rank it does not hold for gone has arrived, or when 60 % of the
// shrink's time has passed (the deadline is the detector for a rank that vanished without a trace
// and for a live rank that never calls shrink). Proposals differ only by ranks some survivor saw
// die, so whichever wins is safe. The new communicator connects under <root>g<g+1>.<r>/ with a
// fresh job token, so its shared-memory names and connections are its own.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "kolo/communicator.hpp"
#include "kolo/communicator/watched_store.hpp"
#include "kolo/core/deadline.hpp"
#include "kolo/core/error.hpp"

namespace kolo {

namespace detail {

// "x:1,3" for {1, 3}, "x:" for none (never empty: an empty value means "absent" to compare_set).
inline std::string encode_rank_set(const std::set<int>& ranks) {
  std::string s = "x:";
  bool first = true;
  for (int r : ranks) {
    if (!first) s += ',';
    s += std::to_string(r);
    first = false;
  }
  return s;
}

// The set encode_rank_set wrote; ranks outside [0, size) are an Error (a corrupt store entry).
inline std::set<int> decode_rank_set(const std::string& s, int size, const std::string& key) {
  std::set<int> out;
  if (s.rfind("x:", 0) != 0) throw Error("shrink: store entry " + key + " is malformed: " + s);
  std::size_t i = 2;
  while (i < s.size()) {
    std::size_t j = s.find(',', i);
    if (j == std::string::npos) j = s.size();
    int v = -1;
    try {
      v = std::stoi(s.substr(i, j - i));
    } catch (...) {
      v = -1;
    }
    if (v < 0 || v >= size) throw Error("shrink: store entry " + key + " is malformed: " + s);
    out.insert(v);
    i = j + 1;
  }
  return out;
}

inline std::string rank_list_text(const std::set<int>& ranks) {
  std::string s = "[";
  for (int r : ranks) s += (s.size() > 1 ? ", " : "") + std::to_string(r);
  return s + "]";
}

}  // namespace detail

template <class T>
void Communicator<T>::revoke(std::string_view why) {
  try {
    if constexpr (requires(T & t, const std::string& w) { t.revoke(w); }) {
      transport_->revoke(std::string(why));
    } else if (!transport_->aborted()) {
      transport_->abort(RevokedError("communicator revoked by rank " + std::to_string(rank()) +
                                     (why.empty() ? std::string() : ": " + std::string(why))));
    }
  } catch (...) {
    // Best effort by contract: the peers also learn of it through their own failure detectors.
  }
}

template <class T>
std::vector<int> Communicator<T>::lost_ranks() {
  if constexpr (requires(T & t) { t.lost_peers(); }) {
    return transport_->lost_peers();
  } else {
    return {};
  }
}

template <class T>
Communicator<T> Communicator<T>::build_child(int rank, int size,
                                             const std::shared_ptr<detail::WatchedStore>& watched,
                                             const std::string& prefix) {
  if constexpr (!Connectable<T>) {
    (void)rank;
    (void)size;
    (void)watched;
    (void)prefix;
    throw ConfigError("this communicator's transport is not built through a rendezvous store");
  } else {
    Topology t = topo_;
    t.rank = rank;
    t.size = size;
    t.local_rank = t.local_size = t.cross_rank = t.cross_size = -1;  // derived anew by host key
    t.listen_fd = -1;
    CommunicatorOptions o = opts_;
    o.inherited_tuning = selector_.tuning();  // the same links: no probe
    try {
      Communicator c(std::move(t), watched, prefix, *topts_, o);
      watched->disarm();
      return c;
    } catch (...) {
      watched->disarm();
      throw;
    }
  }
}

template <class T>
Communicator<T> Communicator<T>::shrink(const std::vector<int>& excluded, const ShrinkOptions& so) {
  if constexpr (!Connectable<T>) {
    (void)excluded;
    (void)so;
    throw ConfigError(
        "shrink: this communicator adopted a transport that is not built through a rendezvous "
        "store (e.g. MPI); shrink the MPI communicator (MPIX_Comm_shrink) and adopt the result");
  } else {
    const int n = size();
    const int me = rank();
    if (!boot_ || boot_->store() == nullptr) {
      throw ConfigError(
          "shrink: this communicator has no rendezvous store (it adopted its transport, or has "
          "one rank); shrink needs the store the ranks met through");
    }
    std::set<int> suspects;
    for (int r : excluded) {
      if (r < 0 || r >= n) {
        throw ConfigError("shrink: excluded rank " + std::to_string(r) + " is not a rank of this " +
                          std::to_string(n) + "-rank communicator");
      }
      if (r == me) {
        throw ConfigError("shrink: rank " + std::to_string(me) +
                          " passed itself in `excluded`; an excluded rank does not call shrink");
      }
      suspects.insert(r);
    }
    if (so.min_size < 1) throw ConfigError("shrink: min_size must be at least 1");
    auto hook = [&](int step) {
      if (so.test_hook) so.test_hook(step);
    };
    revoke("shrink");  // a survivor still inside a collective fails out of it and comes here
    const double budget = so.timeout_seconds >= 0 ? so.timeout_seconds
                                                  : std::min(transport_->timeout_seconds(), 10.0);
    const auto start = std::chrono::steady_clock::now();
    auto elapsed = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    KvStore& st = *boot_->store();
    const std::string root = lineage_.root.empty() ? boot_->prefix() : lineage_.root;
    const std::string gen = "g" + std::to_string(lineage_.generation);
    auto probe = [&] {
      for (int r : lost_ranks()) suspects.insert(r);
    };
    auto store_failed = [&](const Error& e) -> Error {
      std::string msg =
          "shrink: the rendezvous store (" + st.describe() + ") failed: " + std::string(e.what());
      msg +=
          "; surviving a lost rank needs a store outside the ranks (kolo-run's, KOLO_STORE, "
          "torchrun's agent store), not the one rank 0 hosts under MASTER_ADDR or KOLO_PEERS";
      return Error(msg, e.kind() == ErrorKind::config ? ErrorKind::config : ErrorKind::peer_lost);
    };
    const int max_rounds = n / 2 + 2;
    std::string last_failure;
    for (int round = 1; round <= max_rounds; ++round) {
      const std::string base = root + gen + "/shrink/" + std::to_string(round) + "/";
      // ---- agreement: who is gone ----
      std::set<int> decided;
      try {
        probe();
        hook(1);
        std::string said = detail::encode_rank_set(suspects);
        st.set(base + "here/" + std::to_string(me), said);
        hook(2);
        const double agree_by = elapsed() + 0.6 * std::max(0.0, budget - elapsed());
        for (;;) {
          if (auto d = st.try_get(base + "decision")) {
            decided = detail::decode_rank_set(*d, n, base + "decision");
            break;
          }
          probe();
          if (const std::string now = detail::encode_rank_set(suspects); now != said) {
            said = now;
            st.set(base + "here/" + std::to_string(me), said);
          }
          std::set<int> all = suspects;
          std::vector<std::string> missing;
          for (int k = 0; k < n; ++k) {
            if (k == me) continue;
            const std::string key = base + "here/" + std::to_string(k);
            if (auto h = st.try_get(key)) {
              for (int r : detail::decode_rank_set(*h, n, key)) all.insert(r);
            } else if (!all.count(k)) {
              missing.push_back(key);
            }
          }
          const bool late = elapsed() >= agree_by;
          if (missing.empty() || late) {
            if (late) {
              for (const std::string& key : missing) {
                all.insert(std::stoi(key.substr(key.rfind('/') + 1)));
              }
            }
            const std::string mine = detail::encode_rank_set(all);
            decided = detail::decode_rank_set(st.compare_set(base + "decision", "", mine), n,
                                              base + "decision");
            break;
          }
          st.wait_for(missing, 0.005);
        }
      } catch (const Error& e) {
        throw store_failed(e);
      }
      hook(3);
      if (decided.count(me)) {
        throw RevokedError("shrink: rank " + std::to_string(me) +
                           " was excluded by the survivors' agreement (excluded: " +
                           detail::rank_list_text(decided) + ")");
      }
      std::vector<int> members;
      for (int k = 0; k < n; ++k) {
        if (!decided.count(k)) members.push_back(k);
      }
      if (static_cast<int>(members.size()) < so.min_size) {
        throw Error("shrink: " + std::to_string(members.size()) + " of " + std::to_string(n) +
                    " ranks survive (excluded: " + detail::rank_list_text(decided) +
                    "), fewer than min_size " + std::to_string(so.min_size));
      }
      // ---- the new communicator, then the commit barrier ----
      const int new_rank =
          static_cast<int>(std::find(members.begin(), members.end(), me) - members.begin());
      const std::string prefix =
          root + "g" + std::to_string(lineage_.generation + 1) + "." + std::to_string(round) + "/";
      std::optional<Communicator> next;
      // While it is built and in the commit barrier, a member's death, a member's failed build
      // or the end of the shrink's time ends the waits (WatchedStore, the barrier below), not
      // the store's own deadline.
      auto check = [&] {
        if (auto f = st.try_get(base + "failed")) throw Error("a member's set-up failed: " + *f);
        for (int r : lost_ranks()) {
          if (!decided.count(r)) {
            throw PeerLostError("rank " + std::to_string(r) + " died during the shrink");
          }
        }
        if (elapsed() >= budget) throw TimeoutError("members did not finish their set-up");
      };
      auto watched = std::make_shared<detail::WatchedStore>(boot_->shared_store(), check);
      try {
        next.emplace(build_child(new_rank, static_cast<int>(members.size()), watched, prefix));
        hook(4);
        detail::commit_barrier(st, base, next->rank(), static_cast<int>(members.size()), check);
      } catch (const Error& e) {
        last_failure = e.what();
        try {
          st.set(base + "failed", "rank " + std::to_string(me) + ": " + last_failure);
        } catch (const Error& se) {
          throw store_failed(se);
        }
        next.reset();
        if (elapsed() >= budget) break;
        probe();  // who died during the build; the next round excludes them
        for (int r : decided) suspects.insert(r);
        continue;
      }
      next->boot_->inherit_server(*boot_);
      next->lineage_.generation = lineage_.generation + 1;
      next->lineage_.root = root;
      next->lineage_.parent_rank = members;
      next->lineage_.excluded.assign(decided.begin(), decided.end());
      return std::move(*next);
    }
    throw TimeoutError("shrink: the survivors could not build a new communicator within " +
                       std::to_string(budget) + " s (ShrinkOptions::timeout_seconds)" +
                       (last_failure.empty() ? std::string() : ": " + last_failure));
  }
}

}  // namespace kolo
