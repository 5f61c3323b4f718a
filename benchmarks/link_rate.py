#!/usr/bin/env python3
"""How much of a link's rate an allreduce uses: two namespace "hosts", tc tbf on their links.

    sudo python3 benchmarks/link_rate.py --build build                 # 1 and 5 Gbit/s, ~6 min
    sudo python3 benchmarks/link_rate.py --build build --rates 1gbit --repeats 3

Two network namespaces joined by a bridge (tests/netns/netns.sh) stand for two hosts with two
ranks each; every host's link is limited with `tc tbf` in both directions. At each rate the
script measures, interleaved (the order rotates every repeat):

  tcp xK          raw TCP from host 1 to host 2 over K streams (K = 1 and 4): what the link and
                  this machine's CPUs give one and several sockets, without kolo
  tcp duplex xK   the same in both directions at once, as an allreduce moves its bytes
  kolo            kolo-bench allreduce, float32 sum, routed transport (shared memory inside a
                  host, TCP between), the Selector's choice (hierarchical at this size)
  kolo fp16       the same with --compression fp16 (a 16-bit wire)
  kolo ring       the flat ring forced (KOLO_ALLREDUCE=ring:0-max), for comparison
  gloo            Gloo's ring allreduce through kolo-bench --impl gloo, when built with Gloo

With --base-build DIR (the build of another checkout, e.g. the commit before a change), the kolo
cases also run with that build's kolo-bench, as "base kolo" and "base kolo fp16", interleaved
with the others: a before/after in one run.

and then, on the root namespace's loopback, N = 2 over TCP, kolo with and without fp16 (5
iterations after one warm-up).

Each case is a fresh `kolo-run` (connection set-up excluded, the first timed iteration
included) timing --iters allreduces of --size bytes; a repeat is one such run. Reported: the
median and the worst repeat of the time per allreduce, and the "link busbw" S * 2(H-1)/H / t with
H = 2 hosts, the bytes each host must send through its link for an allreduce whichever the
algorithm, as a fraction of the link's rate (tbf rate / 8). For fp16 the fraction counts the
float32 bytes, so it may exceed 1. Needs root; docs/performance.md ("Links used to their rate")
has the figures.
"""
import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
NETNS = os.path.join(HERE, "..", "tests", "netns", "netns.sh")
PREFIX = "klink"
SUBNET = "10.77.21"
PORT = 29611
ALGOS = {}  # case -> the algorithms kolo-bench reported
BASE_BUILD = None  # --base-build: the build the "base ..." cases run


