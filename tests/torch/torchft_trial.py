#!/usr/bin/env python3
"""torchft_trial.py — torchft from PyPI with kolo as the replica groups' backend
(kolo_torch.torchft.ProcessGroupKolo), run by hand: torchft is not in the cached test
environment.

Two replica groups of one process each train a small model under torchft's Manager (its Rust
lighthouse and quorum, torchft's DistributedDataParallel and OptimizerWrapper, min_replica_size
1). Replica 1 SIGKILLs itself after step KILL_AT; replica 0 notices through kolo (its allreduce
fails), torchft re-forms the quorum without it and replica 0 trains on alone; the driver then
starts replica 1 again 1.5 s later, which joins the quorum, heals from replica 0 (torchft's checkpoint
transport) and trains to the end with it. Checked: both replicas finish STEPS steps with the
same parameters bit for bit, replica 0 ran steps with one participant, and the new replica 1
started from a healed step > 0. Exit 0 when all of that holds.

    pip install torchft==0.2.0          # where torch and kolo_torch are installed
    python tests/torch/torchft_trial.py  # PASS, about 15 s
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

STEPS = 30
KILL_AT = 8


def replica(replica_id: int, lighthouse: str, out: str, kill_at: int) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torchft import DistributedDataParallel, Manager
    from torchft.optim import OptimizerWrapper

    from kolo_torch.torchft import ProcessGroupKolo

    store = dist.TCPStore("localhost", 0, is_master=True, wait_for_workers=False)
    torch.manual_seed(0)
    net = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)

    def state_dict():
        return {"model": net.state_dict(), "optim": opt.state_dict()}

    def load_state_dict(sd):
        net.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optim"])

    manager = Manager(pg=ProcessGroupKolo(timeout=timedelta(seconds=10)), min_replica_size=1,
                      load_state_dict=load_state_dict, state_dict=state_dict,
                      replica_id=f"replica{replica_id}", store_addr="localhost",
                      store_port=store.port, rank=0, world_size=1, lighthouse_addr=lighthouse,
                      timeout=timedelta(seconds=10), quorum_timeout=timedelta(seconds=30))
    model = DistributedDataParallel(manager, net)
    optimizer = OptimizerWrapper(manager, opt)
    first = None
    while manager.current_step() < STEPS:
        step = manager.current_step()
        g = torch.Generator().manual_seed(1000 + step)  # every replica the same batch per step
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
        optimizer.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        optimizer.step()
        if first is None:
            first = manager.current_step()
        print(f"replica {replica_id} step {manager.current_step()} participants "
              f"{manager.num_participants()} backend {manager._pg.getBackendName()}", flush=True)
        if kill_at and manager.current_step() >= kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.1)
    torch.save({"state": net.state_dict(), "first": first}, out)
    print(f"replica {replica_id} done at step {manager.current_step()}", flush=True)
    manager.shutdown(wait=False)
    os._exit(0)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "replica":
        replica(int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]))
        return 0
    import torch
    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=1, join_timeout_ms=1000)
    addr = lighthouse.address()
    me = os.path.abspath(__file__)
    with tempfile.TemporaryDirectory(prefix="kolo-torchft-") as d:
        outs = [os.path.join(d, f"r{i}.pt") for i in range(2)]

        def start(i, kill_at):
            return subprocess.Popen([sys.executable, me, "replica", str(i), addr, outs[i],
                                     str(kill_at)], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)

        r0, r1 = start(0, 0), start(1, KILL_AT)
        out1, _ = r1.communicate(timeout=180)
        print(f"replica 1 ended with {r1.returncode} (SIGKILL is {-signal.SIGKILL})")
        time.sleep(1.5)  # replica 0 trains alone meanwhile
        r1b = start(1, 0)
        out1b, _ = r1b.communicate(timeout=180)
        out0, _ = r0.communicate(timeout=180)
        lighthouse.shutdown()
        for name, text in (("replica 0", out0), ("replica 1 (killed)", out1),
                           ("replica 1 (again)", out1b)):
            lines = [ln for ln in text.splitlines() if re.match(r"replica \d (step|done)", ln)]
            print(f"--- {name}: {len(lines)} step lines; last: {lines[-3:]}")
        ok = r0.returncode == 0 and r1b.returncode == 0 and r1.returncode == -signal.SIGKILL
        alone = [int(m.group(1)) for m in (re.match(r"replica 0 step (\d+) participants 1 ", ln)
                                             for ln in out0.splitlines()) if m]
        alone = [s for s in alone if s > KILL_AT]
        print(f"replica 0 steps with one participant after the kill: {alone}")
        if ok:
            a, b = torch.load(outs[0]), torch.load(outs[1])
            same = all(torch.equal(a["state"][k], b["state"][k]) for k in a["state"])
            print(f"replica 1 (again) began at step {b['first']}; parameters equal: {same}")
            ok = same and b["first"] > 1 and len(alone) > 0
        if not ok or os.environ.get("VERBOSE"):
            for text in (out0, out1, out1b):
                print("\n".join(ln for ln in text.splitlines() if ln.startswith("replica ") or
                                "rror" in ln or "Traceback" in ln), "\n=====")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
