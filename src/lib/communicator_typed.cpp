// kolo::kolo_lib: Communicator<RoutedTransport>, <ShmTransport> and <TcpTransport>, compiled
// once (see include/kolo/core/compiled_core.hpp). One file for the three: they share the
// algorithms, the Selector and the mesh transport, which are then compiled once here.
#include "kolo/kolo.hpp"

namespace kolo {
template class Communicator<RoutedTransport>;
template class Communicator<ShmTransport>;
template class Communicator<TcpTransport>;
}  // namespace kolo
