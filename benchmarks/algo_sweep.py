#!/usr/bin/env python3
"""algo_sweep.py — is the Selector's automatic allreduce as fast as the best forced algorithm?

    python3 benchmarks/algo_sweep.py [--build build-all] [--out docs/perf/algo] [--quick]
    python3 benchmarks/algo_sweep.py --netns [--max-bytes 64M]        # root: the slow link

Runs kolo-bench (allreduce, float32, sum; the out-of-place time is used) with `--algo auto`
and with every algorithm forced, plus Open MPI's MPI_Allreduce (vader shared memory), and
compares per size:

  auto/best   auto's time over the best forced algorithm's (issue 4: <= 1.10)
  auto/MPI    auto's time over Open MPI's (issue 4: < 1 on shared memory)

Shared memory (default): N = 2, 4, 8 ranks on this machine, `--transport shm`, sizes 8 B to
256 MiB in steps of x4. Forced: ring, tree, halving-doubling, recursive-doubling (hierarchical
needs several hosts: on one host it is a ring reduce-scatter + allgather; add it with --algos).

--netns (root): 2 network-namespace "hosts" x 2 ranks (tests/netns/netns.sh), the routed
transport (shared memory inside a host, TCP between), each host's link limited to 1 Gbit/s with
tc tbf, and every cross-host TCP connection passed through a relay in the root namespace that
holds each chunk for --delay-ms (1 ms) before forwarding it: this kernel has no netem. Each
rank listens on a known port (KOLO_LISTEN_FD, bound by this script re-executed as a wrapper in
the rank's namespace) and advertises the bridge address (KOLO_ADDR), where the relay listens
on the same port. Forced algorithms include hierarchical; no Open MPI. The namespaces are
removed at exit.

Variants are interleaved repeat by repeat (the order rotates each repeat) so that the rest of
the machine's load falls on all alike; every number is the median of the repeats. To keep the
run short, a variant that was more than --prune times slower than the best (forced algorithms:
than the best forced one; Open MPI: than auto) at every size of a size band in the first repeat
is not run again for that band; its table cell then shows its single time (marked "1x").

Writes <out>/<name>.json (every run, every median) and <out>/<name>.md (one table per N), where
<name> is `shm` or `netns`, and prints the tables.
"""

import argparse
import datetime
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SHM_ALGOS = ["ring", "tree", "halving-doubling", "recursive-doubling", "direct"]
NETNS_ALGOS = SHM_ALGOS + ["hierarchical"]

