#!/usr/bin/env python3
"""DistributedDataParallel on the "kolo" backend matches one process on the full batch.

A small CNN (two conv layers, two linear layers: 0.5 M parameters) trains for STEPS SGD steps
from the same seed. Each of N ranks takes an equal shard of the batch; rank 0 also trains an
undistributed copy on the whole batch. Data parallelism averages the shards' mean gradients,
which equals the full batch's mean gradient, so the weights must agree:
  - every rank holds bit-identical weights (checked exactly with an allgather of the bytes);
  - against the single process: max |diff| <= 1e-6 (float32 sums in another order; measured
    1.5e-8 at N=2, 1.9e-8 at N=3);
  - with fp16_compress_hook: <= 1e-4 (measured 1.4e-5), with bf16_compress_hook: <= 2e-3
    (measured 2.8e-4): the gradients are rounded to 10 and 7 mantissa bits before averaging;
    each bound is about 7x what was measured.
Rendezvous variants prove the bootstrap through torch's own store: env://, tcp://, file://
and a user's TCPStore.

np2-fsdp trains the same model sharded instead, in one process group: with FSDP2
(torch.distributed.fsdp.fully_shard on a CPU DeviceMesh, each conv and linear layer a unit of
its own, then the root) and with FSDP1 (FullyShardedDataParallel, device_id=cpu: without it
FSDP1 raises "FSDP needs a non-CPU accelerator device"). FSDP2 gathers each unit's parameters
with all_gather_into_tensor (in place: the input is this rank's block of the output) and
averages the gradients with reduce_scatter_tensor (ReduceOp.AVG). The gathered weights must
match the single process within the same 1e-6 (measured 3.0e-8 with both).

np2-comm-hooks runs every hook of torch.distributed.algorithms.ddp_comm_hooks under kolo and
under Gloo in one pair of processes (a kolo default group and a Gloo group side by side), with
the same seed, data and hook, and requires the same weights: allreduce, fp16 and bf16
compression (and their wrappers around PowerSGD), PowerSGD and batched PowerSGD (rank 1 and 2,
start_powerSGD_iter=2: the hooks issue collectives from a future's callback and wait on them,
which deadlocked kolo's worker before issue 52), the quantization hooks, noop, and post-localSGD
with PeriodicModelAverager inside PostLocalSGDOptimizer. At N = 2 each reduction is one sum of
two values, which is exact in any order, so the check is bit-exact (torch.equal) for every hook.
A hook that fails under Gloo itself must fail the same way under kolo (the same exception type
and message), and the reason is printed: with torch 2.15, batched_powerSGD_hook raises
AssertionError in powerSGD_hook._orthogonalize (it passes a 2-D matrix where a 3-D batch is
asserted) once PowerSGD starts, on every backend. Each case is bounded:
a group timeout of HOOK_TIMEOUT s, and a watchdog that fails the rank with the case's name
HOOK_TIMEOUT + 5 s after the case began; the driver's deadline for the pair is the sum of those.
"""
import datetime
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

STEPS = 4
BATCH = 24
TOL = {"none": 1e-6, "fp16": 1e-4, "bf16": 2e-3}


def make_model(torch):
    torch.manual_seed(1234)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 4 * 4, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 10))


def train(torch, model, data, target, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(data), target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def rank_main(r, n, config):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=config.get("group_timeout", 60))
    init = config.get("init", "env")
    if init == "env":
        dist.init_process_group("kolo", timeout=timeout)
    elif init == "tcp":
        dist.init_process_group("kolo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}",
                                rank=r, world_size=n, timeout=timeout)
    elif init == "file":
        dist.init_process_group("kolo", init_method="file://" + config["file"], rank=r,
                                world_size=n, timeout=timeout)
    elif init == "store":
        store = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), n, r == 0,
                              timeout=timeout)
        dist.init_process_group("kolo", store=store, rank=r, world_size=n, timeout=timeout)
    assert dist.get_backend() == "kolo"

    g = torch.Generator().manual_seed(99)
    data = torch.randn(BATCH, 3, 16, 16, generator=g)
    target = torch.randint(0, 10, (BATCH,), generator=g)
    shard = BATCH // n
    mine = slice(r * shard, (r + 1) * shard)

    if config.get("wrap") == "hooks":
        comm_hooks_main(torch, dist, r, n)
        return
    if config.get("wrap") == "fsdp":
        fsdp_main(torch, dist, r, n, data, target, mine)
        dist.barrier()
        dist.destroy_process_group()
        return
    model = DDP(make_model(torch), bucket_cap_mb=1)  # several buckets: overlap with backward
    hook = config.get("hook", "none")
    if hook != "none":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        model.register_comm_hook(None, default_hooks.fp16_compress_hook if hook == "fp16"
                                 else default_hooks.bf16_compress_hook)
    losses = train(torch, model, data[mine], target[mine], STEPS)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    # bit-identical on every rank
    everyone = [torch.empty_like(flat) for _ in range(n)]
    dist.all_gather(everyone, flat)
    for q in range(n):
        assert torch.equal(everyone[q], flat), f"rank {q}'s weights differ from rank {r}'s"
    if r == 0:
        ref = make_model(torch)
        ref_losses = train(torch, ref, data, target, STEPS)
        ref_flat = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
        diff = (flat - ref_flat).abs().max().item()
        print(f"result: hook={hook} init={init} n={n}: max |ddp - single| = {diff:.3g} "
              f"(tolerance {TOL[hook]}), loss {ref_losses[0]:.4f} -> {ref_losses[-1]:.4f}")
        assert diff <= TOL[hook], f"DDP weights differ from the single process by {diff}"
        assert ref_losses[-1] < ref_losses[0], "the loss did not go down"
    dist.barrier()
    dist.destroy_process_group()


