// kolo::kolo_lib: Engine<ShmTransport> and Engine<TcpTransport>, compiled once (see
// include/kolo/core/compiled_core.hpp); a file of their own so the library builds in parallel.
#include "kolo/engine/engine.hpp"
#include "kolo/kolo.hpp"

namespace kolo {
template class Engine<ShmTransport>;
template class Engine<TcpTransport>;
}  // namespace kolo
