#!/usr/bin/env bash
# ssh_hosts.sh — kolo-run over ssh to two "machines": network namespaces (netns.sh), each with a
# real sshd (Debian's openssh-server) that this script starts with a host key, a user key and a
# known_hosts file it generates. The ranks reach kolo-run's store through the bridge, as ranks on
# other machines would through the network.
#
#   ssh_hosts.sh KOLO_RUN PROBE PREFIX SUBNET
#
# PROBE is tests/launcher's launcher_probe. What it checks, each on the ranks' own output and on
# the process table:
#   1. 2 hosts x 2 ranks: every rank's contract (host key, local/cross rank), the store reached at
#      the address the ssh connection came from (no --store-host), each host's ranks in that
#      host's namespace, and an allreduce of 1 and 1000003 elements whose values are exact;
#   2. a rank on this machine plus ssh ranks on both hosts (--store-host, KOLO_RUN_SSH instead of
#      --ssh, -x): the allreduce again, and the forwarded variables;
#   3. while 4 ranks run: the job secret is in no process's argument list (every /proc/*/cmdline:
#      kolo-run, the ssh clients, the remote shells, the ranks); then SIGINT to kolo-run reaches
#      every remote rank (exit 130, no SIGTERM escalation) and no process is left;
#   4. one remote rank SIGKILLed: exit 137, kolo-run names it, the other ranks on both hosts and
#      the helper processes they started are gone;
#   5. kolo-run itself SIGKILLed (its ssh connections drop): every remote rank and helper is gone;
#   6. a program missing on the hosts (127) and a host whose sshd does not answer (255);
#   7. 16 ranks on one host, whose sshd has the default MaxStartups (10:30:100, which drops
#      some connections beyond 10 unauthenticated ones): all start, the store sees all 12.
# "No process left" means: no process whose command line holds the run's unique marker.
#
# Needs root (namespaces, sshd) and /usr/sbin/sshd. Outside CI a missing prerequisite skips the
# test (exit 77); in CI (CI set) it fails (tests/common/skip.sh): .ci/install-deps.sh installs
# openssh-server.
set -euo pipefail
kolo_run=$1 probe=$2 prefix=$3 subnet=$4
here=$(cd "$(dirname "$0")" && pwd)
export NETNS_SUBNET=$subnet

# shellcheck source=../common/skip.sh
source "$here/../common/skip.sh"

say() { echo "ssh_hosts: $*"; }
# In CI a failure (tests/common/skip.sh): .ci/install-deps.sh installs openssh-server.
missing() { kolo_skip missing-dependency "ssh_hosts: $*"; }

[[ -x /usr/sbin/sshd ]] || missing "/usr/sbin/sshd is not installed (Debian package openssh-server)"
for tool in ssh ssh-keygen; do
  command -v "$tool" >/dev/null || missing "$tool is not installed (Debian package openssh-client)"
done
if ! why=$("$here/netns.sh" check 2>&1); then missing "network namespaces cannot be made here: $why"; fi

failures=0
fail() {
  echo "ssh_hosts: FAILED: $*" >&2
  failures=$((failures + 1))
}
ok() { echo "ssh_hosts: ok: $*"; }

work=$(mktemp -d /tmp/kolo-ssh-test.XXXXXX)
marker_base="kolo-ssh-test-$$"

