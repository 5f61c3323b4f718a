#!/usr/bin/env bash
# examples/run_demo.sh — the README's first command: builds kolo-run and the allreduce demo
# (installing what a fresh Debian 12 machine lacks), then runs NP ranks (default 4) on this host
# with the default transport (shared memory between local ranks).
#
#   bash examples/run_demo.sh [NP] [ELEMENTS]
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
np=${1:-4}
elements=${2:-4194304}
# shellcheck source=../.ci/install-deps.sh
source "$repo/.ci/install-deps.sh"
install_deps cmake ninja-build g++ libssl-dev

build=${KOLO_DEMO_BUILD_DIR:-$repo/build-demo}
cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKOLO_BUILD_TESTS=OFF \
  -DKOLO_BUILD_BENCHMARKS=OFF -DKOLO_BUILD_EXAMPLES=ON >/dev/null
cmake --build "$build" -j 2 --target kolo-run allreduce_demo
echo "==== kolo-run -np $np allreduce_demo $elements ===="
exec "$build/backends/local/kolo-run" -np "$np" "$build/examples/allreduce_demo" "$elements"
