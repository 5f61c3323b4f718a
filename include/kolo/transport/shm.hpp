// kolo/transport/shm.hpp — ShmTransport: every peer through shared memory (one host).
//
// The engine is MeshTransport (mesh.hpp); this type fixes the route policy so that code which
// must not touch the network says so in its type. A rank on another host is a ConfigError.
#pragma once

#include "kolo/transport/mesh.hpp"

namespace kolo {

class ShmTransport : public MeshTransport {
 public:
  static constexpr const char* name = "shm";
  explicit ShmTransport(Bootstrap& boot, MeshOptions opts = MeshOptions::from_env())
      : MeshTransport(boot, RouteMode::shm_only, opts) {}

  // The factory (transport.hpp, Connectable): the route policy is the type's, so KOLO_TRANSPORT
  // is not read; the mesh's own variables are.
  struct Options {
    MeshOptions mesh;
    static Options from_env(const EnvLookup& env) { return {MeshOptions::from_env(env)}; }
  };
  static std::unique_ptr<ShmTransport> connect(Bootstrap& boot, const Options& o) {
    return std::make_unique<ShmTransport>(boot, o.mesh);
  }
};

static_assert(check_transport<ShmTransport>());

}  // namespace kolo
