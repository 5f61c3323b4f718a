// kolo/transport/routed.hpp — RoutedTransport: shared memory to ranks on this host, TCP to the
// others, served by one progress loop (see mesh.hpp for why it is one engine, not two).
//
// The default transport: right on one host (all shared memory), right across hosts.
#pragma once

#include "kolo/transport/mesh.hpp"
#include "kolo/transport/transport_config.hpp"

namespace kolo {

class RoutedTransport : public MeshTransport {
 public:
  static constexpr const char* name = "routed";
  explicit RoutedTransport(Bootstrap& boot, MeshOptions opts = MeshOptions::from_env())
      : MeshTransport(boot, RouteMode::routed, opts) {}

  // The factory (transport.hpp, Connectable): the route policy is the type's, so KOLO_TRANSPORT
  // is not read; the mesh's own variables are.
  struct Options {
    MeshOptions mesh;
    static Options from_env(const EnvLookup& env) { return {MeshOptions::from_env(env)}; }
  };
  static std::unique_ptr<RoutedTransport> connect(Bootstrap& boot, const Options& o) {
    return std::make_unique<RoutedTransport>(boot, o.mesh);
  }
};

static_assert(check_transport<RoutedTransport>());

}  // namespace kolo
