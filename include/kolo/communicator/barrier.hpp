// kolo/communicator/barrier.hpp — the barrier collective: its definition (a native barrier where
// the transport has one, else the dissemination barrier) and Communicator::barrier.
#pragma once

#include "kolo/communicator.hpp"

namespace kolo {

struct BarrierCollective {
  static constexpr Collective collective = Collective::barrier;
  struct Args {};
  static CallShape shape(const Args&, const CallFacts&) { return {}; }
  static void check(const Args&, const CallFacts&) {}
  template <class T>
  requires HasNativeBarrier<T>
  static bool native(T& t, const Args&, const AlgoOptions& opt) { return t.native_barrier(opt); }
  static void run(TransportRef t, const Args&, const AlgoOptions& opt, const AlgoContext&) {
    barrier_dissemination(t, opt);
  }
};

template <class T>
void Communicator<T>::barrier() {
  call<BarrierCollective>({});
}

}  // namespace kolo
