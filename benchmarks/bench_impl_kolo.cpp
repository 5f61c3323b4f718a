// bench_impl_kolo.cpp — `--impl kolo` over MeshTransport (shm, tcp, routed) under kolo-run;
// `--transport` sets KOLO_TRANSPORT before the communicator reads it.
#include <kolo/kolo.hpp>

#include "bench_impl_kolo.hpp"

namespace kolo::bench {

std::unique_ptr<Impl> make_kolo_impl(const KoloConfig& cfg) {
  const char* route = "MeshTransport, route routed";
  switch (route_mode_from_env()) {
    case RouteMode::shm_only:
      route = "MeshTransport, route shm (KOLO_TRANSPORT)";
      break;
    case RouteMode::tcp_only:
      route = "MeshTransport, route tcp (KOLO_TRANSPORT)";
      break;
    case RouteMode::routed:
      route = "MeshTransport, route routed: shm on a host, tcp across (KOLO_TRANSPORT)";
      break;
  }
  const MeshOptions mo = MeshOptions::from_env();
  std::string desc =
      std::string(route) + "; shm " + std::to_string(mo.shm_slots) + " slots x " +
      std::to_string(mo.shm_slot_bytes) + " B per channel, spin " +
      (mo.spin_us < 0 ? std::string("adaptive") : std::to_string(mo.spin_us) + " us");
  return std::make_unique<KoloImpl<MeshTransport>>(Communicator<>::from_env(), cfg,
                                                   std::move(desc));
}

}  // namespace kolo::bench
