"""The flood figure of docs/reliability.md (issue 53): the Spark driver's hub (LivenessServer)
under 10,000 unauthenticated connection attempts from another process that stay open and idle
(it keeps the newest 500): how many connections per second the hub closes unproven, and an
authenticated rank's latency (a third process: connect, handshake, one log line arriving at the
driver's sink) before and during the flood.

    PYTHONPATH=backends/spark python tests/spark/hub_flood.py [attempts]
"""
import multiprocessing as mp
import resource
import socket
import statistics
import sys
import time
from collections import deque

from kolo_spark import liveness

SECRET = "flood-test-secret-0123456789"


def flood(port, attempts, started):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, 1024), hard), hard))
    held = deque()
    started.set()
    made = 0
    while made < attempts:
        try:
            held.append(socket.create_connection(("127.0.0.1", port)))
        except OSError:
            continue
        made += 1
        if len(held) > 500:
            held.popleft().close()


def prober(port, stop, out, pause):
    """A rank: connects, proves the secret, sends "ping <time.time() at its start>"."""
    r = 0
    while not stop.is_set():
        t0 = time.time()
        c = liveness.connect(("127.0.0.1", port), SECRET, r, timeout=5.0)
        if c is None:
            out.put(None)
        else:
            out.put(1)
            c.line(f"ping {t0!r}")
            c.close(1.0)
        r += 1
        time.sleep(pause)


def measure(hub, arrivals, stop_when):
    stop, out = mp.Event(), mp.Queue()
    p = mp.Process(target=prober, args=(hub.port, stop, out, 0.02))
    p.start()
    stop_when()
    stop.set()
    p.join(30)
    time.sleep(0.1)  # the last line on its way
    lat = [at - t0 for t0, at in arrivals]
    arrivals.clear()
    failed = 0
    while True:
        try:
            failed += out.get(timeout=0.05) is None
        except Exception:  # queue.Empty
            break
    return lat, failed


def main():
    attempts = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
    arrivals = []

    def on_line(rank, line):
        if line.startswith("ping "):
            arrivals.append((float(line[5:]), time.time()))

    hub = liveness.LivenessServer(SECRET, bind_host="127.0.0.1", on_line=on_line)
    base, base_failed = measure(hub, arrivals, lambda: time.sleep(1.0))
    started = mp.Event()
    f = mp.Process(target=flood, args=(hub.port, attempts, started))
    closed0 = hub.refused + hub.rejected
    f.start()
    started.wait()
    t0 = time.monotonic()
    during, failed = measure(hub, arrivals, f.join)
    took = time.monotonic() - t0
    closed = hub.refused + hub.rejected - closed0
    alive = hub.alive()
    hub.close()
    ms = lambda v: f"{v * 1e3:.1f} ms"  # noqa: E731
    print(f"{attempts} attempts in {took:.2f} s ({attempts / took:,.0f}/s): the hub closed "
          f"{closed} unproven ({closed / took:,.0f}/s), its thread alive: {alive}")
    print(f"rank latency idle: {len(base)} ranks, median {ms(statistics.median(base))}, max "
          f"{ms(max(base))}, {base_failed} failed")
    print(f"rank latency under the flood: {len(during)} ranks, median "
          f"{ms(statistics.median(during)) if during else '-'}, max "
          f"{ms(max(during)) if during else '-'}, {failed} failed to connect")
    return 0 if alive and not failed and during else 1


if __name__ == "__main__":
    sys.exit(main())
