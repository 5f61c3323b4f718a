// kolo::kolo_lib: Engine<MeshTransport> (= Engine<>, DefaultTransport), compiled once (see
// include/kolo/core/compiled_core.hpp). The communicator it drives is compiled in
// communicator_default.cpp (this file sees it extern).
#include "kolo/engine/engine.hpp"
#include "kolo/engine/engine_impl.hpp"  // the definitions: this file compiles them
#include "kolo/kolo.hpp"

namespace kolo {
template class Engine<MeshTransport>;
}  // namespace kolo
