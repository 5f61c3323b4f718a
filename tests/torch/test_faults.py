#!/usr/bin/env python3
"""Faults under the "kolo" backend: nothing hangs, every rank raises, nothing is left behind.

kill      3 ranks train a DDP model; the driver SIGKILLs rank 1 mid-training. Every survivor
          must raise (exit non-zero with a kolo error) within the group's timeout + 5 s of the
          kill, and no rank process may remain.
mismatch  2 ranks: all_reduce of 10 vs 11 elements, then all_reduce vs broadcast on a fresh
          group: every rank raises a RuntimeError naming both sides.
hang      2 ranks, a 4 s group timeout: rank 1 sleeps instead of calling all_reduce; rank 0's
          all_reduce must raise a timeout within 4 + 5 s, and wait(timeout) on an async
          all_reduce raises at its own shorter timeout first.
stranger  2 ranks over TCP (KOLO_TRANSPORT=tcp): the driver connects to every TCP port the
          ranks listen on (the torch store's included) and sends garbage; the job's next
          collectives still give exact results.
"""
import datetime
import os
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

TIMEOUT_S = 10


def rank_main(r, n, config):
    import torch
    import torch.distributed as dist

    mode = config["mode"]
    seconds = config.get("timeout", TIMEOUT_S)
    dist.init_process_group("kolo", timeout=datetime.timedelta(seconds=seconds))
    if mode == "hang":
        if r == 1:
            time.sleep(seconds + 2)  # never calls; exits after rank 0 has given up
            os._exit(0)
        w = dist.all_reduce(torch.ones(8), async_op=True)
        t0 = time.monotonic()
        try:
            w.wait(datetime.timedelta(seconds=1))
            raise AssertionError("wait(1 s) returned although rank 1 never called")
        except RuntimeError as e:
            waited = time.monotonic() - t0
            assert waited < seconds, f"wait(1 s) took {waited:.2f} s"
            print(f"result: hang: wait(timeout=1 s) raised after {waited:.2f} s: {e}", flush=True)
        t0 = time.monotonic()
        try:
            w.wait()
            raise AssertionError("the collective completed although rank 1 never called")
        except RuntimeError as e:
            waited = time.monotonic() - t0 + 1.0
            print(f"result: hang: the collective failed {waited:.2f} s after it was issued "
                  f"(timeout {seconds} s): {str(e)[:160]}", flush=True)
            assert waited <= seconds + 5, waited
        os._exit(0)
    if mode == "kill":
        from torch.nn.parallel import DistributedDataParallel as DDP
        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                        torch.nn.Linear(256, 8)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(32, 64)
        step = 0
        try:
            while True:  # until the driver kills rank 1
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
                step += 1
                if step == 5:
                    print("training", flush=True)
                time.sleep(0.01)
        except RuntimeError as e:
            print(f"rank {r} raised after step {step}: {e}", flush=True)
            sys.exit(3)
    if mode == "mismatch":
        errors = []
        try:
            dist.all_reduce(torch.ones(10 + r))
        except RuntimeError as e:
            errors.append(str(e))
        # the default group is now unusable, as after NCCL's abort; a new group is not
        g = dist.new_group(list(range(n)))
        try:
            if r == 0:
                dist.all_reduce(torch.ones(4), group=g)
            else:
                dist.broadcast(torch.ones(4), src=0, group=g)
        except RuntimeError as e:
            errors.append(str(e))
        print(f"rank {r} errors: {errors}", flush=True)
        assert len(errors) == 2, errors
        assert "10 x float32" in errors[0] and "11 x float32" in errors[0], errors[0]
        assert "allreduce" in errors[1] and "broadcast" in errors[1], errors[1]
        os._exit(0)  # the groups are aborted: skip the teardown collectives
    if mode == "stranger":
        t = torch.ones(1000)
        dist.all_reduce(t)  # connected
        print(f"ready pid {os.getpid()}", flush=True)
        while not os.path.exists(config["go"]):
            time.sleep(0.05)
        for i in range(3):
            t = torch.full((1 << 16,), float(r + i))
            dist.all_reduce(t)
            assert torch.all(t == sum(q + i for q in range(n))), t
        dist.barrier()
        print(f"rank {r}: exact after the stranger", flush=True)
        dist.destroy_process_group()


