# tests/common/skip.sh — the shell tests' skip: a skip outside CI, a failure in CI unless its
# reason is on tests/common/skip_allowlist.txt (the C++ twin is skip.hpp, the Python one
# kolo_skip.py; all three read that list and decide alike).
#
#   source "$(dirname "$0")/../common/skip.sh"
#   kolo_skip REASON MESSAGE...   print why and exit: 77 (CTest's SKIP_RETURN_CODE) where the skip
#                                 is allowed, 1 where it is not
#   kolo_skip_allowed REASON      status 0 where a skip for REASON is allowed here
#
# A skip is allowed outside CI (CI unset, empty, "0" or "false"), and in CI only for a reason the
# list names; with KOLO_TEST_REQUIRE_GPU=1 never for the reason no-gpu.

# shellcheck shell=bash
kolo_skip_in_ci() {
  case ${CI:-} in
    "" | 0 | false | FALSE | False | no) return 1 ;;
    *) return 0 ;;
  esac
}

kolo_skip_allowed() {
  local reason=$1 list name listed
  list="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/skip_allowlist.txt"
  if [[ $reason == no-gpu && ${KOLO_TEST_REQUIRE_GPU:-} == 1 ]]; then return 1; fi
  kolo_skip_in_ci || return 0
  [[ -r $list ]] || return 1
  while read -r name listed _; do
    [[ -z $name || $name == \#* ]] && continue
    [[ $listed == "$reason" ]] && return 0
  done <"$list"
  return 1
}

kolo_skip() {
  local reason=$1
  shift
  if kolo_skip_allowed "$reason"; then
    echo "SKIP ($reason): $*" >&2
    exit 77
  fi
  local why="CI=${CI:-} and '$reason' is not on tests/common/skip_allowlist.txt"
  [[ $reason == no-gpu && ${KOLO_TEST_REQUIRE_GPU:-} == 1 ]] && why="KOLO_TEST_REQUIRE_GPU=1"
  echo "FAILED: this test would skip ($reason: $*), and a skip is a failure here ($why)" >&2
  exit 1
}
