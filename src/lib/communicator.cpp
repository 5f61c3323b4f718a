// kolo::kolo_lib: Communicator<T> for the standard transports, compiled once (see
// include/kolo/core/compiled_core.hpp). One file for the four: they share the algorithms, the
// Selector and the mesh transport, which are then compiled once too.
#include "kolo/kolo.hpp"

namespace kolo {
template class Communicator<MeshTransport>;  // = DefaultTransport
template class Communicator<RoutedTransport>;
template class Communicator<ShmTransport>;
template class Communicator<TcpTransport>;
}  // namespace kolo
