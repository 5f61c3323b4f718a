#!/usr/bin/env bash
# netns_faults.sh — runs a case of the namespace fault driver (test_netns_faults.cpp) between
# two "hosts" made of network namespaces (tests/netns/netns.sh).
#
#   netns_faults.sh DRIVER PREFIX SUBNET CASE [nft|want-nft]
#
# DRIVER is kolo_netns_fault_tests, CASE a doctest test-case pattern. With `nft` the case needs
# nftables in the namespaces: it is installed with apt-get when missing (CI machines start fresh
# and run as root); where it still cannot be used, the case is skipped (exit 77). With
# `want-nft` it is installed the same way, but the case runs without it (and says what it left
# out). The driver learns the outcome from KOLO_NETNS_NFT. Exit 77 also
# where namespaces cannot be made (not root, no CAP_SYS_ADMIN). In CI (CI set) each of these is a
# failure instead, `want-nft` without nftables too (tests/common/skip.sh): CI runs as root and
# .ci/install-deps.sh installs nftables. Namespaces PREFIX-h1/-h2 on SUBNET.0/24 are removed on
# exit, whatever happens.
set -euo pipefail
driver=$1 prefix=$2 subnet=$3 case=$4 need_nft=${5:-}
here=$(cd "$(dirname "$0")" && pwd)
netns="$here/../netns/netns.sh"
export NETNS_SUBNET=$subnet
# shellcheck source=../common/skip.sh
source "$here/../common/skip.sh"

"$netns" check || exit $?

# nftables works when a table can be made inside a namespace (the kernel may lack nf_tables).
nft_works() {
  command -v nft >/dev/null 2>&1 || return 1
  local probe="knft$$"
  ip netns add "$probe" 2>/dev/null || return 1
  local ok=0
  ip netns exec "$probe" nft add table inet kolo_probe 2>/dev/null || ok=1
  ip netns delete "$probe" 2>/dev/null || true
  return $ok
}

nft_ok=0
if ! nft_works && ! command -v nft >/dev/null 2>&1 && [[ -n $need_nft ]] &&
  command -v apt-get >/dev/null 2>&1; then
  echo "netns_faults: installing nftables" >&2
  DEBIAN_FRONTEND=noninteractive timeout 120 apt-get install -y -q nftables >/dev/null 2>&1 ||
    { timeout 120 apt-get update -q >/dev/null 2>&1 &&
      DEBIAN_FRONTEND=noninteractive timeout 120 apt-get install -y -q nftables >/dev/null 2>&1; } || true
fi
if nft_works; then nft_ok=1; fi
if [[ $need_nft == nft && $nft_ok == 0 ]]; then
  kolo_skip no-nftables "netns_faults: nftables is not usable in network namespaces here"
fi
if [[ $need_nft == want-nft && $nft_ok == 0 ]] && ! kolo_skip_allowed no-nftables; then
  kolo_skip no-nftables "netns_faults: nftables is not usable here: $case would run without it"
fi

cleanup() { "$netns" down "$prefix" 2 >/dev/null 2>&1 || true; }
trap cleanup EXIT
"$netns" up "$prefix" 2 >/dev/null

KOLO_NETNS_PREFIX=$prefix KOLO_NETNS_SUBNET=$subnet KOLO_NETNS_NFT=$nft_ok \
  "$driver" --test-case="$case"
