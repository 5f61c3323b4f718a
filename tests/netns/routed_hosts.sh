#!/usr/bin/env bash
# routed_hosts.sh — the collective matrix across several "hosts" made of network namespaces.
#
#   routed_hosts.sh KOLO_RUN WORKER PREFIX SUBNET HOSTS RANKS_PER_HOST [WORKER_ARGS...]
#
# Brings up HOSTS namespaces on a private bridge (netns.sh), runs RANKS_PER_HOST ranks in each
# with the routed transport (shared memory inside a namespace, TCP between them), and checks
# with the worker's own assertions that the routes follow the hosts and every result is exact.
# Exit 77 (CTest skip) where namespaces cannot be made (not root, no CAP_SYS_ADMIN); in CI 1
# (netns.sh check, tests/common/skip.sh).
set -euo pipefail
kolo_run=$1 worker=$2 prefix=$3 subnet=$4 hosts=$5 per_host=$6
shift 6  # the rest goes to the worker (e.g. a doctest -tc filter)
here=$(cd "$(dirname "$0")" && pwd)
export NETNS_SUBNET=$subnet

"$here/netns.sh" check || exit $?
cleanup() { "$here/netns.sh" down "$prefix" "$hosts" >/dev/null 2>&1 || true; }
trap cleanup EXIT
"$here/netns.sh" up "$prefix" "$hosts"

spec=""
for ((i = 1; i <= hosts; i++)); do spec+="${spec:+,}${prefix}-h${i}:${per_host}"; done
np=$((hosts * per_host))
echo "routed_hosts: $np ranks on -H $spec (store on ${subnet}.1)"
KOLO_TRANSPORT=routed KOLO_TEST_EXPECT_HOSTS=$hosts KOLO_TIMEOUT_SECONDS=${KOLO_TIMEOUT_SECONDS:-120} \
  "$kolo_run" -np "$np" -H "$spec" --store-host "${subnet}.1" --timeout 280 --grace 5 \
  "$worker" --no-intro=true "$@"
