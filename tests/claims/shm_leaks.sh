#!/usr/bin/env bash
# shm_leaks.sh KOLO_RUN CLAIMS_WORKER — nothing is left in /dev/shm by a job over shared memory,
# after a normal run or after any fault: a rank killed, a rank that calls abort(), a mismatch, a
# rank that arrives after the others' deadline, one that starts connecting after it, and a set-up
# that fails after the segments were created (a peer's TCP address answers nothing), while
# their names still exist.
#
# Each job's kolo-* entries are the ones that appear in /dev/shm during it and are still there
# afterwards; an entry of a job running at the same time goes within its set-up, so an entry is
# a leak only if it is still there 5 s after the job ended (the CTest test is RUN_SERIAL as well).
# Each job must also have done its fault (its ranks' report lines), or the check proves nothing.
# Leaked entries are reported, then removed.
set -u
run=$1 worker=$2
np=3
fails=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT

snapshot() { ls -1 /dev/shm 2>/dev/null | grep '^kolo-' | sort; }

# job MODE MIN_LINES TAG: run it, count "TAG rank=" lines, then look for leftovers.
job() {
  local mode=$1 min=$2 tag=$3 before after new lines rc
  before=$(snapshot)
  KOLO_TRANSPORT=shm KOLO_TIMEOUT_SECONDS=1 "$run" -np "$np" --timeout 60 --grace 5 \
    "$worker" "$mode" >"$out" 2>&1
  rc=$?
  lines=$(grep -c "$tag rank=" "$out")
  if [ "$lines" -lt "$min" ]; then
    cat "$out"
    echo "shm_leaks.sh: $mode: $lines '$tag' lines, expected $min or more (kolo-run exit $rc)" >&2
    fails=$((fails + 1))
  fi
  for _ in $(seq 50); do
    new=$(comm -13 <(echo "$before") <(snapshot))
    [ -z "$new" ] && break
    sleep 0.1
  done
  if [ -n "$new" ]; then
    cat "$out"
    echo "shm_leaks.sh: $mode left in /dev/shm:" $new >&2
    for e in $new; do rm -f "/dev/shm/$e"; done
    fails=$((fails + 1))
  else
    echo "shm_leaks.sh: $mode: $lines '$tag' lines, kolo-run exit $rc, nothing left in /dev/shm"
  fi
}

job clean $np CLAIMS_OK
job mismatch-op $np CLAIMS_OK
job kill $((np - 1)) CLAIMS_FAULT
job abort $((np - 1)) CLAIMS_FAULT
job timeout $((np - 1)) CLAIMS_FAULT
job late-connect $((np - 1)) CLAIMS_FAULT
job unreachable $((np - 1)) CLAIMS_FAULT
[ "$fails" -eq 0 ] || { echo "shm_leaks.sh: $fails of 7 jobs failed" >&2; exit 1; }
echo "shm_leaks.sh: 7 jobs, nothing left in /dev/shm"
