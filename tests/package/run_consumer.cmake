# cmake -P script behind the package/* tests: gets kolo into a fresh consumer project one way
# (MODE), builds the consumer and runs it: the C++ program on kolo::kolo, the compiled-core
# program on kolo::kolo_lib and kolo::kolo_lib_shared, the C program on kolo::kolo_c and
# kolo::kolo_c_static, and (installed prefix) the C program built through
# pkg-config without CMake. Everything happens under WORK_DIR, wiped first, so a
# test never sees what an earlier run left behind.
#
#   -DMODE=install | subdirectory | fetchcontent_source_dir | fetchcontent_url
#   -DKOLO_SOURCE_DIR=<kolo source tree>   -DCONSUMER_SOURCE_DIR=<tests/package/consumer>
#   -DWORK_DIR=<scratch dir>               -DCXX_COMPILER=<compiler of the outer build>
#   -DEXPECT_MPI=ON|OFF  the outer build found MPI with C++ support: kolo::mpi must come through
#   -DMPIEXEC=<mpiexec>  install mode, EXPECT_MPI: the kolo::mpi consumer runs under it (2 ranks)
#   -DKOLO_BUILD_DIR=<built tree>  install mode: install this already built tree (the outer
#                        build: `cmake --install`, nothing of kolo compiled again) instead of
#                        configuring and building kolo afresh in WORK_DIR
cmake_minimum_required(VERSION 3.20)

foreach(var MODE KOLO_SOURCE_DIR CONSUMER_SOURCE_DIR WORK_DIR)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "run_consumer.cmake: -D${var}=... is required")
  endif()
endforeach()

file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")

# Ninja when there is one: it starts faster than make and is what CI uses.
find_program(NINJA_PROGRAM NAMES ninja ninja-build)
if(NINJA_PROGRAM)
  set(generator -G Ninja "-DCMAKE_MAKE_PROGRAM=${NINJA_PROGRAM}")
else()
  set(generator "")
endif()
# The installed package is built as a user builds a release (Release, the consumer's strict
# warnings at -O2 included). The other three ways differ from it only in how CMake gets at kolo,
# so they build without optimisation (-O0, no debug information): each compiles the compiled
# core and the consumers again, and at -O2 the four took 10 minutes of CI's two cores.
if(MODE STREQUAL "install")
  set(build_type_options -DCMAKE_BUILD_TYPE=Release)
else()
  set(build_type_options -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O0
                         -DCMAKE_C_FLAGS_DEBUG=-O0)
endif()
set(common_options ${generator} ${build_type_options}
                   -DCMAKE_FIND_PACKAGE_NO_PACKAGE_REGISTRY=ON)
if(CXX_COMPILER)
  list(APPEND common_options "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}")
endif()
# The nested kolo builds only need the library itself: no tests, benchmarks, examples, launcher
# (except the installed package, whose kolo-run is used below).
set(kolo_options -DKOLO_BUILD_TESTS=OFF -DKOLO_BUILD_BENCHMARKS=OFF -DKOLO_BUILD_EXAMPLES=OFF
                 -DKOLO_BUILD_LAUNCHER=OFF)
if(NOT DEFINED EXPECT_MPI)
  set(EXPECT_MPI OFF)
endif()