# Size bands: many iterations where an operation takes microseconds, few where it takes
# seconds. On shared memory the small bands run long enough (~0.1 s per size and variant) that
# a time slice lost to another process on this 2-core machine does not decide the median; over
# the 1 ms link every small operation takes milliseconds anyway. The largest sizes skip the
# correctness check (-c 0): the test suite covers it, and at 256 MiB x 8 ranks on two cores
# every extra operation costs seconds per variant.
FULL_BANDS = [
    ["-b", "8", "-e", "32K", "-f", "4", "-n", "200", "-w", "20"],
    ["-b", "64K", "-e", "4M", "-f", "4", "-n", "40", "-w", "4"],
    ["-b", "16M", "-e", "64M", "-f", "4", "-n", "2", "-w", "1", "-c", "0"],
    ["-b", "256M", "-e", "256M", "-n", "1", "-w", "1", "-c", "0"],
]
NETNS_BANDS = [
    ["-b", "8", "-e", "32K", "-f", "4", "-n", "40", "-w", "5"],
    ["-b", "64K", "-e", "4M", "-f", "4", "-n", "10", "-w", "2"],
    ["-b", "16M", "-e", "64M", "-f", "4", "-n", "2", "-w", "1", "-c", "0"],
    ["-b", "256M", "-e", "256M", "-n", "1", "-w", "1", "-c", "0"],
]
QUICK_BANDS = [
    ["-b", "8", "-e", "8K", "-f", "32", "-n", "20", "-w", "3"],
    ["-b", "256K", "-e", "4M", "-f", "16", "-n", "4", "-w", "1"],
    ["-b", "64M", "-e", "64M", "-n", "1", "-w", "1", "-c", "0"],
]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def parse_bytes(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip()
    if s and s[-1].upper() in mult:
        return int(s[:-1]) * mult[s[-1].upper()]
    return int(s)


def band_sizes(band):
    """The sizes kolo-bench's -b/-e/-f loop visits (float32: multiples of 4 bytes)."""
    args = dict(zip(band[::2], band[1::2]))
    lo, hi, f = parse_bytes(args["-b"]), parse_bytes(args["-e"]), int(args.get("-f", "2"))
    out, b = [], lo
    while True:
        out.append(b)
        if b > hi // f:
            return out
        b *= f


def human(b):
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if b >= 1 << k and b % (1 << k) == 0:
            return f"{b >> k} {unit}"
    return f"{b} B"


def loadavg():
    try:
        return [float(x) for x in open("/proc/loadavg").read().split()[:3]]
    except OSError:
        return None


# ---------------------------------------------------------------------- the slow-link hosts


class Relay:
    """TCP relay: listens on (host, port) pairs, forwards each connection to its target and
    holds every chunk `delay` seconds before passing it on (order preserved), both ways."""

    def __init__(self, routes, delay):
        self.delay = delay
        self.stop = threading.Event()
        self.bytes = 0
        self.connections = 0
        self.lock = threading.Lock()
        self.listeners = []
        for lhost, lport, thost, tport in routes:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((lhost, lport))
            s.listen(16)
            s.settimeout(0.2)
            self.listeners.append(s)
            threading.Thread(target=self._accept, args=(s, thost, tport), daemon=True).start()

    def _accept(self, lsock, thost, tport):
        while not self.stop.is_set():
            try:
                c, _ = lsock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                t = socket.create_connection((thost, tport), timeout=10)
            except OSError:
                c.close()
                continue
            t.settimeout(None)
            c.settimeout(None)
            for s in (c, t):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.lock:
                self.connections += 1
            self._pipe(c, t)
            self._pipe(t, c)

    def _pipe(self, src, dst):
        """One direction: a reader stamps each chunk with its release time, a writer sends it
        then. (Python copies the bytes: on this loaded 2-core machine the relay passes about
        0.7 Gbit/s on one stream, less with four at once.)"""
        q = deque()
        cv = threading.Condition()

        def reader():
            while True:
                try:
                    data = src.recv(1 << 20)
                except OSError:
                    data = b""
                with cv:
                    q.append((time.monotonic() + self.delay, data))
                    cv.notify()
                if not data:
                    return
                with self.lock:
                    self.bytes += len(data)

        def writer():
            while True:
                with cv:
                    while not q:
                        cv.wait()
                    due, data = q.popleft()
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if not data:
                    try:
                        dst.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                    return
                try:
                    dst.sendall(data)
                except OSError:
                    try:
                        src.shutdown(socket.SHUT_RD)
                    except OSError:
                        pass
                    return

        threading.Thread(target=reader, daemon=True).start()
        threading.Thread(target=writer, daemon=True).start()

    def close(self):
        self.stop.set()
        for s in self.listeners:
            s.close()


class Netns:
    """2 namespace hosts x `per_host` ranks on a private bridge, 1 Gbit/s tbf, a delaying relay."""

    def __init__(self, args):
        self.netns = os.path.join(REPO, "tests", "netns", "netns.sh")
        self.prefix = args.netns_prefix
        self.subnet = args.netns_subnet
        self.hosts = 2
        self.per_host = 2
        self.n = self.hosts * self.per_host
        self.base_port = args.base_port
        self.env = dict(os.environ, NETNS_SUBNET=self.subnet)
        self.relay = None
        self.up = False
        self.rate, self.burst, self.delay = args.rate, args.burst, args.delay_ms / 1000.0

    def sh(self, *argv, check=True):
        p = subprocess.run([self.netns, *argv], env=self.env, capture_output=True, text=True)
        if check and p.returncode != 0:
            raise RuntimeError(f"netns.sh {' '.join(argv)}: exit {p.returncode}\n{p.stderr}")
        return p

    def start(self):
        p = self.sh("check", check=False)
        if p.returncode != 0:
            sys.exit(f"algo_sweep.py --netns: {p.stderr.strip()}")
        self.up = True
        self.sh("up", self.prefix, str(self.hosts))
        self.sh("limit", self.prefix, str(self.hosts), self.rate, self.burst)
        bridge = self.subnet + ".1"
        routes = []
        for r in range(self.n):
            host_ip = f"{self.subnet}.{11 + r // self.per_host}"
            routes.append((bridge, self.base_port + r, host_ip, self.base_port + r))
        self.relay = Relay(routes, self.delay)
        log(f"netns: {self.hosts} hosts x {self.per_host} ranks ({self.prefix}-h1..h{self.hosts},"
            f" {self.subnet}.0/24), tbf {self.rate} burst {self.burst} each way, relay "
            f"{self.delay * 1000:.1f} ms one way on {bridge}:{self.base_port}..")

    def stop(self):
        if self.relay:
            self.relay.close()
        if self.up:
            self.sh("down", self.prefix, str(self.hosts), check=False)
            self.up = False

    def launcher_args(self):
        spec = ",".join(f"{self.prefix}-h{i + 1}:{self.per_host}" for i in range(self.hosts))
        return ["-H", spec, "--store-host", self.subnet + ".1"]

    def wrap(self, program_argv):
        """The rank command: this script as a wrapper that binds the rank's data port."""
        return [sys.executable, os.path.abspath(__file__), "--rank-wrapper",
                str(self.base_port), self.subnet + ".1", "--", *program_argv]


def rank_wrapper(argv):
    """In a rank's namespace: listen on 0.0.0.0:BASE+rank, advertise ADDR, exec the program."""
    base, addr = int(argv[0]), argv[1]
    prog = argv[3:] if argv[2] == "--" else argv[2:]
    rank = int(os.environ["KOLO_RANK"])
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", base + rank))
    s.listen(64)
    s.set_inheritable(True)
    os.environ["KOLO_LISTEN_FD"] = str(s.fileno())
    os.environ["KOLO_ADDR"] = addr
    os.execv(prog[0], prog)


# ---------------------------------------------------------------------------------- the runs


class Runner:
    def __init__(self, args, netns=None):
        self.build = os.path.abspath(args.build)
        self.bench = os.path.join(self.build, "benchmarks", "kolo-bench")
        self.launcher = os.path.join(self.build, "backends", "local", "kolo-run")
        self.mpirun = shutil.which("mpirun")
        self.timeout = args.timeout
        self.netns = netns
        self.tuning = args.tuning
        for path in (self.bench, self.launcher):
            if not os.access(path, os.X_OK):
                sys.exit(f"algo_sweep.py: {path} not found; build it first:\n"
                         f"  cmake --build {args.build} -j2 --target kolo-bench kolo-run")

    def command(self, variant, n):
        if variant == "mpi":
            return [self.mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                    "--mca", "btl", "self,vader", "-np", str(n), self.bench, "--impl", "mpi"]
        bench = [self.bench, "--impl", "kolo", "--algo", variant]
        launcher = [self.launcher, "--no-prefix", "-np", str(n), "--timeout", str(self.timeout)]
        if self.netns:
            return (launcher + self.netns.launcher_args() + ["--grace", "5"] +
                    self.netns.wrap(bench + ["--transport", "routed"]))
        return launcher + bench + ["--transport", "shm"]

    def env(self):
        env = dict(os.environ)
        env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                    "KOLO_TIMEOUT_SECONDS": str(self.timeout)})
        for k in ("KOLO_TRANSPORT", "KOLO_ALLREDUCE"):
            env.pop(k, None)
        if self.tuning:
            env["KOLO_TUNING"] = self.tuning
        return env

    def run(self, variant, n, band):
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        cmd = self.command(variant, n) + band + ["-J", path]
        t0 = time.monotonic()
        # Own process group: a timeout or a SIGTERM to this script takes the launcher and its
        # ranks down together, not just the launcher.
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=self.env(), start_new_session=True)
        try:
            out, _ = p.communicate(timeout=self.timeout + 60)
            wall = time.monotonic() - t0
            if p.returncode != 0:
                tail = "\n".join(out.strip().splitlines()[-6:])
                return {"error": f"exit {p.returncode}: {tail}", "wall_s": wall}
            with open(path) as f:
                data = json.load(f)
        except subprocess.TimeoutExpired:
            return {"error": "timeout", "wall_s": time.monotonic() - t0}
        finally:
            if p.poll() is None:
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    try:
                        os.killpg(p.pid, sig)
                        p.wait(timeout=5)
                        break
                    except (ProcessLookupError, subprocess.TimeoutExpired):
                        pass
            os.unlink(path)
        rows = {}
        for r in data["rows"]:
            oop = r.get("out_of_place", {})
            if "time_us" in oop:
                rows[r["size"]] = {"time_us": oop["time_us"], "algorithm": r.get("algorithm", ""),
                                   "wrong": oop.get("wrong", 0)}
        tuning = next((h for h in data.get("header", []) if "tuning" in h), "")
        return {"rows": rows, "wall_s": wall, "header_tuning": tuning}


