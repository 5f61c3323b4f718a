#!/usr/bin/env bash
# .ci/install-deps.sh — installs, on a fresh Debian 12 machine, only the packages that are
# missing (apt-get update at most once). Sourced by tests/run.sh and examples/run_demo.sh.
#
#   install_deps PACKAGE...     (defaults to everything the build and the tests use)
# openssh-server: the kolo-run-over-ssh test (tests/netns/ssh_hosts.sh) starts real sshds; it
# brings openssh-client (ssh, ssh-keygen), which the launcher tests use too. nftables: the packet
# loss and drop-all partition fault tests (tests/faults/netns_faults.sh), which fail in CI
# without it. python3: .ci/ctest_report.py, which judges tests/run.sh's ctest runs.
KOLO_ALL_PACKAGES=(cmake ninja-build g++ libssl-dev doctest-dev libopenmpi-dev openmpi-bin libgloo-dev
  libbenchmark-dev iproute2 nftables clang-format clang libclang-rt-dev openssh-server python3)

install_deps() {
  local packages=("$@")
  ((${#packages[@]} > 0)) || packages=("${KOLO_ALL_PACKAGES[@]}")
  local missing=() p
  for p in "${packages[@]}"; do
    # dpkg -s also lists removed-but-configured packages: require "install ok installed".
    if [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true) != "install ok installed" ]]; then
      missing+=("$p")
    fi
  done
  ((${#missing[@]} > 0)) || return 0
  echo "==== installing: ${missing[*]} ===="
  local sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || {
      echo "install-deps: missing packages (${missing[*]}) and not root, no sudo" >&2
      return 1
    }
    sudo=(sudo)
  fi
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get update -q
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
}
