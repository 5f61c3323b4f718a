#!/usr/bin/env bash
# netns.sh — network namespaces as the "hosts" of multi-host tests, on one machine.
#
# Each namespace PREFIX-hI has its own network stack, so kolo sees a different host key per
# namespace and must use TCP (not shared memory) between them, as between real hosts. All
# namespaces hang off one bridge in the root namespace:
#
#   root namespace:  PREFIX-br  10.77.0.1/24   (a launcher-hosted store on 0.0.0.0 is reachable here)
#   PREFIX-hI:       eth0       10.77.0.(10+I)/24, lo up, default route via 10.77.0.1
#
# The bridge only connects our own namespaces: nothing is NATed or forwarded beyond it
# (ip_forward is left alone), so test traffic cannot leak onto the machine's real network.
#
# Usage:
#   netns.sh check                    exit 0 if namespaces can be made here, else say why, exit 77
#                                     (CTest: SKIP_RETURN_CODE 77); in CI (CI set) exit 1 instead:
#                                     CI runs as root, where namespaces work (tests/common/skip.sh)
#   netns.sh up PREFIX N              create bridge and N namespaces (tears down leftovers first)
#   netns.sh down PREFIX N            remove them (also any namespaces beyond N left by older runs)
#   netns.sh limit PREFIX N RATE [BURST]
#                                     token-bucket limit each host's link in both directions
#                                     (tc tbf; RATE like 100mbit; RATE "none" removes the limit)
#   netns.sh exec PREFIX I CMD...     run CMD inside PREFIX-hI
#   netns.sh selftest                 up 2 hosts, check TCP between them and to the bridge, down
#
# Environment: NETNS_SUBNET (default 10.77.0) — the /24 to use, for two test runs side by side.
set -euo pipefail

readonly SUBNET="${NETNS_SUBNET:-10.77.0}"
# shellcheck source=../common/skip.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/../common/skip.sh"

die() {
  echo "netns.sh: $*" >&2
  exit 1
}

have() { command -v "$1" >/dev/null 2>&1; }

