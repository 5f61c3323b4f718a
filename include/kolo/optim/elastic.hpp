// kolo/optim/elastic.hpp — elastic training state for a DistributedOptimizer: commit, restore,
// sync, on_reset, and run_elastic, the loop that continues a training function with the
// survivors after a rank is lost (Horovod elastic's State and run, for a C++ training loop).
//
//   kolo::DistributedOptimizer opt(comm, kolo::SGD({.lr = 0.1}), params);
//   kolo::ElasticState state(opt);
//   std::int64_t step = 0;
//   state.track("step", step);                  // restored and synced with the parameters
//   state.on_reset([&](const kolo::ResetInfo& r) { /* e.g. rescale the learning rate */ });
//   kolo::run_elastic(state, [&](kolo::ElasticState<kolo::SGD>& s) {
//     for (; step < steps; ++step) {
//       backward(batch(step, opt.rank(), opt.size()));
//       opt.gradients_ready();
//       opt.step();
//       s.commit();                              // a host copy: no communication
//     }
//   });
//
// * commit() copies the parameters' values, the optimizer's state (StatefulOptimizer) and the
//   tracked bytes into host memory and counts the commit (commit_id()). It is local: committing
//   every step costs one copy of the model.
// * restore() copies the last commit back and forgets the optimizer's pending gradients.
// * sync(root) makes every rank's state root's, bit for bit (the parameters, the optimizer's
//   state, the tracked bytes, the commit count: broadcasts through the engine), then commits.
//   It also ends a recovery: a step the loss interrupted may have completed on one survivor and
//   failed on another, so their commits may differ by one step; after sync they are equal.
// * run_elastic(state, train) syncs from rank 0, then calls train(state); when train throws an
//   error kolo::recoverable() accepts (a peer lost, a revoked communicator, a timeout), every
//   survivor restores, recovers the engine (Engine::recover: the survivors' shrunk
//   communicator, renumbered), calls the on_reset callbacks with what changed, syncs from the
//   new rank 0 (the lowest surviving old rank), and calls train again — which resumes from the
//   restored state (the tracked step). Any other error, and a recovery that fails (this rank
//   was excluded, fewer than min_size survivors, more than max_resets recoveries), is thrown.
// * admit_joiners(name) lets processes that call kolo::join_elastic(name) in: at a commit that
//   finds some waiting, run_elastic grows the engine (Engine::grow), runs on_reset (joined > 0)
//   and syncs everyone — the joiners' first sync — from that commit.
// The state of the training loop that is not tracked (a data loader's position, RNG state) is
// the caller's: track() it, or recompute it from the tracked step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "kolo/core/error.hpp"
#include "kolo/core/tensor.hpp"
#include "kolo/engine/engine.hpp"
#include "kolo/optim/distributed_optimizer.hpp"
#include "kolo/optim/parameter.hpp"

namespace kolo {

// What a recovery changed, for ElasticState::on_reset callbacks.
struct ResetInfo {
  int old_rank = 0, new_rank = 0;  // this process's rank before and after
  int old_size = 0, new_size = 0;  // the world size before and after
  std::vector<int> lost;           // the old ranks the survivors excluded
  std::uint64_t generation = 0;    // Engine::generation() after the recovery
  int resets = 0;                  // recoveries so far in this run_elastic, this one included
  std::string cause;               // what() of the error that started the recovery
  int joined = 0;                  // processes admitted (a grow: lost is empty, cause says so)
};

// run_elastic's limits.
struct ElasticOptions {
  int max_resets = -1;   // recoveries allowed (< 0: any number); one more throws the error
  ShrinkOptions shrink;  // passed to Engine::recover (timeout, min_size)
};

namespace detail {
// Thrown by ElasticState::commit() on every rank when processes wait to join (admit_joiners):
// run_elastic grows the group and calls train again. Not a kolo::Error, so a training function's
// `catch (const kolo::Error&)` does not take it.
struct JoinersWaiting {
  int count = 0;
};
inline std::string elastic_join_key(const std::string& name, const std::string& what) {
  return "kolo/elastic-join/" + name + "/" + what;
}
}  // namespace detail

// Committed training state of one DistributedOptimizer (see the top of this file). The
// optimizer (and its engine) must outlive it. Not thread-safe; use it from the training thread.
template <Optimizer Opt, Transport T = DefaultTransport>
class ElasticState {
 public:
  explicit ElasticState(DistributedOptimizer<Opt, T>& opt) : opt_(&opt) {}

