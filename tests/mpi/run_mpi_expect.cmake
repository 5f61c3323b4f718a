# run_mpi_expect.cmake — runs an mpirun job and checks how it ended: exit status (zero or
# non-zero), output (a regex), and wall time (a job that "fails" only by running into a deadline
# or the limit is a hang, not a pass).
#
#   cmake -DEXPECT=zero|nonzero -DREGEX=<regex> -DMAX_SECONDS=<s> [-DPYTHON=<python3>]
#         -P run_mpi_expect.cmake -- cmd...
#
# The command runs under mpirun_guard.py (next to this script): it kills the job (every rank
# included) at the limit, and ends the wait when mpiexec hangs in its own teardown after it has
# reported the job's end. Without a Python 3 the command runs directly, without those two.
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
  message(FATAL_ERROR "run_mpi_expect.cmake: no command after --")
endif()

math(EXPR _limit "${MAX_SECONDS} * 2")
if(NOT PYTHON)
  find_program(PYTHON NAMES python3)
endif()
set(_guard "")
if(PYTHON)
  set(_guard ${PYTHON} ${CMAKE_CURRENT_LIST_DIR}/mpirun_guard.py --timeout ${_limit} --grace 5 --)
  # The guard ends the job at _limit; this limit only backs it up.
  math(EXPR _limit "${_limit} + 30")
else()
  message("-- no python3: mpiexec runs without mpirun_guard.py")
endif()
string(TIMESTAMP _t0 "%s" UTC)
execute_process(COMMAND ${_guard} ${_cmd} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out
                ERROR_VARIABLE _err TIMEOUT ${_limit})
string(TIMESTAMP _t1 "%s" UTC)
math(EXPR _secs "${_t1} - ${_t0}")
message("${_out}${_err}")
message("-- exit status ${_rc} after ${_secs} s")
# The guard's verdicts (its own lines in the output): a hang, or mpiexec killed by a signal
# (which execute_process reports as a non-number when mpiexec runs directly).
set(_said "(^|\n)-- mpirun_guard: ")
if("${_out}" MATCHES "${_said}the job did not end within")
  message(FATAL_ERROR "the job did not end by itself: killed by mpirun_guard.py")
endif()
if("${_out}" MATCHES "${_said}mpiexec was killed by signal ([0-9]+ \\([A-Z0-9]+\\))")
  set(_rc "signal ${CMAKE_MATCH_2}")
endif()
if(NOT "${_rc}" MATCHES "^[0-9]+$")
  # Open MPI 4.1's mpiexec can crash in its own teardown (PMIx_server_finalize / orte_finalize)
  # after a job whose ranks exited early; the ranks have ended by then, so this is a non-zero
  # end of the job, not a hang — the time and output checks below still apply.
  if("${_out}${_err}" MATCHES "(PMIx_server_finalize|orte_finalize)")
    message("-- mpiexec crashed in its own teardown (${_rc}): counted as a non-zero exit")
    set(_rc 139)
  else()
    message(FATAL_ERROR "the job did not end by itself: ${_rc}")
  endif()
endif()
if(EXPECT STREQUAL "zero" AND NOT _rc EQUAL 0)
  message(FATAL_ERROR "exit status ${_rc}, expected 0")
endif()
if(EXPECT STREQUAL "nonzero" AND _rc EQUAL 0)
  message(FATAL_ERROR "exit status 0, expected a failure")
endif()
if(_secs GREATER ${MAX_SECONDS})
  message(FATAL_ERROR "the job took ${_secs} s, more than ${MAX_SECONDS} s")
endif()
if(DEFINED REGEX AND NOT "${_out}${_err}" MATCHES "${REGEX}")
  message(FATAL_ERROR "output does not match: ${REGEX}")
endif()
