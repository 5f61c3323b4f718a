#!/usr/bin/env bash
# shm_geometry.sh KOLO_RUN DEMO — two ranks of one host whose shared-memory geometry differs
# (rank 1 sets KOLO_SHM_SLOT_BYTES=1048576, rank 0 keeps 262144): every rank must exit with a
# ConfigError naming the variable and both values, at start, no rank killed by a signal
# (it was a SIGBUS in rank 1 mid-allreduce), nothing left in /dev/shm.
set -u
run=$1 demo=$2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
snapshot() { ls -1 /dev/shm 2>/dev/null | grep '^kolo-' | sort; }
before=$(snapshot)
KOLO_TIMEOUT_SECONDS=20 "$run" -np 2 --timeout 60 --grace 5 sh -c \
  '[ "$KOLO_RANK" = 1 ] && export KOLO_SHM_SLOT_BYTES=1048576; exec "$0" 4000000' "$demo" \
  >"$out" 2>&1
rc=$?
cat "$out"
fails=0
fail() {
  echo "shm_geometry.sh: $*" >&2
  fails=$((fails + 1))
}
[ "$rc" -ne 0 ] || fail "kolo-run exited 0, expected a failure"
[ "$rc" -lt 128 ] || fail "kolo-run exited $rc (a signal)"
grep -q 'signal' "$out" && fail "a rank was killed by a signal"
for r in 0 1; do
  grep "^\[$r\] allreduce_demo: ConfigError:" "$out" | grep 'KOLO_SHM_SLOT_BYTES=262144' |
    grep -q 'KOLO_SHM_SLOT_BYTES=1048576' ||
    fail "rank $r: no ConfigError naming KOLO_SHM_SLOT_BYTES=262144 and =1048576"
done
for _ in $(seq 50); do
  new=$(comm -13 <(echo "$before") <(snapshot))
  [ -z "$new" ] && break
  sleep 0.1
done
if [ -n "$new" ]; then
  fail "left in /dev/shm:" $new
  for e in $new; do rm -f "/dev/shm/$e"; done
fi
[ "$fails" -eq 0 ] || exit 1
echo "shm_geometry.sh: both ranks report the mismatch (exit $rc), nothing left in /dev/shm"
