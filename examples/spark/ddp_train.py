#!/usr/bin/env python3
"""A PyTorch training function run by kolo_spark: DistributedDataParallel on the `kolo` backend.

Every rank is a fresh Python process started by a Spark barrier task, with torchrun's environment
(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK, ...), so init_process_group() needs
nothing but the backend's name. Each rank trains on its own slice of a synthetic regression
problem; DDP averages the gradients; run() returns every rank's final weights, in rank order.

    pip install "pyspark==3.5.7" torch backends/spark backends/torch   # kolo_torch: the backend
    python3 examples/spark/ddp_train.py                    # local[2], 2 ranks, backend kolo
    python3 examples/spark/ddp_train.py --backend gloo --np 4
    python3 examples/spark/ddp_train.py --local-mode       # ranks on the driver, no Spark job
    python3 examples/spark/ddp_train.py --master spark://host:7077 --np 8

Exits 0 when every rank ends with the same weights and the loss fell.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import kolo_spark
except ImportError:  # not pip-installed: use the source tree
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "backends", "spark"))
    import kolo_spark


def train(backend="kolo", epochs=30, lr=0.05, batch=32):
    """The training function: runs on every rank, returns this rank's summary."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if backend == "kolo":
        import kolo_torch  # noqa: F401  (registers "kolo" with torch.distributed)
    dist.init_process_group(backend)  # rank, world size, rendezvous: from the environment
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # the same initial model everywhere (DDP also broadcasts rank 0's)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=lr)

    g = torch.Generator().manual_seed(1234)  # the full data set, then this rank's slice
    x = torch.randn(1024, 8, generator=g)
    y = (x @ torch.linspace(-1, 1, 8).unsqueeze(1)).tanh()
    x, y = x[rank::world], y[rank::world]

    first = last = None
    for epoch in range(epochs):
        for i in range(0, len(x), batch):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x[i:i + batch]), y[i:i + batch])
            loss.backward()  # gradients averaged over the ranks by the backend
            opt.step()
        last = loss.item()
        first = last if first is None else first
        if rank == 0 and epoch % 10 == 0:
            print(f"epoch {epoch}: loss {last:.5f}", flush=True)  # streamed to the driver
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    dist.destroy_process_group()
    return {"rank": rank, "first_loss": first, "last_loss": last, "weights": weights.tolist()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--master", default=None, help="Spark master (default local[NP])")
    ap.add_argument("--np", type=int, default=2, help="number of ranks")
    ap.add_argument("--backend", default="kolo", choices=["kolo", "gloo"])
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--local-mode", action="store_true", help="ranks on the driver, no Spark job")
    ap.add_argument("--timeline", default=None, help="write the merged Chrome trace here")
    args = ap.parse_args()

    spark = None
    if not args.local_mode:
        from pyspark.sql import SparkSession
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers run this Python
        spark = (SparkSession.builder.master(args.master or f"local[{args.np}]")
                 .appName("kolo DDP example").getOrCreate())
    try:
        results = kolo_spark.run(spark, args.np, train, kwargs={"backend": args.backend,
                                                                "epochs": args.epochs},
                                 local_mode=args.local_mode, timeline=args.timeline,
                                 env={"KOLO_TIMEOUT_SECONDS": "120"}, timeout=1800)
    finally:
        if spark is not None:
            spark.stop()
    same = all(r["weights"] == results[0]["weights"] for r in results)
    fell = all(r["last_loss"] < r["first_loss"] for r in results)
    for r in results:
        print(f"rank {r['rank']}: loss {r['first_loss']:.5f} -> {r['last_loss']:.5f}")
    print(f"{args.np} ranks on {args.backend}: weights {'identical' if same else 'DIFFER'} on "
          f"every rank, loss {'fell' if fell else 'did NOT fall'} ({results.elapsed:.1f} s)")
    return 0 if same and fell else 1


if __name__ == "__main__":
    sys.exit(main())
