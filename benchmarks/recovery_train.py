#!/usr/bin/env python3
"""recovery_train.py — steps and wall time a training job loses when one rank of N dies:
elastic continuation (run_elastic) against restarting the job from its last checkpoint.

The rank program is tests/faults/kolo_elastic_train_worker: a DistributedOptimizer loop (SGD
with momentum, four parameters, several buckets per step) of STEPS steps with SLEEP_US of
"compute" after each, whose final parameters are checked bit for bit against a replay of the
world sizes it recorded (so every run below also proves it trained correctly). One repeat is,
in an order that rotates per repeat so the machine's load falls on all alike:
  clean    `kolo-run -np N`, nobody dies: the wall time every other case is compared with
  elastic  `kolo-run --elastic -np N`, commit every COMMIT steps; when rank 0 reports step K (a
           random step in the middle half), a random rank is SIGKILLed; the survivors restore
           their last commit, shrink and go on with N - 1
  restart  `kolo-run -np N` without run_elastic (KOLO_TRAIN_ELASTIC=0), rank 0 checkpointing to a
           file every CKPT steps; the same kill at step K ends the job; then a fresh
           `kolo-run -np N-1` loads the checkpoint and finishes (what torchrun --max-restarts or
           a job scheduler does, without their own restart delays)
Steps lost = the last step rank 0 reported before the loss minus the step the job resumed at
(completed steps thrown away; the step in flight at the kill is lost in both). Wall time lost =
the case's wall time (first kolo-run's start to the last one's end) minus the clean run's median.
Both go on with N - 1 ranks after the loss, whose steps may be faster than N's on a small
machine (a wall time lost below 0); their difference is what a restart costs beyond continuing.
Prints the median and the worst repeat of each, and that difference.

  python3 benchmarks/recovery_train.py --build build --repeats 10 [--np 4] [--steps 400]
      [--sleep-us 5000] [--commit 3] [--ckpt 50] [--transport shm] [--json out.json]
"""

import argparse
import json
import os
import random
import re
import signal
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recovery import Job  # noqa: E402  (a kolo-run process whose output lines a thread collects)


def pids_of(lines):
    pids = {}
    for line in lines:
        m = re.search(r"KOLO_PID rank=(\d+) pid=(\d+)", line)
        if m:
            pids[int(m.group(1))] = int(m.group(2))
    return pids


def progress(lines):
    steps = [int(m.group(1)) for m in (re.search(r"KOLO_PROGRESS step=(\d+)", l) for l in lines)
             if m]
    return max(steps) if steps else 0


def trained(lines, n):
    got = [l for l in lines if "KOLO_TRAINED rank=" in l]
    if len(got) != n or any("KOLO_WRONG rank=" in l or "KOLO_FAULT rank=" in l for l in lines):
        raise RuntimeError("%d of %d ranks trained correctly:\n%s" % (len(got), n,
                                                                      "\n".join(lines)))


def kill_at(job, n, step, rng):
    """Waits until rank 0 reported `step`, SIGKILLs a random rank; returns rank 0's last step
    reported before the kill."""
    job.wait_for(lambda ls: progress(ls) >= step, 60)
    pids = pids_of(job.lines)
    if len(pids) != n:
        raise RuntimeError("the ranks did not start:\n" + "\n".join(job.finish()))
    before = progress(list(job.lines))
    os.kill(pids[rng.randrange(n)], signal.SIGKILL)
    return before


def run_clean(args, env):
    t0 = time.monotonic()
    lines = Job([args.kolo_run, "-np", str(args.np), "--timeout", "120", args.worker], env).finish()
    trained(lines, args.np)
    return time.monotonic() - t0


def run_elastic(args, env, step, rng):
    t0 = time.monotonic()
    job = Job([args.kolo_run, "-np", str(args.np), "--elastic", "--timeout", "120", args.worker],
              dict(env, KOLO_TRAIN_PROGRESS="1"))
    before = kill_at(job, args.np, step, rng)
    lines = job.finish()
    wall = time.monotonic() - t0
    trained(lines, args.np - 1)
    resumed = [int(m.group(1)) for m in (re.search(r"KOLO_RESET .* step=(\d+)", l) for l in lines)
               if m]
    if not resumed:
        raise RuntimeError("elastic: no reset:\n" + "\n".join(lines))
    # rank 0 may report steps after the kill that the loss then undoes: the last before the reset
    last = 0
    for line in lines:
        if "KOLO_RESET rank=" in line:
            break
        m = re.search(r"KOLO_PROGRESS step=(\d+)", line)
        if m:
            last = int(m.group(1))
    return wall, max(last, before) - min(resumed)


