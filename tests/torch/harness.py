"""Process harness of the kolo_torch tests: real ranks, each a fresh Python process.

A test script calls `main(rank_fn, configs)`. Run without --rank it is the driver: for each
configuration it starts `world` copies of itself with --rank/--world/--port (and the config's
environment), waits for them with a deadline, and fails with every rank's output when a rank
fails. Run with --rank it is one rank: it sets torch's env:// variables and calls
rank_fn(rank, world, config).
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(script, world, config, extra_env=None):
    port = free_port()
    env = dict(os.environ)
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world),
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.update(config.get("env", {}))
    env.update(extra_env or {})
    for var in config.get("unset", []):  # e.g. CI's KOLO_TIMEOUT_SECONDS over a tested timeout
        env.pop(var, None)
    procs = []
    for r in range(world):
        procs.append(subprocess.Popen(
            [sys.executable, script, "--rank", str(r), "--world", str(world), "--port", str(port),
             "--config", json.dumps(config)],
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True))
    return procs, port


def finish(procs, timeout):
    """Waits for every rank (killing all at the deadline); returns [(rc, output)]."""
    deadline = time.monotonic() + timeout
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                try:
                    os.killpg(q.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            out, _ = p.communicate()
            out += f"\n[harness: rank killed at the {timeout} s deadline]"
        outs.append((p.returncode, out))
    return outs


def report(name, outs):
    for r, (rc, out) in enumerate(outs):
        print(f"---- {name}: rank {r} exit {rc} ----")
        print(out.rstrip())


def run_config(script, config, timeout):
    world = config["world"]
    procs, _ = start_ranks(script, world, config)
    outs = finish(procs, timeout)
    ok = all(rc == 0 for rc, _ in outs)
    if not ok:
        report(config.get("name", "config"), outs)
    else:  # the lines a rank marks as results (measured differences, timings)
        for rc, out in outs:
            for line in out.splitlines():
                if line.startswith("result: "):
                    print("  " + line)
    return ok


def torch_version():
    """(major, minor) of the torch in use."""
    import torch

    return tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])


def load_backend_for_old_torch():
    """torch before 2.14 does not load the "torch.distributed.backends" entry points, so its
    users import kolo_torch (which registers "kolo") before init_process_group; a rank does the
    same there. From 2.14 on a rank imports nothing, as a user's script need not, and the tests
    prove that torch finds the backend through its entry point."""
    if torch_version() < (2, 14):
        import kolo_torch  # noqa: F401


def rank_args():
    """The command line of a driver or of a rank (--rank set: the backend is loadable)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int)
    ap.add_argument("--world", type=int)
    ap.add_argument("--port", type=int)
    ap.add_argument("--config")
    ap.add_argument("--only", help="driver: run only configurations whose name contains this")
    args = ap.parse_args()
    if args.rank is not None:
        load_backend_for_old_torch()
    return args


def main(rank_fn, configs, timeout=180):
    args = rank_args()
    if args.rank is not None:
        rank_fn(args.rank, args.world, json.loads(args.config))
        return
    script = os.path.abspath(sys.argv[0])
    passed = failed = 0
    for c in configs:
        if args.only and args.only not in c["name"]:
            continue
        t0 = time.monotonic()
        ok = run_config(script, c, c.get("deadline", timeout))  # a config's own bound
        print(f"{'PASS' if ok else 'FAIL'} {c['name']} ({time.monotonic() - t0:.1f} s)",
              flush=True)
        passed += ok
        failed += not ok
    print(f"{passed} passed, {failed} failed")
    sys.exit(0 if failed == 0 and passed > 0 else 1)
