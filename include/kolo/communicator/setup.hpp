// kolo/communicator/setup.hpp — building a Communicator: its constructors, the rendezvous and
// connect() (from the environment's transport options or the caller's T::Options), and the
// selection setup (routes, host groups, the tuning probe, the Selector and its overrides).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "kolo/communicator.hpp"

namespace kolo {

template <class T>
Communicator<T>::Communicator(Communicator&&) noexcept = default;
template <class T>
Communicator<T>& Communicator<T>::operator=(Communicator&&) noexcept = default;
template <class T>
Communicator<T>::~Communicator() = default;

template <class T>
Communicator<T>::Communicator(Topology topo) requires Connectable<T>
    : Communicator(std::move(topo), CommunicatorOptions::from_env()) {}

template <class T>
Communicator<T>::Communicator(Topology topo, std::shared_ptr<KvStore> store,
                              std::string prefix) requires Connectable<T>
    : Communicator(std::move(topo), std::move(store), std::move(prefix),
                   CommunicatorOptions::from_env()) {}

template <class T>
Communicator<T>::Communicator(std::unique_ptr<T> transport)
    : Communicator(std::move(transport), CommunicatorOptions::from_env()) {}

// The transport's variables are read before the rendezvous, like the Topology's: a bad value
// then fails every rank alike. Read after it, rank 0 (which may host the store) would throw and
// take the store down while the others are still using it, and they would report "store lost"
// instead of the bad variable.
template <class T>
Communicator<T>::Communicator(Topology topo, CommunicatorOptions opts) requires Connectable<T>
    : opts_(opts) {
  connect(std::move(topo), nullptr, {}, T::Options::from_env(process_env()));
}

template <class T>
Communicator<T>::Communicator(Topology topo, std::shared_ptr<KvStore> store, std::string prefix,
                              CommunicatorOptions opts) requires Connectable<T> : opts_(opts) {
  connect(std::move(topo), std::move(store), std::move(prefix),
          T::Options::from_env(process_env()));
}

template <class T>
Communicator<T>::Communicator(Topology topo, std::shared_ptr<KvStore> store, std::string prefix,
                              TransportOptions<T> transport_opts,
                              CommunicatorOptions opts) requires Connectable<T> : opts_(opts) {
  connect(std::move(topo), std::move(store), std::move(prefix), transport_opts);
}

template <class T>
Communicator<T>::Communicator(Topology topo, std::shared_ptr<KvStore> store, std::string prefix,
                              TransportOptions<T> transport_opts) requires Connectable<T>
    : Communicator(std::move(topo), std::move(store), std::move(prefix), std::move(transport_opts),
                   CommunicatorOptions::from_env()) {}

template <class T>
Communicator<T>::Communicator(std::unique_ptr<T> transport, CommunicatorOptions opts)
    : transport_(std::move(transport)), opts_(opts) {
  if constexpr (HasTopology<T>) {
    topo_ = transport_->topology();
  } else {
    topo_.rank = transport_->rank();
    topo_.size = transport_->size();
  }
  setup_selector();
}

template <class T>
void Communicator<T>::connect(Topology topo, std::shared_ptr<KvStore> store, std::string prefix,
                              const TransportOptions<T>& topts) requires Connectable<T> {
  boot_ = store || !prefix.empty()
              ? std::make_unique<Bootstrap>(std::move(topo), std::move(store), std::move(prefix))
              : std::make_unique<Bootstrap>(std::move(topo));
  topts_ = topts;  // kept for a shrink's communicator (fault.hpp): the same transport choice
  transport_ = T::connect(*boot_, topts);
  if (!transport_) throw Error("Communicator: the transport's connect() returned nothing");
  topo_ = boot_->topology();
  setup_selector();
}

template <class T>
void Communicator<T>::setup_selector() {
  const int n = size();
  const int r = rank();
  SelectionShape shape;
  shape.size = n;
  ProbePartners partners;
  std::optional<TuningSource> source = opts_.tuning;
  // Routes are known when the transport reports them and the host keys were gathered (a
  // communicator built through its Bootstrap): ask "how does rank 0 reach q" for every q.
  // Otherwise one generic route, kept in the tcp slot, and built-in constants by default.
  bool routes = false;
  Route intra = Route::shm, inter = Route::tcp;
  if constexpr (HasPeerRoutes<T>) {
    if (boot_ != nullptr) {
      routes = true;
      const auto& keys = boot_->host_keys();
      groups_ = HostGroups::from_host_keys(keys, r);
      bool seen_intra = false, seen_inter = false;
      // Routes as rank 0 sees them (the probe is rank 0's), derived the same way on every rank.
      for (int q = 1; q < n; ++q) {
        const Route route = transport_->route_between(0, q);
        const bool same_host = keys[static_cast<std::size_t>(q)] == keys[0];
        if (same_host && !seen_intra) {
          intra = route;
          seen_intra = true;
        }
        if (!same_host && !seen_inter) {
          inter = route;
          seen_inter = true;
        }
        int& partner = route == Route::shm ? partners.shm : partners.tcp;
        if (partner < 0) partner = q;
      }
      if (!seen_inter) inter = intra;        // one host: the flat link is the host's own
      if (!source) source = TuningSource{};  // probe
    }
  }
  if (!routes) {
    groups_ = HostGroups::single_host(n, r);
    partners.tcp = n > 1 ? 1 : -1;
    intra = inter = Route::tcp;
  }
  Tuning tuning;
  if (opts_.inherited_tuning) {
    tuning = *opts_.inherited_tuning;  // the parent's links, measured already (shrink)
  } else if (source) {
    try {
      tuning = negotiate_tuning(*transport_, *source, partners,
                                Deadline::after(transport_->timeout_seconds()));
    } catch (const Error& e) {
      transport_->abort(e);
      throw;
    }
  }
  shape.hosts = groups_.hosts;
  // Inputs of the model must be the same on every rank: with uneven hosts this rank's own
  // host size is not, the largest one is.
  shape.local_size = groups_.max_local_size;
  shape.uniform = groups_.uniform;
  shape.hierarchical_ok =
      groups_.known && groups_.uniform && groups_.hosts > 1 && groups_.local_size() > 1;
  auto link = [&](Route route) { return route == Route::shm ? tuning.shm : tuning.tcp; };
  shape.intra = link(intra);
  shape.inter = link(inter);
  shape.flat = groups_.hosts > 1 ? shape.inter : shape.intra;
  selector_ = Selector(tuning, shape, opts_.segment_bytes);
  // The ring allreduce's interleaved allgather (AlgoOptions::ring_overlap_lag) pays where the
  // kernel copies each sent segment out of the sender's memory and every rank has a core: over
  // TCP loopback at N = 2 it took 0.7 x the time in the median (bimodal across fresh runs, level
  // with ranks pinned one per core); through shared memory, or with more ranks than cores, it
  // was slower. Decided from the routes as rank 0 sees them and the negotiated
  // tuning, so every rank decides the same.
  ring_overlap_lag_ =
      routes && intra == Route::tcp && inter == Route::tcp && selector_.oversubscription() <= 1.0
          ? kRingOverlapLag
          : 0;
  opts_.for_each_rules([&](const auto& rules) { selector_.set_rules(rules); });
  selector_.set_allreduce_rules(opts_.effective_allreduce_rules());  // the deprecated threshold
}

}  // namespace kolo
