// kolo/transport/tcp.hpp — TcpTransport: every peer through an authenticated TCP connection.
//
// For ranks on different hosts, and to measure TCP on one host. Every connection proves
// KOLO_SECRET (HMAC-SHA256 challenge-response, net/auth.hpp) before any byte of data.
#pragma once

#include "kolo/transport/mesh.hpp"

namespace kolo {

class TcpTransport : public MeshTransport {
 public:
  static constexpr const char* name = "tcp";
  explicit TcpTransport(Bootstrap& boot, MeshOptions opts = MeshOptions::from_env())
      : MeshTransport(boot, RouteMode::tcp_only, opts) {}

  // The factory (transport.hpp, Connectable): the route policy is the type's, so KOLO_TRANSPORT
  // is not read; the mesh's own variables are.
  struct Options {
    MeshOptions mesh;
    static Options from_env(const EnvLookup& env) { return {MeshOptions::from_env(env)}; }
  };
  static std::unique_ptr<TcpTransport> connect(Bootstrap& boot, const Options& o) {
    return std::make_unique<TcpTransport>(boot, o.mesh);
  }
};

static_assert(check_transport<TcpTransport>());

}  // namespace kolo
