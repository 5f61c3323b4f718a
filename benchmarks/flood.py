#!/usr/bin/env python3
"""Floods a running kolo job's store and data listeners with strangers and measures the cost.

Runs a real job (the fault worker's `verify` mode: random verified collectives over TCP, rank 0
hosting the store, pre-bound data listeners) twice: once alone, once while this script opens
`--attempts` connections (default 10,000) to the store and to every rank's data port, half of them
idle (held until the server closes them or 2 s pass) and half sending 256 random bytes. Prints the
job's time both ways (the slowdown), and what the strangers met per second: connections the
server closed (refused before the challenge at the handshake cap, evicted, or failing
authentication) and connections the kernel refused (a data listener closed after setup).

    benchmarks/flood.py [--worker build/tests/faults/kolo_fault_worker] [--np 2] [--steps 3000]
                        [--attempts 10000] [--open 1000]
"""
import argparse
import errno
import os
import re
import resource
import secrets
import selectors
import socket
import subprocess
import sys
import threading
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def start_job(worker, np, steps):
    port = free_port()
    key = secrets.token_hex(32)
    listeners, procs = [], []
    for r in range(np):
        l = socket.socket()
        l.bind(("127.0.0.1", 0))
        l.listen(4096)
        listeners.append(l)
    for r in range(np):
        fd = listeners[r].fileno()
        os.set_inheritable(fd, True)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "KOLO_RANK": str(r),
               "KOLO_SIZE": str(np), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "KOLO_SECRET": key, "KOLO_TRANSPORT": "tcp", "KOLO_TIMEOUT_SECONDS": "60",
               "KOLO_LISTEN_FD": str(fd)}
        procs.append(subprocess.Popen([worker, "verify", "7", str(steps), "4096"], env=env,
                                      pass_fds=(fd,), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    ports = [port] + [l.getsockname()[1] for l in listeners]
    for l in listeners:
        l.close()  # only the ranks hold them now
    return procs, ports


def finish_job(procs, started):
    outs = [p.communicate(timeout=300)[0] for p in procs]
    wall = time.monotonic() - started
    for p, out in zip(procs, outs):
        if p.returncode != 0 or "KOLO_OK rank=" not in out:
            sys.exit("the job failed:\n" + out)
    secs = [float(m) for out in outs for m in re.findall(r"seconds=([0-9.]+)", out)]
    return wall, (max(secs) if secs else wall)


class Flood:
    def __init__(self, ports, attempts, max_open):
        self.ports, self.attempts, self.max_open = ports, attempts, max_open
        self.made = self.server_closed = self.kernel_refused = self.busy = 0
        self.stop = False
        self.garbage = os.urandom(256)
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        sel = selectors.DefaultSelector()
        opened = {}  # socket -> (opened at, got bytes)
        self.t0 = time.monotonic()
        i = 0
        while (i < self.attempts or opened) and not self.stop:
            while i < self.attempts and len(opened) < self.max_open:
                s = socket.socket()
                s.setblocking(False)
                port = self.ports[i % len(self.ports)]
                err = s.connect_ex(("127.0.0.1", port))
                i += 1
                self.made += 1
                if err not in (0, errno.EINPROGRESS):
                    self.kernel_refused += 1
                    s.close()
                    continue
                opened[s] = [time.monotonic(), False, i % 2 == 0]
                sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE)
            for key, ev in sel.select(timeout=0.01):
                s = key.fileobj
                st = opened[s]
                if ev & selectors.EVENT_WRITE:
                    if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ECONNREFUSED:
                        self.kernel_refused += 1
                        sel.unregister(s)
                        del opened[s]
                        s.close()
                        continue
                    if st[2]:
                        try:
                            s.send(self.garbage)
                        except OSError:
                            pass
                    sel.modify(s, selectors.EVENT_READ)
                    continue
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                if data:
                    st[1] = True
                    continue
                self.server_closed += 1
                if not st[1]:
                    self.busy += 1
                sel.unregister(s)
                del opened[s]
                s.close()
            now = time.monotonic()
            for s in [s for s, st in opened.items() if now - st[0] > 2.0]:
                sel.unregister(s)
                del opened[s]
                s.close()
        self.seconds = time.monotonic() - self.t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", default="build/tests/faults/kolo_fault_worker")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--attempts", type=int, default=10000)
    ap.add_argument("--open", type=int, default=1000)
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, a.open + 256)), hard))

    t = time.monotonic()
    procs, _ = start_job(a.worker, a.np, a.steps)
    base_wall, base = finish_job(procs, t)

    t = time.monotonic()
    procs, ports = start_job(a.worker, a.np, a.steps)
    flood = Flood(ports, a.attempts, a.open)
    flood.thread.start()
    wall, flooded = finish_job(procs, t)
    flood.stop = True
    flood.thread.join()
    fs = max(flood.seconds, 1e-9)

    # Control: the same flood at a listener outside the job (this script accepts and closes
    # every connection), so what the flood costs the machine (2 shared cores: the flooder's and
    # the kernel's work) is told apart from what it costs kolo's listeners.
    dummy = socket.socket()
    dummy.bind(("127.0.0.1", 0))
    dummy.listen(4096)
    dummy.setblocking(False)
    stop_dummy = threading.Event()

    def serve_dummy():
        sel = selectors.DefaultSelector()
        sel.register(dummy, selectors.EVENT_READ)
        while not stop_dummy.is_set():
            for _ in sel.select(timeout=0.05):
                try:
                    while True:
                        c, _ = dummy.accept()
                        c.close()
                except BlockingIOError:
                    pass

    dt = threading.Thread(target=serve_dummy, daemon=True)
    dt.start()
    t = time.monotonic()
    procs, _ = start_job(a.worker, a.np, a.steps)
    control = Flood([dummy.getsockname()[1]], a.attempts, a.open)
    control.thread.start()
    cwall, controlled = finish_job(procs, t)
    control.stop = True
    control.thread.join()
    stop_dummy.set()
    dt.join()
    print(f"job alone        : {base:.2f} s collectives, {base_wall:.2f} s wall")
    print(f"job under flood  : {flooded:.2f} s collectives, {wall:.2f} s wall "
          f"({(flooded / base - 1) * 100:+.1f} % collectives, {(wall / base_wall - 1) * 100:+.1f} % wall)")
    print(f"flood elsewhere  : {controlled:.2f} s collectives, {cwall:.2f} s wall "
          f"({(controlled / base - 1) * 100:+.1f} % collectives: the machine's share)")
    print(f"kolo's share     : {(flooded / controlled - 1) * 100:+.1f} % collectives "
          f"(under flood vs flood elsewhere)")
    print(f"flood            : {flood.made} attempts in {fs:.2f} s ({flood.made / fs:.0f}/s)")
    print(f"closed by server : {flood.server_closed} ({flood.server_closed / fs:.0f}/s), "
          f"{flood.busy} of them before any byte (busy at the cap)")
    print(f"kernel refused   : {flood.kernel_refused} ({flood.kernel_refused / fs:.0f}/s)")


if __name__ == "__main__":
    main()
