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
};

static_assert(Transport<TcpTransport>);

}  // namespace kolo
