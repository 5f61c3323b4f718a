// kolo/communicator/grow.hpp — adding processes to a group: Communicator::grow (the members)
// and Communicator::join (the new processes) meet through the rendezvous store and a join token,
// and all of them build the enlarged communicator.
//
// Keys (T: the token, R: the members' root prefix, g: their generation):
//   kolo/join/<T>/offer   written once by member rank 0 (compare_set: a used token is refused):
//                         "kolo-grow 1", R, g + 1, the members' size n, the count k, then the
//                         members' tuning (Tuning::to_text), one per line
//   R g<g+1>.join.<T>/    the enlarged communicator's prefix; under it:
//     secret              the job secret, for a joiner that has none of its own (the Bootstrap
//                         of a store-built communicator reads it there)
//     grow/slots          add(1) per joiner: its place 1..k, rank n + place - 1
//     grow/built/<j>      rank j finished its constructor (the commit barrier)
//     grow/failed         the first rank's set-up that failed ("<kind>:<who>: <what>"): everyone
//                         throws that kind, no one returns the new communicator
// The set-up runs on a WatchedStore (communicator/watched_store.hpp): a member's death, a failed
// build or the end of the grow's time ends every wait, not the store's own deadline.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kolo/communicator.hpp"
#include "kolo/communicator/watched_store.hpp"
#include "kolo/core/core_config.hpp"
#include "kolo/core/error.hpp"
#include "kolo/net/auth.hpp"
#include "kolo/topology/store/client.hpp"

namespace kolo {

namespace detail {

// What member rank 0 offers the joiners of one grow.
struct GrowOffer {
  std::string root;
  std::uint64_t generation = 0;  // of the enlarged communicator
  int members = 0;
  int count = 0;
  std::string tuning;  // Tuning::to_text of the members

