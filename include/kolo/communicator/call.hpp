// kolo/communicator/call.hpp — Communicator::call<D>(): runs a collective given by its definition
// (communicator/collective.hpp) through run(), with its checks, its rooted agreement, its native
// hook and its algorithm (the Selector's choice from its registry, or D::run).
#pragma once

#include "kolo/communicator.hpp"

namespace kolo {

template <class T>
template <CollectiveDefinition D>
void Communicator<T>::call(const typename D::Args& a) {
  const CallFacts f = facts();
  const CallShape s = D::shape(a, f);
  run(D::collective, s.dtype, s.op, s.count, s.root, s.extra, [&](const AlgoOptions& opt) {
    D::check(a, f);
    if constexpr (requires { D::rooted; }) {
      if (D::rooted) agree(opt);
    }
    if constexpr (requires(T & t, const typename D::Args& x, const AlgoOptions& o) {
                    { D::native(t, x, o) } -> std::convertible_to<bool>;
                  }) {
      if (D::native(*transport_, a, opt)) return;
    }
    if constexpr (requires { typename D::Algorithm; }) {
      select_run<typename D::Algorithm>(D::algorithm_args(a, f), opt);
    } else {
      D::run(TransportRef(*transport_), a, opt, context());
    }
  });
}

}  // namespace kolo
