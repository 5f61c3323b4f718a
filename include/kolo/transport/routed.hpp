// kolo/transport/routed.hpp — RoutedTransport: shared memory to ranks on this host, TCP to the
// others, served by one progress loop (see mesh.hpp for why it is one engine, not two).
//
// The default transport: right on one host (all shared memory), right across hosts.
#pragma once

#include "kolo/core/config.hpp"
#include "kolo/transport/mesh.hpp"

namespace kolo {

class RoutedTransport : public MeshTransport {
 public:
  static constexpr const char* name = "routed";
  explicit RoutedTransport(Bootstrap& boot, MeshOptions opts = MeshOptions::from_env())
      : MeshTransport(boot, RouteMode::routed, opts) {}
};

static_assert(Transport<RoutedTransport>);

// The route policy named by KOLO_TRANSPORT (shm, tcp, routed; default routed), for programs
// that choose at run time: `MeshTransport t(boot, route_mode_from_env());`.
inline RouteMode route_mode_from_env(const EnvLookup& env = process_env()) {
  const auto v = config::get_text(env, config::vars::transport);
  if (!v || *v == "routed" || *v == "auto") return RouteMode::routed;
  if (*v == "shm") return RouteMode::shm_only;
  if (*v == "tcp") return RouteMode::tcp_only;
  throw ConfigError("KOLO_TRANSPORT=" + *v + " is not one of shm, tcp, routed");
}

}  // namespace kolo