  // Adds `bytes` (an epoch counter, a data loader's position, RNG state) to what commit()
  // copies, restore() writes back and sync() broadcasts. Every rank tracks the same names, of
  // the same sizes, in the same order; the memory must outlive this state.
  void track(std::string name, std::span<std::byte> bytes) {
    for (const Extra& e : extras_) {
      if (e.name == name) throw ConfigError("ElasticState: '" + name + "' is tracked twice");
    }
    extras_.push_back({std::move(name), bytes, {}});
  }
  // The same for one trivially copyable object (an int64 step, a struct of counters).
  template <class V>
  requires std::is_trivially_copyable_v<V>
  void track(std::string name, V& value) {
    track(std::move(name), std::as_writable_bytes(std::span<V, 1>(&value, 1)));
  }

  // A callback run after every recovery, before the state is synced (e.g. to rescale the
  // learning rate to the new world size; the optimizer's options are configuration, not state).
  void on_reset(std::function<void(const ResetInfo&)> cb) { callbacks_.push_back(std::move(cb)); }

  // Lets processes that call kolo::join_elastic(name) into the group: every `check_every`
  // commits, commit() asks the store (rank 0) whether any wait and agrees on it (one 8-byte
  // broadcast through the engine); when some do, commit() throws to run_elastic, which grows the
  // group by them at this commit (Engine::grow), runs the on_reset callbacks (ResetInfo::joined)
  // and syncs the state to everyone — the joiners included — before calling train again. Every
  // rank, the joiners too, calls it with the same arguments before run_elastic.
  void admit_joiners(std::string name, int check_every = 1, const GrowOptions& go = {}) {
    detail::check_join_token(name, "admit_joiners");
    if (check_every < 1) throw ConfigError("admit_joiners: check_every must be at least 1");
    join_name_ = std::move(name);
    join_every_ = check_every;
    join_grow_ = go;
  }

  // Copies the parameters, the optimizer's state and the tracked bytes to host memory. Call it
  // between steps (after step() returned), on every rank or on none at a given point. With
  // admit_joiners, every check_every-th commit also checks for joiners (a collective).
  void commit() {
    commit_local();
    if (!join_name_.empty() && ++since_check_ >= join_every_) {
      since_check_ = 0;
      check_joiners();
    }
  }

 private:
  void commit_local() {
    std::span<Parameter> ps = opt_->parameters();
    values_.resize(ps.size());
    for (std::size_t i = 0; i < ps.size(); ++i)
      values_[i].assign(ps[i].value.begin(), ps[i].value.end());
    if constexpr (StatefulOptimizer<Opt>) {
      std::vector<StateTensor> st = opt_->optimizer().state(std::span<const Parameter>(ps));
      state_.resize(st.size());
      for (std::size_t i = 0; i < st.size(); ++i) {
        const auto* b = static_cast<const std::byte*>(st[i].tensor.data);
        state_[i].assign(b, b + st[i].tensor.bytes());
      }
    }
    for (Extra& e : extras_) e.saved.assign(e.bytes.begin(), e.bytes.end());
    ++commit_id_;
    committed_ = true;
  }

  // Rank 0 counts the joiners waiting (announced, not yet offered a place); all agree on it.
  void check_joiners() {
    Engine<T>& eng = opt_->engine();
    std::int64_t waiting = 0;
    if (eng.rank() == 0) {
      Bootstrap* b = eng.communicator().bootstrap();
      if (b != nullptr && b->store() != nullptr) {
        KvStore& st = *b->store();
        waiting = st.add(detail::elastic_join_key(join_name_, "waiting"), 0) -
                  st.add(detail::elastic_join_key(join_name_, "offered"), 0);
      }
    }
    eng.broadcast_async(prefix() + "joiners", TensorView(&waiting, 1, DataType::int64), 0).wait();
    if (waiting > 0) throw detail::JoinersWaiting{static_cast<int>(waiting)};
  }

