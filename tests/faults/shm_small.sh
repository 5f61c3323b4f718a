#!/usr/bin/env bash
# shm_small.sh KOLO_RUN DEMO — a small /dev/shm (a private tmpfs in a mount namespace; root):
#   1. 8 MiB and two ranks that need more (KOLO_SHM_SLOTS=4, KOLO_SHM_SLOT_BYTES=1048576: 8 MiB
#      and a bit for the host): a ConfigError at start on both ranks naming the bytes needed and
#      the bytes free, exit non-zero, no signal, nothing left in that /dev/shm;
#   2. 64 MiB (Docker's default) and 8 ranks with the default geometry: an allreduce of 1M
#      floats is correct on every rank (the default slots shrink to fit; 8 x 8 x 2 MiB = 128 MiB
#      did not).
# Not root (no mount namespace of our own): a skip outside CI, a failure in CI (which is root).
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../common/skip.sh
source "$here/../common/skip.sh"
run=$1 demo=$2
[ "$(id -u)" = 0 ] || kolo_skip not-root "shm_small.sh mounts a tmpfs on /dev/shm: needs root"
if [ "${SHM_SMALL_INSIDE:-}" != 1 ]; then
  exec env SHM_SMALL_INSIDE=1 unshare -m bash "$0" "$@"
fi
out=$(mktemp)
trap 'rm -f "$out"; umount /dev/shm 2>/dev/null' EXIT
fails=0
fail() {
  echo "shm_small.sh: $*" >&2
  fails=$((fails + 1))
}

mount --make-rprivate / 2>/dev/null
mount -t tmpfs -o size=8m tmpfs /dev/shm || { echo "shm_small.sh: mount failed" >&2; exit 1; }
KOLO_TRANSPORT=shm KOLO_SHM_SLOTS=4 KOLO_SHM_SLOT_BYTES=1048576 KOLO_TIMEOUT_SECONDS=20 \
  "$run" -np 2 --timeout 60 --grace 5 "$demo" 4000000 >"$out" 2>&1
rc=$?
cat "$out"
[ "$rc" -ne 0 ] || fail "8 MiB: kolo-run exited 0, expected a ConfigError"
[ "$rc" -lt 128 ] || fail "8 MiB: kolo-run exited $rc (a signal)"
grep -q 'signal' "$out" && fail "8 MiB: a rank was killed by a signal"
for r in 0 1; do
  grep "^\[$r\] allreduce_demo: ConfigError:" "$out" | grep -q 'needs [0-9]* bytes, but /dev/shm has [0-9]* bytes free' ||
    fail "8 MiB: rank $r: no ConfigError naming the bytes needed and free"
done
left=$(ls -A /dev/shm)
[ -z "$left" ] || fail "8 MiB: left in /dev/shm: $left"
umount /dev/shm

mount -t tmpfs -o size=64m tmpfs /dev/shm || { echo "shm_small.sh: mount failed" >&2; exit 1; }
KOLO_TRANSPORT=shm KOLO_TIMEOUT_SECONDS=20 "$run" -np 8 --timeout 60 --grace 5 "$demo" 1000000 \
  >"$out" 2>&1
rc=$?
cat "$out"
[ "$rc" -eq 0 ] || fail "64 MiB, 8 ranks: kolo-run exited $rc"
n=$(grep -c '^\[[0-7]\] rank [0-7]/8 .* = 36 (expected 36), average = 3.5, correct' "$out")
[ "$n" -eq 8 ] || fail "64 MiB, 8 ranks: $n of 8 ranks report the correct sum and average"
left=$(ls -A /dev/shm)
[ -z "$left" ] || fail "64 MiB: left in /dev/shm: $left"

[ "$fails" -eq 0 ] || exit 1
echo "shm_small.sh: 8 MiB refused at start on both ranks; 8 ranks correct in 64 MiB"
