#!/usr/bin/env bash
# tests/contract/trials.sh — the error-contract programs (contract_c, contract_cpp) over many
# seeds: every program, over shm and tcp, at 3 and 4 ranks, TRIALS randomized trials per seed.
# Prints one line per run and a total; exits non-zero if any run failed.
#
#   bash tests/contract/trials.sh [BUILD_DIR] [SEEDS] [TRIALS]   (default build, 10, 100)
set -u
build=${1:-build}
seeds=${2:-10}
trials=${3:-100}
run=$build/backends/local/kolo-run
[[ -x $run ]] || { echo "trials.sh: $run not found; build kolo-run first" >&2; exit 2; }
export KOLO_TIMEOUT_SECONDS=${KOLO_TIMEOUT_SECONDS:-30}
runs=0 failed=0 total=0
for prog in "$build"/tests/contract/kolo_contract_c "$build"/tests/contract/kolo_contract_cpp; do
  [[ -x $prog ]] || { echo "trials.sh: $prog not built" >&2; exit 2; }
  for transport in shm tcp; do
    for np in 3 4; do
      for ((seed = 100; seed < 100 + seeds; ++seed)); do
        out=$(KOLO_TRANSPORT=$transport "$run" -np "$np" --timeout 300 "$prog" "$trials" "$seed" 2>&1)
        rc=$?
        passes=$(grep -c "KOLO_CONTRACT_PASS rank=" <<<"$out")
        runs=$((runs + 1))
        total=$((total + trials))
        if ((rc != 0 || passes != np)); then
          failed=$((failed + 1))
          echo "FAILED $(basename "$prog") $transport np$np seed $seed (exit $rc, $passes of $np ranks passed)"
          grep "contract_" <<<"$out" | head -5
        else
          echo "ok     $(basename "$prog") $transport np$np seed $seed: $(grep -o 'slowest.*' <<<"$out" | sort -t' ' -k4 -n | tail -1)"
        fi
      done
    done
  done
done
echo "trials.sh: $runs runs, $total trials, $failed runs failed"
((failed == 0))