def sweep(args, runner, ranks_list, algos, with_mpi, bands):
    variants = ["auto"] + algos + (["mpi"] if with_mpi else [])
    results = {}
    for n in ranks_list:
        runs = {v: {} for v in variants}  # variant -> size -> list of {time_us, algorithm}
        errors = []
        pruned = set()  # (variant, band index)
        tunings = []
        t_n = time.monotonic()
        for rep in range(args.repeats):
            for bi, band in enumerate(bands):
                order = variants[rep % len(variants):] + variants[:rep % len(variants)]
                for v in order:
                    if (v, bi) in pruned:
                        continue
                    res = runner.run(v, n, band)
                    if "error" in res:
                        errors.append({"variant": v, "band": bi, "repeat": rep,
                                       "error": res["error"]})
                        log(f"  N={n} rep {rep + 1} {v} band {bi}: FAILED {res['error']}")
                        continue
                    if v == "auto" and res["header_tuning"]:
                        tunings.append(res["header_tuning"])
                    for size, row in res["rows"].items():
                        runs[v].setdefault(size, []).append(row)
                    log(f"  N={n} rep {rep + 1}/{args.repeats} band {bi} {v:>18}: "
                        f"{res['wall_s']:.1f} s")
                if rep == 0 and args.prune > 0:
                    prune_band(runs, bands[bi], bi, algos, with_mpi, args.prune, pruned)
        results[n] = summarize(runs, variants, algos, with_mpi)
        results[n]["errors"] = errors
        results[n]["pruned"] = sorted(f"{v}@band{b}" for v, b in pruned)
        results[n]["tuning_seen_by_auto"] = tunings
        results[n]["wall_s"] = time.monotonic() - t_n
        log(f"N={n}: {results[n]['wall_s']:.0f} s")
        print(table_md(n, results[n], with_mpi), flush=True)
    return results