def run_restart(args, env, step, rng):
    with tempfile.TemporaryDirectory(prefix="kolo-recovery-") as d:
        ck = dict(env, KOLO_TRAIN_ELASTIC="0", KOLO_TRAIN_PROGRESS="1",
                  KOLO_TRAIN_CHECKPOINT=os.path.join(d, "ckpt"),
                  KOLO_TRAIN_CHECKPOINT_EVERY=str(args.ckpt))
        t0 = time.monotonic()
        job = Job([args.kolo_run, "-np", str(args.np), "--timeout", "120", args.worker], ck)
        before = kill_at(job, args.np, step, rng)
        first = job.finish()
        if job.p.returncode == 0:
            raise RuntimeError("restart: the job survived the kill:\n" + "\n".join(first))
        last = max(before, progress(first))
        lines = Job([args.kolo_run, "-np", str(args.np - 1), "--timeout", "120", args.worker],
                    ck).finish()
        wall = time.monotonic() - t0
    trained(lines, args.np - 1)
    m = [re.search(r"KOLO_RESUMED step=(\d+)", l) for l in lines]
    resumed = [int(x.group(1)) for x in m if x]
    return wall, last - (resumed[0] if resumed else 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--sleep-us", type=int, default=5000)
    ap.add_argument("--commit", type=int, default=3)
    ap.add_argument("--ckpt", type=int, default=50)
    ap.add_argument("--transport", default="shm")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args()
    args.kolo_run = os.path.join(args.build, "backends/local/kolo-run")
    args.worker = os.path.join(args.build, "tests/faults/kolo_elastic_train_worker")
    for f in (args.kolo_run, args.worker):
        if not os.access(f, os.X_OK):
            sys.exit("recovery_train.py: %s is missing: build kolo-run and "
                     "kolo_elastic_train_worker" % f)
    env = dict(os.environ, KOLO_TRANSPORT=args.transport, KOLO_TRAIN_STEPS=str(args.steps),
               KOLO_TRAIN_SLEEP_US=str(args.sleep_us), KOLO_TRAIN_COMMIT_EVERY=str(args.commit))
    rng = random.Random(args.seed)
    res = {"clean": [], "elastic": [], "elastic_lost": [], "restart": [], "restart_lost": []}
    cases = ["clean", "elastic", "restart"]
    for rep in range(args.repeats):
        step = rng.randrange(args.steps // 4, 3 * args.steps // 4)
        for what in cases[rep % 3:] + cases[:rep % 3]:
            if what == "clean":
                res["clean"].append(run_clean(args, env))
            elif what == "elastic":
                wall, lost = run_elastic(args, env, step, rng)
                res["elastic"].append(wall)
                res["elastic_lost"].append(lost)
            else:
                wall, lost = run_restart(args, env, step, rng)
                res["restart"].append(wall)
                res["restart_lost"].append(lost)
        print("repeat %d of %d done" % (rep + 1, args.repeats), file=sys.stderr)
    clean = statistics.median(res["clean"])
    print("N = %d, %s, %d steps of %.1f ms compute, commit every %d, checkpoint every %d; clean run"
          " %.2f s median (worst %.2f)" % (args.np, args.transport, args.steps,
                                          args.sleep_us / 1000, args.commit, args.ckpt, clean,
                                          max(res["clean"])))
    print("| one rank of %d SIGKILLed | steps lost: median / worst | wall time lost (s): median /"
          " worst |" % args.np)
    print("| --- | ---: | ---: |")
    for what in ("elastic", "restart"):
        lost, wall = res[what + "_lost"], [w - clean for w in res[what]]
        print("| %s | %g / %d | %.2f / %.2f |" % (what, statistics.median(lost), max(lost),
                                                  statistics.median(wall), max(wall)))
    e = statistics.median(res["elastic"]) - clean
    r = statistics.median(res["restart"]) - clean
    # After the loss both run on N - 1 ranks, whose steps may be faster than N's (fewer ranks on
    # the same cores): the difference of the two is what the restart costs beyond continuing.
    print("restart - elastic, wall time lost (medians): %.2f s; steps lost (medians): %g" %
          (r - e, statistics.median(res["restart_lost"]) - statistics.median(res["elastic_lost"])))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
