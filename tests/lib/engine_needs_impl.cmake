# cmake -DCXX=<compiler> -DINCLUDE=<kolo include dir> -DSOURCE=engine_other_transport.cpp -P ...
# With the compiled core, a file that builds Engine<InprocTransport> without including
# <kolo/engine/engine_impl.hpp> must fail to compile, and the error must name that header.
cmake_minimum_required(VERSION 3.20)
set(flags -std=c++20 -fsyntax-only "-I${INCLUDE}" -DKOLO_COMPILED_CORE -DKOLO_NO_ENGINE_IMPL)
execute_process(COMMAND "${CXX}" ${flags} "${SOURCE}" RESULT_VARIABLE rc
                OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "Engine<InprocTransport> compiled with the compiled core and without "
                      "engine_impl.hpp: the static_assert in engine.hpp did not fire")
endif()
if(NOT out MATCHES "kolo/engine/engine_impl.hpp")
  message(FATAL_ERROR "the error does not name <kolo/engine/engine_impl.hpp>:\n${out}")
endif()
string(REGEX MATCHALL "error:" errors "${out}")
list(LENGTH errors n)
message(STATUS "refused with ${n} error(s), naming kolo/engine/engine_impl.hpp")
