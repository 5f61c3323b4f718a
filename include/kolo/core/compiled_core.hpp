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
// are instantiated in the user's files as before; for their Engine<T>, a file includes
// kolo/engine/engine_impl.hpp too (engine.hpp does not parse the engine's machinery here).
//
// Non-template code that is heavy to compile and cold at run time (the x86 vector kernels that
// need <immintrin.h>, ...) lives in `detail/` headers. Header-only, the public headers include
// them and their functions are `inline` (KOLO_IMPL_INLINE); with the compiled core, a user's file
// sees only the declarations and src/lib/core_impl.cpp compiles the definitions once.
//
// KOLO_HEADER_ONLY forces header-only use even where KOLO_COMPILED_CORE is defined (a file that
// wants its own inlined instantiation). docs/performance.md ("Compile time") has the figures.
#pragma once

#if defined(KOLO_COMPILED_CORE) && !defined(KOLO_HEADER_ONLY)
#define KOLO_USE_COMPILED_CORE 1
#else
#define KOLO_USE_COMPILED_CORE 0
#endif

// `inline` on the functions of the detail/ implementation headers, header-only; nothing with the
// compiled core, whose library defines them once.
#if KOLO_USE_COMPILED_CORE
#define KOLO_IMPL_INLINE
#else
#define KOLO_IMPL_INLINE inline
#endif
