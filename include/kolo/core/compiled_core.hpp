// kolo/core/compiled_core.hpp — header-only or compiled core: which one this translation unit
// uses.
//
// kolo is header-only by default: every template (Communicator<T>, Engine<T>) is instantiated in
// the files that use it. The compiled core, the CMake target kolo::kolo_lib (libkolo.a) or
// kolo::kolo_lib_shared (libkolo.so), holds these instantiations for the standard transports
// (MeshTransport = DefaultTransport, RoutedTransport, ShmTransport, TcpTransport) and exports
// the compile definition KOLO_COMPILED_CORE to the targets that link it. With it defined,
// communicator.hpp and engine/engine.hpp declare those instantiations `extern template`, so a
// user's file compiles none of the collectives, algorithms or the transport: it calls them in
// the library. Other transports (InprocTransport, MpiTransport, NcclTransport, a user's own)
// are instantiated in the user's files as before.
//
// KOLO_HEADER_ONLY forces header-only use even where KOLO_COMPILED_CORE is defined (a file that
// wants its own inlined instantiation). docs/performance.md ("Compile time") has the figures.
#pragma once

#if defined(KOLO_COMPILED_CORE) && !defined(KOLO_HEADER_ONLY)
#define KOLO_USE_COMPILED_CORE 1
#else
#define KOLO_USE_COMPILED_CORE 0
#endif