def fsdp_main(torch, dist, r, n, data, target, mine):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import fully_shard

    ref = make_model(torch)
    ref_losses = train(torch, ref, data, target, STEPS)
    ref_flat = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
    # FSDP2: parameters become DTensors sharded over the mesh; full_tensor() gathers one
    mesh = init_device_mesh("cpu", (n,))
    model = make_model(torch)
    for m in model:
        if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear)):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    train(torch, model, data[mine], target[mine], STEPS)
    fsdp2 = torch.cat([p.full_tensor().detach().reshape(-1) for p in model.parameters()])
    # FSDP1 on CPU: device_id=torch.device("cpu")
    model = FSDP(make_model(torch), device_id=torch.device("cpu"))
    train(torch, model, data[mine], target[mine], STEPS)
    with FSDP.summon_full_params(model):
        fsdp1 = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    for name, flat in (("fsdp2 (fully_shard)", fsdp2), ("fsdp1 (device_id=cpu)", fsdp1)):
        diff = (flat - ref_flat).abs().max().item()
        if r == 0:
            print(f"result: {name} n={n}: max |fsdp - single| = {diff:.3g} (tolerance "
                  f"{TOL['none']}), loss {ref_losses[0]:.4f} -> {ref_losses[-1]:.4f}")
        assert flat.numel() == ref_flat.numel(), (name, flat.numel(), ref_flat.numel())
        assert diff <= TOL["none"], f"{name} weights differ from the single process by {diff}"


HOOK_TIMEOUT = 10  # the groups' timeout in np2-comm-hooks (s); each case's watchdog: + 5 s
HOOK_STEPS = 6
HOOK_CASES = 12  # len(comm_hook_cases(...)), for the driver's deadline (it imports no torch);
# 3 more cases follow them: callbacks that wait, wait(timeout) on kolo and on Gloo


def comm_hook_cases(dist, pg):
    """[(name, make(ddp_model) -> optimizer factory or None)]: each registers its hook on pg."""
    from torch.distributed.algorithms.ddp_comm_hooks import (debugging_hooks, default_hooks,
                                                             post_localSGD_hook, powerSGD_hook,
                                                             quantization_hooks)

    def simple(hook):
        return lambda model: model.register_comm_hook(pg, hook)

    def powersgd(hook, rank, wrap=None):
        def reg(model):
            state = powerSGD_hook.PowerSGDState(process_group=pg, matrix_approximation_rank=rank,
                                                start_powerSGD_iter=2, random_seed=7)
            model.register_comm_hook(state, wrap(hook) if wrap else hook)
        return reg

    def localsgd(model):
        # each rank alone in its subgroup: local SGD after step 2, the averager then makes the
        # models agree every 2nd step over pg
        subs = [dist.new_group([q], backend=dist.get_backend(pg)) for q in range(pg.size())]
        state = post_localSGD_hook.PostLocalSGDState(
            process_group=pg, subgroup=subs[dist.get_rank()], start_localSGD_iter=2)
        model.register_comm_hook(state, post_localSGD_hook.post_localSGD_hook)
        return "localsgd"

    return [
        ("allreduce_hook", simple(default_hooks.allreduce_hook)),
        ("fp16_compress_hook", simple(default_hooks.fp16_compress_hook)),
        ("bf16_compress_hook", simple(default_hooks.bf16_compress_hook)),
        ("noop_hook", simple(debugging_hooks.noop_hook)),
        ("quantization_pertensor_hook", simple(quantization_hooks.quantization_pertensor_hook)),
        ("quantization_perchannel_hook", simple(quantization_hooks.quantization_perchannel_hook)),
        ("powerSGD_hook rank 2", powersgd(powerSGD_hook.powerSGD_hook, 2)),
        ("powerSGD_hook rank 1", powersgd(powerSGD_hook.powerSGD_hook, 1)),
        ("batched_powerSGD_hook rank 2", powersgd(powerSGD_hook.batched_powerSGD_hook, 2)),
        ("fp16_compress_wrapper(powerSGD_hook)",
         powersgd(powerSGD_hook.powerSGD_hook, 2, default_hooks.fp16_compress_wrapper)),
        ("bf16_compress_wrapper(powerSGD_hook)",
         powersgd(powerSGD_hook.powerSGD_hook, 2, default_hooks.bf16_compress_wrapper)),
        ("post_localSGD_hook + PostLocalSGDOptimizer", localsgd),
    ]


