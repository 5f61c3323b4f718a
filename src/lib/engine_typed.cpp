// kolo::kolo_lib: Engine<RoutedTransport>, <ShmTransport> and <TcpTransport>, compiled once (see
// include/kolo/core/compiled_core.hpp); their communicators are in communicator_typed.cpp.
#include "kolo/engine/engine.hpp"
#include "kolo/engine/engine_impl.hpp"  // the definitions: this file compiles them
#include "kolo/kolo.hpp"

namespace kolo {
template class Engine<RoutedTransport>;
template class Engine<ShmTransport>;
template class Engine<TcpTransport>;
}  // namespace kolo
