// kolo/kolo.hpp — everything a host program needs: core types, the environment contract,
// rendezvous, the shared-memory/TCP/routed transports and Communicator.
//
// Needs a C++20 compiler, POSIX and libcrypto (HMAC for authenticated TCP; link kolo::kolo).
// GPU (NCCL) and MPI support live in their own headers so that nothing here pulls them in.
#pragma once

#include "kolo/communicator.hpp"
#include "kolo/core/dtype.hpp"
#include "kolo/core/error.hpp"
#include "kolo/core/float16.hpp"
#include "kolo/core/reduce.hpp"
#include "kolo/core/tensor.hpp"
#include "kolo/topology/bootstrap.hpp"
#include "kolo/topology/topology.hpp"
#include "kolo/transport/routed.hpp"
#include "kolo/transport/shm.hpp"
#include "kolo/transport/tcp.hpp"

namespace kolo {

inline constexpr const char* version = "0.1.0";

}  // namespace kolo