def med(runs, v, size):
    xs = [r["time_us"] for r in runs[v].get(size, [])]
    return statistics.median(xs) if xs else None


def prune_band(runs, band, bi, algos, with_mpi, factor, pruned):
    sizes = band_sizes(band)
    best = {s: min([t for t in (med(runs, a, s) for a in algos) if t is not None],
                   default=None) for s in sizes}
    for a in algos:
        if all(med(runs, a, s) is not None and best[s] is not None and
               med(runs, a, s) > factor * best[s] for s in sizes):
            pruned.add((a, bi))
    if with_mpi and all(med(runs, "mpi", s) is not None and med(runs, "auto", s) is not None and
                        med(runs, "mpi", s) > factor * med(runs, "auto", s) for s in sizes):
        pruned.add(("mpi", bi))


def summarize(runs, variants, algos, with_mpi):
    sizes = sorted({s for v in variants for s in runs[v]})
    rows = []
    for s in sizes:
        row = {"size": s, "times_us": {}, "repeats": {}}
        for v in variants:
            xs = runs[v].get(s, [])
            if xs:
                row["times_us"][v] = statistics.median(x["time_us"] for x in xs)
                row["repeats"][v] = [x["time_us"] for x in xs]
        chosen = [x["algorithm"] for x in runs["auto"].get(s, [])]
        row["auto_algorithms"] = chosen
        row["auto_algorithm"] = max(set(chosen), key=chosen.count) if chosen else ""
        forced = {a: row["times_us"][a] for a in algos if a in row["times_us"]}
        if forced:
            row["best"] = min(forced, key=forced.get)
            row["best_us"] = forced[row["best"]]
        a = row["times_us"].get("auto")
        if a is not None and "best_us" in row:
            row["auto_over_best"] = a / row["best_us"]
        if with_mpi and a is not None and "mpi" in row["times_us"]:
            row["auto_over_mpi"] = a / row["times_us"]["mpi"]
        rows.append(row)
    return {"rows": rows}


