// kolo/communicator/broadcast.hpp — the broadcast collective: its definition (signature, checks,
// native hook, the Selector's broadcast) and Communicator::broadcast, which calls it.
#pragma once

#include "kolo/communicator.hpp"

namespace kolo {

// The root's data.count elements reach every rank.
struct BroadcastCollective {
  static constexpr Collective collective = Collective::broadcast;
  static constexpr bool rooted = true;  // the rooted entry agreement (Communicator::agree)
  using Algorithm = BroadcastAlgorithm;
  struct Args {
    TensorView data;
    int root = 0;
  };
  static CallShape shape(const Args& a, const CallFacts&) {
    return {a.data.dtype, ReduceOp::sum, a.data.count, a.root, 0};
  }
  static void check(const Args& a, const CallFacts& f) {
    checks::check_buffer(a.data, "broadcast buffer", f.device_ok);
    checks::check_root(a.root, f.size, "broadcast");
  }
  template <class T>
  requires HasNativeBroadcast<T>
  static bool native(T& t, const Args& a, const AlgoOptions& opt) {
    return t.native_broadcast(a.data.data, a.data.count, a.data.dtype, a.root, opt);
  }
  static BroadcastArgs algorithm_args(const Args& a, const CallFacts&) {
    BroadcastArgs b;
    b.data = a.data.data;
    b.nbytes = a.data.bytes();
    b.root = a.root;
    return b;
  }
};

template <class T>
void Communicator<T>::broadcast(TensorView data, int root) {
  call<BroadcastCollective>({data, root});
}

}  // namespace kolo
