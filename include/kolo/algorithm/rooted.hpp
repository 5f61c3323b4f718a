// kolo/algorithm/rooted.hpp — collectives with a root (reduce, gather, scatter) and the
// variable-size alltoall (alltoallv).
//
// reduce_binomial: ranks are numbered relative to the root (v = rank - root mod n); rank v folds
//   in the partial results of its children v + 2^k (for every 2^k below v's lowest set bit,
//   smallest subtree first: it is ready first), then sends its partial result to its parent.
//   ceil(log2 n)·(α + S·β + S·γ) — the small-message choice (Thakur, Rabenseifner & Gropp 2005).
//   For large messages the Communicator runs its selected allreduce instead (the ring's
//   2(n-1)·α + 2(n-1)/n·S·β + (n-1)/n·S·γ; non-roots discard the result), which beats the tree's
//   log2(n)·S·β once S·β dominates α.
// gather_direct / scatter_direct: the root exchanges one block with every other rank, all posted
//   at once ((n-1)·α + (n-1)/n·S·β at the root, which is the bound for a rooted operation).
// alltoallv_pairwise: block j of this rank's input goes to rank j, all exchanges posted at once
//   (as alltoall_pairwise). Every message carries its own byte count in the signature, so a
//   rank that sends a block of another size than its peer expects gets a MismatchError.
#pragma once

#include <cstring>
#include <span>
#include <vector>

#include "kolo/algorithm/options.hpp"
#include "kolo/core/reduce.hpp"
#include "kolo/core/tensor.hpp"
#include "kolo/transport/transport_ref.hpp"

namespace kolo {

// out (significant on the root only) = the reduction of every rank's `in`. `scratch` holds a
// non-root rank's partial result; the root accumulates in `out` (in may equal out).
inline void reduce_binomial(TransportRef t, const void* in, void* out, std::size_t count,
                            DataType dtype, ReduceOp op, int root, std::vector<std::byte>& scratch,
                            const AlgoOptions& opt) {
  const int n = t.size();
  const int r = t.rank();
  const std::size_t es = dtype_size(dtype);
  const std::size_t bytes = count * es;
  const int v = mod(r - root, n);
  std::byte* acc;
  if (r == root) {
    acc = static_cast<std::byte*>(out);
  } else {
    if (scratch.size() < bytes) scratch.resize(bytes);
    acc = scratch.data();
  }
  if (bytes > 0 && acc != in) std::memcpy(acc, in, bytes);
  if (n == 1) return;
  const ReduceSpec rs{reduce_function(dtype, op), es};
  int span = 1;
  while (span < n && (v & span) == 0) span <<= 1;
  for (int m = 1; m < span; m <<= 1) {  // children, smallest subtree first
    if (v + m >= n) break;
    auto q = t.irecv_reduce(mod(v + m + root, n), acc, acc, bytes, rs, opt.sig);
    t.wait(q, opt.deadline);
  }
  if (v == 0) {
    if (op == ReduceOp::average && count > 0) finish_average(acc, count, dtype, n);
    return;
  }
  auto q = t.isend(mod(v - span + root, n), acc, bytes, opt.sig);
  t.wait(q, opt.deadline);
}

// Root receives block p (block_bytes each) of out from rank p; everyone sends `in`.
inline void gather_direct(TransportRef t, const void* in, void* out, std::size_t block_bytes,
                          int root, const AlgoOptions& opt) {
  const int n = t.size();
  const int r = t.rank();
  if (r != root) {
    auto q = t.isend(root, in, block_bytes, opt.sig);
    t.wait(q, opt.deadline);
    return;
  }
  auto* dst = static_cast<std::byte*>(out);
  const auto blk = [&](int p) { return static_cast<std::size_t>(p) * block_bytes; };
  if (block_bytes > 0 && dst + blk(r) != in) std::memmove(dst + blk(r), in, block_bytes);
  std::vector<TransportRef::Request> reqs;
  reqs.reserve(static_cast<std::size_t>(n));
  for (int s = 1; s < n; ++s) {
    const int p = mod(r + s, n);
    reqs.push_back(t.irecv(p, dst + blk(p), block_bytes, opt.sig));
  }
  for (auto& q : reqs) t.wait(q, opt.deadline);
}

// Root sends block p of in to rank p; everyone receives its block into out.
inline void scatter_direct(TransportRef t, const void* in, void* out, std::size_t block_bytes,
                           int root, const AlgoOptions& opt) {
  const int n = t.size();
  const int r = t.rank();
  if (r != root) {
    auto q = t.irecv(root, out, block_bytes, opt.sig);
    t.wait(q, opt.deadline);
    return;
  }
  const auto* src = static_cast<const std::byte*>(in);
  const auto blk = [&](int p) { return static_cast<std::size_t>(p) * block_bytes; };
  std::vector<TransportRef::Request> reqs;
  reqs.reserve(static_cast<std::size_t>(n));
  for (int s = 1; s < n; ++s) {
    const int p = mod(r + s, n);
    reqs.push_back(t.isend(p, src + blk(p), block_bytes, opt.sig));
  }
  if (block_bytes > 0 && src + blk(r) != out) std::memmove(out, src + blk(r), block_bytes);
  for (auto& q : reqs) t.wait(q, opt.deadline);
}

// Block j of in (send_counts[j] elements, back to back) goes to rank j; block i of out
// (recv_counts[i] elements) comes from rank i. in and out must not overlap.
inline void alltoallv_pairwise(TransportRef t, const void* in,
                               std::span<const std::size_t> send_counts, void* out,
                               std::span<const std::size_t> recv_counts, std::size_t elem_size,
                               const AlgoOptions& opt) {
  const int n = t.size();
  const int r = t.rank();
  const auto* src = static_cast<const std::byte*>(in);
  auto* dst = static_cast<std::byte*>(out);
  std::vector<std::size_t> soff(static_cast<std::size_t>(n) + 1, 0);
  std::vector<std::size_t> roff(static_cast<std::size_t>(n) + 1, 0);
  for (std::size_t i = 0; i < static_cast<std::size_t>(n); ++i) {
    soff[i + 1] = soff[i] + send_counts[i] * elem_size;
    roff[i + 1] = roff[i] + recv_counts[i] * elem_size;
  }
  const auto ur = static_cast<std::size_t>(r);
  if (send_counts[ur] > 0) std::memcpy(dst + roff[ur], src + soff[ur], send_counts[ur] * elem_size);
  std::vector<TransportRef::Request> reqs;
  reqs.reserve(static_cast<std::size_t>(2 * n));
  // The signature of each message names its own size: the sender's count for the block and the
  // receiver's expectation must agree, or both sides see a MismatchError naming the two.
  for (int s = 1; s < n; ++s) {
    const auto from = static_cast<std::size_t>(mod(r - s, n));
    Signature sig = opt.sig;
    sig.count = recv_counts[from];
    reqs.push_back(
        t.irecv(static_cast<int>(from), dst + roff[from], roff[from + 1] - roff[from], sig));
  }
  for (int s = 1; s < n; ++s) {
    const auto to = static_cast<std::size_t>(mod(r + s, n));
    Signature sig = opt.sig;
    sig.count = send_counts[to];
    reqs.push_back(t.isend(static_cast<int>(to), src + soff[to], soff[to + 1] - soff[to], sig));
  }
  for (auto& q : reqs) t.wait(q, opt.deadline);
}

}  // namespace kolo
