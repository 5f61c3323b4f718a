// kolo/algorithm/group_view.hpp — a subset of a transport's ranks, seen as a transport of its
// own, so every algorithm runs on a sub-group unchanged (MPI's communicator split without the
// communicator: no new connections, no new buffers, no rendezvous).
//
// GroupView<T> maps group rank i to global rank members[i] and forwards everything else. Two
// properties make this sufficient for hierarchical collectives:
//  - Operations to one peer complete in posting order on the underlying transport, so phases run
//    one after another on different groups (reduce-scatter inside a host, then allreduce across
//    hosts, then allgather inside the host) cannot steal each other's messages: every pair of
//    ranks posts its messages of phase k before those of phase k+1, on both ends.
//  - wait_any_progress is the transport's: a group that waits is woken by any completion, and an
//    algorithm only ever waits for its own requests to complete, so nothing is missed.
// Ranks outside the group are never addressed. Only one algorithm may drive the transport at a
// time (true of every Communicator call).
#pragma once

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "kolo/core/error.hpp"
#include "kolo/transport/transport.hpp"

namespace kolo {

template <Transport T>
class GroupView {
 public:
  using Request = typename T::Request;

  // members: the group's ranks in the underlying transport, in group-rank order; must contain
  // t.rank() exactly once.
  GroupView(T& t, std::vector<int> members) : t_(&t), members_(std::move(members)) {
    const auto it = std::find(members_.begin(), members_.end(), t.rank());
    if (it == members_.end()) {
      throw Error("GroupView: rank " + std::to_string(t.rank()) + " is not a member of the group");
    }
    rank_ = static_cast<int>(it - members_.begin());
  }

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(members_.size()); }
  // The underlying transport's rank of group rank g.
  int global(int g) const { return members_[static_cast<std::size_t>(g)]; }
  const std::vector<int>& members() const { return members_; }

  Request isend(int peer, const void* src, std::size_t bytes, const Signature& sig) {
    return t_->isend(global(peer), src, bytes, sig);
  }
  Request irecv(int peer, void* dst, std::size_t bytes, const Signature& sig) {
    return t_->irecv(global(peer), dst, bytes, sig);
  }
  Request irecv_reduce(int peer, void* dst, const void* local, std::size_t bytes,
                       const ReduceSpec& rs, const Signature& sig) {
    return t_->irecv_reduce(global(peer), dst, local, bytes, rs, sig);
  }
  bool done(Request r) const { return t_->done(r); }
  bool test(Request r) { return t_->test(r); }
  void wait(Request r, const Deadline& dl) { t_->wait(r, dl); }
  void wait_any_progress(const Deadline& dl) { t_->wait_any_progress(dl); }
  // An error in a group is an error of the whole job: the transport tells every rank.
  void abort(const Error& err) { t_->abort(err); }
  double timeout_seconds() const { return t_->timeout_seconds(); }

 private:
  T* t_;
  std::vector<int> members_;
  int rank_ = 0;
};

}  // namespace kolo
