#!/usr/bin/env python3
"""Every c10d collective through the "kolo" backend, with exact checks (integer-valued data):
reduce_scatter with every op, the coalesced forms included.

Driver: `python tests/torch/test_collectives.py [--only NAME]` starts the ranks itself (see
harness.py). init_process_group("kolo") is called WITHOUT importing kolo_torch: torch must find
the backend through its entry point.
"""
import datetime
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def rank_main(r, n, config):
    import torch
    import torch.distributed as dist

    dist.init_process_group("kolo", timeout=datetime.timedelta(seconds=60))
    check(dist.get_backend() == "kolo", f"backend is {dist.get_backend()}")
    check(dist.get_rank() == r and dist.get_world_size() == n, "rank/size")

    # allreduce: every supported dtype x op, exact
    for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
               torch.uint8, torch.int32, torch.int64):
        base = torch.arange(1, 8, dtype=torch.int64)
        for op, ref in ((dist.ReduceOp.SUM, lambda v: v * n * (n + 1) // 2),
                        (dist.ReduceOp.MAX, lambda v: v * n),
                        (dist.ReduceOp.MIN, lambda v: v),
                        (dist.ReduceOp.PRODUCT, None)):
            if op == dist.ReduceOp.PRODUCT:
                t = torch.full((7,), 2 if r == 0 else 1, dtype=dt)
                dist.all_reduce(t, op=op)
                check(torch.all(t.to(torch.int64) == 2), f"product {dt}: {t}")
                continue
            t = (base * (r + 1)).to(dt)
            dist.all_reduce(t, op=op)
            check(torch.equal(t.to(torch.int64), ref(base)), f"{op} {dt}: {t}")
    t = torch.full((5,), float(2 * r), dtype=torch.float32)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    check(torch.all(t == float(n - 1)), f"avg {t}")
    t = torch.tensor([r == 0, False, True])
    dist.all_reduce(t)
    check(t.tolist() == [True, False, True], f"bool sum (or) {t}")
    t = torch.tensor([r == 0, True])
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    check(t.tolist() == [n == 1, True], f"bool min (and) {t}")
    t = torch.ones(4)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(3.0))
    check(torch.all(t == 3 * n), f"premul_sum {t}")
    # unsupported op: a RuntimeError that names it. A refused call fails its group for good
    # (docs/torch.md, "Errors"): on a group of its own.
    refusing = dist.new_group(list(range(n)))
    try:
        dist.all_reduce(torch.ones(2), op=dist.ReduceOp.BXOR, group=refusing)
        raise AssertionError("BXOR on float accepted")
    except RuntimeError as e:
        check("BXOR" in str(e), str(e))
    try:
        dist.all_reduce(torch.ones(2), group=refusing)
        raise AssertionError("a group that refused a call still runs collectives")
    except RuntimeError as e:
        check("BXOR" in str(e), str(e))
    dist.destroy_process_group(refusing)
    # non-contiguous input: reduced in a contiguous copy, written back
    m = (torch.arange(12, dtype=torch.float32).reshape(3, 4) + r).t()
    check(not m.is_contiguous(), "test tensor is contiguous")
    dist.all_reduce(m)
    want = (torch.arange(12, dtype=torch.float32).reshape(3, 4) * n + n * (n - 1) // 2).t()
    check(torch.equal(m, want), f"non-contiguous {m}")
    # large, async, future
    big = torch.full((1 << 20,), float(r))
    w = dist.all_reduce(big, async_op=True)
    fut = w.get_future()
    check(w.wait(), "wait")
    check(w.is_completed(), "is_completed")
    check(torch.all(fut.value()[0] == n * (n - 1) / 2), "future value")
    # issue order across the paths: async works queued for the worker thread, a synchronous
    # call issued behind them (it must not run before them on the caller's thread), works
    # waited for out of order (wait() may run the next one itself), a future's callback
    x = torch.ones(1 << 12)
    ws = [dist.all_reduce(x, async_op=True) for _ in range(3)]  # x: 1 -> n -> n^2 -> n^3
    y = torch.full((1 << 12,), float(r))
    wy = dist.all_reduce(y, async_op=True)
    dist.all_reduce(x)  # behind the three: n^4
    check(all(w.is_completed() for w in ws), "a synchronous call returned before earlier works")
    check(torch.all(x == n ** 4), f"issue order: {x[:4]} != {n ** 4}")
    wy.wait()
    check(torch.all(y == n * (n - 1) / 2), f"async behind sync {y[:4]}")
    z = [torch.full((7,), float(r + k)) for k in range(4)]
    zw = [dist.all_reduce(t, async_op=True) for t in z]
    seen = []
    zw[0].get_future().then(lambda f: seen.append(float(f.value()[0][0])))
    for k in (3, 1, 2, 0):
        zw[k].wait()
    check(all(torch.all(z[k] == n * (n - 1) / 2 + n * k) for k in range(4)), f"out of order {z}")
    check(seen == [n * (n - 1) / 2], f"future callback saw {seen}")
    # allreduce_coalesced
    ts = [torch.full((3,), float(r)), torch.full((5,), float(2 * r))]
    dist.all_reduce_coalesced(ts)
    check(torch.all(ts[0] == n * (n - 1) / 2) and torch.all(ts[1] == n * (n - 1)), "coalesced")
    # ... with an empty tensor, a non-contiguous one (staged through a copy), a large one across
    # several ring segments, and an average and a max
    big = torch.arange(100003, dtype=torch.float32) % 7 + r
    wide = torch.full((4, 6), float(r + 1))
    col = wide[:, 1]  # stride 6: not contiguous
    ts = [torch.zeros(0), big, col, torch.full((2,), float(3 * r))]
    dist.all_reduce_coalesced(ts, op=dist.ReduceOp.AVG)
    want_big = torch.arange(100003, dtype=torch.float32) % 7 + (n - 1) / 2
    check(torch.equal(ts[1], want_big), "coalesced avg: large tensor")
    check(torch.all(wide[:, 1] == (n + 1) / 2) and torch.all(wide[:, 0] == r + 1),
          f"coalesced avg: strided column {wide}")
    check(torch.all(ts[3] == 3 * (n - 1) / 2), f"coalesced avg: {ts[3]}")
    ms = [torch.tensor([r, -r], dtype=torch.int64), torch.tensor([7 * r], dtype=torch.int64)]
    dist.all_reduce_coalesced(ms, op=dist.ReduceOp.MAX)
    check(ms[0].tolist() == [n - 1, 0] and ms[1].tolist() == [7 * (n - 1)], f"coalesced max {ms}")

    # broadcast from every root
    for root in range(n):
        t = torch.full((6,), float(r * 10))
        dist.broadcast(t, src=root)
        check(torch.all(t == root * 10), f"broadcast root {root}: {t}")
    # reduce to every root
    for root in range(n):
        t = torch.full((9,), r + 1, dtype=torch.int32)
        dist.reduce(t, dst=root)
        if r == root:
            check(torch.all(t == n * (n + 1) // 2), f"reduce root {root}: {t}")
    # all_gather, uneven all_gather, all_gather_into_tensor
    outs = [torch.zeros(3) for _ in range(n)]
    dist.all_gather(outs, torch.full((3,), float(r)))
    check(all(torch.all(outs[q] == q) for q in range(n)), f"all_gather {outs}")
    outs = [torch.zeros(q + 1, dtype=torch.int64) for q in range(n)]
    dist.all_gather(outs, torch.full((r + 1,), r, dtype=torch.int64))
    check(all(torch.all(outs[q] == q) for q in range(n)), f"uneven all_gather {outs}")
    flat = torch.zeros(2 * n, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(flat, torch.full((2,), float(r), dtype=torch.bfloat16))
    check(torch.equal(flat, torch.arange(n).repeat_interleave(2).to(torch.bfloat16)), f"{flat}")
    # gather / scatter at every root
    for root in range(n):
        g = [torch.zeros(4) for _ in range(n)] if r == root else None
        dist.gather(torch.full((4,), float(r + 100)), gather_list=g, dst=root)
        if r == root:
            check(all(torch.all(g[q] == q + 100) for q in range(n)), f"gather {g}")
        out = torch.zeros(2, dtype=torch.int32)
        lst = [torch.full((2,), q * 7, dtype=torch.int32) for q in range(n)] if r == root else None
        dist.scatter(out, scatter_list=lst, src=root)
        check(torch.all(out == r * 7), f"scatter root {root}: {out}")
    # reduce_scatter (list and tensor forms)
    o = torch.zeros(3)
    dist.reduce_scatter(o, [torch.full((3,), float(q * 10 + r)) for q in range(n)])
    check(torch.all(o == r * 10 * n + n * (n - 1) / 2), f"reduce_scatter {o}")
    o = torch.zeros(2)
    dist.reduce_scatter_tensor(o, torch.arange(2 * n, dtype=torch.float32) + r)
    want = torch.arange(2 * r, 2 * r + 2, dtype=torch.float32) * n + n * (n - 1) / 2
    check(torch.equal(o, want), f"reduce_scatter_tensor {o}")
    # reduce_scatter with every op (list form on int64, tensor form on float32): rank r gets
    # element k of its block reduced over q of (q*10 + r + 1 + k) (list), of 2r + k + q (tensor)
    ops = {dist.ReduceOp.SUM: sum, dist.ReduceOp.PRODUCT: math.prod,
           dist.ReduceOp.MIN: min, dist.ReduceOp.MAX: max}
    for op, fold in ops.items():
        o = torch.zeros(2, dtype=torch.int64)
        dist.reduce_scatter(o, [torch.arange(2, dtype=torch.int64) + r * 10 + q + 1
                                for q in range(n)], op=op)
        want = [fold(q * 10 + r + 1 + k for q in range(n)) for k in range(2)]
        check(o.tolist() == want, f"reduce_scatter {op}: {o.tolist()} != {want}")
    for op, fold in list(ops.items()) + [(dist.ReduceOp.AVG, lambda v: sum(v) / n)]:
        o = torch.zeros(2)
        dist.reduce_scatter_tensor(o, torch.arange(2 * n, dtype=torch.float32) + r, op=op)
        want = [float(fold([2 * r + k + q for q in range(n)])) for k in range(2)]
        check(o.tolist() == want, f"reduce_scatter_tensor {op}: {o.tolist()} != {want}")
    # the coalesced forms (torch's _coalescing_manager: one all_gather_single_coalesced and one
    # reduce_scatter_single_coalesced call), with a large tensor across several ring segments
    big = 100003
    ins = [torch.full((2,), float(r)), torch.arange(big, dtype=torch.float32) % 5 + r]
    outs = [torch.zeros(2 * n), torch.zeros(big * n)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    cm.wait()
    check(torch.equal(outs[0], torch.arange(n).repeat_interleave(2).float()),
          f"coalesced all_gather_into_tensor {outs[0]}")
    want = torch.cat([torch.arange(big, dtype=torch.float32) % 5 + q for q in range(n)])
    check(torch.equal(outs[1], want), "coalesced all_gather_into_tensor: large tensor")
    for op, fold in ((dist.ReduceOp.SUM, sum), (dist.ReduceOp.MAX, max)):
        ins = [torch.arange(3 * n, dtype=torch.float32) + r,
               (torch.arange(big * n, dtype=torch.float32) % 7) * (r + 1)]
        outs = [torch.zeros(3), torch.zeros(big)]
        with dist._coalescing_manager(async_ops=True) as cm:
            for o, i in zip(outs, ins):
                dist.reduce_scatter_tensor(o, i, op=op)
        cm.wait()
        want = [float(fold([3 * r + k + q for q in range(n)])) for k in range(3)]
        check(outs[0].tolist() == want, f"coalesced reduce_scatter_tensor {op}: {outs[0]}")
        mine = torch.arange(r * big, (r + 1) * big, dtype=torch.float32) % 7
        want = mine * (n * (n + 1) / 2 if op == dist.ReduceOp.SUM else n)
        check(torch.equal(outs[1], want), f"coalesced reduce_scatter_tensor {op}: large tensor")
    # all_to_all_single, even and with split sizes; all_to_all with lists
    inp = torch.arange(2 * n, dtype=torch.float32) + 100 * r
    outp = torch.zeros(2 * n)
    dist.all_to_all_single(outp, inp)
    want = torch.cat([torch.arange(2 * r, 2 * r + 2, dtype=torch.float32) + 100 * q
                      for q in range(n)])
    check(torch.equal(outp, want), f"all_to_all_single {outp}")
    in_splits = [q + 1 for q in range(n)]          # rank r sends q+1 rows to rank q
    out_splits = [r + 1] * n                        # and receives r+1 rows from everyone
    inp = torch.cat([torch.full((q + 1, 2), float(r * 10 + q)) for q in range(n)])
    outp = torch.zeros(sum(out_splits), 2)
    dist.all_to_all_single(outp, inp, out_splits, in_splits)
    want = torch.cat([torch.full((r + 1, 2), float(q * 10 + r)) for q in range(n)])
    check(torch.equal(outp, want), f"all_to_all_single splits {outp}")
    outs = [torch.zeros(r + 1, dtype=torch.int64) for _ in range(n)]
    dist.all_to_all(outs, [torch.full((q + 1,), r, dtype=torch.int64) for q in range(n)])
    check(all(torch.all(outs[q] == q) for q in range(n)), f"all_to_all {outs}")
    # point to point: a ring of simultaneous exchanges, then blocking send/recv
    nxt, prv = (r + 1) % n, (r - 1) % n
    if n > 1:
        a = torch.full((1 << 20,), float(r))
        b = torch.zeros(1 << 20)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, a, nxt),
                                       dist.P2POp(dist.irecv, b, prv)])
        for q in reqs:
            q.wait()
        check(torch.all(b == prv), "ring isend/irecv")
        if r == 0:
            dist.send(torch.arange(5, dtype=torch.int64), dst=n - 1, tag=4)
        elif r == n - 1:
            t = torch.zeros(5, dtype=torch.int64)
            dist.recv(t, src=0, tag=4)
            check(torch.equal(t, torch.arange(5)), f"recv {t}")
    # sub-groups: every rank calls new_group; members use it
    if n >= 2:
        sub = dist.new_group([0, n - 1])
        if r in (0, n - 1):
            t = torch.ones(3)
            dist.all_reduce(t, group=sub)
            check(torch.all(t == 2), f"subgroup {t}")
        rest = dist.new_group(list(range(1, n))) if n >= 3 else None
        if rest is not None and r >= 1:
            t = torch.full((2,), float(r))
            dist.broadcast(t, src=n - 1, group=rest)
            check(torch.all(t == n - 1), f"subgroup broadcast {t}")
        # split_group: torch asks the backend to split itself (supportsSplitting). torch before
        # 2.15 refuses it for a group bound to no device, whatever the backend ("No device
        # associated with the default pg"), and binds no CPU device: nothing to test there.
        if harness.torch_version() >= (2, 15):
            others = [q for q in range(n) if q not in (0, n - 1)]
            sg = dist.split_group(split_ranks=[[0, n - 1]] + ([others] if others else []))
            t = torch.full((2,), float(r))
            dist.all_reduce(t, group=sg)
            want = float(n - 1) if r in (0, n - 1) else float(sum(others))
            check(torch.all(t == want), f"split_group allreduce {t}")
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {r}: collectives ok")


CONFIGS = [
    {"name": "np2", "world": 2},
    {"name": "np3", "world": 3},
    {"name": "np2-tcp", "world": 2, "env": {"KOLO_TRANSPORT": "tcp"}},
]

if __name__ == "__main__":
    harness.main(rank_main, CONFIGS)
