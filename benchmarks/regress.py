#!/usr/bin/env python3
"""regress.py — this build's collective next to another build's, interleaved, at every size.

A regression check for docs/performance.md's N = 2/4/8 tables: kolo-bench of --build ("kolo")
and of --base-build ("base", e.g. an older checkout built the same way) run the same bands as
compare.py (8 B to 256 MiB), under kolo-run, for each transport and rank count. Every repeat
runs both builds back to back, the order swapped every repeat, so that whatever else the
machine does falls on both alike. Prints, per rank count and transport, the median and the
worst repeat of each build and the ratio kolo / base of the medians; a size where kolo is more
than --tolerance slower is marked.

  python3 benchmarks/regress.py --build build-bench --base-build ../old/build-bench \\
      --repeats 5 --out regress.json
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (the same bands, runner and medians as the main sweep)


def sweep(runner, transport, n, bands, coll):
    docs = [runner.bench_json(runner.command("kolo-" + transport, n) + ["-C", coll] + band)
            for band in bands]
    return compare.merge_rows(docs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build-bench", help="this build (default build-bench)")
    ap.add_argument("--base-build", required=True, help="the build to compare against")
    ap.add_argument("--ranks", default="2,4,8", help="rank counts (default 2,4,8)")
    ap.add_argument("--coll", default="allreduce",
                    help="kolo-bench's collective (-C): allreduce (default), broadcast, ...")
    ap.add_argument("--transports", default="shm,tcp", help="shm, tcp or both (default)")
    ap.add_argument("--repeats", type=int, default=5, help="runs per build and case (default 5)")
    ap.add_argument("--quick", action="store_true", help="compare.py's quick bands")
    ap.add_argument("--band", action="append",
                    help="kolo-bench size options instead of compare.py's bands, e.g. "
                         "--band=\"-b 16M -e 16M -n 20 -w 3\" (repeatable; note the =)")
    ap.add_argument("--tolerance", type=float, default=0.05,
                    help="mark sizes where kolo is slower than base by more (default 0.05)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per kolo-bench run")
    ap.add_argument("--out", help="write every repeat and median here (JSON)")
    args = ap.parse_args()

    runners = {}
    for label, build in (("kolo", args.build), ("base", args.base_build)):
        runners[label] = compare.Runner(argparse.Namespace(build=build, timeout=args.timeout))
    ranks = [int(x) for x in args.ranks.split(",")]
    transports = [t for t in args.transports.split(",") if t]
    for t in transports:
        if t not in ("shm", "tcp"):
            sys.exit(f"regress.py: unknown transport {t} (expected shm or tcp)")
    bands = compare.QUICK_BANDS if args.quick else compare.FULL_BANDS
    if args.band:
        bands = [b.split() for b in args.band]
    load_before = os.getloadavg()
    started = time.strftime("%Y-%m-%dT%H:%M:%S")

    raw = {(label, t, n): [] for label in runners for t in transports for n in ranks}
    for rep in range(args.repeats):
        order = ["kolo", "base"] if rep % 2 == 0 else ["base", "kolo"]
        for n in ranks:
            for t in transports:
                for label in order:
                    t0 = time.time()
                    raw[(label, t, n)].append(sweep(runners[label], t, n, bands, args.coll))
                    compare.log(f"repeat {rep + 1}/{args.repeats}  N={n}  {t}  {label}  "
                                f"{time.time() - t0:6.1f} s")
    load_after = os.getloadavg()

    med = {k: compare.median_table(v, k[2]) for k, v in raw.items()}
    print(f"regress.py {started}: {os.cpu_count()} cores, load {load_before[0]:.2f} before / "
          f"{load_after[0]:.2f} after; {args.coll}; {args.repeats} repeats, interleaved; "
          f"kolo = {os.path.abspath(args.build)}, base = {os.path.abspath(args.base_build)}; "
          f"out-of-place time µs, median (worst); marked: kolo slower than base by more than "
          f"{args.tolerance:.0%} in the median\n")
    worst_ratio = 0.0
    marked = []
    for n in ranks:
        for t in transports:
            print(f"#### N = {n}, {t}\n")
            print("| size | kolo µs | base µs | kolo / base |")
            print("| ---: | ---: | ---: | ---: |")
            k, b = med[("kolo", t, n)], med[("base", t, n)]
            for s in sorted(set(k) & set(b)):
                ko, bo = k[s]["oop"], b[s]["oop"]
                r = ko["time_us"] / bo["time_us"]
                worst_ratio = max(worst_ratio, r)
                flag = ""
                if r > 1 + args.tolerance:
                    flag = " **slower**"
                    marked.append((n, t, s, r))
                print(f"| {compare.fmt_size(s)} | {ko['time_us']:.1f} ({max(ko['repeats']):.1f}) | "
                      f"{bo['time_us']:.1f} ({max(bo['repeats']):.1f}) | {r:.2f}{flag} |")
            print()
    print(f"sizes slower by more than {args.tolerance:.0%}: {len(marked)}" +
          "".join(f"\n  N={n} {t} {compare.fmt_size(s)}: {r:.2f} x" for n, t, s, r in marked))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"started": started, "load": [load_before[0], load_after[0]],
                       "collective": args.coll,
                       "repeats": args.repeats,
                       "raw": {f"{lab}/{t}/{n}": v for (lab, t, n), v in raw.items()},
                       "medians": {f"{lab}/{t}/{n}": v for (lab, t, n), v in med.items()}},
                      f, indent=1, default=str)


if __name__ == "__main__":
    try:
        main()
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        sys.exit(f"regress.py: {e}")