def hook_train(torch, dist, pg, register, r):
    """HOOK_STEPS steps of an MLP 64->64->8 under DDP on pg with the hook; the final weights."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(5)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    model = DDP(net, process_group=pg)
    kind = register(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if kind == "localsgd":
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
        from torch.distributed.optim import PostLocalSGDOptimizer

        opt = PostLocalSGDOptimizer(optim=opt, averager=PeriodicModelAverager(
            period=2, warmup_steps=2, process_group=pg))
    g = torch.Generator().manual_seed(11 + r)
    for _ in range(HOOK_STEPS):
        x = torch.randn(16, 64, generator=g)
        y = torch.randn(16, 8, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def case_watchdog(what):
    """Fails the rank with `what` named if it is still running HOOK_TIMEOUT + 5 s from now."""
    import threading

    def expired():
        print(f"FAIL: {what} did not finish within {HOOK_TIMEOUT + 5} s (the group timeout "
              f"{HOOK_TIMEOUT} s + 5 s): a hang", flush=True)
        os._exit(3)

    watchdog = threading.Timer(HOOK_TIMEOUT + 5, expired)
    watchdog.daemon = True
    watchdog.start()
    return watchdog


def comm_hooks_main(torch, dist, r, n):
    import time
    import traceback

    gloo = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=HOOK_TIMEOUT))
    kolo = dist.group.WORLD
    failing = []
    total = time.monotonic()
    assert len(comm_hook_cases(dist, kolo)) == HOOK_CASES
    for (name, reg_kolo), (_, reg_gloo) in zip(comm_hook_cases(dist, kolo),
                                                comm_hook_cases(dist, gloo)):
        watchdog = case_watchdog(f"comm hook {name!r}")
        t0 = time.monotonic()
        try:
            want = hook_train(torch, dist, gloo, reg_gloo, r)
        except Exception as gloo_error:  # the hook cannot run: kolo must fail alike
            try:
                hook_train(torch, dist, kolo, reg_kolo, r)
                raise AssertionError(f"{name}: kolo ran the hook Gloo fails with {gloo_error!r}")
            except type(gloo_error) as kolo_error:
                assert str(kolo_error) == str(gloo_error), (name, kolo_error, gloo_error)
            watchdog.cancel()
            failing.append(name)
            if r == 0:
                print(f"result: {name}: fails under Gloo and kolo alike (not a kolo gap): "
                      f"{type(gloo_error).__name__} {str(gloo_error)[:80]!r} raised at "
                      f"{traceback.extract_tb(gloo_error.__traceback__)[-1].name}", flush=True)
            continue
        t1 = time.monotonic()
        got = hook_train(torch, dist, kolo, reg_kolo, r)
        t2 = time.monotonic()
        watchdog.cancel()
        everyone = [torch.empty_like(got) for _ in range(n)]
        dist.all_gather(everyone, got)
        if name.startswith(("post_localSGD", "noop")):
            pass  # local steps (no averaging): ranks differ, each must match its Gloo twin
        else:
            assert all(torch.equal(e, got) for e in everyone), f"{name}: ranks' weights differ"
        diff = (got - want).abs().max().item()
        if r == 0:
            print(f"result: {name}: max |kolo - gloo| = {diff:.3g} (exact required); "
                  f"gloo {t1 - t0:.2f} s, kolo {t2 - t1:.2f} s", flush=True)
        assert torch.equal(got, want), f"{name}: kolo's weights differ from Gloo's by {diff}"
    if r == 0:
        print(f"result: {HOOK_CASES} hooks ({len(failing)} failing under Gloo too: {failing}) in "
              f"{time.monotonic() - total:.1f} s")
    watchdog = case_watchdog("callbacks that wait")
    callbacks_wait(torch, dist, r)
    watchdog.cancel()
    for label, pg in (("kolo", kolo), ("gloo", gloo)):
        watchdog = case_watchdog(f"{label}: wait(timeout)")
        timed_wait_runs_on(torch, dist, label, pg, r)
        watchdog.cancel()
    dist.barrier()
    dist.destroy_process_group()


def callbacks_wait(torch, dist, r):
    """A future's callback issues collectives (sync and async) and waits on them, and one
    point-to-point request's callback waits for the other request, finished with it."""
    def chained(fut):
        b = fut.value()[0] + 1  # 3
        dist.all_reduce(b)  # synchronous, from the callback: 6
        dist.all_reduce(b, async_op=True).wait()  # 12
        return dist.all_reduce(b, async_op=True).get_future().wait()[0]  # 24

    a = torch.ones(8)
    got = dist.all_reduce(a, async_op=True).get_future().then(chained).wait()
    assert torch.equal(got, torch.full((8,), 24.0)), got
    x, y = torch.full((4,), 5.0), torch.full((4,), 7.0)
    if r == 0:
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, x, 1),
                                         dist.P2POp(dist.isend, y, 1)]):
            w.wait()
    else:
        x.zero_()
        y.zero_()
        rx, ry = dist.batch_isend_irecv([dist.P2POp(dist.irecv, x, 0),
                                         dist.P2POp(dist.irecv, y, 0)])
        both = rx.get_future().then(lambda f: ry.wait() and f.value()[0] + y).wait()
        assert torch.equal(both, torch.full((4,), 12.0)), both
    dist.barrier()
    if r == 0:
        print("result: callbacks that wait on collectives and on a sibling request: exact")


