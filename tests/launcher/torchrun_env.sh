#!/usr/bin/env bash
# torchrun_env.sh — docs/multihost.md's torchrun recipe for a C++ kolo program, under a real
# torchrun (torch from tests/pyenv.sh):
#
#   torchrun_env.sh PROBE
#
# torchrun's agent serves its own store on MASTER_PORT, where kolo's rank 0 would host kolo's;
# the recipe gives kolo another port (`--no-python env MASTER_PORT=...`) and a shared
# KOLO_SECRET. Checked: 3 ranks, every one reports the exact allreduce (launcher_probe checks
# each element itself).
set -euo pipefail
probe=$1
here=$(cd "$(dirname "$0")/.." && pwd)
py=$(bash "$here/pyenv.sh") || {
  echo "torchrun_env: FAILED: no Python test environment (tests/pyenv.sh)" >&2
  exit 1
}
for v in $(env | sed -n 's/^\(KOLO_[A-Z0-9_]*\)=.*/\1/p'); do unset "$v"; done
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE
ports=$("$py" -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))')
read -r agent_port kolo_port <<<"$ports"
KOLO_SECRET=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
export KOLO_SECRET KOLO_TIMEOUT_SECONDS=60
out=$(mktemp)
trap 'rm -f "$out"' EXIT
rc=0
timeout 240 "$py" -m torch.distributed.run --nnodes 1 --nproc-per-node 3 --node-rank 0 \
  --master-addr 127.0.0.1 --master-port "$agent_port" \
  --no-python env MASTER_PORT="$kolo_port" "$probe" allreduce 1000 >"$out" 2>&1 || rc=$?
grep -v '^W[0-9]' "$out" | sed 's/^/    | /'
n=$(grep -cxF "allreduce ok n=1000 int64[0]=6 int64[n-1]=6000 float32[n-1]=6.000000" "$out" || true)
if ((rc == 0 && n == 3)); then
  echo "torchrun_env: ok: torchrun exits 0, 3 ranks with exact sums"
  exit 0
fi
echo "torchrun_env: FAILED: torchrun exit code $rc, $n of 3 ranks reported the exact allreduce" >&2
exit 1