def listening_ports(pid):
    """TCP ports a process listens on (its socket inodes matched in /proc/net/tcp{,6})."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = open(f"/proc/{pid}/net/{table}").read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # LISTEN
                ports.add(int(f[1].split(":")[1], 16))
    return sorted(ports)


def alive(pids):
    return [p for p in pids if os.path.exists(f"/proc/{p}") and
            open(f"/proc/{p}/stat").read().split()[2] != "Z"]


def drive_kill(script):
    config = {"name": "kill", "world": 3, "mode": "kill"}
    procs, _ = harness.start_ranks(script, 3, config)
    # wait until rank 0 trains
    t0 = time.monotonic()
    line = ""
    while "training" not in line and time.monotonic() - t0 < 60:
        line = procs[0].stdout.readline()
        if not line and procs[0].poll() is not None:
            break
    killed_at = time.monotonic()
    os.kill(procs[1].pid, signal.SIGKILL)
    outs = harness.finish(procs, TIMEOUT_S + 5)
    elapsed = time.monotonic() - killed_at
    ok = True
    for r in (0, 2):
        rc, out = outs[r]
        if rc != 3 or "kolo" not in out:
            ok = False
    left = alive([p.pid for p in procs])
    print(f"  result: kill: survivors raised within {elapsed:.2f} s of the SIGKILL "
          f"(limit {TIMEOUT_S + 5} s); processes left: {left}")
    for r in (0, 2):
        last = [x for x in outs[r][1].splitlines() if "raised" in x]
        print("  result: " + (last[0] if last else f"rank {r}: no error line"))
    if not ok or left:
        harness.report("kill", outs)
    return ok and not left and elapsed <= TIMEOUT_S + 5


def drive_mismatch(script):
    config = {"name": "mismatch", "world": 2, "mode": "mismatch"}
    return harness.run_config(script, config, 60)


def drive_hang(script):
    config = {"name": "hang", "world": 2, "mode": "hang", "timeout": 4}
    return harness.run_config(script, config, 60)


def drive_stranger(script):
    go = f"/tmp/kolo-stranger-go-{os.getpid()}"
    config = {"name": "stranger", "world": 2, "mode": "stranger", "go": go,
              "env": {"KOLO_TRANSPORT": "tcp"}}
    procs, _ = harness.start_ranks(script, 2, config)
    pids = []
    for p in procs:
        line = ""
        t0 = time.monotonic()
        while "ready pid" not in line and time.monotonic() - t0 < 60:
            line = p.stdout.readline()
            if not line and p.poll() is not None:
                break
        pids.append(p.pid)
    poked = 0
    for pid in pids:
        for port in listening_ports(pid):
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                    s.sendall(os.urandom(200) + b"GET / HTTP/1.0\r\n\r\n")
                    poked += 1
            except OSError:
                pass
    open(go, "w").close()
    outs = harness.finish(procs, 60)
    os.unlink(go)
    ok = all(rc == 0 for rc, _ in outs) and all("exact after the stranger" in o for _, o in outs)
    print(f"  result: stranger: garbage sent to {poked} listening port(s); job exact: {ok}")
    if not ok:
        harness.report("stranger", outs)
    return ok


if __name__ == "__main__":
    args = harness.rank_args()
    if args.rank is not None:
        import json
        rank_main(args.rank, args.world, json.loads(args.config))
        sys.exit(0)
    script = os.path.abspath(sys.argv[0])
    passed = failed = 0
    for name, fn in (("kill", drive_kill), ("mismatch", drive_mismatch), ("hang", drive_hang),
                     ("stranger", drive_stranger)):
        if args.only and args.only not in name:
            continue
        t0 = time.monotonic()
        ok = fn(script)
        print(f"{'PASS' if ok else 'FAIL'} {name} ({time.monotonic() - t0:.1f} s)", flush=True)
        passed += ok
        failed += not ok
    print(f"{passed} passed, {failed} failed")
    sys.exit(0 if failed == 0 and passed > 0 else 1)
