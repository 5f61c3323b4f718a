// kolo/transport/route.hpp — how one rank reaches another, and the route policy a job asks for.
//
// A transport that knows its routes answers `route_between(a, b)` (transport.hpp, HasPeerRoutes);
// the Selector costs every algorithm with the constants of the routes it uses (shared memory
// inside a host, TCP between hosts). The policy names the three mesh transports: ShmTransport
// (shm_only), TcpTransport (tcp_only) and RoutedTransport (routed: shm to ranks of this host,
// TCP to the others).
#pragma once

#include <cstdint>
#include <string>

#include "kolo/core/config_var.hpp"
#include "kolo/core/env.hpp"
#include "kolo/transport/transport_config.hpp"

namespace kolo {

enum class Route : std::uint8_t { self, shm, tcp };
// RouteMode (shm_only, tcp_only, routed): transport_config.hpp, with KOLO_TRANSPORT's values.

inline const char* route_name(Route r) {
  return r == Route::shm ? "shm" : r == Route::tcp ? "tcp" : "self";
}

// The route policy named by KOLO_TRANSPORT (shm, tcp, routed or auto; default routed), for
// programs that choose at run time: `MeshTransport t(boot, route_mode_from_env());`.
inline RouteMode route_mode_from_env(const EnvLookup& env = process_env()) {
  return config::get_choice<RouteMode>(env, config::vars::transport).value_or(RouteMode::routed);
}

}  // namespace kolo
