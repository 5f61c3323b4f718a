#!/usr/bin/env bash
# run_ranks.sh NP TAG kolo-run-args... -- program args...
# Runs `kolo-run -np NP program args` and passes when kolo-run exits 0 and exactly NP lines
# "TAG rank=R" came out (one per rank: a rank that died early, hung or was skipped fails it).
set -u
np=$1 tag=$2
shift 2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$@" >"$out" 2>&1
rc=$?
cat "$out"
passes=$(grep -c "${tag} rank=" "$out")
if [ "$rc" -ne 0 ]; then
  echo "run_ranks.sh: kolo-run exited with $rc" >&2
  exit 1
fi
if [ "$passes" -ne "$np" ]; then
  echo "run_ranks.sh: $passes of $np ranks reported ${tag}" >&2
  exit 1
fi