def parse_size(text):
    m = re.fullmatch(r"(\d+)([KMG]?)", text)
    if not m:
        raise SystemExit(f"link_rate.py: size '{text}' must be a number with K/M/G")
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def parse_rate(text):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(k|m|g)bit", text)
    if not m:
        raise SystemExit(f"link_rate.py: rate '{text}' must look like 1gbit or 500mbit")
    return float(m.group(1)) * {"k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8  # bytes/s


# ---- raw TCP: a receiver (run inside host 2) and a sender (inside host 1) ----

def serve(port, streams):
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("0.0.0.0", port))
    srv.listen(streams)
    print("ready", flush=True)
    conns = [srv.accept()[0] for _ in range(streams)]
    total = [0] * streams
    first = [None]
    lock = threading.Lock()

    def drain(i, c):
        buf = bytearray(1 << 20)
        view = memoryview(buf)
        while True:
            n = c.recv_into(view)
            if n == 0:
                break
            with lock:
                if first[0] is None:
                    first[0] = time.perf_counter()
            total[i] += n

    threads = [threading.Thread(target=drain, args=(i, c)) for i, c in enumerate(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    end = time.perf_counter()
    print(f"{sum(total)} {end - first[0]:.6f}", flush=True)


def send(addr, port, streams, nbytes):
    chunk = bytes(1 << 20)
    socks = [socket.create_connection((addr, port)) for _ in range(streams)]
    per = nbytes // streams

    def pump(s):
        left = per
        while left > 0:
            n = min(left, len(chunk))
            s.sendall(chunk[:n] if n < len(chunk) else chunk)
            left -= n
        s.shutdown(socket.SHUT_WR)
        s.recv(1)
        s.close()

    threads = [threading.Thread(target=pump, args=(s,)) for s in socks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def raw_tcp(streams, nbytes, duplex):
    """Seconds to move `nbytes` from host 1 to host 2 over `streams` sockets; duplex: host 2
    sends as many bytes to host 1 at the same time (as an allreduce does), the slower side."""
    me = os.path.abspath(__file__)
    pairs = [(1, 2), (2, 1)] if duplex else [(1, 2)]
    servers = []
    for src, dst in pairs:
        srv = subprocess.Popen(["ip", "netns", "exec", f"{PREFIX}-h{dst}", sys.executable, me,
                                "--serve", str(streams)], stdout=subprocess.PIPE, text=True)
        assert srv.stdout.readline().strip() == "ready"
        servers.append(srv)
    senders = [subprocess.Popen(["ip", "netns", "exec", f"{PREFIX}-h{src}", sys.executable, me,
                                 "--send", f"{SUBNET}.{10 + dst}", str(streams), str(nbytes)])
               for src, dst in pairs]
    for p in senders:
        if p.wait(timeout=300) != 0:
            raise SystemExit("link_rate.py: a raw TCP sender failed")
    worst = 0.0
    for srv in servers:
        total, secs = srv.stdout.readline().split()
        srv.wait(timeout=30)
        worst = max(worst, float(secs) * nbytes / int(total))
    return worst


# ---- allreduce runs ----

def allreduce(build, case, size, iters, hosts=True, warmup=0):
    """Seconds per allreduce (kolo-bench's out-of-place time), or None where not available."""
    label = case
    if case.startswith("base "):
        build, case = BASE_BUILD, case[len("base "):]
    run = os.path.join(build, "backends", "local", "kolo-run")
    bench = os.path.join(build, "benchmarks", "kolo-bench")
    env = dict(os.environ, KOLO_TIMEOUT_SECONDS="300")
    args = [bench, "-b", str(size), "-e", str(size), "-n", str(iters), "-w", str(warmup), "-c", "1"]
    if case == "gloo":
        args += ["--impl", "gloo"]
    else:
        args += ["--transport", "routed" if hosts else "tcp"]
        env["KOLO_TRANSPORT"] = "routed" if hosts else "tcp"
        if case.endswith("fp16"):
            args += ["--compression", "fp16"]
        if case == "kolo ring":
            env["KOLO_ALLREDUCE"] = "ring:0-max"
    if hosts:
        cmd = [run, "-np", "4", "-H", f"{PREFIX}-h1:2,{PREFIX}-h2:2", "--store-host",
               f"{SUBNET}.1", "--timeout", "600"] + args
    else:
        cmd = [run, "-np", "2", "--timeout", "600"] + args
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    if p.returncode == 3:
        return None
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-2000:] + p.stderr[-2000:])
        raise SystemExit(f"link_rate.py: {case} failed (exit {p.returncode})")
    algo = re.search(r"Algorithm by size : %d B (\S+)" % size, p.stdout)
    if algo:
        ALGOS.setdefault(label if hosts else label + " loopback", set()).add(algo.group(1))
    for line in p.stdout.splitlines():
        f = re.sub(r"^\[0\]\s*", "", line).split()
        if f and f[0] == str(size):
            if int(f[8]) != 0:
                raise SystemExit(f"link_rate.py: {case}: {f[8]} wrong elements")
            return float(f[5]) * 1e-6
    raise SystemExit(f"link_rate.py: no result row in {case}'s output:\n{p.stdout[-2000:]}")


def netns(*args):
    subprocess.run([NETNS, *args], check=True, env=dict(os.environ, NETNS_SUBNET=SUBNET),
                   stdout=subprocess.DEVNULL)


def fmt(xs, scale=1.0, digits=3):
    return f"{statistics.median(xs) * scale:.{digits}f} / {max(xs) * scale:.{digits}f}"


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--serve":
        return serve(PORT, int(sys.argv[2]))
    if len(sys.argv) >= 2 and sys.argv[1] == "--send":
        return send(sys.argv[2], PORT, int(sys.argv[3]), int(sys.argv[4]))
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--rates", default="1gbit,5gbit")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--size", default="64M")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--no-gloo", action="store_true")
    ap.add_argument("--base-build", default=None,
                    help="another checkout's build: its kolo cases run too, as 'base ...'")
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("link_rate.py: needs root (network namespaces, tc)")
    build = os.path.abspath(a.build)
    size = parse_size(a.size)
    cases = ["kolo", "kolo fp16", "kolo ring"] + ([] if a.no_gloo else ["gloo"])
    if a.base_build:
        global BASE_BUILD
        BASE_BUILD = os.path.abspath(a.base_build)
        cases += ["base kolo", "base kolo fp16"]
    print(f"cpus: {os.cpu_count()}; load before: {open('/proc/loadavg').read().split()[:3]}")
    netns("up", PREFIX, "2")
    results = {}
    try:
        for rate_text in a.rates.split(","):
            rate = parse_rate(rate_text)
            # A real link has no burst: keep the bucket small (tbf's timer is a high-resolution
            # one), and below the 256 KiB messages of the Selector's probe, which would
            # otherwise measure the burst instead of the rate.
            burst = 128 * 1024
            netns("limit", PREFIX, "2", rate_text, str(burst))
            res = results.setdefault(rate_text, {})
            for r in range(a.repeats):
                order = ["tcp x1", "tcp x4", "tcp duplex x1", "tcp duplex x4"] + cases
                k = r % len(order)
                for case in order[k:] + order[:k]:
                    if case.startswith("tcp"):
                        res.setdefault(case, []).append(
                            raw_tcp(int(case[-1]), size, "duplex" in case))
                    else:
                        t = allreduce(build, case, size, a.iters)
                        if t is not None:
                            res.setdefault(case, []).append(t)
                print(f"{rate_text} repeat {r + 1}: " + ", ".join(
                    f"{c} {v[-1] * 1e3:.1f} ms" for c, v in res.items()), flush=True)
        netns("limit", PREFIX, "2", "none")
    finally:
        netns("down", PREFIX, "2")
    loop = {}
    for r in range(a.repeats):
        for case in (["kolo", "kolo fp16"] if r % 2 == 0 else ["kolo fp16", "kolo"]):
            loop.setdefault(case, []).append(
                allreduce(build, case, size, 5, hosts=False, warmup=1))
    print(f"load after: {open('/proc/loadavg').read().split()[:3]}")

    print(f"\n{size} B allreduce float32 sum, 2 hosts x 2 ranks, {a.repeats} repeats "
          f"of {a.iters} iterations; median / worst")
    for rate_text, res in results.items():
        rate = parse_rate(rate_text)
        print(f"\nlink {rate_text} ({rate / 1e6:.0f} MB/s)\n")
        print("| case | time per allreduce (ms) | link busbw (MB/s) | x link rate |")
        print("| --- | --- | --- | --- |")
        for case, ts in res.items():
            # raw TCP: bytes per direction / t; an allreduce: S * 2(H-1)/H / t = S / t (H = 2)
            bw = [size / t for t in ts]
            label = case + (f" ({', '.join(sorted(ALGOS[case]))})" if case in ALGOS else "")
            print(f"| {label} | {fmt(ts, 1e3, 1)} | {statistics.median(bw) / 1e6:.0f} / "
                  f"{min(bw) / 1e6:.0f} | {statistics.median(bw) / rate:.2f} / "
                  f"{min(bw) / rate:.2f} |")
    print(f"\nTCP loopback, N = 2, one host: none {fmt(loop['kolo'], 1e3, 1)} ms, "
          f"fp16 {fmt(loop['kolo fp16'], 1e3, 1)} ms; fp16 / none (medians) = "
          f"{statistics.median(loop['kolo fp16']) / statistics.median(loop['kolo']):.3f}")


if __name__ == "__main__":
    main()
