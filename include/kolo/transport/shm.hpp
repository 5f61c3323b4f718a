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
};

static_assert(Transport<ShmTransport>);

}  // namespace kolo
