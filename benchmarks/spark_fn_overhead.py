#!/usr/bin/env python3
"""How long a Python training function waits for Spark: kolo_spark.run next to pyspark's
TorchDistributor (pyspark.ml.torch), measured the same way in the same process.

For each launcher and mode it runs a no-op function (it records when its first line runs,
prints one line, returns None) --reps times, interleaved (kolo, TorchDistributor, kolo, ...),
after one warm-up run of each, and reports the median and the range of:

  first line   time from the run() call to the function's first line, on the last rank to get
               there (the ranks write time.time() to a file: same machine, same clock)
  at driver    kolo only: time from run() to that rank's first printed line reaching the
               driver through the log stream
  total        run() from call to return: the whole overhead of a no-op function

Modes: `driver` (local_mode=True: processes on the driver, no Spark job), `local` (barrier tasks
on a local[NP] master), `standalone` (a master and two workers started here, NP/2 cores each).

    python3 benchmarks/spark_fn_overhead.py --np 4 --reps 5 --modes driver,local,standalone

Needs pyspark, torch and cloudpickle (tests/pyenv.sh has them) and Java. Prints a Markdown
table (docs/spark.md, "Overhead") and the machine's load next to it.
"""

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "backends", "spark"))
import kolo_spark  # noqa: E402

JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def probe(directory):
    import os
    import time

    t = time.time()
    rank = os.environ["RANK"]
    with open(os.path.join(directory, f"start.{rank}"), "w") as f:
        f.write(repr(t))
    print(f"first line of rank {rank}", flush=True)
    return None


def first_line_delay(directory, n, t_call):
    times = []
    for r in range(n):
        with open(os.path.join(directory, f"start.{r}")) as f:
            times.append(float(f.read()))
    return max(times) - t_call


class Standalone:
    def __init__(self, workdir, cores):
        self.workdir, self.cores, self.procs = workdir, cores, []

    def _start(self, name, args, extra=None):
        home = os.path.dirname(__import__("pyspark").__file__)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_WORKER_OPTS")}
        env.update(SPARK_HOME=home, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
                   SPARK_DAEMON_JAVA_OPTS=JVM_OPTS, **(extra or {}))
        log = os.path.join(self.workdir, f"{name}.log")
        with open(log, "wb") as out:
            p = subprocess.Popen([os.path.join(home, "bin", "spark-class"), *args], env=env,
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(p)
        return log

    @staticmethod
    def _wait(log, pattern, limit=180):
        end = time.monotonic() + limit
        while time.monotonic() < end:
            with open(log, errors="replace") as f:
                m = re.search(pattern, f.read())
            if m:
                return m
            time.sleep(0.2)
        raise RuntimeError(f"no {pattern} in {log}")

    def start(self):
        log = self._start("master", ["org.apache.spark.deploy.master.Master", "--host",
                                     "127.0.0.1", "--port", "0", "--webui-port", "0"])
        url = self._wait(log, r"Starting Spark master at (spark://[\d.]+:\d+)").group(1)
        self._wait(log, "I have been elected leader")
        for w in range(2):
            wdir = os.path.join(self.workdir, f"w{w}")
            os.makedirs(wdir)
            wlog = self._start(f"worker{w}", ["org.apache.spark.deploy.worker.Worker", "--host",
                                              "127.0.0.1", "--port", "0", "--webui-port", "0",
                                              "--cores", str(self.cores), "--memory", "1g",
                                              "--work-dir", wdir, url])
            self._wait(wlog, "Successfully registered with master")
        return url

    def stop(self):
        for p in reversed(self.procs):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def session(master, **conf):
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    c = SparkConf().setMaster(master).setAppName("kolo_spark overhead")
    for k, v in {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                 "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                 "spark.driver.extraJavaOptions": JVM_OPTS,
                 "spark.executor.extraJavaOptions": JVM_OPTS, **conf}.items():
        c.set(k, v)
    sc = SparkContext(conf=c)
    sc.setLogLevel("ERROR")
    return SparkSession(sc)


def measure(mode, n, reps, spark):
    from pyspark.ml.torch.distributor import TorchDistributor

    rows = {"kolo_spark": [], "TorchDistributor": []}
    local = mode == "driver"
    for i in range(reps + 1):  # the first of each is the warm-up
        for name in ("kolo_spark", "TorchDistributor"):
            d = tempfile.mkdtemp(prefix="kolo-overhead-")
            arrived = {}

            def sink(rank, line, arrived=arrived):
                arrived.setdefault(rank, time.time())

            t_call = time.time()
            if name == "kolo_spark":
                kolo_spark.run(spark, n, probe, args=(d,), local_mode=local, stream_logs=sink)
            else:
                TorchDistributor(num_processes=n, local_mode=local, use_gpu=False).run(probe, d)
            total = time.time() - t_call
            first = first_line_delay(d, n, t_call)
            at_driver = max(arrived.values()) - t_call if len(arrived) == n else None
            shutil.rmtree(d, ignore_errors=True)
            if i > 0:
                rows[name].append((first, at_driver, total))
            print(f"  {mode} {name} run {i}: first line {first:.2f} s, total {total:.2f} s"
                  + (f", at driver {at_driver:.2f} s" if at_driver else "")
                  + (" (warm-up)" if i == 0 else ""), file=sys.stderr, flush=True)
    return rows


def fmt(values):
    values = [v for v in values if v is not None]
    if not values:
        return "—"
    return f"{statistics.median(values):.2f} s ({min(values):.2f}–{max(values):.2f})"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--modes", default="driver,local,standalone")
    args = ap.parse_args()
    import pyspark
    import torch

    table = []
    loads = [os.getloadavg()[0]]
    for mode in args.modes.split(","):
        cluster = None
        work = tempfile.mkdtemp(prefix="kolo-overhead-cluster-")
        try:
            if mode == "standalone":
                cluster = Standalone(work, args.np // 2)
                spark = session(cluster.start(), **{"spark.executor.cores": str(args.np // 2),
                                                    "spark.cores.max": str(args.np),
                                                    "spark.task.maxFailures": "1"})
                while kolo_spark.task_slots(spark.sparkContext) < args.np:
                    time.sleep(0.5)
            else:
                spark = session(f"local[{args.np}]")
            rows = measure(mode, args.np, args.reps, spark)
            spark.stop()
        finally:
            if cluster is not None:
                cluster.stop()
            shutil.rmtree(work, ignore_errors=True)
        loads.append(os.getloadavg()[0])
        for name, runs in rows.items():
            table.append((mode, name, fmt([r[0] for r in runs]), fmt([r[1] for r in runs]),
                          fmt([r[2] for r in runs])))
    print(f"\n{args.np} ranks, no-op function, median (min–max) of {args.reps} runs after a "
          f"warm-up; pyspark {pyspark.__version__}, torch {torch.__version__.split('+')[0]}; "
          f"{os.cpu_count()} cores, load {min(loads):.1f}–{max(loads):.1f}\n")
    print("| mode | launcher | run() → first line, last rank | → at the driver | total |")
    print("| --- | --- | --- | --- | --- |")
    for row in table:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
