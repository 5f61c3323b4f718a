// kolo/algorithm/entry.hpp — what an algorithm is, for the registry: its name and aliases,
// where it applies, its cost function and its entry point, per collective.
//
// One registry per collective (allreduce, broadcast, allgather, reduce_scatter, alltoall;
// algorithm/registry.hpp); the Selector is one argmin over it (selector.hpp). An algorithm's
// identity is a small integer of its collective's type (AllreduceAlgorithm, ...): the built-ins
// have the named values below, in registry order, and register_algorithm() hands out the next
// ones. Every entry point has the same shape per collective:
//     void run(TransportRef t, const <Collective>Args& a, const AlgoOptions& opt,
//              const AlgoContext& ctx)
// and is called with a TransportRef of the communicator (or of a sub-group), on every rank at
// once, with the same arguments everywhere but the buffers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kolo/algorithm/cost_model.hpp"
#include "kolo/algorithm/options.hpp"
#include "kolo/core/dtype.hpp"
#include "kolo/core/signature.hpp"
#include "kolo/transport/transport_ref.hpp"

namespace kolo {

struct HostGroups;  // allreduce_hierarchical.hpp

// ---------------------------------------------------------------- identities

// The built-in algorithms of each collective; registered ones take the values after these.
enum class AllreduceAlgorithm : std::uint8_t {
  ring = 0,
  tree = 1,  // pipelined double binary tree
  halving_doubling = 2,
  recursive_doubling = 3,
  hierarchical = 4,
  direct = 5,  // one round: every rank sends to every other (small messages, a few ranks)
};
enum class BroadcastAlgorithm : std::uint8_t { chain = 0, binomial = 1 };
enum class AllgatherAlgorithm : std::uint8_t { ring = 0 };
enum class ReduceScatterAlgorithm : std::uint8_t { ring = 0 };
enum class AlltoallAlgorithm : std::uint8_t { pairwise = 0 };

inline constexpr AllreduceAlgorithm all_allreduce_algorithms[] = {
    AllreduceAlgorithm::ring,
    AllreduceAlgorithm::tree,
    AllreduceAlgorithm::halving_doubling,
    AllreduceAlgorithm::recursive_doubling,
    AllreduceAlgorithm::hierarchical,
    AllreduceAlgorithm::direct};
inline constexpr BroadcastAlgorithm all_broadcast_algorithms[] = {BroadcastAlgorithm::chain,
                                                                  BroadcastAlgorithm::binomial};

// ---------------------------------------------------------------- arguments per collective

// out = op over ranks of in (count elements; in may equal out).
struct AllreduceArgs {
  const void* in = nullptr;
  void* out = nullptr;
  std::size_t count = 0;
  DataType dtype = DataType::float32;
  ReduceOp op = ReduceOp::sum;
  std::size_t bytes() const { return count * dtype_size(dtype); }
};
// The root's `bytes` bytes at data reach every rank.
struct BroadcastArgs {
  void* data = nullptr;
  std::size_t nbytes = 0;
  int root = 0;
  std::size_t bytes() const { return nbytes; }
};
// out = every rank's in, back to back: counts[i] elements of elem_size bytes from rank i
// (allgatherv; allgather has equal counts). in may sit at its place in out. Selection size: the
// whole result.
struct AllgatherArgs {
  const void* in = nullptr;
  void* out = nullptr;
  std::span<const std::size_t> counts;
  std::size_t elem_size = 1;
  std::size_t bytes() const {
    std::size_t n = 0;
    for (std::size_t c : counts) n += c;
    return n * elem_size;
  }
};
// out (count elements) = block `rank` of the reduction of every rank's in (size x count
// elements). Selection size: the whole input.
struct ReduceScatterArgs {
  const void* in = nullptr;
  void* out = nullptr;
  std::size_t count = 0;  // per rank (the output)
  DataType dtype = DataType::float32;
  ReduceOp op = ReduceOp::sum;
  int size = 1;  // ranks (the input holds size x count elements)
  std::size_t bytes() const { return count * dtype_size(dtype) * static_cast<std::size_t>(size); }
};
// Block j (block_bytes) of in goes to rank j, block i of out comes from rank i; in and out are
// distinct. Selection size: the whole input.
struct AlltoallArgs {
  const void* in = nullptr;
  void* out = nullptr;
  std::size_t block_bytes = 0;
  int size = 1;
  std::size_t bytes() const { return block_bytes * static_cast<std::size_t>(size); }
};

// What an entry point may use besides its arguments; every field has a usable default, so an
// algorithm can also be called with AlgoContext{}.
struct AlgoContext {
  std::vector<std::byte>* scratch = nullptr;  // reusable temporary (grow it as needed)
  const HostGroups* groups = nullptr;         // this rank's host layout; nullptr: one host
  LinkCost link;                              // the link this call's steps wait on (0: unknown)
  std::size_t segment_cap = 256 * 1024;       // KOLO_SEGMENT_BYTES
  // Runs the Selector's allreduce for a sub-group (hierarchical's cross step); nullptr: the ring.
  void (*sub_allreduce)(const void* self, TransportRef group, const AllreduceArgs& a,
                        const AlgoOptions& opt) = nullptr;
  const void* self = nullptr;
};

// ---------------------------------------------------------------- per-collective traits

template <class Algo>
struct AlgorithmTraits;
template <>
struct AlgorithmTraits<AllreduceAlgorithm> {
  using Args = AllreduceArgs;
  static constexpr Collective collective = Collective::allreduce;
  static constexpr const char* name = "allreduce";
  static constexpr const char* env = "KOLO_ALLREDUCE";
};
template <>
struct AlgorithmTraits<BroadcastAlgorithm> {
  using Args = BroadcastArgs;
  static constexpr Collective collective = Collective::broadcast;
  static constexpr const char* name = "broadcast";
  static constexpr const char* env = "KOLO_BROADCAST";
};
template <>
struct AlgorithmTraits<AllgatherAlgorithm> {
  using Args = AllgatherArgs;
  static constexpr Collective collective = Collective::allgather;
  static constexpr const char* name = "allgather";
  static constexpr const char* env = "KOLO_ALLGATHER";
};
template <>
struct AlgorithmTraits<ReduceScatterAlgorithm> {
  using Args = ReduceScatterArgs;
  static constexpr Collective collective = Collective::reduce_scatter;
  static constexpr const char* name = "reduce_scatter";
  static constexpr const char* env = "KOLO_REDUCE_SCATTER";
};
template <>
struct AlgorithmTraits<AlltoallAlgorithm> {
  using Args = AlltoallArgs;
  static constexpr Collective collective = Collective::alltoall;
  static constexpr const char* name = "alltoall";
  static constexpr const char* env = "KOLO_ALLTOALL";
};

template <class Algo>
concept AlgorithmId = requires {
  typename AlgorithmTraits<Algo>::Args;
};

// ---------------------------------------------------------------- an entry

template <class Algo>
struct AlgorithmEntry {
  using Args = typename AlgorithmTraits<Algo>::Args;
  using Run = void (*)(TransportRef t, const Args& a, const AlgoOptions& opt,
                       const AlgoContext& ctx);

  std::string name;                  // lower case, [a-z0-9-]; what KOLO_<COLLECTIVE> names
  std::vector<std::string> aliases;  // other accepted names
  // Whether it can run on this communicator at all (nullptr: everywhere). A forced algorithm
  // that cannot run falls back to the model's choice (last_*_algorithm() says which ran).
  bool (*applies)(const SelectionShape& shape) = nullptr;
  // Modelled seconds (+infinity: never the model's choice here; still runs when forced).
  // nullptr: only ever run when forced.
  double (*cost)(const CostQuery& q) = nullptr;
  Run run = nullptr;
  // Allreduce only: runs on any group of ranks by point-to-point alone, so hierarchical may use
  // it for its cross-host step.
  bool flat = true;
};

}  // namespace kolo
