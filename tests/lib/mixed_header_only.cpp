// Half of lib/mixed: this file defines KOLO_HEADER_ONLY in a program that links kolo::kolo_lib,
// so it compiles kolo itself (inline), while mixed_main.cpp uses the library's definitions. The
// rendezvous, the environment reading and the transport set-up then exist twice in the program,
// inline here and in the library: the linker must keep one, and both halves must work.
#define KOLO_HEADER_ONLY 1
#include <cstdint>
#include <span>
#include <vector>

#include "kolo/kolo.hpp"

#if KOLO_USE_COMPILED_CORE
#error "KOLO_HEADER_ONLY must override KOLO_COMPILED_CORE"
#endif

// An allreduce over a TcpTransport communicator of its own, instantiated here; the number of
// wrong values.
int header_only_half() {
  kolo::Communicator<kolo::TcpTransport> comm(kolo::Topology::from_env());
  const int n = comm.size();
  const int r = comm.rank();
  std::vector<std::int64_t> v(301, r + 1);
  comm.allreduce(std::span<std::int64_t>(v), kolo::ReduceOp::sum);
  int bad = 0;
  for (std::int64_t x : v) bad += x != n * (n + 1) / 2;
  return bad;
}