  std::string prefix(const std::string& token) const {
    return root + "g" + std::to_string(generation) + ".join." + token + "/";
  }
  std::string encode() const {
    return "kolo-grow 1\n" + root + "\n" + std::to_string(generation) + "\n" +
           std::to_string(members) + "\n" + std::to_string(count) + "\n" + tuning;
  }
  static GrowOffer decode(const std::string& s, const std::string& key) {
    std::istringstream in(s);
    std::string magic, gen, members, count;
    GrowOffer o;
    if (!std::getline(in, magic) || magic != "kolo-grow 1" || !std::getline(in, o.root) ||
        !std::getline(in, gen) || !std::getline(in, members) || !std::getline(in, count)) {
      throw Error("join: store entry " + key + " is not a grow offer");
    }
    try {
      o.generation = std::stoull(gen);
      o.members = std::stoi(members);
      o.count = std::stoi(count);
    } catch (...) {
      throw Error("join: store entry " + key + " is not a grow offer");
    }
    std::ostringstream rest;
    rest << in.rdbuf();
    o.tuning = rest.str();
    return o;
  }
};

inline std::string offer_key(const std::string& token) {
  return "kolo/join/" + token + "/offer";
}

inline void check_join_token(const std::string& token, const char* who) {
  if (token.empty()) {
    throw ConfigError(std::string(who) + ": the join token is empty (GrowOptions::token on the " +
                      "members, the same string in Communicator::join on the new processes)");
  }
  for (char c : token) {
    if (c == '/' || c == '\n' || static_cast<unsigned char>(c) < 0x20) {
      throw ConfigError(std::string(who) + ": the join token \"" + token +
                        "\" has a '/' or a control character");
    }
  }
}

// A rank's set-up failed: the first failure is recorded under base/failed as "<kind>:<who>: <what>"
// (a compare_set: later ones keep it), so every rank rethrows it with the same kind.
inline void grow_record_failure(KvStore& st, const std::string& base, const std::string& who,
                                const Error& e) {
  try {
    (void)st.compare_set(base + "failed", "",
                         std::to_string(static_cast<int>(e.kind())) + ":" + who + ": " + e.what());
  } catch (const Error&) {
    // the store is gone too: the others fail on it by themselves
  }
}

inline void grow_throw_if_failed(KvStore& st, const std::string& base) {
  if (auto f = st.try_get(base + "failed")) {
    const auto colon = f->find(':');
    int kind = static_cast<int>(ErrorKind::generic);
    try {
      kind = std::stoi(f->substr(0, colon));
    } catch (...) {
      kind = static_cast<int>(ErrorKind::generic);
    }
    if (kind < 1 || kind > static_cast<int>(ErrorKind::revoked)) kind = 1;
    throw_error(
        static_cast<ErrorKind>(kind),
        "a rank's set-up failed: " + (colon == std::string::npos ? *f : f->substr(colon + 1)));
  }
}

}  // namespace detail

template <class T>
Communicator<T> Communicator<T>::grow(int count, const GrowOptions& go) {
  if constexpr (!Connectable<T>) {
    (void)count;
    (void)go;
    throw ConfigError(
        "grow: this communicator adopted a transport that is not built through a rendezvous "
        "store (e.g. MPI); grow the MPI communicator (MPI_Comm_spawn, MPI_Intercomm_merge) and "
        "adopt the result");
  } else {
    detail::check_join_token(go.token, "grow");
    if (count < 1)
      throw ConfigError("grow: count must be at least 1 (got " + std::to_string(count) + ")");
    if (!boot_ || boot_->store() == nullptr) {
      throw ConfigError(
          "grow: this communicator has no rendezvous store (it adopted its transport, or has "
          "one rank); grow needs a store the new processes can reach");
    }
    const int n = size();
    const int me = rank();
    const double budget =
        go.timeout_seconds >= 0 ? go.timeout_seconds : transport_->timeout_seconds();
    const auto start = std::chrono::steady_clock::now();
    auto elapsed = [&] {
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    KvStore& st = *boot_->store();
    detail::GrowOffer offer;
    offer.root = lineage_.root.empty() ? boot_->prefix() : lineage_.root;
    offer.generation = lineage_.generation + 1;
    offer.members = n;
    offer.count = count;
    offer.tuning = selector_.tuning().to_text();
    const std::string prefix = offer.prefix(go.token);
    const std::string base = prefix + "grow/";
    const std::string okey = detail::offer_key(go.token);
    auto arrived = [&] {
      try {
        return std::to_string(st.add(base + "slots", 0));
      } catch (const Error&) {
        return std::string("?");
      }
    };
    auto check = [&] {
      detail::grow_throw_if_failed(st, base);
      if (const auto lost = lost_ranks(); !lost.empty()) {
        throw PeerLostError("member rank " + std::to_string(lost.front()) +
                            " died during the grow");
      }
      if (elapsed() >= budget) {
        throw TimeoutError(arrived() + " of " + std::to_string(count) +
                           " joiners came with token \"" + go.token + "\" within " +
                           std::to_string(budget) + " s (GrowOptions::timeout_seconds)");
      }
    };
    std::optional<Communicator> next;
    try {
      // ---- the offer: written once by rank 0; every member checks it is theirs ----
      const std::string mine = offer.encode();
      if (me == 0) {
        st.set(prefix + "secret", topo_.secret);
        const std::string held = st.compare_set(okey, "", mine);
        if (held != mine) {
          throw ConfigError("grow: the join token \"" + go.token +
                            "\" was used by an earlier grow; give each grow a token of its own");
        }
      }
      auto watched = std::make_shared<detail::WatchedStore>(boot_->shared_store(), check);
      const std::string held = watched->get(okey);
      if (held != mine) {
        const detail::GrowOffer other = detail::GrowOffer::decode(held, okey);
        if (other.root != offer.root || other.generation != offer.generation) {
          throw ConfigError("grow: the join token \"" + go.token +
                            "\" was used by an earlier grow; give each grow a token of its own");
        }
        throw ConfigError("grow: rank 0 offered " + std::to_string(other.count) + " places to " +
                          std::to_string(other.members) + " members at generation " +
                          std::to_string(other.generation) + " with token \"" + go.token +
                          "\", this rank " + std::to_string(count) + " to " + std::to_string(n) +
                          " at " + std::to_string(offer.generation) +
                          ": every member passes the same count and token");
      }
      // ---- the enlarged communicator, then the commit barrier ----
      next.emplace(build_child(me, n + count, watched, prefix));
      detail::commit_barrier(st, base, me, n + count, check);
    } catch (const Error& e) {
      detail::grow_record_failure(st, base, "member " + std::to_string(me), e);
      if (e.kind() == ErrorKind::config) throw;
      throw_error(e.kind(), "grow: " + std::string(e.what()) + "; this communicator is unchanged");
    }
    next->boot_->inherit_server(*boot_);
    next->lineage_.generation = offer.generation;
    next->lineage_.root = offer.root;
    next->lineage_.parent_rank.resize(static_cast<std::size_t>(n + count), -1);
    for (int i = 0; i < n; ++i) next->lineage_.parent_rank[static_cast<std::size_t>(i)] = i;
    next->lineage_.joined = count;
    return std::move(*next);
  }
}

template <class T>
Communicator<T> Communicator<T>::join(std::shared_ptr<KvStore> store, const std::string& token,
                                      const JoinOptions& jo) requires Connectable<T> {
  detail::check_join_token(token, "join");
  if (!store) throw ConfigError("join: no store (the members' rendezvous store is needed)");
  const EnvLookup& env = process_env();
  // The knobs of a rank (KOLO_SECRET if set, KOLO_TIMEOUT_SECONDS, KOLO_HOST_KEY, ...); rank and
  // size come from the offer.
  Topology t = Topology::for_rank(0, 2, env);
  if (auto j = config::get_text(env, config::vars::job_id); j && !j->empty()) t.job = *j;
  const double budget = jo.timeout_seconds >= 0 ? jo.timeout_seconds : t.timeout_seconds;
  const TransportOptions<T> topts = T::Options::from_env(env);
  CommunicatorOptions o = CommunicatorOptions::from_env(env);
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const std::string okey = detail::offer_key(token);
  std::string base;
  auto check = [&] {
    if (!base.empty()) detail::grow_throw_if_failed(*store, base);
    if (elapsed() >= budget) {
      throw TimeoutError(base.empty()
                             ? "no grow with token \"" + token + "\" was offered within " +
                                   std::to_string(budget) +
                                   " s (JoinOptions::timeout_seconds): the members call "
                                   "Communicator::grow(count, {token}) with the same token"
                             : "the set-up did not finish within " + std::to_string(budget) + " s");
    }
  };
  auto watched = std::make_shared<detail::WatchedStore>(store, check);
  detail::GrowOffer offer;
  int place = 0;
  try {
    offer = detail::GrowOffer::decode(watched->get(okey), okey);
    base = offer.prefix(token) + "grow/";
    place = static_cast<int>(store->add(base + "slots", 1));
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::config) throw;
    throw_error(e.kind(), "join: " + std::string(e.what()));
  }
  if (place > offer.count) {
    throw ConfigError(
        "join: the grow with token \"" + token + "\" offered " + std::to_string(offer.count) +
        " places and all are taken (this process is joiner number " + std::to_string(place) + ")");
  }
  const int size = offer.members + offer.count;
  t.rank = offer.members + place - 1;
  t.size = size;
  o.inherited_tuning = Tuning::from_text(offer.tuning, okey);
  std::optional<Communicator> next;
  try {
    try {
      next.emplace(std::move(t), watched, offer.prefix(token), topts, o);
    } catch (...) {
      watched->disarm();
      throw;
    }
    watched->disarm();
    detail::commit_barrier(*store, base, next->rank(), size, check);
  } catch (const Error& e) {
    detail::grow_record_failure(*store, base, "joiner " + std::to_string(place), e);
    if (e.kind() == ErrorKind::config) throw;
    throw_error(e.kind(), "join: " + std::string(e.what()));
  }
  next->lineage_.generation = offer.generation;
  next->lineage_.root = offer.root;
  next->lineage_.parent_rank.assign(static_cast<std::size_t>(size), -1);
  for (int i = 0; i < offer.members; ++i)
    next->lineage_.parent_rank[static_cast<std::size_t>(i)] = i;
  next->lineage_.joined = offer.count;
  return std::move(*next);
}

namespace detail {

// The job's rendezvous store as a process outside the job's ranks reaches it (a joiner): the
// KOLO_STORE address, authenticated with KOLO_SECRET and KOLO_JOB_ID; its waits last
// `timeout_seconds` (<= 0: KOLO_TIMEOUT_SECONDS).
inline std::shared_ptr<KvStore> joiner_store(const char* who, double timeout_seconds) {
  const EnvLookup& env = process_env();
  const auto addr = config::get_text(env, config::vars::store);
  if (!addr || addr->empty()) {
    throw ConfigError(std::string(who) +
                      ": KOLO_STORE is not set: a joining process needs the address of the "
                      "job's rendezvous store (kolo-run exports it to its ranks), or pass the "
                      "store to Communicator::join()");
  }
  const Topology t = Topology::for_rank(0, 2, env);
  std::string job;
  if (auto j = config::get_text(env, config::vars::job_id); j && !j->empty()) job = *j;
  const double budget = timeout_seconds > 0 ? timeout_seconds : t.timeout_seconds;
  return std::make_shared<StoreClient>(net::parse_host_port(*addr, "KOLO_STORE"),
                                       net::job_key(t.secret, job), -1, budget);
}

}  // namespace detail

template <class T>
Communicator<T> Communicator<T>::join(const std::string& token,
                                      const JoinOptions& jo) requires Connectable<T> {
  return join(detail::joiner_store("join", jo.timeout_seconds), token, jo);
}

}  // namespace kolo