def fmt_us(t):
    if t is None:
        return "—"
    if t >= 1e5:
        return f"{t / 1e3:.0f} ms"
    if t >= 1e4:
        return f"{t / 1e3:.1f} ms"
    return f"{t:.1f} µs" if t < 1e3 else f"{t / 1e3:.2f} ms"


def table_md(n, res, with_mpi):
    # auto/same: auto over the algorithm it ran, forced — both run the same code, so this
    # column is the run-to-run noise that the auto/best ratio carries too.
    head = ["size", "auto", "auto ran", "best forced", "best", "auto/best (≤ 1.10)",
            "auto/same"]
    if with_mpi:
        head += ["Open MPI", "auto/MPI (< 1)"]
    lines = [f"#### N = {n}", "", "| " + " | ".join(head) + " |",
             "| " + " | ".join(["---:"] + ["---:"] * (len(head) - 1)) + " |"]
    for r in res["rows"]:
        t = r["times_us"]
        ran = r["auto_algorithm"]
        if len(set(r["auto_algorithms"])) > 1:
            ran += " (" + "/".join(sorted(set(r["auto_algorithms"]))) + ")"
        ratio = r.get("auto_over_best")
        rs = "—" if ratio is None else (f"{ratio:.2f}" if ratio <= 1.10 else f"**{ratio:.2f}**")
        same = t.get(r["auto_algorithm"])
        cells = [human(r["size"]), fmt_us(t.get("auto")), ran, fmt_us(r.get("best_us")),
                 r.get("best", "—"), rs,
                 f"{t['auto'] / same:.2f}" if same and t.get("auto") else "—"]
        if with_mpi:
            m = t.get("mpi")
            reps = max(len(x) for x in r["repeats"].values())
            one = " (1x)" if reps > 1 and len(r["repeats"].get("mpi", [])) == 1 else ""
            rm = r.get("auto_over_mpi")
            cells += [fmt_us(m) + one,
                      "—" if rm is None else (f"{rm:.2f}" if rm < 1 else f"**{rm:.2f}**")]
        lines.append("| " + " | ".join(cells) + " |")
    miss = [r for r in res["rows"] if r.get("auto_over_best", 0) > 1.10]
    summary = (f"auto within 10% of the best forced algorithm at "
               f"{len(res['rows']) - len(miss)}/{len(res['rows'])} sizes" +
               (" (misses: " + ", ".join(f"{human(r['size'])} {r['auto_over_best']:.2f}"
                                         for r in miss) + ")" if miss else ""))
    if with_mpi:
        slow = [r for r in res["rows"] if r.get("auto_over_mpi", 0) >= 1]
        summary += (f"; ahead of Open MPI at {len(res['rows']) - len(slow)}/{len(res['rows'])}" +
                    (" (behind: " + ", ".join(f"{human(r['size'])} {r['auto_over_mpi']:.2f}"
                                              for r in slow) + ")" if slow else ""))
    switches = []
    prev = None
    for r in res["rows"]:
        if r["auto_algorithm"] != prev:
            switches.append(f"{r['auto_algorithm']} from {human(r['size'])}")
            prev = r["auto_algorithm"]
    summary += f". Auto chose: {', '.join(switches)}."
    return "\n".join(lines) + "\n\n" + summary + "\n"


