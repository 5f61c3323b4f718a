#!/usr/bin/env bash
# ran_nothing.sh COUNT command... — a doctest program (or a kolo-run job of one) given a filter
# that matches no test case must fail: exit non-zero, and COUNT processes (one per rank) say
# "the filters matched no test case". The test of the tests for doctest_ran_nothing.hpp.
set -u
count=$1
shift
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$@" >"$out" 2>&1
rc=$?
cat "$out"
said=$(grep -c "the filters matched no test case" "$out")
if [ "$rc" -eq 0 ]; then
  echo "ran_nothing.sh: exit 0 although no test case ran" >&2
  exit 1
fi
if [ "$said" -ne "$count" ]; then
  echo "ran_nothing.sh: $said of $count processes said the filters matched nothing" >&2
  exit 1
fi
echo "ran_nothing.sh: exit $rc, $said of $count processes failed the empty run"
