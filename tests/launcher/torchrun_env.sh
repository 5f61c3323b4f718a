#!/usr/bin/env bash
# torchrun_env.sh — docs/multihost.md's torchrun recipe for a C++ kolo program, under a real
# torchrun (torch from tests/pyenv.sh):
#
#   torchrun_env.sh PROBE
#
# torchrun's agent serves its own store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True);
# kolo's rank 0 then hosts kolo's store on MASTER_PORT + 1 by itself. The recipe needs only a
# shared KOLO_SECRET. Checked: 3 ranks, every one reports the exact allreduce (launcher_probe
# checks each element itself), with the program started as is (`--no-python PROG`), and the
# explicit-port form (`env MASTER_PORT=...`) still works.
set -euo pipefail
probe=$1
here=$(cd "$(dirname "$0")/.." && pwd)
py=$(bash "$here/pyenv.sh") || {
  echo "torchrun_env: FAILED: no Python test environment (tests/pyenv.sh)" >&2
  exit 1
}
for v in $(env | sed -n 's/^\(KOLO_[A-Z0-9_]*\)=.*/\1/p'); do unset "$v"; done
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE
# Free ports: the agent's, the one above it (kolo's by default) and another for the explicit form.
ports=$("$py" -c '
import socket
for _ in range(200):
    socks = [socket.socket() for _ in range(3)]
    try:
        socks[0].bind(("127.0.0.1", 0))
        base = socks[0].getsockname()[1]
        socks[1].bind(("127.0.0.1", base + 1))
        socks[2].bind(("127.0.0.1", 0))
    except OSError:
        continue
    print(base, socks[2].getsockname()[1])
    break')
read -r agent_port kolo_port <<<"$ports"
KOLO_SECRET=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
export KOLO_SECRET KOLO_TIMEOUT_SECONDS=60
out=$(mktemp)
# torchrun's agent makes a log directory (torchelastic_*) under TMPDIR and leaves it: give it
# one of ours, removed at the end.
tmp=$(mktemp -d)
trap 'rm -rf "$out" "$tmp"' EXIT
failed=0
for form in plain explicit-port; do
  cmd=("$probe")
  [[ $form == explicit-port ]] && cmd=(env MASTER_PORT="$kolo_port" "$probe")
  rc=0
  TMPDIR=$tmp timeout 240 "$py" -m torch.distributed.run --nnodes 1 --nproc-per-node 3 --node-rank 0 \
    --master-addr 127.0.0.1 --master-port "$agent_port" \
    --no-python "${cmd[@]}" allreduce 1000 >"$out" 2>&1 || rc=$?
  grep -v '^W[0-9]' "$out" | sed 's/^/    | /'
  n=$(grep -cxF "allreduce ok n=1000 int64[0]=6 int64[n-1]=6000 float32[n-1]=6.000000" "$out" || true)
  if ((rc == 0 && n == 3)); then
    echo "torchrun_env: ok ($form): torchrun exits 0, 3 ranks with exact sums"
  else
    echo "torchrun_env: FAILED ($form): torchrun exit code $rc, $n of 3 ranks reported the exact allreduce" >&2
    failed=1
  fi
done
exit "$failed"
