#!/usr/bin/env bash
# tests/soak/soak.sh — the full soak (not in CI): 100,000 random collectives across 4 ranks,
# every element checked on every rank; exit code 0 only with 0 wrong.
#
#   tests/soak/soak.sh [BUILD_DIR]          (default: build-ci, else build)
#
# Knobs (environment): SOAK_COLLECTIVES (100000), SOAK_RANKS (4), SOAK_SEED (42),
# SOAK_TRANSPORTS (space-separated, default "shm tcp": the collectives are split evenly over
# them, each transport run with its own seed), SOAK_MAX_COUNT (262144 elements),
# KOLO_TIMEOUT_SECONDS (60). Builds kolo_soak and kolo-run in BUILD_DIR if they are missing.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${1:-}
if [[ -z $build ]]; then
  if [[ -d $repo/build-ci ]]; then build=$repo/build-ci; else build=$repo/build; fi
fi
collectives=${SOAK_COLLECTIVES:-100000}
ranks=${SOAK_RANKS:-4}
seed=${SOAK_SEED:-42}
read -r -a transports <<<"${SOAK_TRANSPORTS:-shm tcp}"
max_count=${SOAK_MAX_COUNT:-262144}
export KOLO_TIMEOUT_SECONDS=${KOLO_TIMEOUT_SECONDS:-60}

if [[ ! -f $build/CMakeCache.txt ]]; then
  cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
soak=$(find "$build" -name kolo_soak -type f -perm -u+x | head -1)
run=$(find "$build" -name kolo-run -type f -perm -u+x | head -1)
if [[ -z $soak || -z $run ]]; then
  cmake --build "$build" -j "${CI_JOBS:-2}" --target kolo_soak kolo-run
  soak=$(find "$build" -name kolo_soak -type f -perm -u+x | head -1)
  run=$(find "$build" -name kolo-run -type f -perm -u+x | head -1)
fi

per=$((collectives / ${#transports[@]}))
start=$(date +%s)
rc=0
i=0
for t in "${transports[@]}"; do
  n=$per
  ((i == ${#transports[@]} - 1)) && n=$((collectives - per * (${#transports[@]} - 1)))
  echo "==== soak: $n collectives, $ranks ranks, KOLO_TRANSPORT=$t, seed $((seed + i)) ===="
  t0=$(date +%s)
  if ! KOLO_TRANSPORT=$t "$run" -np "$ranks" --timeout 86400 "$soak" --collectives "$n" \
    --seed $((seed + i)) --max-count "$max_count"; then
    rc=1
  fi
  echo "==== soak on $t: $(($(date +%s) - t0)) s, exit $([[ $rc == 0 ]] && echo ok || echo FAILED) ===="
  i=$((i + 1))
done
echo "==== soak total: $collectives collectives in $(($(date +%s) - start)) s: $([[ $rc == 0 ]] && echo '0 wrong' || echo FAILED) ===="
exit "$rc"
