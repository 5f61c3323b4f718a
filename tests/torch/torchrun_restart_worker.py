"""torchrun_restart_worker.py — the training script of test_faults.py's torchrun case: started by
`torchrun --max-restarts 1`, it trains on the kolo backend, rank 0 checkpointing every 10 steps
to CKPT_DIR; in the first attempt (TORCHELASTIC_RESTART_COUNT 0) rank KILL_RANK SIGKILLs itself
at step KILL_STEP, so the agent restarts every worker, which resume from the checkpoint. The
"model" is exact: each step adds the all_reduce of (rank + 1) to w, so after STEPS steps at world
size n every element of w is STEPS * n(n+1)/2, whichever step the job resumed at.

Prints "attempt A rank R resumed at S" and, at the end, "attempt A rank R done w=W".
"""
import os
import signal
import sys

import torch
import torch.distributed as dist

import kolo_torch  # noqa: F401  (registers the backend)


def main():
    steps = int(os.environ["STEPS"])
    ckpt = os.path.join(os.environ["CKPT_DIR"], "ckpt.pt")
    kill_rank, kill_step = int(os.environ["KILL_RANK"]), int(os.environ["KILL_STEP"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group("kolo")
    r, n = dist.get_rank(), dist.get_world_size()
    w = torch.zeros(1000, dtype=torch.float64)
    start = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        w, start = state["w"], state["step"]
    print(f"attempt {attempt} rank {r} resumed at {start}", flush=True)
    for step in range(start, steps):
        if attempt == 0 and r == kill_rank and step == kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        g = torch.full((1000,), float(r + 1), dtype=torch.float64)
        dist.all_reduce(g)
        w += g
        if r == 0 and (step + 1) % 10 == 0:
            torch.save({"w": w, "step": step + 1}, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
    want = steps * n * (n + 1) / 2
    assert torch.all(w == want), (w[:4], want)
    dist.barrier()
    print(f"attempt {attempt} rank {r} done w={w[0].item():.0f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
