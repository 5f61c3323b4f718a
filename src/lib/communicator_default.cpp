// kolo::kolo_lib: Communicator<MeshTransport> (= Communicator<>, DefaultTransport), compiled once
// (see include/kolo/core/compiled_core.hpp). A file of its own: a program that only uses
// Communicator<> links this object and not the typed communicators' (communicator_typed.cpp).
#include "kolo/kolo.hpp"

namespace kolo {
template class Communicator<MeshTransport>;
}  // namespace kolo