# Every process whose command line holds $1, as "PID CMDLINE" lines (this script's own excluded).
processes_with() {
  local f pid cmd
  for f in /proc/[0-9]*/cmdline; do
    pid=${f#/proc/}
    pid=${pid%/cmdline}
    [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
    cmd=$(tr '\0' ' ' 2>/dev/null <"$f") || continue
    [[ $cmd == *"$1"* ]] && echo "$pid $cmd"
  done
  return 0
}

cleanup() {
  local pid
  # Whatever a failed case left behind (only processes carrying this run's marker), then sshd.
  for pid in $(processes_with "$marker_base" | awk '{print $1}'); do kill -9 "$pid" 2>/dev/null || true; done
  for pidfile in "$work"/sshd*.pid; do
    [[ -f $pidfile ]] && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  "$here/netns.sh" down "$prefix" 2 >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

"$here/netns.sh" up "$prefix" 2 >/dev/null
h1=$subnet.11
h2=$subnet.12
store_ip=$subnet.1

# --- keys and two sshds, one per namespace ---
ssh-keygen -q -t ed25519 -N '' -C kolo-ssh-test -f "$work/id"
cp "$work/id.pub" "$work/authorized_keys"
: >"$work/known_hosts"
mkdir -p /run/sshd && chmod 0755 /run/sshd # sshd's privilege-separation directory
for i in 1 2; do
  addr=$subnet.1$i
  ssh-keygen -q -t ed25519 -N '' -C "host$i" -f "$work/host$i"
  echo "$addr $(cut -d' ' -f1,2 "$work/host$i.pub")" >>"$work/known_hosts"
  cat >"$work/sshd$i.conf" <<EOF
ListenAddress $addr
Port 22
HostKey $work/host$i
PidFile $work/sshd$i.pid
AuthorizedKeysFile $work/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
X11Forwarding no
PrintMotd no
EOF
  /usr/sbin/sshd -t -f "$work/sshd$i.conf"
  ip netns exec "$prefix-h$i" /usr/sbin/sshd -f "$work/sshd$i.conf" -E "$work/sshd$i.log"
done

ssh_cmd="ssh -F /dev/null -i $work/id -o IdentitiesOnly=yes -o UserKnownHostsFile=$work/known_hosts -o StrictHostKeyChecking=yes"
for addr in "$h1" "$h2"; do
  up=0
  for _ in $(seq 100); do
    # shellcheck disable=SC2086 # the ssh command is a list of words on purpose
    if $ssh_cmd -o BatchMode=yes "$addr" true 2>/dev/null; then up=1 && break; fi
    sleep 0.1
  done
  if ((up == 0)); then
    cat "$work"/sshd*.log >&2 || true
    echo "ssh_hosts: FAILED: sshd on $addr does not accept the test key" >&2
    exit 1
  fi
done
say "sshd up on $h1 ($prefix-h1) and $h2 ($prefix-h2)"

# Waits until no process carries marker $1 (the remote side may take a moment after kolo-run
# exits: sshd notices the closed connection). Fails after 10 s, listing what is left.
expect_none_left() {
  local marker=$1 what=$2 left=""
  for _ in $(seq 100); do
    left=$(processes_with "$marker")
    [[ -z $left ]] && break
    sleep 0.1
  done
  if [[ -n $left ]]; then
    fail "$what: processes left:"$'\n'"$left"
  else
    ok "$what: no process left"
  fi
}

# The "probe KEY=VALUE ..." field $2 of rank $1 in file $3.
field() {
  sed -n "s/^\[$1\] probe .*\<$2=\([^ ]*\).*/\1/p" "$3" | head -1
}

expect_line() { # file, exact line, what
  if grep -qxF -- "$2" "$1"; then ok "$3"; else fail "$3: no line '$2'"; fi
}

expect_in() { # file, text, what
  if grep -qF -- "$2" "$1"; then ok "$3"; else fail "$3: '$2' not in $1"; fi
}

expect_not_in() {
  if grep -qF -- "$2" "$1"; then fail "$3: '$2' in $1"; else ok "$3"; fi
}

show() { # the output of a case, for the log
  sed 's/^/    | /' "$1"
}

my_netns=$(stat -L -c %i /proc/self/ns/net)

# --- 1. two hosts x two ranks, store address from the ssh connection ---
m="$marker_base-1"
out=$work/1.out err=$work/1.err
set +e
"$kolo_run" -np 4 -H "$h1:2,$h2:2" --ssh "$ssh_cmd" --timeout 120 \
  "$probe" env allreduce 1 allreduce 1000003 line "$m" >"$out" 2>"$err"
rc=$?
set -e
show "$out"
show "$err"
if ((rc == 0)); then ok "1: 4 ranks on 2 ssh hosts exit 0"; else fail "1: exit code $rc"; fi
port=$(field 0 KOLO_STORE "$out")
port=${port##*:}
for r in 0 1 2 3; do
  host=$h1 local=$r cross=0
  ((r >= 2)) && host=$h2 local=$((r - 2)) cross=1
  got="$(field $r KOLO_HOST_KEY "$out") $(field $r KOLO_LOCAL_RANK "$out")/$(field $r KOLO_LOCAL_SIZE "$out") $(field $r KOLO_CROSS_RANK "$out")/$(field $r KOLO_CROSS_SIZE "$out") $(field $r KOLO_STORE "$out")"
  want="$host $local/2 $cross/2 $store_ip:$port"
  if [[ $got == "$want" ]]; then ok "1: rank $r contract ($want)"; else fail "1: rank $r contract '$got', want '$want'"; fi
  expect_line "$out" "[$r] allreduce ok n=1 int64[0]=10 int64[n-1]=10 float32[n-1]=3.000000" "1: rank $r allreduce of 1 element"
  expect_line "$out" "[$r] allreduce ok n=1000003 int64[0]=10 int64[n-1]=10000030 float32[n-1]=5.000000" "1: rank $r allreduce of 1000003 elements"
done
ns_of() { field "$1" NETNS "$out"; }
if [[ $(ns_of 0) == "$(ns_of 1)" && $(ns_of 2) == "$(ns_of 3)" && $(ns_of 0) != "$(ns_of 2)" &&
  $(ns_of 0) != "$my_netns" && $(ns_of 2) != "$my_netns" && -n $(ns_of 0) ]]; then
  ok "1: ranks ran in their host's namespace ($(ns_of 0), $(ns_of 2); kolo-run in $my_netns)"
else
  fail "1: namespaces of ranks 0-3: $(ns_of 0) $(ns_of 1) $(ns_of 2) $(ns_of 3), kolo-run's $my_netns"
fi
expect_none_left "$m" "1"

# --- 2. this machine + both hosts; KOLO_RUN_SSH, --store-host, -x and KOLO_* forwarding ---
m="$marker_base-2"
out=$work/2.out err=$work/2.err
set +e
KOLO_RUN_SSH=$ssh_cmd KOLO_SSH_TEST_KNOB=knob SSH_TEST_BY_NAME="by name" \
  "$kolo_run" -np 4 -H "localhost:1,$h1:2,$h2:1" --store-host "$store_ip" --timeout 120 \
  -x SSH_TEST_BY_NAME -x SSH_TEST_SET="a 'quoted' value" \
  "$probe" env allreduce 65537 getenv KOLO_SSH_TEST_KNOB getenv SSH_TEST_BY_NAME \
  getenv SSH_TEST_SET line "$m" >"$out" 2>"$err"
rc=$?
set -e
show "$out"
show "$err"
if ((rc == 0)); then ok "2: 1 local + 3 ssh ranks exit 0"; else fail "2: exit code $rc"; fi
for r in 0 1 2 3; do
  expect_line "$out" "[$r] allreduce ok n=65537 int64[0]=10 int64[n-1]=655370 float32[n-1]=4.000000" "2: rank $r allreduce"
  expect_line "$out" "[$r] getenv KOLO_SSH_TEST_KNOB=knob" "2: rank $r has kolo-run's KOLO_* variables"
  expect_line "$out" "[$r] getenv SSH_TEST_BY_NAME=by name" "2: rank $r has -x NAME"
  expect_line "$out" "[$r] getenv SSH_TEST_SET=a 'quoted' value" "2: rank $r has -x NAME=VALUE"
done
[[ $(field 0 KOLO_HOST_KEY "$out") == localhost && $(field 0 NETNS "$out") == "$my_netns" ]] &&
  ok "2: rank 0 ran on this machine" || fail "2: rank 0 not on this machine"
[[ $(field 3 KOLO_CROSS_RANK "$out")/$(field 3 KOLO_CROSS_SIZE "$out") == 2/3 ]] &&
  ok "2: three hosts" || fail "2: rank 3 cross rank/size $(field 3 KOLO_CROSS_RANK "$out")/$(field 3 KOLO_CROSS_SIZE "$out")"
expect_none_left "$m" "2"

# Starts kolo-run in the background (stdout $out, stderr $err; pid in $job) and waits until all
# 4 ranks printed "ready".
start_and_wait_ready() {
  "$kolo_run" "$@" >"$out" 2>"$err" &
  job=$!
  for _ in $(seq 300); do
    (($(grep -c '^\[[0-9]\] ready$' "$out" || true) == 4)) && return 0
    kill -0 "$job" 2>/dev/null || break
    sleep 0.1
  done
  show "$out"
  show "$err"
  fail "the ranks did not all report ready"
  kill -9 "$job" 2>/dev/null || true
  return 1
}

# Waits for the background kolo-run (at most 30 s: then it is killed and the case fails).
finish() {
  local rc
  for _ in $(seq 300); do
    kill -0 "$job" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$job" 2>/dev/null; then
    fail "kolo-run did not finish within 30 s"
    kill -9 "$job"
  fi
  rc=0
  wait "$job" || rc=$?
  return "$rc"
}

# --- 3. the secret in no argument list; SIGINT reaches every remote rank ---
m="$marker_base-3"
out=$work/3.out err=$work/3.err
if start_and_wait_ready -np 4 -H "$h1:2,$h2:2" --ssh "$ssh_cmd" --timeout 120 \
  "$probe" env store line ready sleep 60 line "$m"; then
  secret=$(field 0 KOLO_SECRET "$out")
  if [[ ${#secret} -ne 64 ]]; then fail "3: no 64-character secret in rank 0's output"; fi
  holders=$(processes_with "$secret")
  [[ -z $holders ]] && ok "3: the secret is in no process's command line" ||
    fail "3: the secret is in the command line of:"$'\n'"$holders"
  # ... and the scan did see the job's processes: kolo-run, 4 ssh clients, the 4 remote shells
  # (and their watchers) and the 4 ranks all carry the marker.
  procs=$(processes_with "$m")
  n_ssh=$(grep -c "^[0-9]* [^ ]*ssh -F /dev/null" <<<"$procs" || true)
  n_sh=$(grep -c "^[0-9]* /bin/sh -c .* kolo-rank " <<<"$procs" || true)
  n_rank=$(grep -c "^[0-9]* $probe " <<<"$procs" || true)
  if ((n_ssh == 4 && n_sh >= 4 && n_rank == 4)); then
    ok "3: the scan saw 4 ssh clients, $n_sh remote shells, 4 ranks"
  else
    fail "3: the scan saw $n_ssh ssh clients, $n_sh remote shells, $n_rank ranks:"$'\n'"$procs"
  fi
  for pid in $(grep "^[0-9]* [^ ]*ssh -F /dev/null" <<<"$procs" | awk '{print $1}'); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qF "$secret"; then
      fail "3: the secret is in the environment of ssh client $pid"
    fi
  done
  sent=$SECONDS
  kill -INT "$job"
  rc=0
  finish || rc=$?
  show "$err"
  say "3: kolo-run exited $((SECONDS - sent)) s after SIGINT"
  [[ $rc == 130 ]] && ok "3: exit 130 after SIGINT" || fail "3: exit code $rc after SIGINT, want 130"
  expect_in "$err" "kolo-run: received SIGINT; forwarding it to all ranks" "3: SIGINT forwarded"
  # The ranks died of the SIGINT itself: no escalation to SIGTERM after the grace period.
  expect_not_in "$err" "sending SIGTERM" "3: no escalation"
  expect_none_left "$m" "3"
fi

# --- 4. a remote rank SIGKILLed: every rank on every host ends, helpers included ---
m="$marker_base-4"
out=$work/4.out err=$work/4.err
set +e
"$kolo_run" -np 4 -H "$h1:2,$h2:2" --ssh "$ssh_cmd" --grace 1 --timeout 120 \
  "$probe" store spawn-sleeper 60 kill-if-rank 2 9 sleep 60 line "$m" >"$out" 2>"$err"
rc=$?
set -e
show "$out"
show "$err"
[[ $rc == 137 ]] && ok "4: exit 137 (128 + SIGKILL)" || fail "4: exit code $rc, want 137"
expect_in "$err" "kolo-run: rank 2 on $h2 killed by signal 9 (SIGKILL)" "4: kolo-run names the killed rank"
expect_in "$err" "kolo-run: sending SIGTERM to rank(s) 0, 1, 3" "4: the others are stopped"
(($(grep -c "^\[[0-3]\] sleeper " "$out" || true) == 4)) && ok "4: every rank started a helper" ||
  fail "4: not every rank reported its helper"
expect_none_left "$m" "4"

# --- 5. kolo-run SIGKILLed: the dropped ssh connections end every remote rank ---
m="$marker_base-5"
out=$work/5.out err=$work/5.err
if start_and_wait_ready -np 4 -H "$h1:2,$h2:2" --ssh "$ssh_cmd" --timeout 120 \
  "$probe" store spawn-sleeper 60 line ready sleep 60 line "$m"; then
  kill -9 "$job"
  wait "$job" 2>/dev/null || true
  expect_none_left "$m" "5: kolo-run SIGKILLed"
fi

# --- 6. what fails before the program runs ---
m="$marker_base-6"
set +e
"$kolo_run" -np 2 -H "$h1:1,$h2:1" --ssh "$ssh_cmd" --timeout 60 "/nonexistent/$m" >"$work/6a.out" 2>"$work/6a.err"
rc=$?
set -e
show "$work/6a.err"
[[ $rc == 127 ]] && ok "6: a program missing on the hosts exits 127" || fail "6: missing program: exit $rc, want 127"
expect_in "$work/6a.err" "[1] kolo-run: cannot execute /nonexistent/$m on $h2" "6: the host says what is missing"
set +e
"$kolo_run" -np 2 -H "$h1:1,$h2:1" --ssh "$ssh_cmd -p 2" --timeout 60 "$probe" line "$m" >"$work/6b.out" 2>"$work/6b.err"
rc=$?
set -e
show "$work/6b.err"
[[ $rc == 255 ]] && ok "6: no sshd on the port: exit 255" || fail "6: unreachable sshd: exit $rc, want 255"
expect_in "$work/6b.err" "Connection refused" "6: ssh's own message is relayed"
expect_in "$work/6b.err" "kolo-run: rank 0 on $h1 exited with code 255 (ssh's code for its own failures" "6: kolo-run explains 255"
expect_none_left "$m" "6"

# --- 7. more ranks on one host than sshd takes connections at once ---
m="$marker_base-7"
rc=0
"$kolo_run" -np 16 -H "$h1:16" --ssh "$ssh_cmd" --timeout 120 "$probe" store line "$m" \
  >"$work/7.out" 2>"$work/7.err" || rc=$?
show "$work/7.err"
[[ $rc == 0 ]] && ok "7: 16 ranks on one host exit 0" || fail "7: exit code $rc"
n=$(grep -c '^\[[0-9]*\] store ok$' "$work/7.out" || true)
((n == 16)) && ok "7: all 16 met at the store" || fail "7: $n of 16 ranks met at the store"
expect_none_left "$m" "7"

if ((failures > 0)); then
  echo "ssh_hosts: $failures check(s) FAILED" >&2
  for i in 1 2; do
    echo "--- sshd $i log" >&2
    cat "$work/sshd$i.log" >&2 || true
  done
  exit 1
fi
say "all checks passed"
