#!/usr/bin/env python3
"""wait_bench.py — small-message allreduce latency of fresh runs, kolo next to Open MPI.

    python3 benchmarks/wait_bench.py --build build [--build-base other/build] [--repeats 5]
                                     [--json out.json]

What a user meets first: every repeat is a fresh `kolo-run -np N kolo-bench` (and a fresh
`mpirun -np N kolo-bench --impl mpi`), with kolo-bench's defaults (5 warm-up and 20 timed
iterations per size), so the first sizes of each run carry whatever a fresh job costs. The
implementations are interleaved repeat by repeat, so that load from the rest of the machine falls
on all of them alike. Reported per N and size: the median over the repeats of the
out-of-place time and the worst repeat (max), both in µs, and the load average before and after.

  kolo          kolo-run -np N <build>/benchmarks/kolo-bench --transport shm
  kolo-base     the same from --build-base (e.g. the main branch, built alike), if given
  mpi           mpirun --oversubscribe --mca btl self,vader -np N kolo-bench --impl mpi
                (Open MPI's defaults otherwise: it binds ranks to cores when N <= 2)

Cases: N = 2 from 8 B to 2 KiB (factor 4), N = 4 and N = 8 at 8 B (docs/performance.md,
"Waiting", the targets of issue 18 item 1).
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

CASES = [(2, "8", "2K"), (4, "8", "8"), (8, "8", "8")]
ROW = re.compile(r"^\s*(\d+)\s+\d+\s+\S+\s+\S+\s+-?\d+\s+([0-9.]+)\s")


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def command(impl, n, lo, hi, builds, mpirun):
    size = ["-b", lo, "-e", hi, "-f", "4"]
    if impl == "mpi":
        return [mpirun, "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,vader",
                "-np", str(n), os.path.join(builds["kolo"], "benchmarks", "kolo-bench"),
                "--impl", "mpi"] + size
    b = builds[impl]
    return [os.path.join(b, "backends", "local", "kolo-run"), "--no-prefix", "-np", str(n),
            "--timeout", "120", os.path.join(b, "benchmarks", "kolo-bench"),
            "--transport", "shm"] + size


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        sys.exit(f"wait_bench.py: {' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}{p.stderr}")
    rows = {}
    for line in p.stdout.splitlines():
        m = ROW.match(line)
        if m:
            rows[int(m.group(1))] = float(m.group(2))
    if not rows:
        sys.exit(f"wait_bench.py: no result rows from {' '.join(cmd)}:\n{p.stdout}")
    return rows


def size_name(b):
    return f"{b // 1024} KiB" if b >= 1024 else f"{b} B"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--build", required=True, help="build directory of the kolo measured")
    ap.add_argument("--build-base", help="a second build (e.g. main), measured as kolo-base")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", help="also write the raw times here")
    args = ap.parse_args()
    builds = {"kolo": os.path.abspath(args.build)}
    if args.build_base:
        builds["kolo-base"] = os.path.abspath(args.build_base)
    mpirun = shutil.which("mpirun")
    if not mpirun:
        sys.exit("wait_bench.py: mpirun not found (Open MPI is the peer measured against)")
    impls = ["kolo"] + (["kolo-base"] if args.build_base else []) + ["mpi"]
    load_before = loadavg()
    raw = {}  # (n, impl) -> size -> [µs per repeat]
    for rep in range(args.repeats):
        for n, lo, hi in CASES:
            for impl in impls:
                rows = run(command(impl, n, lo, hi, builds, mpirun))
                for size, us in rows.items():
                    raw.setdefault(f"{n}/{impl}", {}).setdefault(size, []).append(us)
        print(f"repeat {rep + 1}/{args.repeats} done, load {loadavg():.2f}", file=sys.stderr)
    load_after = loadavg()
    print(f"load average {load_before:.2f} before, {load_after:.2f} after; {args.repeats} fresh "
          f"runs each, interleaved; out-of-place time in µs, median (max)")
    for n, _, _ in CASES:
        print(f"\nN = {n}\n")
        print("| size | " + " | ".join(impls) + " | kolo / mpi (median, max) |")
        print("|---" * (len(impls) + 2) + "|")
        for size in sorted(raw[f"{n}/kolo"]):
            cells = []
            for impl in impls:
                v = raw[f"{n}/{impl}"][size]
                cells.append(f"{statistics.median(v):.2f} ({max(v):.2f})")
            k, m = raw[f"{n}/kolo"][size], raw[f"{n}/mpi"][size]
            ratio = (f"{statistics.median(k) / statistics.median(m):.2f}, "
                     f"{max(k) / max(m):.2f}")
            print(f"| {size_name(size)} | " + " | ".join(cells) + f" | {ratio} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"load_before": load_before, "load_after": load_after, "times_us": raw}, f,
                      indent=1)


if __name__ == "__main__":
    main()