# Runs one step; on failure prints its whole output and stops with the step's name.
function(step name)
  string(REPLACE ";" " " command_line "${ARGN}")
  message(STATUS "[${MODE}] ${name}: ${command_line}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message("${out}")
    message(FATAL_ERROR "[${MODE}] ${name} failed (exit ${rc})")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

set(consumer_build "${WORK_DIR}/consumer-build")
set(consumer_options "")

if(MODE STREQUAL "install")
  set(stage "${WORK_DIR}/stage")
  if(KOLO_BUILD_DIR)
    set(kolo_build "${KOLO_BUILD_DIR}")
  else()
    set(kolo_build "${WORK_DIR}/kolo-build")
    step("configure kolo" "${CMAKE_COMMAND}" -S "${KOLO_SOURCE_DIR}" -B "${kolo_build}"
         ${common_options} ${kolo_options} -DKOLO_BUILD_LAUNCHER=ON
         "-DCMAKE_INSTALL_PREFIX=${stage}")
    step("build kolo" "${CMAKE_COMMAND}" --build "${kolo_build}")
  endif()
  step("install kolo" "${CMAKE_COMMAND}" --install "${kolo_build}" --prefix "${stage}")
  foreach(f include/kolo/core/reduce.hpp include/kolo/topology/topology.hpp include/kolo/c/kolo.h
          include/kolo/spark/data_file.hpp)
    if(NOT EXISTS "${stage}/${f}")
      message(FATAL_ERROR "[install] ${f} was not installed")
    endif()
  endforeach()
  # The compiled core (libkolo.a, libkolo.so with its SONAME link) and the C ABI: the shared
  # library (with its SONAME link), the static one, the pkg-config file.
  foreach(pattern libkolo.a libkolo.so libkolo.so.[0-9]* libkolo_c.so libkolo_c.so.[0-9]*
          libkolo_c_static.a pkgconfig/kolo_c.pc)
    file(GLOB_RECURSE found "${stage}/*/${pattern}")
    if(NOT found)
      message(FATAL_ERROR "[install] nothing matching ${pattern} was installed")
    endif()
  endforeach()
  file(GLOB_RECURSE config_files "${stage}/*/koloConfig.cmake")
  list(LENGTH config_files n_configs)
  if(NOT n_configs EQUAL 1)
    message(FATAL_ERROR "[install] expected one koloConfig.cmake under ${stage}, found: "
                        "${config_files}")
  endif()
  get_filename_component(config_dir "${config_files}" DIRECTORY)
  set(installed_files koloConfigVersion.cmake koloTargets.cmake)
  if(EXPECT_MPI)
    list(APPEND installed_files koloMpiTargets.cmake)
  endif()
  foreach(f ${installed_files})
    if(NOT EXISTS "${config_dir}/${f}")
      message(FATAL_ERROR "[install] ${config_dir}/${f} was not installed")
    endif()
  endforeach()
  # Move the installed tree before using it: a package that still points at its install
  # location (or at the source or build tree) is not relocatable, and this catches it.
  set(prefix "${WORK_DIR}/relocated-prefix")
  file(RENAME "${stage}" "${prefix}")
  if(NOT KOLO_BUILD_DIR)  # a build of its own: gone, so nothing can point into it
    file(REMOVE_RECURSE "${kolo_build}")
  endif()
  list(APPEND consumer_options -DKOLO_CONSUME=package "-DCMAKE_PREFIX_PATH=${prefix}"
       "-DKOLO_EXPECTED_PREFIX=${prefix}" -DKOLO_BUILD_MPI_CONSUMER=${EXPECT_MPI})
elseif(MODE STREQUAL "subdirectory")
  # A project that builds everything as unity builds (CMAKE_UNITY_BUILD): the consumer's files and
  # kolo's own targets become unity sources, except the compiled core's objects, which opt out
  # (checked after the build).
  list(APPEND consumer_options -DKOLO_CONSUME=subdirectory "-DKOLO_SOURCE_DIR=${KOLO_SOURCE_DIR}"
       -DCMAKE_UNITY_BUILD=ON ${kolo_options})
elseif(MODE STREQUAL "fetchcontent_source_dir")
  list(APPEND consumer_options -DKOLO_CONSUME=fetchcontent "-DKOLO_SOURCE_DIR=${KOLO_SOURCE_DIR}"
       ${kolo_options})
elseif(MODE STREQUAL "fetchcontent_url")
  # A release-style archive of the source tree, fetched through a file:// URL with a hash, as a
  # user would fetch a release tarball (no network involved). Build trees, hidden files and VCS
  # data are not part of a source release.
  file(GLOB entries RELATIVE "${KOLO_SOURCE_DIR}" "${KOLO_SOURCE_DIR}/*")
  list(FILTER entries EXCLUDE REGEX "^(build|_build|\\.|__pycache__)")
  set(archive "${WORK_DIR}/kolo-src.tar.gz")
  execute_process(COMMAND "${CMAKE_COMMAND}" -E tar czf "${archive}" -- ${entries}
                  WORKING_DIRECTORY "${KOLO_SOURCE_DIR}" RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "[fetchcontent_url] could not archive ${KOLO_SOURCE_DIR}")
  endif()
  file(SHA256 "${archive}" archive_hash)
  list(APPEND consumer_options -DKOLO_CONSUME=fetchcontent "-DKOLO_URL=file://${archive}"
       "-DKOLO_URL_HASH=SHA256=${archive_hash}" -DFETCHCONTENT_QUIET=OFF ${kolo_options})
else()
  message(FATAL_ERROR "run_consumer.cmake: unknown MODE=${MODE}")
endif()

step("configure consumer" "${CMAKE_COMMAND}" -S "${CONSUMER_SOURCE_DIR}" -B "${consumer_build}"
     ${common_options} ${consumer_options} -DKOLO_EXPECT_MPI=${EXPECT_MPI})
message(STATUS "${step_output}")
step("build consumer" "${CMAKE_COMMAND}" --build "${consumer_build}")
if(MODE STREQUAL "subdirectory")
  if(NOT EXISTS "${consumer_build}/CMakeFiles/kolo_consumer.dir/Unity")
    message(FATAL_ERROR "[subdirectory] CMAKE_UNITY_BUILD=ON did not make the consumer a "
                        "unity build")
  endif()
  if(EXISTS "${consumer_build}/kolo/src/lib/CMakeFiles/kolo_lib_objects.dir/Unity")
    message(FATAL_ERROR "[subdirectory] kolo's compiled core was built as a unity build; "
                        "kolo_lib_objects must opt out (UNITY_BUILD OFF, src/lib/CMakeLists.txt)")
  endif()
endif()
step("run consumer" "${consumer_build}/kolo_consumer")
message(STATUS "${step_output}")
if(NOT step_output MATCHES "kolo consumer \\(")
  message(FATAL_ERROR "[${MODE}] the consumer did not report success: ${step_output}")
endif()

if(MODE STREQUAL "install")
  # The installed kolo-run, moved with its prefix, starts ranks (the consumer needs no peers).
  step("installed kolo-run" "${prefix}/bin/kolo-run" -np 2 "${consumer_build}/kolo_consumer")
  message(STATUS "${step_output}")
  foreach(rank 0 1)
    if(NOT step_output MATCHES "\\[${rank}\\] kolo consumer \\(package\\): ok")
      message(FATAL_ERROR "[install] rank ${rank} of the installed kolo-run did not report success")
    endif()
  endforeach()
  # The compiled core from the package, shared and static, on 2 ranks of the installed kolo-run.
  foreach(link kolo_lib kolo_lib_shared)
    step("${link} consumer under kolo-run" "${prefix}/bin/kolo-run" -np 2
         "${consumer_build}/kolo_consumer_${link}")
    message(STATUS "${step_output}")
    foreach(rank 0 1)
      if(NOT step_output MATCHES "kolo lib consumer \\(package, ${link}\\): rank ${rank}/2 ok, sum 3")
        message(FATAL_ERROR "[install] rank ${rank} of the ${link} consumer did not report success")
      endif()
    endforeach()
  endforeach()
  # kolo::mpi from the package: a real MPI job of 2 ranks.
  if(EXPECT_MPI)
    if(NOT MPIEXEC)
      message(FATAL_ERROR "[install] MPI was found but no mpiexec: -DMPIEXEC=... is required")
    endif()
    execute_process(COMMAND "${MPIEXEC}" --version OUTPUT_VARIABLE mpi_version ERROR_QUIET)
    set(mpi_flags "")
    if(mpi_version MATCHES "Open MPI|OpenRTE")  # root, 2 cores, shared memory: as tests/mpi
      set(mpi_flags --oversubscribe --allow-run-as-root --bind-to none --mca btl self,vader)
    endif()
    step("kolo::mpi consumer under mpiexec" "${MPIEXEC}" ${mpi_flags} -np 2
         "${consumer_build}/kolo_consumer_mpi")
    message(STATUS "${step_output}")
    foreach(rank 0 1)
      if(NOT step_output MATCHES "kolo mpi consumer: rank ${rank}/2 ok, sum 3000")
        message(FATAL_ERROR "[install] rank ${rank} of the kolo::mpi consumer did not report success")
      endif()
    endforeach()
  endif()
endif()

# The compiled core, one rank, through kolo::kolo_lib and kolo::kolo_lib_shared.
foreach(link kolo_lib kolo_lib_shared)
  step("run compiled-core consumer (${link})" "${consumer_build}/kolo_consumer_${link}")
  message(STATUS "${step_output}")
  if(NOT step_output MATCHES "kolo lib consumer \\([a-z_]+, ${link}\\): rank 0/1 ok, sum 1")
    message(FATAL_ERROR "[${MODE}] the compiled-core consumer (${link}) did not report success: "
                        "${step_output}")
  endif()
endforeach()

# The C ABI from C, through kolo::kolo_c and kolo::kolo_c_static, without LD_LIBRARY_PATH:
# from an installed prefix, the imported target's full path and the consumer's build-tree RPATH
# find libkolo_c.so.
foreach(link kolo_c kolo_c_static)
  step("run C consumer (${link})" "${CMAKE_COMMAND}" -E env --unset=LD_LIBRARY_PATH
       "${consumer_build}/kolo_consumer_${link}")
  message(STATUS "${step_output}")
  if(NOT step_output MATCHES "kolo C consumer \\([a-z_]+, ${link}\\): ok")
    message(FATAL_ERROR "[${MODE}] the C consumer (${link}) did not report success: ${step_output}")
  endif()
endforeach()

# An installed prefix serves builds without CMake too: `cc app.c $(pkg-config kolo_c)`.
if(MODE STREQUAL "install")
  find_program(PKG_CONFIG_PROGRAM pkg-config REQUIRED)
  find_program(C_COMPILER NAMES cc gcc clang REQUIRED)
  file(GLOB_RECURSE pc_file "${prefix}/*/pkgconfig/kolo_c.pc")
  get_filename_component(pc_dir "${pc_file}" DIRECTORY)
  step("pkg-config kolo_c" "${CMAKE_COMMAND}" -E env "PKG_CONFIG_PATH=${pc_dir}"
       "${PKG_CONFIG_PROGRAM}" --cflags --libs kolo_c)
  string(STRIP "${step_output}" pc_flags)
  separate_arguments(pc_flags UNIX_COMMAND "${pc_flags}")
  set(pc_exe "${WORK_DIR}/c_consumer_pkgconfig")
  step("compile with pkg-config" "${C_COMPILER}" -std=c11 -Wall -Wextra -Wpedantic -Werror
       "-DKOLO_CONSUMER_MODE=\"install\"" "-DKOLO_CONSUMER_LINK=\"pkg-config\""
       "${CONSUMER_SOURCE_DIR}/c_consumer.c" -o "${pc_exe}" ${pc_flags})
  # No LD_LIBRARY_PATH: the .pc file's Libs carry an rpath to the relocated prefix's libdir.
  step("run C consumer (pkg-config)" "${CMAKE_COMMAND}" -E env --unset=LD_LIBRARY_PATH
       "${pc_exe}")
  message(STATUS "${step_output}")
  if(NOT step_output MATCHES "kolo C consumer \\(install, pkg-config\\): ok")
    message(FATAL_ERROR "[install] the pkg-config C consumer did not report success: "
                        "${step_output}")
  endif()
endif()
