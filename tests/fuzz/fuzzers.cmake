# kolo's libFuzzer targets, for a clang build: included by tests/fuzz/CMakeLists.txt when the
# project's own compiler is clang, and by tests/fuzz/standalone (the clang sub-build) otherwise.
#
#   kolo_add_fuzzers(<kolo include dir> <extra link libraries...>)
# defines kolo_fuzz_env, kolo_fuzz_store, kolo_fuzz_mesh_frames and kolo_fuzz_shm_slots in the
# current directory.
set(KOLO_FUZZ_NAMES env store mesh_frames shm_slots)
list(APPEND KOLO_FUZZ_NAMES store_protocol)  # the store protocol alone (store/protocol.hpp)
list(APPEND KOLO_FUZZ_NAMES negotiator)  # the engine's negotiation (engine/detail/negotiator.hpp)
set(_KOLO_FUZZ_DIR ${CMAKE_CURRENT_LIST_DIR})

function(kolo_add_fuzzers include_dir)
  foreach(name IN LISTS KOLO_FUZZ_NAMES)
    set(target kolo_fuzz_${name})
    add_executable(${target} ${_KOLO_FUZZ_DIR}/fuzz_${name}.cpp)
    # libFuzzer drives the input; ASan and UBSan turn memory errors and undefined behaviour into
    # findings (UBSan fatal, so libFuzzer saves the input). -O1: fast enough, still debuggable.
    target_compile_options(${target} PRIVATE -fsanitize=fuzzer,address,undefined
                           -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1
                           -Wall -Wextra -Wpedantic -Werror)
    target_link_options(${target} PRIVATE -fsanitize=fuzzer,address,undefined)
    target_compile_features(${target} PRIVATE cxx_std_20)
    target_include_directories(${target} PRIVATE ${include_dir} ${_KOLO_FUZZ_DIR})
    target_link_libraries(${target} PRIVATE ${ARGN})
  endforeach()
endfunction()
