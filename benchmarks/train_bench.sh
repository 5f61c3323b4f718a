#!/usr/bin/env bash
# train_bench.sh — training speed of examples/train_mlp with N = 1, 2, 4 ranks on this host, and
# the scaling efficiency (issue 6's benchmark).
#
#   benchmarks/train_bench.sh [BUILD_DIR=build] [EPOCHS=30] [REPEATS=3] [BATCH=16] [-- train_mlp args]
#
# Weak scaling, as data-parallel training runs: the per-rank batch is fixed, so N ranks process
# N times more samples per step. For each N: median over REPEATS runs of steps/s and samples/s
# (train_mlp's own "speed:" line, training loop only). Efficiency(N) = samples/s(N) /
# (N · samples/s(1)): 1.0 is perfect; above N = number of free cores it cannot reach 1.
# The environment passes through (KOLO_TRANSPORT, KOLO_COMPRESSION, ...). Output: a table, and
# JSON in $TRAIN_BENCH_JSON when set.
set -euo pipefail
build=${1:-build}
epochs=${2:-30}
repeats=${3:-3}
batch=${4:-16}
shift $(( $# < 4 ? $# : 4 ))
[ "${1:-}" = "--" ] && shift
run="$build/backends/local/kolo-run"
prog="$build/examples/train_mlp"
for f in "$run" "$prog"; do
  [ -x "$f" ] || { echo "train_bench: $f not built (cmake --build $build --target kolo-run train_mlp)" >&2; exit 2; }
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "# train_bench: train_mlp, $epochs epochs, per-rank batch $batch, median of $repeats," \
     "transport ${KOLO_TRANSPORT:-routed}, compression ${KOLO_COMPRESSION:-none}," \
     "$(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '# %5s %12s %12s %10s %11s %9s\n' ranks steps/s samples/s 'step(ms)' efficiency accuracy
base=""
json="["
for np in 1 2 4; do
  : > "$tmp/speeds"
  acc=""
  for ((k = 0; k < repeats; ++k)); do
    out=$("$run" -np "$np" --timeout 600 "$prog" --epochs "$epochs" --batch "$batch" --quiet \
          --checkpoint "$tmp/ckpt" "$@" 2>&1) || { echo "$out" >&2; exit 1; }
    # "speed: S steps in T s = X steps/s, Y samples/s (N ranks)"
    echo "$out" | sed -n 's/.*speed: .* = \([0-9.]*\) steps\/s, \([0-9.]*\) samples\/s.*/\1 \2/p' >> "$tmp/speeds"
    acc=$(echo "$out" | sed -n 's/.*final accuracy \([0-9.]*\).*/\1/p')
  done
  read -r sps samples < <(sort -n -k2 "$tmp/speeds" | awk -v m=$(( (repeats + 1) / 2 )) 'NR == m')
  [ -z "$base" ] && base=$samples
  eff=$(awk -v s="$samples" -v b="$base" -v n="$np" 'BEGIN { printf "%.2f", s / (n * b) }')
  ms=$(awk -v s="$sps" 'BEGIN { printf "%.3f", 1000 / s }')
  printf '  %5d %12.1f %12.0f %10s %11s %9s\n' "$np" "$sps" "$samples" "$ms" "$eff" "$acc"
  json+="$([ "$np" = 1 ] || echo ,){\"ranks\":$np,\"steps_per_s\":$sps,\"samples_per_s\":$samples,\"efficiency\":$eff,\"accuracy\":$acc}"
done
json+="]"
if [ -n "${TRAIN_BENCH_JSON:-}" ]; then echo "$json" > "$TRAIN_BENCH_JSON"; fi
