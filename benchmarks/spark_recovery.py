#!/usr/bin/env python3
"""spark_recovery.py — steps and wall time a Spark run loses when one rank of N dies: elastic
continuation (kolo_spark.run(elastic=True)), a retried attempt that resumes from a commit as
frequent as the elastic one (run(max_attempts=2)), and a retried attempt from a sparser
checkpoint (what restarting the job from its last checkpoint costs).

The rank program is tests/faults/kolo_elastic_train_worker (a DistributedOptimizer loop whose
final parameters are checked bit for bit against a replay of the world sizes it recorded, so
every run below also proves it trained correctly), started by kolo_spark.run on a local[N]
SparkSession. One repeat is, in an order that rotates per repeat:
  clean    run(elastic=True), nobody dies: the wall time every other case is compared with
  elastic  run(elastic=True), commit every COMMIT steps (run_elastic); when rank 0 reports step
           K (a random step in the middle half) a random rank's process is SIGKILLed; the
           survivors restore their last commit, shrink (through the driver's store) and go on
           with N - 1; the dead rank's task ends without failing the stage
  retry    run(max_attempts=2) without run_elastic (KOLO_TRAIN_ELASTIC=0), rank 0 writing its
           state to a file every COMMIT steps; the same kill fails the stage; the second attempt
           (a new barrier job of N ranks) loads the file and finishes
  restart  the same with a checkpoint every CKPT steps: a job restarted from its last periodic
           checkpoint
Steps lost = rank 0's last step reported before the loss minus the step the run resumed at.
Wall time lost = the case's wall time minus the clean run's median. Prints the median and the
worst repeat of each.

  python3 benchmarks/spark_recovery.py --build build --repeats 10 [--np 4] [--steps 400]
      [--sleep-us 5000] [--commit 3] [--ckpt 50] [--json out.json]

Needs pyspark and the kolo_spark sources (backends/spark) on PYTHONPATH, e.g. the test venv of
tests/pyenv.sh.
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
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "backends",
                                "spark"))
import kolo_spark  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recovery_train import trained  # noqa: E402  (every rank's KOLO_TRAINED, none wrong)


class Lines:
    """A stream_logs sink that keeps every line and SIGKILLs a random rank once rank 0 reports
    step ``kill_at`` (None: nobody is killed)."""

    def __init__(self, n, kill_at, rng):
        self.n, self.kill_at, self.rng = n, kill_at, rng
        self.lines, self.pids = [], {}
        self.before = None  # rank 0's last step before the kill
        self.second = None  # where a second attempt's lines start (its first KOLO_PID line)
        self.lock = threading.Lock()

    def __call__(self, rank, line):
        with self.lock:
            self.lines.append(line)
            m = re.search(r"KOLO_PID rank=(\d+) pid=(\d+)", line)
            if m and self.before is None:
                self.pids[int(m.group(1))] = int(m.group(2))
            elif m and self.second is None:
                self.second = len(self.lines) - 1
            m = re.search(r"KOLO_PROGRESS step=(\d+)", line)
            if m and self.kill_at is not None and self.before is None and \
                    int(m.group(1)) >= self.kill_at and len(self.pids) == self.n:
                self.before = int(m.group(1))
                os.kill(self.pids[self.rng.randrange(self.n)], signal.SIGKILL)


def one(spark, args, env, kill_at, rng, **run_kw):
    sink = Lines(args.np, kill_at, rng)
    t0 = time.monotonic()
    result = kolo_spark.run(spark, args.np, args.worker, env=env, stream_logs=sink,
                            log_lines_per_second=1e6, timeout=300, **run_kw)
    return time.monotonic() - t0, sink, result


def run_elastic(spark, args, env, step, rng):
    wall, sink, result = one(spark, args, dict(env, KOLO_TRAIN_PROGRESS="1"), step, rng,
                             elastic=True)
    if len(result.lost) != 1:
        raise RuntimeError(f"elastic: lost {result.lost}")
    trained(sink.lines, args.np - 1)
    resumed = [int(m.group(1)) for m in (re.search(r"KOLO_RESET .* step=(\d+)", ln)
                                         for ln in sink.lines) if m]
    if not resumed:
        raise RuntimeError("elastic: no reset:\n" + "\n".join(sink.lines[-50:]))
    last = 0  # rank 0 may report steps after the kill that the loss undoes
    for line in sink.lines:
        if "KOLO_RESET rank=" in line:
            break
        m = re.search(r"KOLO_PROGRESS step=(\d+)", line)
        if m:
            last = int(m.group(1))
    return wall, max(last, sink.before) - min(resumed)


def run_retry(spark, args, env, step, rng, every):
    with tempfile.TemporaryDirectory(prefix="kolo-spark-recovery-") as d:
        ck = dict(env, KOLO_TRAIN_ELASTIC="0", KOLO_TRAIN_PROGRESS="1",
                  KOLO_TRAIN_CHECKPOINT=os.path.join(d, "ckpt"),
                  KOLO_TRAIN_CHECKPOINT_EVERY=str(every))
        wall, sink, result = one(spark, args, ck, step, rng, max_attempts=2)
    if len(result.attempts) != 2:
        raise RuntimeError(f"retry: {len(result.attempts)} attempts")
    resumed = [int(m.group(1)) for m in (re.search(r"KOLO_RESUMED step=(\d+)", ln)
                                         for ln in sink.lines) if m]
    if sink.second is None:
        raise RuntimeError("retry: no second attempt started:\n" + "\n".join(sink.lines[-50:]))
    trained(sink.lines[sink.second:], args.np)
    return wall, sink.before - (resumed[0] if resumed else 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--sleep-us", type=int, default=5000)
    ap.add_argument("--commit", type=int, default=3)
    ap.add_argument("--ckpt", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args()
    args.worker = os.path.abspath(os.path.join(args.build, "tests/faults/kolo_elastic_train_worker"))
    if not os.access(args.worker, os.X_OK):
        sys.exit("spark_recovery.py: %s is missing: build kolo_elastic_train_worker" % args.worker)
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession
    os.environ["PYSPARK_PYTHON"] = sys.executable
    conf = SparkConf().setMaster(f"local[{args.np}]").setAppName("kolo spark_recovery") \
        .set("spark.ui.enabled", "false").set("spark.task.cpus", "1")
    spark = SparkSession(SparkContext(conf=conf))
    spark.sparkContext.setLogLevel("ERROR")
    env = dict(KOLO_TRAIN_STEPS=str(args.steps), KOLO_TRAIN_SLEEP_US=str(args.sleep_us),
               KOLO_TRAIN_COMMIT_EVERY=str(args.commit), KOLO_TIMEOUT_SECONDS="30")
    rng = random.Random(args.seed)
    res = {k: [] for k in ("clean", "elastic", "elastic_lost", "retry", "retry_lost", "restart",
                           "restart_lost")}
    cases = ["clean", "elastic", "retry", "restart"]
    try:
        one(spark, args, env, None, rng, elastic=True)  # warm-up: the JVM's first job
        for rep in range(args.repeats):
            step = rng.randrange(args.steps // 4, 3 * args.steps // 4)
            for what in cases[rep % 4:] + cases[:rep % 4]:
                if what == "clean":
                    wall, sink, _ = one(spark, args, env, None, rng, elastic=True)
                    trained(sink.lines, args.np)
                    res["clean"].append(wall)
                    continue
                if what == "elastic":
                    wall, lost = run_elastic(spark, args, env, step, rng)
                else:
                    every = args.commit if what == "retry" else args.ckpt
                    wall, lost = run_retry(spark, args, env, step, rng, every)
                res[what].append(wall)
                res[what + "_lost"].append(lost)
            print("repeat %d of %d done" % (rep + 1, args.repeats), file=sys.stderr)
    finally:
        spark.stop()
    clean = statistics.median(res["clean"])
    print("Spark local[%d], N = %d, %d steps of %.1f ms compute, commit every %d, checkpoint every "
          "%d; clean run %.2f s median (worst %.2f)" % (args.np, args.np, args.steps,
                                                       args.sleep_us / 1000, args.commit,
                                                       args.ckpt, clean, max(res["clean"])))
    print("| one rank process of %d SIGKILLed | steps lost: median / worst | wall time lost (s): "
          "median / worst |" % args.np)
    print("| --- | ---: | ---: |")
    for what, label in (("elastic", "elastic=True (continue with N - 1)"),
                        ("retry", "max_attempts=2, resume from a commit every %d" % args.commit),
                        ("restart", "max_attempts=2, resume from a checkpoint every %d"
                         % args.ckpt)):
        lost, wall = res[what + "_lost"], [w - clean for w in res[what]]
        print("| %s | %g / %d | %.2f / %.2f |" % (label, statistics.median(lost), max(lost),
                                                  statistics.median(wall), max(wall)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
