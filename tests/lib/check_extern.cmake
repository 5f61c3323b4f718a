# cmake -P check_extern.cmake -DNM=<nm> -DOBJECTS=<object files of probe.cpp>
# Asserts that a file compiled against kolo::kolo_lib instantiated nothing of the compiled core:
#   - it references (U) Communicator<MeshTransport>::allreduce, ::broadcast, its constructor, and
#     Engine<MeshTransport>::allreduce_async and Communicator<ShmTransport>::allreduce, which the
#     library defines;
#   - it defines (T/W) no member of Communicator<T> or Engine<T> for the standard transports,
#     no MeshTransport member and no algorithm or Selector code;
#   - nor any function of the detail/ implementation headers (core/compiled_core.hpp): the
#     rendezvous (Bootstrap), Topology::from_env, CommunicatorOptions, Tuning, the Timeline's
#     writer, the x86 vector kernels; Topology::from_env is an undefined reference, defined by
#     the library.
foreach(var NM OBJECTS)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "check_extern.cmake: -D${var}=... is required")
  endif()
endforeach()
execute_process(COMMAND "${NM}" -C ${OBJECTS} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nm failed (${rc}): ${err}")
endif()
string(REPLACE "\n" ";" lines "${out}")
set(undefined "")
set(defined "")
foreach(line IN LISTS lines)
  if(line MATCHES "^ +U (.*)$")
    list(APPEND undefined "${CMAKE_MATCH_1}")
  elseif(line MATCHES "^[0-9a-f]+ [TtWw] (.*)$")
    list(APPEND defined "${CMAKE_MATCH_1}")
  endif()
endforeach()
set(std "kolo::(Mesh|Routed|Shm|Tcp)Transport")
foreach(name IN LISTS defined)
  if(name MATCHES "^kolo::(Communicator|Engine|EngineCore)<${std}>::" OR name MATCHES "^kolo::MeshTransport::"
     OR name MATCHES "^kolo::Selector::" OR name MATCHES "^kolo::[a-z_]*(allreduce|broadcast)_[a-z_]*\\("
     OR name MATCHES "^kolo::(Bootstrap|Topology|CommunicatorOptions|Tuning|StoreClient|StoreServer|Timeline)::[a-z_]+\\("
     OR name MATCHES "^kolo::detail::(reduce_f16_simd|reduce_bf16_simd|cpu_has_|f32_to_|f16_to_|bf16_to_)")
    message(FATAL_ERROR "the probe compiled kolo code that kolo_lib should provide: ${name}")
  endif()
endforeach()
foreach(want "kolo::Communicator<kolo::MeshTransport>::allreduce(kolo::TensorView, kolo::TensorView, kolo::ReduceOp)"
        "kolo::Communicator<kolo::MeshTransport>::broadcast(kolo::TensorView, int)"
        "kolo::Communicator<kolo::MeshTransport>::~Communicator()"
        "kolo::Communicator<kolo::ShmTransport>::allreduce(kolo::TensorView, kolo::TensorView, kolo::ReduceOp)"
        "kolo::Engine<kolo::MeshTransport>::allreduce_async("
        "kolo::Topology::from_env(")
  set(found FALSE)
  foreach(name IN LISTS undefined)
    string(FIND "${name}" "${want}" at)
    if(at EQUAL 0)
      set(found TRUE)
      break()
    endif()
  endforeach()
  if(NOT found)
    message(FATAL_ERROR "the probe does not call ${want} in the library (no undefined reference)")
  endif()
endforeach()
list(LENGTH defined n_defined)
list(LENGTH undefined n_undefined)
message(STATUS "probe: ${n_defined} symbols defined, ${n_undefined} undefined; no compiled-core "
               "code instantiated")
