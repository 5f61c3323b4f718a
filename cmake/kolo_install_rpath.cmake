# kolo_set_install_rpath(target...): an installed kolo shared library finds what is installed
# next to it (another kolo library, or a dependency a packager puts there) wherever the prefix
# is: RUNPATH $ORIGIN (@loader_path on macOS), after any CMAKE_INSTALL_RPATH of the build.
# Neither library needs the other today: libkolo_c.so contains the compiled core's objects
# (src/c), and their other dependencies (libstdc++, libcrypto, libc) are the system's.
# CMAKE_SKIP_INSTALL_RPATH=ON still leaves every RUNPATH out.
function(kolo_set_install_rpath)
  if(APPLE)
    set(origin "@loader_path")
  else()
    set(origin "$ORIGIN")
  endif()
  set(rpath ${CMAKE_INSTALL_RPATH})
  list(APPEND rpath "${origin}")
  foreach(t IN LISTS ARGN)
    set_target_properties(${t} PROPERTIES INSTALL_RPATH "${rpath}")
  endforeach()
endfunction()
