#!/usr/bin/env bash
# keyed_hosts.sh — several "hosts" on one machine without root: ranks get different host keys.
#
#   keyed_hosts.sh KOLO_RUN WORKER LAYOUT [WORKER_ARGS...]
#
# LAYOUT lists ranks per host, e.g. "3,3" (2 hosts x 3 ranks) or "3,2" (uneven). kolo-run starts
# every rank on this machine; each rank is started through this script again ("--rank" mode),
# which sets KOLO_HOST_KEY to its host's name and removes the launcher's local/cross ranks, so
# kolo derives the layout from the host keys as it would on real hosts. With the routed
# transport, ranks of one key share memory and ranks of different keys talk TCP (loopback).
# Network namespaces (routed_hosts.sh) are the real thing; this runs anywhere, also in CI
# without CAP_SYS_ADMIN.
set -euo pipefail

if [[ ${1:-} == --rank ]]; then
  layout=$2
  shift 2
  rank=${KOLO_RANK:?KOLO_RANK is not set}
  host=0
  first=0
  IFS=, read -ra per_host <<<"$layout"
  for n in "${per_host[@]}"; do
    if ((rank < first + n)); then break; fi
    first=$((first + n))
    host=$((host + 1))
  done
  export KOLO_HOST_KEY="keyed-h${host}"
  unset KOLO_LOCAL_RANK KOLO_LOCAL_SIZE KOLO_CROSS_RANK KOLO_CROSS_SIZE
  exec "$@"
fi

kolo_run=$1 worker=$2 layout=$3
shift 3
[[ $layout =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || {
  echo "keyed_hosts.sh: LAYOUT '$layout' must be ranks per host, e.g. 3,3" >&2
  exit 2
}
np=0
IFS=, read -ra per_host <<<"$layout"
for n in "${per_host[@]}"; do np=$((np + n)); done
echo "keyed_hosts: $np ranks on ${#per_host[@]} host keys ($layout)"
KOLO_TRANSPORT=${KOLO_TRANSPORT:-routed} KOLO_TIMEOUT_SECONDS=${KOLO_TIMEOUT_SECONDS:-120} \
  "$kolo_run" -np "$np" --timeout 280 --grace 5 \
  "$0" --rank "$layout" "$worker" --no-intro=true "$@"
