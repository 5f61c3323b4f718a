#!/usr/bin/env bash
# survive_campaign.sh — the script-size kill-and-survive campaign (not run by CTest).
#
#   tests/faults/survive_campaign.sh BUILD_DIR [TRIALS]
#
# Runs TRIALS (default 75) random kill-and-shrink trials per transport (shm, tcp) of
# faults/shrink (tests/faults/test_shrink.cpp: survivors shrink and run 100 exact operations)
# and TRIALS per transport of faults/elastic_train (tests/faults/test_elastic_train.cpp:
# run_elastic training that must end bit-equal to its replay): 4 x TRIALS in all, 300 by
# default, with the same checks as CI. The base seed is printed first; KOLO_FAULT_SEED=<it>
# replays the run. Every failing trial is printed with its parameters and the ranks' output.
#
# Exit status: 0 when every trial passed, 1 otherwise.
set -uo pipefail
build=${1:?usage: survive_campaign.sh BUILD_DIR [TRIALS]}
trials=${2:-75}
shrink=$build/tests/faults/kolo_shrink_tests
elastic=$build/tests/faults/kolo_elastic_train_tests
for exe in "$shrink" "$elastic"; do
  [[ -x $exe ]] || { echo "survive_campaign: $exe not built (cmake --build $build)" >&2; exit 2; }
done

seed=${KOLO_FAULT_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
export KOLO_FAULT_SEED=$seed KOLO_SHRINK_TRIALS=$trials KOLO_ELASTIC_TRAIN_TRIALS=$trials
echo "survive_campaign: seed $seed, $trials trials per transport and suite ($((4 * trials)) in all)"
failed=0
start=$SECONDS
"$shrink" --test-case="*SIGKILLed*" || failed=1
echo "survive_campaign: shrink done at $((SECONDS - start)) s"
"$elastic" --test-case="*SIGKILLed*" || failed=1
echo "survive_campaign: elastic_train done at $((SECONDS - start)) s"
if ((failed)); then
  echo "survive_campaign: FAILED (seed $seed)"
  exit 1
fi
echo "survive_campaign: all $((4 * trials)) trials passed in $((SECONDS - start)) s"
