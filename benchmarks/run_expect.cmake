# run_expect.cmake — runs a command and checks both its exit status and its output, which
# CTest's PASS_REGULAR_EXPRESSION alone cannot (it ignores the exit status).
#
#   cmake -DEXPECT_RC=2 -DEXPECT_REGEX=<regex> -P run_expect.cmake -- <command> [args...]
set(_cmd "")
set(_started OFF)
math(EXPR _last "${CMAKE_ARGC} - 1")
foreach(i RANGE ${_last})
  if(_started)
    list(APPEND _cmd "${CMAKE_ARGV${i}}")
  elseif("${CMAKE_ARGV${i}}" STREQUAL "--")
    set(_started ON)
  endif()
endforeach()
if(NOT _cmd)
  message(FATAL_ERROR "run_expect.cmake: no command after --")
endif()

execute_process(COMMAND ${_cmd} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out ERROR_VARIABLE _err)
message("${_out}${_err}")
if(NOT "${_rc}" STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "exit status ${_rc}, expected ${EXPECT_RC}")
endif()
if(DEFINED EXPECT_REGEX AND NOT "${_out}${_err}" MATCHES "${EXPECT_REGEX}")
  message(FATAL_ERROR "output does not match: ${EXPECT_REGEX}")
endif()
