// kolo/communicator/collective.hpp — what a collective is, for the Communicator: a definition
// type (its signature, its argument checks, what runs it) that Communicator::call<D>() runs with
// the signature, deadline and error agreement every collective gets, and the per-collective
// state table (what each collective's last call ran).
//
// The built-in collectives broadcast, reduce_scatter, alltoall and barrier are such definitions
// (communicator/broadcast.hpp, ...); a new collective is one more: one file with a struct
//
//   struct MyCollective {
//     static constexpr Collective collective = ...;   // stamped on its messages
//     struct Args { ... };                             // the call's arguments
//     static CallShape shape(const Args&, const CallFacts&);     // dtype, op, count, root, extra
//     static void check(const Args&, const CallFacts&);          // ConfigError on a bad argument
//     // then one of:
//     using Algorithm = XAlgorithm;                    // run by the Selector from X's registry
//     static AlgorithmTraits<XAlgorithm>::Args algorithm_args(const Args&, const CallFacts&);
//     // or
//     static void run(TransportRef, const Args&, const AlgoOptions&, const AlgoContext&);
//     // optional:
//     static constexpr bool rooted = true;             // the rooted entry agreement first
//     template <class T> static bool native(T&, const Args&, const AlgoOptions&);  // a hook
//   };
//
// and `comm.call<MyCollective>(args)` runs it on every rank (tests/inproc/test_toy_collective.cpp
// adds one in a test file, as test_toy_algorithm.cpp adds an algorithm).
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>

#include "kolo/algorithm/entry.hpp"
#include "kolo/algorithm/options.hpp"
#include "kolo/core/dtype.hpp"
#include "kolo/core/signature.hpp"
#include "kolo/transport/transport_ref.hpp"

namespace kolo {

// What a collective call's Signature carries besides its sequence number: ranks whose calls
// differ in any of these fail with a MismatchError at the first message.
struct CallShape {
  DataType dtype = DataType::uint8;
  ReduceOp op = ReduceOp::sum;
  std::size_t count = 0;  // elements per rank (or what the ranks agree on)
  int root = -1;
  std::uint64_t extra = 0;  // anything else the ranks must agree on (a hash of counts, ...)
};

// What a definition's checks may use of the communicator.
struct CallFacts {
  int rank = 0;
  int size = 1;
  bool device_ok = false;  // the transport takes device buffers (AcceptsDeviceBuffers)
};

// A collective the Communicator can run (the shape above).
template <class D>
concept CollectiveDefinition = requires(const typename D::Args& a, const CallFacts& f) {
  { D::collective } -> std::convertible_to<Collective>;
  { D::shape(a, f) } -> std::same_as<CallShape>;
  D::check(a, f);
}
&&(
    requires { typename D::Algorithm; } ||
    requires(TransportRef t, const typename D::Args& a, const AlgoOptions& o,
             const AlgoContext& c) { D::run(t, a, o, c); });

// Per-collective state, one slot per Collective value (an array indexed by the enum, not a
// member per collective): the identity of the algorithm each collective's last call ran.
class CollectiveTable {
 public:
  template <AlgorithmId Algo>
  Algo last() const {
    return static_cast<Algo>(last_[slot(AlgorithmTraits<Algo>::collective)]);
  }
  template <AlgorithmId Algo>
  void record(Algo a) {
    last_[slot(AlgorithmTraits<Algo>::collective)] = static_cast<std::uint8_t>(a);
  }

 private:
  static constexpr std::size_t slot(Collective c) { return static_cast<std::size_t>(c); }
  // Every collective's built-in algorithm 0 until its first call (ring, chain, pairwise).
  std::array<std::uint8_t, 256> last_{};
};

}  // namespace kolo
