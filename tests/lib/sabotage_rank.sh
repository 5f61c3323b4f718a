#!/usr/bin/env bash
# sabotage_rank.sh MODE RANK program args... — a rank that misbehaves after doing its work, to
# prove that a multi-rank test fails for it (the lib/sabotage/* tests and docs/testing.md's
# tests of the tests). Run under kolo-run in place of the program: every rank runs the program;
# the rank whose KOLO_RANK is RANK then
#   abort   dies of SIGABRT after the program ended well (a crash at shutdown, after its line);
#   exit1   exits 1 after the program ended well;
#   silent  keeps the program's exit status but its output never appears (a rank whose line is
#           missing).
# The other ranks run the program unchanged.
set -u
mode=$1 victim=$2
shift 2
if [ "${KOLO_RANK:-}" != "$victim" ]; then
  exec "$@"
fi
if [ "$mode" = silent ]; then
  "$@" >/dev/null 2>&1
  exit $?
fi
"$@"
rc=$?
[ "$rc" -eq 0 ] || exit "$rc"
case $mode in
  abort)
    ulimit -c 0  # no core file left behind
    kill -ABRT $$
    ;;
  exit1) exit 1 ;;
esac
echo "sabotage_rank.sh: unknown mode $mode" >&2
exit 2