 public:
  // Writes the last commit back (parameters, optimizer state, tracked bytes) and forgets the
  // optimizer's pending gradients (DistributedOptimizer::reset_pending). Before any commit: an
  // Error (sync() commits, and run_elastic syncs first).
  void restore() {
    if (!committed_) throw Error("ElasticState::restore: nothing was committed yet");
    opt_->reset_pending();
    std::span<Parameter> ps = opt_->parameters();
    for (std::size_t i = 0; i < ps.size() && i < values_.size(); ++i) {
      std::copy(values_[i].begin(), values_[i].end(), ps[i].value.begin());
    }
    if constexpr (StatefulOptimizer<Opt>) {
      std::vector<StateTensor> st = opt_->optimizer().state(std::span<const Parameter>(ps));
      for (std::size_t i = 0; i < st.size() && i < state_.size(); ++i) {
        std::memcpy(st[i].tensor.data, state_[i].data(), state_[i].size());
      }
    }
    for (Extra& e : extras_) std::copy(e.saved.begin(), e.saved.end(), e.bytes.begin());
  }

  // Every rank's parameters, optimizer state, tracked bytes and commit count become root's
  // (collective, through the engine), then commit. A joiner or a survivor starts from here.
  void sync(int root = 0) {
    opt_->reset_pending();
    opt_->broadcast_parameters(root);
    if constexpr (StatefulOptimizer<Opt>) opt_->broadcast_optimizer_state(root);
    Engine<T>& eng = opt_->engine();
    std::vector<Handle> hs;
    std::int64_t id = static_cast<std::int64_t>(commit_id_);
    hs.push_back(
        eng.broadcast_async(prefix() + "commit_id", TensorView(&id, 1, DataType::int64), root));
    for (Extra& e : extras_) {
      hs.push_back(eng.broadcast_async(prefix() + "extra/" + e.name,
                                       TensorView(reinterpret_cast<std::uint8_t*>(e.bytes.data()),
                                                  e.bytes.size(), DataType::uint8),
                                       root));
    }
    for (Handle& h : hs) h.wait();
    commit_local();
    commit_id_ = static_cast<std::uint64_t>(id);
    since_check_ = 0;  // every rank counts commits to the next join check from here
  }

  // Commits so far (root's after a sync): where a resumed loop stands.
  std::uint64_t commit_id() const { return commit_id_; }

  DistributedOptimizer<Opt, T>& optimizer() { return *opt_; }

  // True after a reset whose Engine::recover threw (run_elastic then rethrows instead of
  // retrying); a later successful reset clears it.
  bool recovery_failed() const { return recovery_failed_; }

  // run_elastic's recovery after `cause`: restore, Engine::recover, the callbacks, sync.
  void reset(const Error& cause, int resets, const ShrinkOptions& so) {
    Engine<T>& eng = opt_->engine();
    ResetInfo info;
    info.old_rank = eng.rank();
    info.old_size = eng.size();
    info.resets = resets;
    info.cause = cause.what();
    recovery_failed_ = false;
    restore();
    try {
      eng.recover({}, so);
    } catch (...) {
      // This rank was excluded, too few survived, or the shrink timed out: the communicator
      // is not replaceable from here, so run_elastic must not try again.
      recovery_failed_ = true;
      throw;
    }
    info.new_rank = eng.rank();
    info.new_size = eng.size();
    info.generation = eng.generation();
    info.lost = eng.communicator().lineage().excluded;
    for (auto& cb : callbacks_) cb(info);
    sync(0);
  }

  // run_elastic's admission of `count` waiting joiners at the commit just made: rank 0 hands
  // each its place's token, Engine::grow, the callbacks, sync (the joiners' first).
  void grow_reset(int count, int resets) {
    Engine<T>& eng = opt_->engine();
    ResetInfo info;
    info.old_rank = eng.rank();
    info.old_size = eng.size();
    info.resets = resets;
    info.joined = count;
    info.cause = std::to_string(count) + " process(es) joined";
    restore();  // the commit just made: forgets nothing but pending gradients
    // One token per grow, the same on every member without talking: the generation and the
    // commit count are equal on all of them here.
    const std::string token =
        join_name_ + ".g" + std::to_string(eng.generation()) + ".c" + std::to_string(commit_id_);
    if (eng.rank() == 0) {
      KvStore& st = *eng.communicator().bootstrap()->store();
      // Places are handed out once, even if this grow fails (a joiner that died after it
      // announced itself must not make every later check try again).
      const std::int64_t offered = st.add(detail::elastic_join_key(join_name_, "offered"), count);
      for (std::int64_t t = offered - count + 1; t <= offered; ++t) {
        st.set(detail::elastic_join_key(join_name_, "ticket/" + std::to_string(t)), token);
      }
    }
    GrowOptions go = join_grow_;
    go.token = token;
    eng.grow(count, go);
    opt_->verify_parameters_again();  // what the joiners' DistributedOptimizer constructors run
    info.new_rank = eng.rank();
    info.new_size = eng.size();
    info.generation = eng.generation();
    for (auto& cb : callbacks_) cb(info);
    sync(0);
  }

