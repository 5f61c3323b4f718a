#!/usr/bin/env bash
# nightly_kill.sh — the nightly-size SIGKILL campaign (not run by CTest).
#
#   tests/faults/nightly_kill.sh BUILD_DIR [TRIALS] [PARTITIONS]
#
# Runs TRIALS (default 500) SIGKILL trials per transport — shm and tcp on this host, routed
# across two network-namespace hosts — and PARTITIONS (default 10) network-partition trials,
# with the same checks as CI (tests/faults/test_kill.cpp, test_netns_faults.cpp): every
# surviving rank raises within KOLO_TIMEOUT_SECONDS + 5 s, kolo-run names the killed rank, no
# process of the job is left, no rank hangs or computes a wrong number. Each trial draws its
# rank count, victim, kill moment and collective sequence from a seed; the run's base seed is
# printed first, and KOLO_FAULT_SEED=<it> replays the run. Parallel jobs: KOLO_FAULT_PARALLEL
# (default 3). The namespace parts are skipped (not failed) where namespaces cannot be made.
#
# Exit status: 0 when every trial passed, 1 otherwise. A summary line per transport gives the
# mean and worst detection time (kill -> last survivor's error), for docs/reliability.md.
set -uo pipefail
build=${1:?usage: nightly_kill.sh BUILD_DIR [TRIALS] [PARTITIONS]}
trials=${2:-500}
partitions=${3:-10}
here=$(cd "$(dirname "$0")" && pwd)
driver=$build/tests/faults/kolo_fault_tests
netns_driver=$build/tests/faults/kolo_netns_fault_tests
for exe in "$driver" "$netns_driver"; do
  [[ -x $exe ]] || { echo "nightly_kill: $exe not built (cmake --build $build)" >&2; exit 2; }
done

seed=${KOLO_FAULT_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
export KOLO_FAULT_SEED=$seed KOLO_FAULT_TRIALS=$trials KOLO_FAULT_TRIALS_ROUTED=$trials
export KOLO_FAULT_PARALLEL=${KOLO_FAULT_PARALLEL:-3} KOLO_FAULTS_VERBOSE=1
echo "nightly_kill: seed $seed, $trials trials per transport, $partitions partitions" \
  "($KOLO_FAULT_PARALLEL jobs at a time)"
failed=0
start=$SECONDS

"$driver" --test-case="random rank SIGKILLed in random collectives*" || failed=1

run_netns() {  # CASE PREFIX SUBNET
  "$here/netns_faults.sh" "$netns_driver" "$2" "$3" "$1" want-nft
  local rc=$?
  if [[ $rc == 77 ]]; then
    echo "nightly_kill: skipped (no network namespaces here): $1"
  elif [[ $rc != 0 ]]; then
    failed=1
  fi
}
run_netns "*SIGKILLed*" kfnkill 10.77.71
for ((i = 1; i <= partitions; i++)); do
  KOLO_FAULT_SEED=$((seed + i)) run_netns "*partition*" kfnpart 10.77.72
done

echo "nightly_kill: $((SECONDS - start)) s, $([[ $failed == 0 ]] && echo passed || echo FAILED)"
exit "$failed"
