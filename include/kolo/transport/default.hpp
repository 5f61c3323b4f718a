// kolo/transport/default.hpp — the transport Communicator<> and Engine<> use when none is named:
// MeshTransport, whose route policy KOLO_TRANSPORT picks at run time (shm, tcp, routed).
#pragma once

#include "kolo/transport/mesh.hpp"

namespace kolo {

using DefaultTransport = MeshTransport;

}  // namespace kolo
