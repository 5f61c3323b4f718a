#!/usr/bin/env python3
"""benchmarks/estimator_bench.py — kolo_spark.torch's TorchEstimator at 1, 2 and 4 ranks on the
same DataFrame: data preparation time, rank start-up, epoch time and throughput (the figures
of docs/estimator.md).

    py=$(bash tests/pyenv.sh)   # pyspark, torch; and kolo_torch: $py -m pip install backends/torch
    PYTHONPATH=backends/spark nice -n 10 $py benchmarks/estimator_bench.py --ranks 1 2 4

Every fit writes the DataFrame to the store (prepare), starts the ranks through kolo_spark.run
and trains ``--epochs`` epochs; the epoch time is the slowest rank's training loop (no
validation, no checkpoint), the median over the epochs after the first. The data is a
regression on ``--dim`` features through an MLP (dim -> hidden -> hidden -> 1), ``--rows`` rows,
``--batch`` rows per step over all ranks (batch_size = batch / ranks per rank). Prints one line
per configuration and a Markdown table.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--batch", type=int, default=256, help="rows per step, all ranks together")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--backend", default="kolo")
    ap.add_argument("--repeats", type=int, default=1, help="rounds over --ranks (interleaved)")
    ap.add_argument("--master", default=None, help="Spark master (default local[max ranks])")
    args = ap.parse_args()

    import numpy as np
    import torch
    from pyspark import SparkConf, SparkContext
    from pyspark.ml.linalg import Vectors
    from pyspark.sql import SparkSession

    from kolo_spark.torch import LocalStore, TorchEstimator

    os.environ["PYSPARK_PYTHON"] = sys.executable
    master = args.master or f"local[{max(args.ranks)}]"
    conf = (SparkConf().setMaster(master).setAppName("estimator_bench")
            .set("spark.ui.enabled", "false").set("spark.ui.showConsoleProgress", "false")
            .set("spark.driver.host", "127.0.0.1")
            .set("spark.driver.bindAddress", "127.0.0.1")
            .set("spark.sql.shuffle.partitions", str(max(args.ranks))))
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    spark = SparkSession(sc)

    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.rows, args.dim))
    y = np.tanh(x @ rng.normal(size=args.dim) / np.sqrt(args.dim)) + rng.normal(0, 0.05,
                                                                                  args.rows)
    t0 = time.monotonic()
    df = spark.createDataFrame([(Vectors.dense(a), float(b)) for a, b in zip(x, y)],
                               ["features", "y"]).repartition(max(args.ranks)).cache()
    df.count()
    print(f"# DataFrame: {args.rows} rows x {args.dim} features, cached in "
          f"{time.monotonic() - t0:.1f} s; load {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores", flush=True)

    rows = []
    with tempfile.TemporaryDirectory(prefix="kolo-estimator-bench-") as tmp:
        for rep in range(args.repeats):
            for n in args.ranks:
                torch.manual_seed(0)
                net = torch.nn.Sequential(
                    torch.nn.Linear(args.dim, args.hidden), torch.nn.ReLU(),
                    torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                    torch.nn.Linear(args.hidden, 1))
                est = TorchEstimator(
                    num_proc=n, model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.01),
                    loss=torch.nn.MSELoss(), feature_cols=["features"], label_cols=["y"],
                    batch_size=max(1, args.batch // n), epochs=args.epochs,
                    store=LocalStore(os.path.join(tmp, f"s{rep}_{n}")), run_id=f"r{n}",
                    verbose=0, backend=args.backend)
                load = os.getloadavg()[0]
                t = time.monotonic()
                model = est.fit(df)
                total = time.monotonic() - t
                run = est.last_run
                times = model.history["train_time"]
                epoch = statistics.median(times[1:] if len(times) > 1 else times)
                setup = max(r["setup_seconds"] for r in run["ranks"])
                row = dict(n=n, prepare=run["prepare_seconds"], run=run["run_seconds"],
                           setup=setup, epoch=epoch, rps=run["train_rows"] / epoch,
                           loss=model.history["loss"][-1], total=total, load=load)
                rows.append(row)
                print(f"ranks {n}: prepare {row['prepare']:.2f} s, ranks' run {row['run']:.2f} s "
                      f"(rank start-up to first step {setup:.2f} s), epoch {epoch:.3f} s, "
                      f"{row['rps']:.0f} rows/s, final loss {row['loss']:.4f}, fit {total:.2f} s,"
                      f" load {load:.1f}", flush=True)
    spark.stop()
    print("\n| ranks | prepare (s) | run (s) | rank start-up (s) | epoch (s) | rows/s | fit (s) "
          "| load |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n']} | {r['prepare']:.2f} | {r['run']:.2f} | {r['setup']:.2f} | "
              f"{r['epoch']:.3f} | {r['rps']:.0f} | {r['total']:.2f} | {r['load']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
