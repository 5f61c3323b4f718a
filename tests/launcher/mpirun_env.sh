#!/usr/bin/env bash
# mpirun_env.sh — a plain kolo program (Communicator<>::from_env(), no MPI in it) under a real
# mpirun, the way a newcomer tries it first (issue 17, item 2):
#
#   mpirun_env.sh MPIEXEC PROBE [MPIEXEC_FLAGS...]   (Open MPI's flags by default)
#
#   1. mpirun -np 2 without any KOLO_* (or torchrun) variable: every rank fails with the one
#      message that says what to do (MpiTransport, or kolo-run) — not "KOLO_STORE is not set"
#      followed by "KOLO_SECRET is not set" — and mpirun exits non-zero;
#   2. mpirun -np 1: a single-rank job (size 1), whose allreduce returns the rank's own values;
#   3. the multi-machine recipe of docs/multihost.md: mpirun -np 3 with -x KOLO_SECRET,
#      MASTER_ADDR, MASTER_PORT (rank 0 hosts the store): the allreduce is exact on every rank.
# PROBE is launcher_probe; its allreduce checks every element itself and prints the sums.
set -euo pipefail
mpiexec=$1 probe=$2
shift 2
flags=("$@")
# Open MPI needs to be told that root, oversubscription (2 cores, 3 ranks) and shared memory are
# intended (the flags of tests/mpi); other MPIs get what the caller passes.
if ((${#flags[@]} == 0)) && "$mpiexec" --version 2>/dev/null | grep -q "Open MPI\|OpenRTE"; then
  flags=(--oversubscribe --allow-run-as-root --bind-to none --mca btl self,vader)
fi

# Nothing of an enclosing job may leak in: the point is an environment without kolo's variables.
for v in $(env | sed -n 's/^\(KOLO_[A-Z0-9_]*\)=.*/\1/p'); do unset "$v"; done
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
export KOLO_TIMEOUT_SECONDS=60 # a knob, not a launcher variable
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

failures=0
ok() { echo "mpirun_env: ok: $*"; }
fail() {
  echo "mpirun_env: FAILED: $*" >&2
  failures=$((failures + 1))
}
run() { # output file, then the mpirun arguments
  local out=$1 rc=0
  shift
  timeout 120 "$mpiexec" "${flags[@]}" "$@" >"$out" 2>&1 || rc=$?
  sed 's/^/    | /' "$out"
  return "$rc"
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# --- 1 ---
rc=0
run "$work/1" -np 2 "$probe" allreduce 10 || rc=$?
((rc != 0)) && ok "1: mpirun exits non-zero ($rc)" || fail "1: mpirun exited 0"
want="allreduce failed: started by mpirun (OMPI_COMM_WORLD_SIZE=2) without a kolo rendezvous"
n=$(grep -cF "$want" "$work/1" || true)
((n == 2)) && ok "1: both ranks name the cause" || fail "1: $n rank(s) printed '$want'"
for what in MpiTransport kolo-run; do
  grep -qF "$what" "$work/1" && ok "1: the message names $what" || fail "1: no '$what' in the message"
done
for wrong in "KOLO_STORE is not set" "KOLO_SECRET is not set" "KOLO_SIZE is not set"; do
  grep -qF "$wrong" "$work/1" && fail "1: misleading '$wrong'" || ok "1: no '$wrong'"
done

# --- 2 ---
rc=0
run "$work/2" -np 1 "$probe" env allreduce 10 || rc=$?
((rc == 0)) && ok "2: mpirun -np 1 exits 0" || fail "2: exit code $rc"
grep -qxF "allreduce ok n=10 int64[0]=1 int64[n-1]=10 float32[n-1]=4.000000" "$work/2" &&
  ok "2: a single-rank job: the allreduce returns the rank's values" || fail "2: no single-rank allreduce"

# --- 3: the recipe ---
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
KOLO_SECRET=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
export KOLO_SECRET
rc=0
run "$work/3" -np 3 -x KOLO_SECRET -x KOLO_TIMEOUT_SECONDS -x MASTER_ADDR=127.0.0.1 \
  -x "MASTER_PORT=$port" "$probe" allreduce 1000 || rc=$?
((rc == 0)) && ok "3: the recipe exits 0" || fail "3: exit code $rc"
n=$(grep -cxF "allreduce ok n=1000 int64[0]=6 int64[n-1]=6000 float32[n-1]=6.000000" "$work/3" || true)
((n == 3)) && ok "3: 3 ranks with exact sums" || fail "3: $n of 3 ranks reported the exact allreduce"

if ((failures > 0)); then
  echo "mpirun_env: $failures check(s) FAILED" >&2
  exit 1
fi
echo "mpirun_env: all checks passed"