def write_md(path, meta, results):
    nn = meta.get("netns")
    with_mpi = meta["open_mpi"]
    title = (f"{nn['hosts']} namespace hosts x {nn['ranks_per_host']} ranks, {nn['rate']} tbf, "
             f"{nn['delay_ms']:.1f} ms relay") if nn else "shared memory"
    md = [f"### Allreduce: auto vs forced ({title})", "",
          f"Measured {meta['started']} on {meta['host']}: {meta['cpus']} cores, load average "
          f"{meta['load_before'][0]:.2f} before / {meta['load_after'][0]:.2f} after; "
          f"{meta['repeats']} repeat(s), medians; float32 sum out-of-place; "
          f"KOLO_TUNING {meta['tuning']}; {meta['wall_s'] / 60:.1f} min.", ""]
    for n in meta["ranks"]:
        md.append(table_md(n, results[n], with_mpi))
        if results[n]["errors"]:
            md.append(f"Failed runs: {len(results[n]['errors'])} (see the JSON).\n")
    with open(path, "w") as f:
        f.write("\n".join(md))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--rank-wrapper":
        rank_wrapper(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build-all"))
    ap.add_argument("--out", default=os.path.join(REPO, "docs", "perf", "algo"))
    ap.add_argument("--ranks", default=None, help="comma list (shared memory); default 2,4,8")
    ap.add_argument("--algos", default=None, help="forced algorithms, comma list")
    ap.add_argument("--repeats", type=int, default=None, help="default 3 (--quick: 1)")
    ap.add_argument("--quick", action="store_true", help="fewer sizes, one repeat")
    ap.add_argument("--no-mpi", action="store_true")
    ap.add_argument("--prune", type=float, default=2.0,
                    help="drop a variant this many times slower after repeat 1 (0: never)")
    ap.add_argument("--timeout", type=int, default=900, help="per kolo-bench run, seconds")
    ap.add_argument("--tuning", default=None, help="KOLO_TUNING for every kolo run")
    ap.add_argument("--netns", action="store_true", help="the slow-link case (root)")
    ap.add_argument("--max-bytes", default=None,
                    help="largest size (default 256M; --netns 64M)")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--burst", default="64kb", help="tbf burst; below 256 KiB so the tuning "
                    "probe's 256 KiB messages see the rate")
    ap.add_argument("--delay-ms", type=float, default=1.0)
    ap.add_argument("--netns-prefix", default="kalgo")
    ap.add_argument("--netns-subnet", default="10.77.40")
    ap.add_argument("--base-port", type=int, default=47610)
    ap.add_argument("--from-json", default=None,
                    help="rewrite the tables of an earlier run's JSON, run nothing")
    args = ap.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            d = json.load(f)
        meta = d["meta"]
        results = {int(k): v for k, v in d["results"].items()}
        out = os.path.splitext(args.from_json)[0] + ".md"
        write_md(out, meta, results)
        print(open(out).read())
        return
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    bands = [list(b) for b in (QUICK_BANDS if args.quick else
                                NETNS_BANDS if args.netns else FULL_BANDS)]
    max_bytes = parse_bytes(args.max_bytes) if args.max_bytes else (
        64 << 20 if args.netns else 256 << 20)
    kept = []
    for b in bands:
        sizes = [s for s in band_sizes(b) if s <= max_bytes]
        if not sizes:
            continue
        i = b.index("-e")
        b[i + 1] = str(sizes[-1])
        kept.append(b)
    bands = kept

    netns = Netns(args) if args.netns else None
    algos = args.algos.split(",") if args.algos else (NETNS_ALGOS if args.netns else SHM_ALGOS)
    ranks = [netns.n] if netns else [int(x) for x in (args.ranks or "2,4,8").split(",")]
    with_mpi = not args.netns and not args.no_mpi and shutil.which("mpirun") is not None
    runner = Runner(args, netns)
    os.makedirs(args.out, exist_ok=True)
    name = "netns" if netns else "shm"
    meta = {
        "tool": "algo_sweep.py", "case": name,
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "host": os.uname().nodename, "cpus": os.cpu_count(), "load_before": loadavg(),
        "ranks": ranks, "algos": algos, "open_mpi": with_mpi, "repeats": args.repeats,
        "bands": bands, "prune": args.prune, "tuning": args.tuning or "probe (default)",
        "build": runner.build,
    }
    if netns:
        meta["netns"] = {"hosts": netns.hosts, "ranks_per_host": netns.per_host,
                         "rate": args.rate, "burst": args.burst, "delay_ms": args.delay_ms}
    # SIGTERM (and SIGINT, which a background job ignores) must still remove the namespaces.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    t0 = time.monotonic()
    try:
        if netns:
            netns.start()
        results = sweep(args, runner, ranks, algos, with_mpi, bands)
    finally:
        if netns:
            if netns.relay:
                meta["relay"] = {"connections": netns.relay.connections,
                                 "bytes": netns.relay.bytes}
            netns.stop()
    meta["load_after"] = loadavg()
    meta["wall_s"] = time.monotonic() - t0
    with open(os.path.join(args.out, name + ".json"), "w") as f:
        json.dump({"meta": meta, "results": {str(k): v for k, v in results.items()}}, f,
                  indent=1)
    write_md(os.path.join(args.out, name + ".md"), meta, results)
    log(f"wrote {os.path.join(args.out, name + '.json')} and {name}.md "
        f"({meta['wall_s'] / 60:.1f} min)")


if __name__ == "__main__":
    main()
