#!/usr/bin/env python3
"""recovery.py — how long a job is down when one rank dies: shrink against a restart.

For each transport (shm, tcp) and rank count N, one repeat is:
  shrink   `kolo-run --elastic -np N elastic_worker SEED`: every rank runs exact random
           collectives; a random 0-300 ms after all are in their loop, a random rank is
           SIGKILLed; the survivors catch the loss, call Communicator::shrink and run an
           allreduce on the new communicator. Recovery = the last survivor's completion of that
           first allreduce minus the kill (CLOCK_MONOTONIC: the driver's and the ranks' clocks
           are the same). "Detected" = the last survivor's catch minus the kill.
  restart  what a job without shrink pays at least: from the same kind of kill, a fresh
           `kolo-run -np N-1 elastic_worker SEED first` (process start, rendezvous, connections,
           the tuning probe) until its first allreduce completes — the kill itself, the failing
           job's own exit and reloading a checkpoint not counted.
The two run interleaved per repeat, so the machine's load falls on both alike. Prints per
(transport, N) the median and the worst repeat of each, and the ratio of the medians.

  python3 benchmarks/recovery.py --build build --repeats 10 [--ranks 2,4,8] [--json out.json]

Needs the build's kolo-run and tests/faults/kolo_elastic_worker (the fault tests' rank program).
"""

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time


class Job:
    """A kolo-run process whose output lines a thread collects."""

    def __init__(self, cmd, env):
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  env=env, text=True)
        self.lines = []
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pred, limit):
        dl = time.monotonic() + limit
        while time.monotonic() < dl and not pred(list(self.lines)) and self.p.poll() is None:
            time.sleep(0.002)

    def finish(self, limit=60):
        try:
            self.p.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.t.join()
        return self.lines


def shrink_once(args, env, n, seed, rng):
    p = Job([args.kolo_run, "-np", str(n), "--elastic", "--timeout", "60", args.worker,
             str(seed)], env)
    p.wait_for(lambda ls: sum("KOLO_LOOP rank=" in l for l in ls) == n, 30)
    pids = {}
    for l in list(p.lines):
        m = re.search(r"KOLO_PID rank=(\d+) pid=(\d+)", l)
        if m:
            pids[int(m.group(1))] = int(m.group(2))
    if len(pids) != n:
        raise RuntimeError("shrink: the ranks did not start:\n" + "\n".join(p.finish()))
    time.sleep(rng.uniform(0, 0.3))
    victim = rng.randrange(n)
    t_kill = time.monotonic()
    os.kill(pids[victim], signal.SIGKILL)
    lines = p.finish()
    firsts, caught = [], []
    for l in lines:
        m = re.search(r"KOLO_SHRUNK .* mono_caught=([\d.]+) mono_first=([\d.]+)", l)
        if m:
            caught.append(float(m.group(1)) - t_kill)
            firsts.append(float(m.group(2)) - t_kill)
    if p.p.returncode != 0 or len(firsts) != n - 1:
        raise RuntimeError("shrink: exit %s, %d of %d survivors shrank:\n%s" %
                           (p.p.returncode, len(firsts), n - 1, "\n".join(lines)))
    return max(firsts), max(caught)


def restart_once(args, env, n, seed):
    t0 = time.monotonic()
    p = Job([args.kolo_run, "-np", str(n - 1), "--timeout", "60", args.worker, str(seed),
             "first"], env)
    lines = p.finish()
    firsts = [float(m.group(1)) for m in
              (re.search(r"KOLO_FIRST rank=\d+ mono_first=([\d.]+)", l) for l in lines) if m]
    if p.p.returncode != 0 or len(firsts) != n - 1:
        raise RuntimeError("restart: exit %s:\n%s" % (p.returncode, "\n".join(lines)))
    return max(firsts) - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--ranks", default="2,3,4,6,8")
    ap.add_argument("--transports", default="shm,tcp")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args()
    args.kolo_run = os.path.join(args.build, "backends/local/kolo-run")
    args.worker = os.path.join(args.build, "tests/faults/kolo_elastic_worker")
    for f in (args.kolo_run, args.worker):
        if not os.access(f, os.X_OK):
            sys.exit("recovery.py: %s is missing: build kolo-run and kolo_elastic_worker" % f)
    rng = random.Random(args.seed)
    ranks = [int(x) for x in args.ranks.split(",")]
    transports = args.transports.split(",")
    res = {}
    for rep in range(args.repeats):
        for t in transports:
            env = dict(os.environ, KOLO_TRANSPORT=t)
            for n in ranks:
                seed = args.seed * 1000 + rep
                r = res.setdefault("%s/%d" % (t, n), {"shrink": [], "detect": [], "restart": []})
                order = ["shrink", "restart"] if rep % 2 == 0 else ["restart", "shrink"]
                for what in order:
                    if what == "shrink":
                        s, d = shrink_once(args, env, n, seed, rng)
                        r["shrink"].append(s)
                        r["detect"].append(d)
                    else:
                        r["restart"].append(restart_once(args, env, n, seed))
        print("repeat %d of %d done" % (rep + 1, args.repeats), file=sys.stderr)
    print("| transport | N | detected: median / worst (s) | shrink, kill to first op: median /"
          " worst (s) | restart: median / worst (s) | restart / shrink |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for key, r in res.items():
        t, n = key.split("/")
        med = {k: statistics.median(v) for k, v in r.items()}
        print("| %s | %s | %.3f / %.3f | %.3f / %.3f | %.3f / %.3f | %.1f |" %
              (t, n, med["detect"], max(r["detect"]), med["shrink"], max(r["shrink"]),
               med["restart"], max(r["restart"]), med["restart"] / med["shrink"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
