// kolo/algorithm/cost_model.hpp — what an algorithm's cost function sees: the α-β-γ model's
// constants for one call (Hockney; Thakur, Rabenseifner & Gropp 2005).
//
// Sending m bytes over a link costs α + m·β, reducing m bytes costs m·γ. Every registered
// algorithm (algorithm/registry.hpp) has a cost function of a CostQuery returning modelled
// seconds; the Selector (selector.hpp) takes the cheapest. The formulas live next to their
// algorithms; docs/algorithms.md has them all in one table.
#pragma once

#include <algorithm>
#include <cstddef>

namespace kolo {

// One route's Hockney parameters: a message of m bytes takes alpha + m·beta seconds.
struct LinkCost {
  double alpha = 0;  // seconds
  double beta = 0;   // seconds per byte
};

// What the model needs to know about the communicator.
struct SelectionShape {
  int size = 1;
  int hosts = 1;                 // hosts in the job (1 when unknown)
  int local_size = 1;            // ranks per host (the largest host's count when uneven)
  bool hierarchical_ok = false;  // several hosts with several ranks each, equal counts, known
  bool uniform = true;           // every host has the same number of ranks (or one host)
  LinkCost flat;   // the link every step of a flat algorithm waits on (the slowest route in use)
  LinkCost intra;  // between ranks of one host
  LinkCost inter;  // between hosts
};

// A pairwise exchange (recursive doubling, halving-doubling) moves data only while its one
// partner of the round runs too; ring and tree ranks stream to and from neighbours through the
// channels' slots, which absorb the gaps when ranks outnumber cores. Measured on the 2-core CI
// machine with 4 and 8 ranks (docs/algorithms.md): the exchange algorithms' bytes took a median
// 1.3x as long as the ring's and the tree's at 1-64 MiB. Their β and γ terms are charged this
// factor whenever a host has more ranks than cores.
inline constexpr double kExchangeOversubscribed = 1.3;

// The inputs of one cost evaluation. `link` and `gamma` are effective constants: on a host with
// more ranks than cores the Selector has already multiplied the host-local β and γ by the ranks
// per core (the probe timed two ranks alone; a collective runs them all at once).
struct CostQuery {
  int n = 1;         // ranks taking part
  double bytes = 0;  // S: the collective's byte count (each Args type says which)
  LinkCost link;     // the link every step waits on
  double gamma = 0;  // seconds per reduced byte
  std::size_t segment_bytes = 256 * 1024;  // pipelining unit (KOLO_SEGMENT_BYTES)
  // Ranks of one host that share the inter-host link when every rank talks across hosts at once
  // (1: one host, or a step that never crosses hosts from several ranks at a time).
  int contention = 1;
  double oversubscription = 1;            // ranks per core on the busiest host (>= 1)
  const SelectionShape* shape = nullptr;  // the whole communicator (hierarchical's cost)
  // The cheapest flat allreduce of `bytes` over `n` ranks on link `l` (hierarchical's cross step);
  // set by the Selector.
  double (*best_flat_allreduce)(const void* self, int n, double bytes, LinkCost l) = nullptr;
  const void* self = nullptr;

  // The link with the inter-host sharing applied (every algorithm but the ring has all ranks of
  // a host talking across hosts in some round).
  LinkCost contended() const {
    LinkCost l = link;
    l.beta *= std::max(1, contention);
    return l;
  }
  // The factor a pairwise-exchange algorithm's byte terms take (kExchangeOversubscribed).
  double exchange_factor() const { return oversubscription > 1.0 ? kExchangeOversubscribed : 1.0; }
  // The contended link with β taken by exchange_factor(): what an algorithm whose byte terms
  // take that factor is charged (its γ is charged gamma * exchange_factor()).
  LinkCost exchange_link() const {
    LinkCost l = contended();
    l.beta *= exchange_factor();
    return l;
  }
};

namespace cost {

inline int floor_pow2(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}
inline int log2_floor(int n) {
  int k = 0;
  while ((2 << k) <= n) ++k;
  return k;
}
inline int log2_ceil(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

// Extra cost of folding n - p ranks into a power of two p and back (MPICH's pairing):
//   (α + S·β + S·γ) before, (α + S·β) after.
inline double non_pow2_fold(int n, double S, LinkCost l, double gamma) {
  return n == floor_pow2(n) ? 0.0 : 2.0 * l.alpha + 2.0 * S * l.beta + S * gamma;
}

}  // namespace cost

}  // namespace kolo