def timed_wait_runs_on(torch, dist, label, pg, r):
    """work.wait(timeout) that expires raises and does not cancel: the operation completes
    later, when the late peer joins, and writes its result into the tensor (docs/torch.md)."""
    import time

    dist.barrier(group=pg)
    x = torch.full((1000,), float(r + 1))
    if r == 1:
        time.sleep(1.0)
    work = dist.all_reduce(x, group=pg, async_op=True)
    if r == 0:
        t0 = time.monotonic()
        try:
            work.wait(timeout=datetime.timedelta(milliseconds=200))
            raise AssertionError("wait(timeout=0.2 s) returned while the peer was 1 s late")
        except RuntimeError as e:
            waited = time.monotonic() - t0
            print(f"result: {label}: wait(timeout=0.2 s) raised after "
                  f"{waited:.2f} s: {str(e).splitlines()[0][:160]}", flush=True)
            assert 0.15 < waited < 0.9, waited
            if label == "kolo":
                assert "not cancelled" in str(e), str(e)
    work.wait()  # the peer came: the same work completes and wrote the sum into x
    assert work.is_completed()
    assert torch.equal(x, torch.full((1000,), 3.0)), x[:4]


_file = os.path.join(tempfile.gettempdir(), f"kolo-ddp-filestore-{os.getpid()}")
CONFIGS = [
    {"name": "np2-env", "world": 2},
    {"name": "np3-tcp-init", "world": 3, "init": "tcp"},
    {"name": "np2-file-init", "world": 2, "init": "file", "file": _file},
    {"name": "np2-user-tcpstore", "world": 2, "init": "store"},
    {"name": "np2-fp16-hook", "world": 2, "hook": "fp16"},
    {"name": "np2-bf16-hook", "world": 2, "hook": "bf16"},
    {"name": "np2-fsdp", "world": 2, "wrap": "fsdp"},
    {"name": "np2-comm-hooks", "world": 2, "wrap": "hooks", "group_timeout": HOOK_TIMEOUT,
     "unset": ["KOLO_TIMEOUT_SECONDS"],  # CI's longer kolo timeout would outlast the watchdog
     "deadline": 20 + (HOOK_CASES + 3) * (HOOK_TIMEOUT + 5)},  # 20 s: start-up and torch's import
]

if __name__ == "__main__":
    try:
        harness.main(rank_main, CONFIGS)
    finally:
        if os.path.exists(_file) and "--rank" not in sys.argv:
            os.unlink(_file)
