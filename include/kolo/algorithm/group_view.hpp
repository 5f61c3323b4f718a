// kolo/algorithm/group_view.hpp — a subset of a transport's ranks, seen as a transport of its
// own, so every algorithm runs on a sub-group unchanged (MPI's communicator split without the
// communicator: no new connections, no new buffers, no rendezvous).
//
// A GroupView maps group rank i to the transport's rank members[i]; as a TransportRef (it
// converts implicitly) it forwards everything else. One class for every transport: it holds a
// TransportRef, not the transport's type. Two properties make this sufficient for hierarchical
// collectives:
//  - Operations to one peer complete in posting order on the underlying transport, so phases run
//    one after another on different groups (reduce-scatter inside a host, then allreduce across
//    hosts, then allgather inside the host) cannot steal each other's messages: every pair of
//    ranks posts its messages of phase k before those of phase k+1, on both ends.
//  - wait_any_progress is the transport's: a group that waits is woken by any completion, and an
//    algorithm only ever waits for its own requests to complete, so nothing is missed.
// Ranks outside the group are never addressed. Only one algorithm may drive the transport at a
// time (true of every Communicator call). A group of a group maps straight to the transport.
#pragma once

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "kolo/core/error.hpp"
#include "kolo/transport/transport_ref.hpp"

namespace kolo {

class GroupView {
 public:
  // members: the group's ranks in `t`, in group-rank order; must contain t.rank() exactly once.
  GroupView(TransportRef t, std::vector<int> members) : base_(t), members_(std::move(members)) {
    const auto it = std::find(members_.begin(), members_.end(), t.rank());
    if (it == members_.end()) {
      throw Error("GroupView: rank " + std::to_string(t.rank()) + " is not a member of the group");
    }
    rank_ = static_cast<int>(it - members_.begin());
    for (int& m : members_) m = t.global(m);  // to the transport's own ranks
    base_.map_ = nullptr;
  }

  GroupView(const GroupView&) = delete;  // refs point into members_
  GroupView& operator=(const GroupView&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(members_.size()); }
  // The underlying transport's rank of group rank g.
  int global(int g) const { return members_[static_cast<std::size_t>(g)]; }
  const std::vector<int>& members() const { return members_; }

  // The group as a transport (valid while this GroupView lives).
  TransportRef ref() const {
    TransportRef r = base_;
    r.map_ = members_.data();
    r.rank_ = rank_;
    r.size_ = size();
    return r;
  }
  operator TransportRef() const { return ref(); }  // NOLINT(google-explicit-constructor)

 private:
  TransportRef base_;
  std::vector<int> members_;
  int rank_ = 0;
};

}  // namespace kolo
