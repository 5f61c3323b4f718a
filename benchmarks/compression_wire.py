#!/usr/bin/env python3
"""Wire compression, measured as a user meets it: fp32 allreduce with fp16/bf16 messages against
the uncompressed allreduce, one fresh `kolo-run -np N kolo-bench` per case and repeat, the cases
interleaved and their order rotating every repeat (a user's first run counts: medians and the
worst repeat are reported).

    python3 benchmarks/compression_wire.py --build build [--repeats 5] [--np 2]
        [--transports tcp,shm] [--bytes 64M] [--base /path/to/older/kolo-bench]

`--base` adds the same cases run by another kolo-bench binary (e.g. one built from an older
commit), interleaved with these, for a before/after in one run. kolo-bench --compression runs
Communicator::allreduce_compressed (docs/api.md); every run checks its values (#wrong = 0, within
the wire format's tolerance), and a run with wrong values fails this script.
"""
import argparse
import os
import statistics
import subprocess
import sys


def run_case(kolo_run, bench, np, transport, compression, size, iters):
    cmd = [kolo_run, "-np", str(np), bench, "--transport", transport, "--compression",
           compression, "-b", size, "-e", size, "-w", "1", "-n", str(iters)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    for line in out.stdout.splitlines() + out.stderr.splitlines():
        parts = line.split()
        if len(parts) > 12 and parts[0] == "[0]" and parts[1].isdigit():
            # [0] size count type redop root time algbw busbw #wrong time algbw busbw #wrong
            if parts[9] != "0" or parts[13] != "0":
                sys.exit("wrong values: " + " ".join(cmd) + "\n" + line)
            return float(parts[6]) / 1e3, float(parts[10]) / 1e3  # ms out of place, in place
    sys.exit("no result from: " + " ".join(cmd) + "\n" + out.stdout[-2000:] + out.stderr[-2000:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--transports", default="tcp,shm")
    ap.add_argument("--bytes", default="64M")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--base", help="another kolo-bench binary to interleave (before/after)")
    a = ap.parse_args()
    kolo_run = os.path.join(a.build, "backends/local/kolo-run")
    bench = os.path.join(a.build, "benchmarks/kolo-bench")
    benches = [("now", bench)] + ([("base", a.base)] if a.base else [])
    cases = [(label, b, t, c) for t in a.transports.split(",") for c in ("none", "fp16", "bf16")
             for (label, b) in benches]
    times = {c: [] for c in cases}
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    for rep in range(a.repeats):
        k = rep % len(cases)
        for case in cases[k:] + cases[:k]:
            label, b, t, c = case
            times[case].append(run_case(kolo_run, b, a.np, t, c, a.bytes, a.iters))
    print(f"# compression_wire: N = {a.np}, {a.bytes} float32, {a.iters} iterations after one "
          f"warm-up per run, {a.repeats} repeats interleaved; load before {' '.join(load)}")
    print("| binary | transport | compression | out of place ms (median / worst) | in place ms "
          "(median / worst) | / none (median, out of place) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for case in cases:
        label, b, t, c = case
        oop = [x[0] for x in times[case]]
        ip = [x[1] for x in times[case]]
        none = statistics.median(x[0] for x in times[(label, b, t, "none")])
        print(f"| {label} | {t} | {c} | {statistics.median(oop):.1f} / {max(oop):.1f} | "
              f"{statistics.median(ip):.1f} / {max(ip):.1f} | {statistics.median(oop) / none:.2f} |")


if __name__ == "__main__":
    main()
