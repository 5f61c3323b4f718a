#!/usr/bin/env python3
"""torch_bench.py — kolo's torch.distributed backend against gloo, side by side in one run.

    py=$(bash tests/pyenv.sh); $py -m pip install backends/torch
    $py benchmarks/torch_bench.py allreduce --np 2 --repeats 5 --json docs/perf/torch_allreduce_np2.json
    $py benchmarks/torch_bench.py ddp --np 2 --repeats 5 --json docs/perf/torch_ddp_np2.json

allreduce: dist.all_reduce(float32, SUM) from 8 B to 256 MiB (x4 steps). Every rank holds two
process groups over the same ranks, "kolo" and "gloo"; for each size the repeats alternate
between them (kolo, gloo, kolo, gloo, ...), so both see the same machine load. A third column,
"comm", is kolo's C++ Communicator called straight (no queue, no future): what the plugin adds.
"kolo" is the synchronous call (torch's async_op=False, which the plugin runs on the calling
thread when nothing is queued); "async" is all_reduce(async_op=True).wait(), the path of
DDP-style code that issues and waits later (here at once: wait() runs the work itself when the
worker thread has not started it).
Each repeat times `iters` back-to-back calls after a warm-up; the table gives the median and
the worst repeat of the time per call, and the bus bandwidth 2(N-1)/N x bytes / time. The
plugin's cost over the Communicator is given twice: from the medians, and from the best
repeats (on a shared, loaded machine the best repeat is the one least disturbed by others).

cuda: dist.all_reduce on CUDA tensors (float32, SUM), rank r on GPU r % count, with the CUDA
build of kolo_torch (KOLO_TORCH_CUDA=1). Against NCCL's own backend ("nccl") where every rank
has its own GPU; where ranks share one (NCCL refuses that) against "gloo" on the same CUDA
tensors, with KOLO_NCCL=0 (kolo stages through pinned host memory). Each repeat times `iters`
calls and a device synchronisation; "async" is all_reduce(async_op=True).wait().

ddp: the training step time of one model (a small CNN on 32x32 images) under
DistributedDataParallel with each backend, interleaved, and the same step without DDP (the
compute alone): the communication share is (ddp - local) / ddp.
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time
from queue import Empty

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sizes(lo, hi):
    out, b = [], lo
    while b <= hi:
        out.append(b)
        b *= 4
    if out and out[-1] != hi:
        out.append(hi)  # the top of the range (256 MiB) even off the x4 grid
    return out


def iters_for(nbytes):
    if nbytes <= 64 * 1024:
        return 200
    if nbytes <= 4 << 20:
        return 20
    if nbytes <= 64 << 20:
        return 4
    return 2


def timed(fn, iters):
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def allreduce_rank(rank, n, port, args, queue):
    import kolo_torch  # noqa: F401  (registers "kolo"; the entry point would too)

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(n))
    dist.init_process_group("kolo")
    kolo_pg = dist.group.WORLD
    gloo_pg = dist.new_group(backend="gloo")
    kolo_backend = kolo_pg._get_backend(torch.device("cpu"))
    rows = []
    for nbytes in sizes(args.min_bytes, args.max_bytes):
        count = max(1, nbytes // 4)
        x = torch.ones(count, dtype=torch.float32)
        iters = iters_for(nbytes)
        impls = {
            "kolo": lambda: dist.all_reduce(x, group=kolo_pg),
            "async": lambda: dist.all_reduce(x, group=kolo_pg, async_op=True).wait(),
            "gloo": lambda: dist.all_reduce(x, group=gloo_pg),
            "comm": lambda: kolo_torch._C.communicator_allreduce_(kolo_backend, x),
        }
        times = {k: [] for k in impls}
        for name, fn in impls.items():  # warm-up (connections, first-touch, caches)
            timed(fn, 2)
        for _ in range(args.repeats):
            for name, fn in impls.items():
                dist.barrier(group=gloo_pg)
                times[name].append(timed(fn, iters))
        # every rank's time is the slowest rank's (a collective ends when the last rank does)
        t = torch.tensor([times[k] for k in impls], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo_pg)
        row = {"bytes": count * 4, "iters": iters}
        for i, name in enumerate(impls):
            vals = t[i].tolist()
            row[name] = {"median_us": statistics.median(vals) * 1e6, "max_us": max(vals) * 1e6,
                         "min_us": min(vals) * 1e6}
        # correctness of the last call: ones summed over n ranks, many times over — just check
        # the value is finite and equal on every rank
        rows.append(row)
    # a final exact check: the three paths agree
    y = torch.arange(1000, dtype=torch.float32) + rank
    z = y.clone()
    dist.all_reduce(y, group=kolo_pg)
    dist.all_reduce(z, group=gloo_pg)
    assert torch.equal(y, z), "kolo and gloo disagree"
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def cuda_rank(rank, n, port, args, queue):
    import kolo_torch

    assert kolo_torch._C.built_with_cuda(), f"{kolo_torch.__file__} is not the CUDA build"
    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    shared = n > torch.cuda.device_count()
    if shared:
        os.environ["KOLO_NCCL"] = "0"  # NCCL refuses two ranks on one GPU: kolo stages
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(n))
    dist.init_process_group("kolo")
    kolo_pg = dist.group.WORLD
    peer = "gloo" if shared else "nccl"
    peer_pg = dist.new_group(backend=peer)
    sync_pg = dist.new_group(backend="gloo")
    rows = []
    for nbytes in sizes(args.min_bytes, args.max_bytes):
        count = max(1, nbytes // 4)
        x = torch.ones(count, dtype=torch.float32, device=dev)
        iters = iters_for(nbytes)

        def run(fn):
            def calls():
                for _ in range(iters):
                    fn()
                torch.cuda.synchronize(dev)
            return calls

        impls = {
            "kolo": run(lambda: dist.all_reduce(x, group=kolo_pg)),
            "async": run(lambda: dist.all_reduce(x, group=kolo_pg, async_op=True).wait()),
            peer: run(lambda: dist.all_reduce(x, group=peer_pg)),
        }
        times = {k: [] for k in impls}
        for fn in impls.values():  # warm-up (communicators, pinned buffers, caches)
            timed(fn, 2)
        for _ in range(args.repeats):
            for name, fn in impls.items():
                dist.barrier(group=sync_pg)
                times[name].append(timed(fn, 1) / iters)
        t = torch.tensor([times[k] for k in impls], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=sync_pg)
        row = {"bytes": count * 4, "iters": iters, "peer": peer}
        for i, name in enumerate(impls):
            vals = t[i].tolist()
            row[name] = {"median_us": statistics.median(vals) * 1e6, "max_us": max(vals) * 1e6}
        rows.append(row)
    # exact: both backends give the same sums of small integers
    y = torch.arange(1000, dtype=torch.float32, device=dev) + rank
    z = y.clone()
    dist.all_reduce(y, group=kolo_pg)
    dist.all_reduce(z, group=peer_pg)
    want = (torch.arange(1000, dtype=torch.float32) * n + n * (n - 1) / 2).to(dev)
    assert torch.equal(y, want) and torch.equal(z, want), f"kolo and {peer} disagree"
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Flatten(), torch.nn.Linear(64 * 8 * 8, 512), torch.nn.ReLU(),
            torch.nn.Linear(512, 10))

    def forward(self, x):
        return self.net(x)


def ddp_rank(rank, n, port, args, queue):
    import kolo_torch  # noqa: F401
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(n))
    dist.init_process_group("kolo")
    gloo_pg = dist.new_group(backend="gloo")
    torch.manual_seed(0)
    base = SmallCNN()
    models = {
        "kolo": DDP(SmallCNN(), process_group=dist.group.WORLD),
        "gloo": DDP(SmallCNN(), process_group=gloo_pg),
        "local": SmallCNN(),
    }
    for m in models.values():
        m.load_state_dict(base.state_dict()) if not isinstance(m, DDP) else \
            m.module.load_state_dict(base.state_dict())
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.01) for k, m in models.items()}
    g = torch.Generator().manual_seed(rank)
    data = torch.randn(args.batch, 3, 32, 32, generator=g)
    target = torch.randint(0, 10, (args.batch,), generator=g)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(name):
        m, o = models[name], opts[name]
        o.zero_grad(set_to_none=True)
        loss_fn(m(data), target).backward()
        o.step()

    def divergence():
        return max(((pk - pg_).abs() / (pg_.abs() + 1e-3)).max().item()
                   for pk, pg_ in zip(models["kolo"].parameters(), models["gloo"].parameters()))

    for name in models:
        for _ in range(2):
            step(name)
    # kolo's and gloo's DDP replicas took the same two steps from the same start: equal weights
    # up to the order of the floating-point sums (~1e-7). Checked here, not at the end: over
    # more steps a 1e-7 difference can flip a ReLU or a max-pool choice somewhere, and from then
    # on the two trajectories differ by ~lr x gradient (1e-4) for a reason that is no error.
    early = divergence()
    assert early < 1e-5, f"kolo and gloo DDP diverged: max |kolo - gloo| / (|gloo| + 1e-3) = {early:.3g}"
    times = {k: [] for k in models}
    for _ in range(args.repeats):
        for name in models:
            dist.barrier(group=gloo_pg)
            times[name].append(timed(lambda: step(name), args.steps))
    t = torch.tensor([times[k] for k in models], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=gloo_pg)
    late = divergence()
    if rank == 0:
        print(f"kolo vs gloo weights, max |kolo - gloo| / (|gloo| + 1e-3): {early:.3g} after 2 "
              f"steps (checked < 1e-5), {late:.3g} after {2 + args.repeats * args.steps}", flush=True)
    if rank == 0:
        params = sum(p.numel() for p in base.parameters())
        out = {"params": params, "grad_bytes": params * 4, "batch": args.batch,
               "steps": args.steps}
        for i, name in enumerate(models):
            vals = t[i].tolist()
            out[name] = {"median_ms": statistics.median(vals) * 1e3, "max_ms": max(vals) * 1e3}
        queue.put(out)
    dist.destroy_process_group()


def human(b):
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k:
            return f"{b // k} {unit}"
    return f"{b} B"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("mode", choices=["allreduce", "ddp", "cuda"])
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--min-bytes", type=int, default=8)
    ap.add_argument("--max-bytes", type=int, default=256 << 20)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    target = {"allreduce": allreduce_rank, "ddp": ddp_rank, "cuda": cuda_rank}[args.mode]
    procs = [ctx.Process(target=target, args=(r, args.np, port, args, q)) for r in range(args.np)]
    for p in procs:
        p.start()
    # Wait for rank 0's result, but not for a rank that already failed.
    deadline = time.monotonic() + 3600
    while True:
        try:
            result = q.get(timeout=1)
            break
        except Empty:
            dead = [p for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                sys.exit(f"rank exited with {dead[0].exitcode}" if dead else "timed out")
    for p in procs:
        p.join(60)
        if p.exitcode != 0:
            sys.exit(f"rank exited with {p.exitcode}")
    meta = {"mode": args.mode, "np": args.np, "repeats": args.repeats, "torch": torch.__version__,
            "cores": os.cpu_count(), "load": os.getloadavg()}
    if args.mode == "allreduce":
        n = args.np
        print(f"| bytes | kolo us (max) | gloo us (max) | kolo/gloo time | kolo busbw GB/s | "
              f"gloo busbw GB/s | comm us (max) | plugin cost | async us (max) | async cost | "
              f"best: kolo / async / comm us | best: plugin / async cost |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")

        def cost(us, c):
            if r["bytes"] < 1 << 20:  # below 1 MiB: the added microseconds say more
                return f"{us - c:+.1f} us"
            return f"{(us / c - 1) * 100:+.1f}%"

        for r in result:
            k, g, c, a = r["kolo"], r["gloo"], r["comm"], r["async"]
            bw = lambda us: 2 * (n - 1) / n * r["bytes"] / (us * 1e-6) / 1e9  # noqa: E731
            print(f"| {human(r['bytes'])} | {k['median_us']:.1f} ({k['max_us']:.1f}) | "
                  f"{g['median_us']:.1f} ({g['max_us']:.1f}) | {k['median_us'] / g['median_us']:.3f} | "
                  f"{bw(k['median_us']):.3f} | {bw(g['median_us']):.3f} | "
                  f"{c['median_us']:.1f} ({c['max_us']:.1f}) | "
                  f"{cost(k['median_us'], c['median_us'])} | "
                  f"{a['median_us']:.1f} ({a['max_us']:.1f}) | {cost(a['median_us'], c['median_us'])} | "
                  f"{k['min_us']:.1f} / {a['min_us']:.1f} / {c['min_us']:.1f} | "
                  f"{cost(k['min_us'], c['min_us'])} / {cost(a['min_us'], c['min_us'])} |")
    elif args.mode == "cuda":
        peer = result[0]["peer"]
        print(f"| bytes | kolo us (max) | async us (max) | {peer} us (max) | kolo / {peer} | "
              f"kolo added us |")
        print("|---|---|---|---|---|---|")
        for r in result:
            k, a, p = r["kolo"], r["async"], r[peer]
            print(f"| {human(r['bytes'])} | {k['median_us']:.1f} ({k['max_us']:.1f}) | "
                  f"{a['median_us']:.1f} ({a['max_us']:.1f}) | {p['median_us']:.1f} "
                  f"({p['max_us']:.1f}) | {k['median_us'] / p['median_us']:.2f} | "
                  f"{k['median_us'] - p['median_us']:+.1f} |")
    else:
        r = result
        local = r["local"]["median_ms"]
        print(f"model params {r['params']} ({r['grad_bytes'] / 2**20:.1f} MiB of gradients), "
              f"batch {r['batch']} per rank, N={args.np}")
        print("| backend | step ms (max) | vs gloo | communication share |")
        print("|---|---|---|---|")
        for name in ("kolo", "gloo", "local"):
            s = r[name]
            share = (s["median_ms"] - local) / s["median_ms"] if name != "local" else 0.0
            print(f"| {name} | {s['median_ms']:.1f} ({s['max_ms']:.1f}) | "
                  f"{s['median_ms'] / r['gloo']['median_ms']:.3f} | {share * 100:.0f}% |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "result": result}, f, indent=1)


if __name__ == "__main__":
    main()
