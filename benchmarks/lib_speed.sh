#!/usr/bin/env bash
# No speed lost to the compiled core: kolo-bench built header-only (kolo::kolo) against
# kolo-bench-lib, the same source on kolo::kolo_lib, interleaved in one run. Allreduce, float32
# sum, out-of-place: the time at 8 B and the busbw at 1 MiB and 64 MiB, N = 2 and 4, shared
# memory and TCP (loopback).
#
#   benchmarks/lib_speed.sh [BUILD_DIR] [REPEATS] [CELLS]
#
# BUILD_DIR (default: build) must hold kolo-run, kolo-bench and kolo-bench-lib (cmake --build
# BUILD_DIR --target kolo-run kolo-bench kolo-bench-lib). Each repeat (default 5) runs both
# binaries on every cell, alternating which goes first; prints the median and worst per binary,
# their ratio and the load. CELLS (default "shm:2 shm:4 tcp:2 tcp:4") picks transport:ranks.
# docs/performance.md ("Compile time") has the figures.
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
cells="${3:-shm:2 shm:4 tcp:2 tcp:4}"
one() {  # binary label transport ranks size iters warmup
  local line
  line="$("$run" -np "$4" --timeout 300 "$build/benchmarks/$1" --transport "$3" -b "$5" -e "$5" \
           -n "$6" -w "$7" | sed -n 's/^\[0\] *//p' | awk '$1 ~ /^[0-9]+$/ { print $6, $8 }' |
           head -1)"
  echo "$2 $3:$4 $5 $line" >> "$out"
}
for ((i = 1; i <= repeats; ++i)); do
  if ((i % 2)); then order=(kolo-bench kolo-bench-lib); else order=(kolo-bench-lib kolo-bench); fi
  for cell in $cells; do
    for exe in "${order[@]}"; do
      label=header-only
      [[ "$exe" == kolo-bench-lib ]] && label=compiled-core
      one "$exe" "$label" "${cell%:*}" "${cell#*:}" 8 5000 500
      one "$exe" "$label" "${cell%:*}" "${cell#*:}" 1M 200 20
      one "$exe" "$label" "${cell%:*}" "${cell#*:}" 64M 5 1
    done
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$out" "$repeats" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
cells = list(dict.fromkeys(r[1] for r in rows))
def pick(label, cell, size, col):
    return [float(r[col]) for r in rows if r[0] == label and r[1] == cell and r[2] == size]
print(f"allreduce float32 sum, {sys.argv[2]} interleaved repeats (median / worst)")
print("| transport, N | what | header-only | compiled core | compiled / header-only |")
print("| --- | --- | --- | --- | --- |")
for cell in cells:
    t, n = cell.split(":")
    where = f"{t}, N = {n}"
    h, c = pick("header-only", cell, "8", 3), pick("compiled-core", cell, "8", 3)
    print(f"| {where} | 8 B time (µs) | {statistics.median(h):.2f} / {max(h):.2f} | "
          f"{statistics.median(c):.2f} / {max(c):.2f} | "
          f"{statistics.median(c) / statistics.median(h):.3f} |")
    for size in ("1M", "64M"):
        h, c = pick("header-only", cell, size, 4), pick("compiled-core", cell, size, 4)
        print(f"| {where} | {size}iB busbw (GB/s) | {statistics.median(h):.2f} / {min(h):.2f} | "
              f"{statistics.median(c):.2f} / {min(c):.2f} | "
              f"{statistics.median(c) / statistics.median(h):.3f} |")
PY