usage() {
  sed -n '/^# Usage:/,/^# Environment/p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# Interface names are limited to 15 characters: PREFIX-v<I> must fit.
check_args() {
  local prefix=$1 n=$2
  [[ $prefix =~ ^[A-Za-z][A-Za-z0-9_-]{0,9}$ ]] ||
    die "PREFIX '$prefix' must be 1-10 characters [A-Za-z0-9_-], starting with a letter"
  if ! [[ $n =~ ^[0-9]+$ ]] || ((n < 1 || n > 200)); then die "N '$n' must be 1..200"; fi
  [[ $SUBNET =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] ||
    die "NETNS_SUBNET '$SUBNET' must be the first three octets, e.g. 10.77.0"
}

cmd_check() {
  if [[ $(id -u) -ne 0 ]]; then
    kolo_skip no-netns "netns.sh: network namespaces need root (running as uid $(id -u))"
  fi
  if ! have ip; then
    kolo_skip no-netns "netns.sh: the 'ip' command (iproute2) is not installed"
  fi
  if ! ip netns list >/dev/null 2>&1; then
    kolo_skip no-netns "netns.sh: 'ip netns' does not work here: $(ip netns list 2>&1 | head -1)"
  fi
  # Root inside an unprivileged container can list but not create: try it for real.
  local probe="knsprobe$$"
  if ! ip netns add "$probe" 2>/dev/null; then
    kolo_skip no-netns "netns.sh: cannot create a network namespace (no CAP_SYS_ADMIN?)"
  fi
  ip netns delete "$probe"
  if ! ip link add "$probe" type bridge 2>/dev/null; then
    kolo_skip no-netns "netns.sh: cannot create a bridge (no bridge support in this kernel?)"
  fi
  ip link delete "$probe"
  return 0
}

# Firewalls on CI machines (Docker's FORWARD policy DROP, hardened INPUT chains) would drop
# namespace-to-namespace frames, which br_netfilter passes through iptables, and namespace-to-
# bridge packets. Accept exactly our bridge's traffic, first in the chains; `down` removes it.
ipt_rules() {
  local br=$1
  printf '%s\n' "FORWARD -i $br -o $br -j ACCEPT" "INPUT -i $br -j ACCEPT"
}

open_firewall() {
  local br=$1 rule
  if have iptables; then
    while read -r rule; do
      # shellcheck disable=SC2086 # the rule is a list of words on purpose
      iptables -C $rule 2>/dev/null || iptables -I ${rule/ / 1 }
    done < <(ipt_rules "$br")
    return 0
  fi
  # nftables only: an accept in a table of ours cannot override another table's drop, so when
  # br_netfilter would hand bridged frames to a forward hook that exists, keep them out of it.
  # (The ruleset goes through a variable: `nft | grep -q` fails under pipefail when grep exits
  # early and nft gets SIGPIPE.)
  local knob=/proc/sys/net/bridge/bridge-nf-call-iptables ruleset=""
  have nft && ruleset=$(nft list ruleset 2>/dev/null || true)
  if [[ -r $knob && $(<"$knob") == 1 && $ruleset == *"hook forward"* ]]; then
    echo "netns.sh: nftables has a forward hook and br_netfilter is on:" \
      "setting net.bridge.bridge-nf-call-iptables=0 so bridged test traffic is not filtered" >&2
    sysctl -qw net.bridge.bridge-nf-call-iptables=0
  fi
  if grep -q 'hook input.*policy drop' <<<"$ruleset"; then
    echo "netns.sh: warning: an nftables input chain drops by default;" \
      "namespaces may not reach $SUBNET.1 (accept iifname \"$br\" there)" >&2
  fi
}

close_firewall() {
  local br=$1 rule
  have iptables || return 0
  while read -r rule; do
    # shellcheck disable=SC2086
    while iptables -C $rule 2>/dev/null; do iptables -D $rule; done
  done < <(ipt_rules "$br")
}

cmd_down() {
  local prefix=$1 n=$2 ns i
  check_args "$prefix" "$n"
  # Every namespace of this prefix, also beyond N (a larger earlier run), and hI <= N.
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${prefix}-h[0-9]+$" || true); do
    ip netns delete "$ns" 2>/dev/null || true
  done
  for ((i = 1; i <= n; i++)); do
    ip netns delete "${prefix}-h${i}" 2>/dev/null || true
    ip link delete "${prefix}-v${i}" 2>/dev/null || true  # gone with its peer's namespace, usually
  done
  ip link delete "${prefix}-br" 2>/dev/null || true
  close_firewall "${prefix}-br"
}

cmd_up() {
  local prefix=$1 n=$2 i ns veth br="${1}-br"
  check_args "$prefix" "$n"
  cmd_check
  cmd_down "$prefix" "$n"

  # Our addresses must be ours alone: another bridge on the subnet would steal the replies.
  local owner
  owner=$(ip -4 -o addr show to "${SUBNET}.0/24" 2>/dev/null | awk '{print $2}' | head -1)
  [[ -z $owner ]] ||
    die "${SUBNET}.0/24 is already used by interface $owner (another netns.sh up? set NETNS_SUBNET)"

  ip link add "$br" type bridge
  ip addr add "${SUBNET}.1/24" dev "$br"
  ip link set "$br" up
  for ((i = 1; i <= n; i++)); do
    ns="${prefix}-h${i}"
    veth="${prefix}-v${i}"
    ip netns add "$ns"
    # The peer is created inside the namespace as eth0: each "host" looks like a machine.
    ip link add "$veth" type veth peer name eth0 netns "$ns"
    ip link set "$veth" master "$br" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "${SUBNET}.$((10 + i))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" route add default via "${SUBNET}.1"
  done
  open_firewall "$br"
  for ((i = 1; i <= n; i++)); do
    echo "${prefix}-h${i} ${SUBNET}.$((10 + i))"
  done
}

cmd_limit() {
  local prefix=$1 n=$2 rate=$3 burst=${4:-1mb} i
  check_args "$prefix" "$n"
  for ((i = 1; i <= n; i++)); do
    if [[ $rate == none ]]; then
      tc qdisc del dev "${prefix}-v${i}" root 2>/dev/null || true
      ip netns exec "${prefix}-h${i}" tc qdisc del dev eth0 root 2>/dev/null || true
    else
      # Both directions: the root-side veth shapes what host I receives, eth0 what it sends.
      # The burst must hold at least rate/HZ bytes or tbf cannot reach the rate.
      tc qdisc replace dev "${prefix}-v${i}" root tbf rate "$rate" burst "$burst" latency 50ms
      ip netns exec "${prefix}-h${i}" \
        tc qdisc replace dev eth0 root tbf rate "$rate" burst "$burst" latency 50ms
    fi
  done
}

cmd_exec() {
  local prefix=$1 i=$2
  shift 2
  exec ip netns exec "${prefix}-h${i}" "$@"
}

# A one-connection TCP server (perl-base is on every Debian system, unlike nc or socat).
serve_once() {
  local addr=$1 port=$2 reply=$3
  # shellcheck disable=SC2016 # perl code, expanded by perl
  timeout 20 perl -MIO::Socket::INET -e '
    my $s = IO::Socket::INET->new(LocalAddr => $ARGV[0], LocalPort => $ARGV[1], Listen => 4,
                                  ReuseAddr => 1) or die "listen $ARGV[0]:$ARGV[1]: $!\n";
    my $c = $s->accept or die "accept: $!\n";
    print $c "$ARGV[2]\n";
    close $c;' "$addr" "$port" "$reply"
}

# Connects (retrying while the server starts) and prints the line the server sent.
fetch_line() {
  local addr=$1 port=$2 try
  for ((try = 0; try < 50; try++)); do
    # shellcheck disable=SC2016 # expanded by the inner bash
    if timeout 5 bash -c 'exec 3<>"/dev/tcp/$0/$1" && IFS= read -r line <&3 && echo "$line"' \
      "$addr" "$port" 2>/dev/null; then
      return 0
    fi
    sleep 0.1
  done
  return 1
}

expect_line() {
  local what=$1 got=$2 want=$3
  if [[ $got == "$want" ]]; then
    echo "ok: $what"
  else
    echo "FAILED: $what (got '$got', want '$want')" >&2
    return 1
  fi
}

cmd_selftest() {
  cmd_check
  local failed=0 got prefix
  prefix="knst$$"
  prefix=${prefix:0:10}
  SELFTEST_PREFIX=$prefix  # global: the EXIT trap runs after this function's locals are gone
  trap 'cmd_down "$SELFTEST_PREFIX" 2' EXIT
  cmd_up "$prefix" 2 >/dev/null

  # host 2 -> host 1, across the bridge.
  ip netns exec "${prefix}-h1" bash -c "$(declare -f serve_once); serve_once ${SUBNET}.11 47001 from-h1" &
  got=$(ip netns exec "${prefix}-h2" bash -c "$(declare -f fetch_line); fetch_line ${SUBNET}.11 47001") || true
  wait || true
  expect_line "TCP ${prefix}-h2 -> ${prefix}-h1" "$got" from-h1 || failed=1

  # host 1 -> a server in the root namespace listening on 0.0.0.0, as kolo-run's store does.
  # The root namespace is shared with every other test: a fixed port inside the ephemeral range
  # (32768-60999) can be taken by anyone's connection, so pick one below it, per process.
  local root_port=$((20000 + $$ % 10000))
  serve_once 0.0.0.0 "$root_port" from-root &
  got=$(ip netns exec "${prefix}-h1" bash -c "$(declare -f fetch_line); fetch_line ${SUBNET}.1 $root_port") || true
  wait || true
  expect_line "TCP ${prefix}-h1 -> ${SUBNET}.1 (root namespace, 0.0.0.0)" "$got" from-root || failed=1

  # root namespace -> host 2.
  ip netns exec "${prefix}-h2" bash -c "$(declare -f serve_once); serve_once 0.0.0.0 47003 from-h2" &
  got=$(fetch_line "${SUBNET}.12" 47003) || true
  wait || true
  expect_line "TCP root -> ${prefix}-h2" "$got" from-h2 || failed=1

  # Namespaces are separate hosts: host 1's loopback is not host 2's.
  ip netns exec "${prefix}-h1" bash -c "$(declare -f serve_once); serve_once 127.0.0.1 47004 lo" &
  if ip netns exec "${prefix}-h2" timeout 2 bash -c 'exec 3<>/dev/tcp/127.0.0.1/47004' 2>/dev/null; then
    echo "FAILED: ${prefix}-h2 reached ${prefix}-h1's loopback" >&2
    failed=1
  else
    echo "ok: loopback is per namespace"
  fi
  got=$(ip netns exec "${prefix}-h1" bash -c "$(declare -f fetch_line); fetch_line 127.0.0.1 47004") || true
  wait || true
  expect_line "TCP ${prefix}-h1 -> its own loopback" "$got" lo || failed=1

  return "$failed"
}

main() {
  [[ $# -ge 1 ]] || usage
  local cmd=$1
  shift
  case $cmd in
    check) [[ $# -eq 0 ]] || usage; cmd_check ;;
    up) [[ $# -eq 2 ]] || usage; cmd_up "$@" ;;
    down) [[ $# -eq 2 ]] || usage; cmd_down "$@" ;;
    limit) [[ $# -eq 3 || $# -eq 4 ]] || usage; cmd_limit "$@" ;;
    exec) [[ $# -ge 3 ]] || usage; cmd_exec "$@" ;;
    selftest) [[ $# -eq 0 ]] || usage; cmd_selftest ;;
    -h | --help | help) usage ;;
    *) usage ;;
  esac
}

main "$@"
