// kolo/transport/pool_completion.hpp — the completion calls of the transports whose operations
// live in a detail::OpPool (MeshTransport, transport/mesh.hpp, and MpiTransport,
// transport/mpi/transport.hpp): done, test, wait, wait_all and wait_any_progress, written once.
//
// A transport derives from PoolCompletion<itself> and befriends it; the calls reach its `pool_`,
// `progress()` and `block(const Deadline&)` through a static cast, so they compile to what the
// transport's own members were (no virtual call, nothing stored).
#pragma once

#include "kolo/core/deadline.hpp"
#include "kolo/transport/op_pool.hpp"

namespace kolo::detail {

template <class Derived>
class PoolCompletion {
 public:
  // Whether the operation `r` has completed (answerable forever: see OpPool).
  bool done(OpHandle r) const { return self().pool_.done(r); }

  // One progress pass unless `r` has completed already; whether it has now.
  bool test(OpHandle r) {
    if (done(r)) return true;
    self().progress();
    return done(r);
  }

  // Blocks until `r` has completed (the transport's block() throws at the deadline or on an
  // error).
  void wait(OpHandle r, const Deadline& dl) {
    while (!done(r)) self().block(dl);
  }

  // wait() on each request of `reqs`, in order.
  template <class Range>
  void wait_all(const Range& reqs, const Deadline& dl) {
    for (const OpHandle& r : reqs) wait(r, dl);
  }

  // Blocks until at least one operation has completed since this last returned (or none is
  // pending). "Since this last returned", not "from now": an operation may complete inside an
  // isend/irecv call (eager progress), and a caller that then waits must not miss it.
  void wait_any_progress(const Deadline& dl) {
    if (!self().pool_.completed_since_seen()) self().block(dl);
    self().pool_.mark_seen();
  }

 private:
  Derived& self() { return static_cast<Derived&>(*this); }
  const Derived& self() const { return static_cast<const Derived&>(*this); }
};

}  // namespace kolo::detail