 private:
  struct Extra {
    std::string name;
    std::span<std::byte> bytes;
    std::vector<std::byte> saved;
  };
  std::string prefix() const { return opt_->options().name_prefix + "elastic/"; }

  DistributedOptimizer<Opt, T>* opt_;
  std::vector<std::vector<float>> values_;
  std::vector<std::vector<std::byte>> state_;
  std::vector<Extra> extras_;
  std::vector<std::function<void(const ResetInfo&)>> callbacks_;
  std::uint64_t commit_id_ = 0;
  bool committed_ = false;
  bool recovery_failed_ = false;
  std::string join_name_;  // admit_joiners
  int join_every_ = 1;
  int since_check_ = 0;
  GrowOptions join_grow_;
};

// Runs train(state) with the survivors until it returns (see the top of this file): first a
// sync from rank 0, then, after every recoverable error, a reset (restore, Engine::recover,
// on_reset, sync) and train again. Returns what train returns. A loss during a reset (a second
// rank dying while the survivors shrink or sync) starts another reset.
template <Optimizer Opt, Transport T, class F>
decltype(auto) run_elastic(ElasticState<Opt, T>& state, F&& train, const ElasticOptions& o = {}) {
  int resets = 0;
  auto recover_from = [&](const Error& first) {
    std::string cause = first.what();
    for (;;) {
      if (o.max_resets >= 0 && resets >= o.max_resets) {
        throw_error(first.kind(), cause + " (run_elastic: max_resets " +
                                      std::to_string(o.max_resets) + " reached)");
      }
      ++resets;
      try {
        state.reset(Error(cause, first.kind()), resets, o.shrink);
        return;
      } catch (const Error& e) {
        if (!recoverable(e) || state.recovery_failed()) throw;
        cause = e.what();
      }
    }
  };
  for (bool synced = false;;) {
    try {
      if (!synced) {
        state.sync(0);
        synced = true;
      }
      return train(state);
    } catch (const detail::JoinersWaiting& j) {
      // Every rank is at the same commit: grow there and train again from it.
      ++resets;
      try {
        state.grow_reset(j.count, resets);
      } catch (const Error& e) {
        // The grow failed on every member alike (a joiner never came): the engine goes on over
        // the unchanged communicator, from the commit restored above. A member lost meanwhile
        // fails the next step, which recovers as any loss does.
        if (!recoverable(e)) throw;
      }
    } catch (const Error& e) {
      if (!recoverable(e)) throw;
      if (!synced) {
        // The first sync failed: nothing was committed to restore; recover and sync again.
        state.commit();
      }
      recover_from(e);
      synced = true;
    }
  }
}

// The joining process's side of ElasticState::admit_joiners(name): announces itself in the job's
// store (KOLO_STORE, KOLO_SECRET, KOLO_JOB_ID), waits until the members reach a join check and
// hand it a place, and returns the enlarged communicator (Communicator::join). Build the
// DistributedOptimizer and ElasticState over it as the members did, call admit_joiners(name)
// and run_elastic: its first sync gives this process the members' committed state.
// jo.timeout_seconds bounds the wait for a place as well as the set-up.
template <Transport T = DefaultTransport>
Communicator<T> join_elastic(const std::string& name, const JoinOptions& jo = {}) {
  detail::check_join_token(name, "join_elastic");
  std::shared_ptr<KvStore> store = detail::joiner_store("join_elastic", jo.timeout_seconds);
  const std::int64_t place = store->add(detail::elastic_join_key(name, "waiting"), 1);
  std::string token;
  try {
    token = store->get(detail::elastic_join_key(name, "ticket/" + std::to_string(place)));
  } catch (const TimeoutError& e) {
    throw TimeoutError("join_elastic: no member offered this process a place under \"" + name +
                       "\" in time (the members call ElasticState::admit_joiners(\"" + name +
                       "\") and commit): " + e.what());
  }
  return Communicator<T>::join(std::move(store), token, jo);
}

}  // namespace kolo
