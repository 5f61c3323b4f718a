#!/usr/bin/env python3
"""The allreduce demo launched from PySpark: N barrier tasks run examples/allreduce_demo.

    cmake -S . -B build -G Ninja && cmake --build build --target allreduce_demo
    pip install pyspark==3.5.7                       # Java 17 must be installed
    python3 examples/spark/run_demo.py               # local[4], 4 ranks
    python3 examples/spark/run_demo.py --master spark://host:7077 --np 8 --demo /shared/allreduce_demo
    python3 examples/spark/run_demo.py --local-mode  # no Spark job: ranks as subprocesses

With --data, each rank also gets a shard of a DataFrame and examples/spark/shard_sum checks the
global row count and sum (build it: cmake --build build --target kolo_spark_shard_sum; or pass
--shard-sum PATH). Binaries are looked for in build*/examples of this checkout. Exits 0 when every
rank reports exact results.
"""

import argparse
import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
try:
    import kolo_spark
except ImportError:  # not pip-installed: use the source tree
    sys.path.insert(0, os.path.join(REPO, "backends", "spark"))
    import kolo_spark


def find_binary(name):
    found = sorted((p for p in glob.glob(os.path.join(REPO, "build*", "examples", name))
                    if is_program(p)), key=os.path.getmtime)
    return found[-1] if found else None


def is_program(path):
    return bool(path) and os.path.isfile(path) and os.access(path, os.X_OK)


def program(given, name, target):
    """An absolute path to an executable file: --option PATH, else the newest build's."""
    path = os.path.abspath(given) if given else find_binary(name)
    if not is_program(path):
        sys.exit(f"{name} not found" + (f" at {given} (not an executable file)" if given else "") +
                 f": build it (cmake --build build --target {target}) or pass its path")
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--master", default=None, help="Spark master (default local[NP])")
    ap.add_argument("--np", type=int, default=4, help="number of ranks (barrier tasks)")
    ap.add_argument("--demo", default=None, help="path of allreduce_demo on the executors")
    ap.add_argument("--elements", type=int, default=1 << 20)
    ap.add_argument("--local-mode", action="store_true", help="ranks on the driver, no Spark job")
    ap.add_argument("--data", action="store_true", help="also run shard_sum on a DataFrame")
    ap.add_argument("--shard-sum", default=None, help="path of shard_sum on the executors")
    ap.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args()

    demo = program(args.demo, "allreduce_demo", "allreduce_demo")
    shard_sum = program(args.shard_sum, "kolo_spark_shard_sum", "kolo_spark_shard_sum") \
        if args.data else None

    spark = None
    if not args.local_mode or args.data:
        from pyspark.sql import SparkSession
        spark = (SparkSession.builder.master(args.master or f"local[{args.np}]")
                 .appName("kolo allreduce demo").getOrCreate())
    try:
        env = {"KOLO_TIMEOUT_SECONDS": "60"}
        result = kolo_spark.run(spark, args.np, demo, [str(args.elements)], env=env,
                                timeout=args.timeout, local_mode=args.local_mode,
                                collect_output="all", stream_logs=False)
        for rank in result.ranks:
            print(rank.output.splitlines()[-1] if rank.output else f"rank {rank.rank}: no output")
        ok = all("correct" in r.output for r in result.ranks)

        if args.data:
            n = 100000
            df = spark.range(n).selectExpr("id", "id * 0.25 AS x")
            expect = sum(i * 0.25 for i in range(n))
            data = kolo_spark.run(spark, args.np, shard_sum,
                                  ["x", "--expect-rows", str(n), "--expect-sum", repr(expect)],
                                  env=env, df=df, data_format="f64", local_mode=args.local_mode,
                                  collect_output="all", stream_logs=False, timeout=args.timeout)
            for rank in data.ranks:
                print(rank.output.splitlines()[-1])
            ok = ok and all("correct" in r.output for r in data.ranks)
        print(f"{args.np} ranks: {'all correct' if ok else 'WRONG results'} "
              f"({result.elapsed:.1f} s for the demo job)")
        return 0 if ok else 1
    except kolo_spark.KoloSparkError as e:
        print(e, file=sys.stderr)
        return 1
    finally:
        if spark is not None:
            spark.stop()


if __name__ == "__main__":
    sys.exit(main())
