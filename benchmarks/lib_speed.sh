#!/usr/bin/env bash
# No speed lost to the compiled core: kolo-bench built header-only (kolo::kolo) against
# kolo-bench-lib, the same source on kolo::kolo_lib, interleaved in one run. Allreduce, float32
# sum, out-of-place, N = 2 ranks on shared memory: the time at 8 B and the busbw at 1 MiB.
#
#   benchmarks/lib_speed.sh [BUILD_DIR] [REPEATS]
#
# BUILD_DIR (default: build) must hold kolo-run, kolo-bench and kolo-bench-lib (cmake --build
# BUILD_DIR --target kolo-run kolo-bench kolo-bench-lib). Each repeat (default 5) runs both
# binaries, alternating which goes first; prints the median and worst per binary, their ratio
# and the load. docs/performance.md ("Compile time") has the figures.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-build}"
repeats="${2:-5}"
[[ "$build" = /* ]] || build="$here/$build"
run="$build/backends/local/kolo-run"
for exe in "$run" "$build/benchmarks/kolo-bench" "$build/benchmarks/kolo-bench-lib"; do
  if [[ ! -x "$exe" ]]; then
    echo "lib_speed.sh: $exe not found: build kolo-run kolo-bench kolo-bench-lib first" >&2
    exit 2
  fi
done
out="$(mktemp)"
trap 'rm -f "$out"' EXIT
echo "cpus: $(nproc); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
one() {  # binary label size iters warmup
  local line
  line="$("$run" -np 2 --timeout 300 "$build/benchmarks/$1" --transport shm -b "$3" -e "$3" \
           -n "$4" -w "$5" | sed -n 's/^\[0\] *//p' | awk '$1 ~ /^[0-9]+$/ { print $6, $8 }' |
           head -1)"
  echo "$2 $3 $line" >> "$out"
}
for ((i = 1; i <= repeats; ++i)); do
  if ((i % 2)); then order=(kolo-bench kolo-bench-lib); else order=(kolo-bench-lib kolo-bench); fi
  for exe in "${order[@]}"; do
    label=header-only
    [[ "$exe" == kolo-bench-lib ]] && label=compiled-core
    one "$exe" "$label" 8 20000 2000
    one "$exe" "$label" 1M 500 50
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$out" "$repeats" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
def pick(label, size, col):
    return [float(r[col]) for r in rows if r[0] == label and r[1] == size]
print(f"allreduce float32 sum, N=2, shm, {sys.argv[2]} interleaved repeats (median / worst)")
print("| | header-only | compiled core | compiled / header-only |")
print("| --- | --- | --- | --- |")
h, c = pick("header-only", "8", 2), pick("compiled-core", "8", 2)
print(f"| 8 B time (µs) | {statistics.median(h):.2f} / {max(h):.2f} | "
      f"{statistics.median(c):.2f} / {max(c):.2f} | {statistics.median(c) / statistics.median(h):.3f} |")
h, c = pick("header-only", "1M", 3), pick("compiled-core", "1M", 3)
print(f"| 1 MiB busbw (GB/s) | {statistics.median(h):.2f} / {min(h):.2f} | "
      f"{statistics.median(c):.2f} / {min(c):.2f} | {statistics.median(c) / statistics.median(h):.3f} |")
PY
