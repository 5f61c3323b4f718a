// kolo::kolo_lib: Engine<MeshTransport> (= Engine<>, DefaultTransport) and
// Engine<RoutedTransport>, compiled once (see include/kolo/core/compiled_core.hpp). The
// communicators they drive are compiled in communicator.cpp (this file sees them extern).
#include "kolo/engine/engine.hpp"
#include "kolo/kolo.hpp"

namespace kolo {
template class Engine<MeshTransport>;
template class Engine<RoutedTransport>;
}  // namespace kolo
