# run_expect.cmake — runs a job and checks how it ended: its exit status, its output, and its wall
# time (a job that "fails" only by running into a deadline or the limit is a hang, not a pass).
# One script for every CTest entry that expects a job to fail in a particular way.
#
#   cmake -DEXPECT=<status>|zero|nonzero [-DREGEX=<regex>[;<regex>...]]
#         [-DCOUNT=<n> -DCOUNT_REGEX=<regex>] [-DRANKS=<n> -DRANK_REGEX=<regex>]
#         [-DMAX_SECONDS=<s>] [-DLOG=<file>]
#         [-DMPI_GUARD=<mpirun_guard.py> [-DPYTHON=<python3>]]
#         -P run_expect.cmake -- cmd...
#
# EXPECT      the exit status: a number, or zero / nonzero.
# REGEX       every regex of the list must match the output (stdout and stderr together).
# COUNT       exactly COUNT lines of the output match COUNT_REGEX.
# RANKS       for every rank r in 0..RANKS-1, exactly one line matches RANK_REGEX with each
#             @RANK@ in it replaced by r: a line from every rank, once each (kolo-run prefixes a
#             rank's lines with "[r] ", so "^\\[@RANK@\\] ..." names the rank that printed).
# MAX_SECONDS the job must end within this (default 600); the command is killed at twice that.
# LOG         also write the output to this file.
# MPI_GUARD   an mpirun job: the command runs under tests/mpi/mpirun_guard.py, which kills the
#             whole job at the limit and ends the wait when mpiexec hangs in its own teardown
#             after it has reported the job's end (without a Python 3 the command runs
#             directly).
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
if("${_cmd}" STREQUAL "")
  message(FATAL_ERROR "run_expect.cmake: no command after --")
endif()
if(NOT DEFINED EXPECT)
  message(FATAL_ERROR "run_expect.cmake: -DEXPECT=<status>|zero|nonzero is required")
endif()
if(NOT MAX_SECONDS)
  set(MAX_SECONDS 600)
endif()

math(EXPR _limit "${MAX_SECONDS} * 2")
set(_wrap "")
if(MPI_GUARD)
  if(NOT PYTHON)
    find_program(PYTHON NAMES python3)
  endif()
  if(PYTHON)
    set(_wrap ${PYTHON} ${MPI_GUARD} --timeout ${_limit} --grace 5 --)
    # The guard ends the job at _limit; this limit only backs it up.
    math(EXPR _limit "${_limit} + 30")
  else()
    message("-- no python3: mpiexec runs without mpirun_guard.py")
  endif()
endif()
string(TIMESTAMP _t0 "%s" UTC)
execute_process(COMMAND ${_wrap} ${_cmd} RESULT_VARIABLE _rc OUTPUT_VARIABLE _out
                ERROR_VARIABLE _err TIMEOUT ${_limit})
string(TIMESTAMP _t1 "%s" UTC)
math(EXPR _secs "${_t1} - ${_t0}")
set(_all "${_out}${_err}")
message("${_all}")
message("-- exit status ${_rc} after ${_secs} s")
if(LOG)
  file(WRITE "${LOG}" "${_all}")
endif()

if(MPI_GUARD)
  # The guard's verdicts (its own lines in the output): a hang, or mpiexec killed by a signal
  # (which execute_process reports as a non-number when mpiexec runs directly).
  set(_said "(^|\n)-- mpirun_guard: ")
  if("${_out}" MATCHES "${_said}the job did not end within")
    message(FATAL_ERROR "the job did not end by itself: killed by mpirun_guard.py")
  endif()
  if("${_out}" MATCHES "${_said}mpiexec was killed by signal ([0-9]+ \\([A-Z0-9]+\\))")
    set(_rc "signal ${CMAKE_MATCH_2}")
  endif()
  if(NOT "${_rc}" MATCHES "^[0-9]+$" AND "${_all}" MATCHES "(PMIx_server_finalize|orte_finalize)")
    # Open MPI 4.1's mpiexec can crash in its own teardown (PMIx_server_finalize /
    # orte_finalize) after a job whose ranks exited early; the ranks have ended by then, so this
    # is a non-zero end of the job, not a hang — the time and output checks below still apply.
    message("-- mpiexec crashed in its own teardown (${_rc}): counted as a non-zero exit")
    set(_rc 139)
  endif()
endif()
if(NOT "${_rc}" MATCHES "^[0-9]+$")
  message(FATAL_ERROR "the job did not end by itself: ${_rc}")
endif()
if(EXPECT STREQUAL "zero")
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "exit status ${_rc}, expected 0")
  endif()
elseif(EXPECT STREQUAL "nonzero")
  if(_rc EQUAL 0)
    message(FATAL_ERROR "exit status 0, expected a failure")
  endif()
elseif(NOT _rc EQUAL EXPECT)
  message(FATAL_ERROR "exit status ${_rc}, expected ${EXPECT}")
endif()
if(_secs GREATER ${MAX_SECONDS})
  message(FATAL_ERROR "the job took ${_secs} s, more than ${MAX_SECONDS} s")
endif()
foreach(_re IN LISTS REGEX)
  if(NOT "${_all}" MATCHES "${_re}")
    message(FATAL_ERROR "output does not match: ${_re}")
  endif()
endforeach()
if(DEFINED COUNT OR DEFINED RANKS)
  # Line by line ("." would match across lines otherwise). A line with a ';' splits in two here,
  # which only matters to a COUNT_REGEX that spans one.
  string(REGEX MATCHALL "[^\n]+" _lines "${_all}")
endif()
if(DEFINED COUNT)
  set(_n 0)
  foreach(_line IN LISTS _lines)
    if("${_line}" MATCHES "${COUNT_REGEX}")
      math(EXPR _n "${_n} + 1")
    endif()
  endforeach()
  if(NOT _n EQUAL COUNT)
    message(FATAL_ERROR "${_n} lines match '${COUNT_REGEX}', expected ${COUNT}")
  endif()
endif()
if(DEFINED RANKS)
  if(NOT RANK_REGEX)
    message(FATAL_ERROR "run_expect.cmake: -DRANKS needs -DRANK_REGEX=<regex with @RANK@>")
  endif()
  math(EXPR _top "${RANKS} - 1")
  foreach(_r RANGE ${_top})
    string(REPLACE "@RANK@" "${_r}" _re "${RANK_REGEX}")
    set(_n 0)
    foreach(_line IN LISTS _lines)
      if("${_line}" MATCHES "${_re}")
        math(EXPR _n "${_n} + 1")
      endif()
    endforeach()
    if(NOT _n EQUAL 1)
      message(FATAL_ERROR "rank ${_r}: ${_n} lines match '${_re}', expected 1")
    endif()
  endforeach()
endif()
