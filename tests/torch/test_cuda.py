#!/usr/bin/env python3
"""The CUDA build of kolo_torch (KOLO_TORCH_CUDA=1): CUDA tensors through kolo's NCCL transport.

    KOLO_TORCH_CUDA=1 pip install --target DIR backends/torch
    PYTHONPATH=DIR python tests/torch/test_cuda.py host      # anywhere: the build loads and works
    PYTHONPATH=DIR python tests/torch/test_cuda.py device    # a GPU: exit 77 without one

host    the extension loaded is the CUDA build (kolo_torch._C.built_with_cuda()); 2 ranks run
        the collectives of the NCCL path on CPU tensors through it (exact), and the group
        never creates an NCCL communicator for them (no GPU needed).
device  needs a GPU (exit 77 without one, as kolo's GPU tests; 1 with KOLO_TEST_REQUIRE_GPU=1).
        nccl-np1: one rank, every NCCL-path collective on CUDA tensors of every dtype (exact), a
        tensor written on a side stream just before the call (kolo's stream must wait for it), a
        non-contiguous and a rooted collective on CUDA tensors (staged through the host), CPU and
        CUDA tensors interleaved in one group. staged-np2: two ranks sharing GPU 0 with
        KOLO_NCCL=0 (the transport stages device buffers through pinned host memory). nccl-np2:
        two ranks, one GPU each (needs 2 GPUs; NCCL refuses two ranks on one GPU).
"""
import datetime
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def nccl_path_collectives(r, n, device):
    """The collectives the CUDA build sends to NCCL, on `device` tensors; exact."""
    import torch
    import torch.distributed as dist

    for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
               torch.int64, torch.uint8, torch.int8):
        t = (torch.arange(1, 6, dtype=torch.int64) * (r + 1)).to(dt).to(device)
        dist.all_reduce(t)
        want = torch.arange(1, 6, dtype=torch.int64) * (n * (n + 1) // 2)
        check(torch.equal(t.cpu().to(torch.int64), want), f"all_reduce {dt} on {device}: {t}")
    t = torch.full((1 << 20,), float(r), device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    check(bool(torch.all(t == n - 1)), f"all_reduce max 4 MiB on {device}")
    t = torch.ones(4, device=device)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(3.0))
    check(bool(torch.all(t == 3 * n)), f"premul_sum on {device}: {t}")
    for root in range(n):
        t = torch.full((6,), float(r * 10), device=device)
        dist.broadcast(t, src=root)
        check(bool(torch.all(t == root * 10)), f"broadcast root {root} on {device}: {t}")
    flat = torch.zeros(2 * n, device=device)
    dist.all_gather_into_tensor(flat, torch.full((2,), float(r), device=device))
    check(torch.equal(flat.cpu(), torch.arange(n).repeat_interleave(2).float()),
          f"all_gather_into_tensor on {device}: {flat}")
    o = torch.zeros(2, device=device)
    dist.reduce_scatter_tensor(o, torch.arange(2 * n, dtype=torch.float32, device=device) + r)
    want = torch.arange(2 * r, 2 * r + 2, dtype=torch.float32) * n + n * (n - 1) / 2
    check(torch.equal(o.cpu(), want), f"reduce_scatter_tensor on {device}: {o}")
    inp = torch.arange(2 * n, dtype=torch.float32, device=device) + 100 * r
    outp = torch.zeros(2 * n, device=device)
    dist.all_to_all_single(outp, inp)
    want = torch.cat([torch.arange(2 * r, 2 * r + 2, dtype=torch.float32) + 100 * q
                      for q in range(n)])
    check(torch.equal(outp.cpu(), want), f"all_to_all_single on {device}: {outp}")
    w = dist.all_reduce(torch.full((8,), float(r), device=device), async_op=True)
    w.wait()
    check(bool(torch.all(w.result()[0] == n * (n - 1) / 2)), f"async result on {device}")


def rank_main(r, n, config):
    import torch
    import torch.distributed as dist

    import kolo_torch

    check(kolo_torch._C.built_with_cuda(), f"{kolo_torch.__file__} is not the CUDA build")
    dist.init_process_group("kolo", timeout=datetime.timedelta(seconds=60))
    if config["mode"] == "host":
        nccl_path_collectives(r, n, "cpu")
        dist.barrier()
        dist.destroy_process_group()
        print(f"rank {r}: the CUDA build's host path is exact", flush=True)
        return
    dev = torch.device("cuda", config.get("gpu_of_rank", [0, 1])[r] if n > 1 else 0)
    torch.cuda.set_device(dev)
    nccl_path_collectives(r, n, dev)
    # written on a side stream just before the call: kolo's stream must wait for it
    side = torch.cuda.Stream(device=dev)
    with torch.cuda.stream(side):
        t = torch.empty(1 << 22, device=dev)
        torch.cuda._sleep(50_000_000)  # ~tens of ms of GPU time ahead of the fill
        t.fill_(float(r + 1))
        dist.all_reduce(t)
    side.synchronize()
    check(bool(torch.all(t == n * (n + 1) / 2)), f"side stream: {t[:4]}")
    # staged through the host: a non-contiguous CUDA tensor, a rooted collective
    m = (torch.arange(12, dtype=torch.float32, device=dev).reshape(3, 4) + r).t()
    dist.all_reduce(m)
    want = (torch.arange(12, dtype=torch.float32).reshape(3, 4) * n + n * (n - 1) // 2).t()
    check(torch.equal(m.cpu(), want), f"non-contiguous CUDA: {m}")
    t = torch.full((9,), r + 1, dtype=torch.int32, device=dev)
    dist.reduce(t, dst=0)
    if r == 0:
        check(bool(torch.all(t == n * (n + 1) // 2)), f"reduce on CUDA: {t}")
    # CPU and CUDA tensors interleaved in one group, in issue order
    a = torch.ones(16)
    b = torch.ones(16, device=dev)
    wa = dist.all_reduce(a, async_op=True)
    wb = dist.all_reduce(b, async_op=True)
    dist.all_reduce(a)
    wa.wait()
    wb.wait()
    check(bool(torch.all(a == n * n)) and bool(torch.all(b == n)), f"mixed: {a[:2]} {b[:2]}")
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {r}: CUDA tensors exact ({config['name']})", flush=True)


HOST = [{"name": "host-np2", "world": 2, "mode": "host"}]
DEVICE = [
    {"name": "nccl-np1", "world": 1, "mode": "device"},
    {"name": "staged-np2", "world": 2, "mode": "device", "gpu_of_rank": [0, 0],
     "env": {"KOLO_NCCL": "0"}},
    {"name": "nccl-np2", "world": 2, "mode": "device", "gpu_of_rank": [0, 1], "gpus": 2},
]

if __name__ == "__main__":
    if "--rank" in sys.argv:
        harness.main(rank_main, HOST + DEVICE)
    else:
        what = sys.argv.pop(1) if len(sys.argv) > 1 and sys.argv[1] in ("host", "device") else ""
        if what not in ("host", "device"):
            sys.exit("usage: test_cuda.py host|device [--only NAME]")
        import kolo_torch
        import torch

        if not kolo_torch._C.built_with_cuda():
            sys.exit(f"{kolo_torch.__file__} is not the CUDA build (install it with "
                     "KOLO_TORCH_CUDA=1)")
        if what == "device":
            gpus = torch.cuda.device_count()
            if gpus == 0:
                # tests/common/kolo_skip.py: 77, allowed in CI (no-gpu); 1 where
                # KOLO_TEST_REQUIRE_GPU=1 says this machine must have one.
                sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                "..", "common"))
                import kolo_skip

                kolo_skip.exit_skip("no-gpu", "no CUDA device: the device checks need a GPU")
            configs = [c for c in DEVICE if c.get("gpus", 1) <= gpus]
            print(f"{gpus} GPU(s): {[c['name'] for c in configs]}")
        else:
            configs = HOST
        harness.main(rank_main, configs)
