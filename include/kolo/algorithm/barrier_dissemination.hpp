// kolo/algorithm/barrier_dissemination.hpp — dissemination barrier (Hensgen, Finkel & Manber
// 1988): in round k each rank signals rank r+2^k and waits for rank r-2^k; after ceil(log2 n)
// rounds every rank has heard, directly or transitively, from every other. Zero-byte messages.
#pragma once

#include "kolo/algorithm/options.hpp"
#include "kolo/transport/transport_ref.hpp"

namespace kolo {

inline void barrier_dissemination(TransportRef t, const AlgoOptions& opt) {
  const int n = t.size();
  const int r = t.rank();
  for (int k = 1; k < n; k <<= 1) {
    auto rq = t.irecv(mod(r - k, n), nullptr, 0, opt.sig);
    auto sq = t.isend(mod(r + k, n), nullptr, 0, opt.sig);
    t.wait(sq, opt.deadline);
    t.wait(rq, opt.deadline);
  }
}

}  // namespace kolo
