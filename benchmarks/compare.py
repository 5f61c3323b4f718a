#!/usr/bin/env python3
"""compare.py — kolo next to Open MPI and Gloo, in one run, on this machine.

    python3 benchmarks/compare.py --build build-bench --out docs/perf [--quick]

Builds nothing: it runs the kolo-bench and kolo-run of an existing build directory
(cmake -DKOLO_BUILD_BENCHMARKS=ON). Every implementation is measured with the same harness
(kolo-bench, nccl-tests format) in the same run, interleaved repeat by repeat so that noise from
the rest of the machine falls on all of them alike, and every number used is a median of the
repeats:

  kolo-shm            kolo-run -np N kolo-bench --impl kolo --transport shm
  kolo-tcp            kolo-run -np N kolo-bench --impl kolo --transport tcp   (loopback)
  mpi                 mpirun --mca btl self,vader -np N kolo-bench --impl mpi  (Open MPI, shm)
  gloo                kolo-run -np N kolo-bench --impl gloo                    (TCP loopback)
  gloo-ring-chunked   kolo-run -np N kolo-bench --impl gloo-ring-chunked       (TCP loopback)

plus this machine's memcpy bandwidth M (kolo-bench --memcpy) and the time to compile a file
that includes <kolo/kolo.hpp> at -O2. Writes <out>/results.json, <out>/allreduce_busbw.png,
<out>/allreduce_latency.png and <out>/tables.md; prints the table of the speed targets
(target vs measured, PASS/SHORT); with --doc, replaces the generated section of that file
(between `<!-- compare.py:begin -->` and `<!-- compare.py:end -->`).

    python3 benchmarks/compare.py --render docs/perf/results.json --doc docs/performance.md --check

renders that section again from a results.json, running nothing; --check compares it with the
file's section instead of writing it (exit status 1 and a diff when they differ: the CTest test
docs/performance_table). Every number in the section comes from the results file, or from the
GPU kernels' results file (--gpu-results, kolo-gpu-kernels-bench --json); nothing is typed in.
"""

import argparse
import datetime
import json
import os
import platform
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

IMPLS = ["kolo-shm", "kolo-tcp", "mpi", "gloo", "gloo-ring-chunked", "kolo-mpi",
         "kolo-mpi-native"]
DEFAULT_IMPLS = IMPLS[:5]
LABELS = {
    "kolo-shm": "kolo (shm)",
    "kolo-tcp": "kolo (tcp loopback)",
    "kolo-mpi": "kolo over MPI (vader)",
    "kolo-mpi-native": "kolo API, MPI's collectives",
    "mpi": "Open MPI (vader shm)",
    "gloo": "Gloo allreduce (tcp)",
    "gloo-ring-chunked": "Gloo AllreduceRingChunked (tcp)",
}
MiB = 1 << 20

# Size bands: many iterations where an operation takes microseconds, few where it takes
# seconds (nccl-tests' fixed -n would spend an hour on 256 MiB x 8 ranks on two cores).
FULL_BANDS = [
    ["-b", "8", "-e", "32K", "-f", "4", "-n", "50", "-w", "5"],
    ["-b", "64K", "-e", "4M", "-f", "4", "-n", "10", "-w", "2"],
    ["-b", "16M", "-e", "256M", "-f", "4", "-n", "3", "-w", "1"],
]
QUICK_BANDS = [
    ["-b", "8", "-e", "8K", "-f", "32", "-n", "50", "-w", "5"],
    ["-b", "1M", "-e", "64M", "-f", "8", "-n", "3", "-w", "1"],
]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def busbw_factor(n):
    return 2.0 * (n - 1) / n


# ---------------------------------------------------------------------------------------- runs


class Runner:
    def __init__(self, args):
        self.build = os.path.abspath(args.build)
        self.bench = os.path.join(self.build, "benchmarks", "kolo-bench")
        self.launcher = os.path.join(self.build, "backends", "local", "kolo-run")
        self.mpirun = shutil.which("mpirun")
        self.timeout = args.timeout
        for path in (self.bench, self.launcher):
            if not os.access(path, os.X_OK):
                sys.exit(f"compare.py: {path} not found; build it first:\n"
                         f"  cmake -S . -B {args.build} -G Ninja -DCMAKE_BUILD_TYPE=Release\n"
                         f"  cmake --build {args.build} -j2 --target kolo-bench kolo-run")

    def command(self, impl, n, program=None):
        program = program or self.bench
        if impl in ("mpi", "kolo-mpi", "kolo-mpi-native"):
            mpi = [self.mpirun, "--allow-run-as-root", "--oversubscribe", "--mca", "btl",
                   "self,vader", "-np", str(n), program]
            if impl == "mpi":
                return mpi + ["--impl", "mpi"]
            return mpi + ["--transport", impl[len("kolo-"):]]
        base = [self.launcher, "--no-prefix", "-np", str(n), "--timeout", str(self.timeout),
                program]
        if impl == "kolo-shm":
            return base + ["--impl", "kolo", "--transport", "shm"]
        if impl == "kolo-tcp":
            return base + ["--impl", "kolo", "--transport", "tcp"]
        return base + ["--impl", impl]

    def available(self, impl):
        """Runs a one-rank probe: exit status 3 means not built in (or no MPI launcher)."""
        if impl in ("mpi", "kolo-mpi", "kolo-mpi-native") and not self.mpirun:
            return False, "mpirun not found"
        cmd = self.command(impl, 1) + ["-b", "8", "-e", "8", "-n", "1", "-w", "0"]
        p = subprocess.run(cmd, capture_output=True, text=True, env=self.env(),
                           timeout=120)
        if p.returncode != 0:
            return False, (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]
        return True, ""

    def env(self):
        env = dict(os.environ)
        env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                    "KOLO_TIMEOUT_SECONDS": str(self.timeout)})
        env.pop("KOLO_TRANSPORT", None)
        return env

    def bench_json(self, cmd):
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            path = f.name
        try:
            p = subprocess.run(cmd + ["-J", path], capture_output=True, text=True,
                               env=self.env(), timeout=self.timeout + 60)
            if p.returncode != 0:
                tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-5:])
                raise RuntimeError(f"exit {p.returncode}: {' '.join(cmd)}\n{tail}")
            with open(path) as f:
                return json.load(f)
        finally:
            os.unlink(path)

    def fusion(self, n):
        """kolo-fusion-bench under kolo-run (shm): 1024 x 4 KiB through the engine."""
        fusion = os.path.join(self.build, "benchmarks", "kolo-fusion-bench")
        if not os.access(fusion, os.X_OK):
            raise RuntimeError(f"{fusion} not built")
        cmd = [self.launcher, "--no-prefix", "-np", str(n), "--timeout", str(self.timeout),
               fusion, "--transport", "shm", "-n", "20", "-w", "3", "-r", "5"]
        return self.bench_json(cmd)

    def memcpy(self, threads, size):
        return self.bench_json([self.bench, "--memcpy", "--threads", str(threads), "-b", size,
                                "-e", size, "-n", "10", "-w", "2"])


def compile_time(build, repeats=3):
    """Seconds to compile a translation unit that includes <kolo/kolo.hpp> and instantiates a
    Communicator<> allreduce, at -O2 (median of repeats)."""
    cxx = "c++"
    cache = os.path.join(build, "CMakeCache.txt")
    if os.path.exists(cache):
        m = re.search(r"^CMAKE_CXX_COMPILER:\w+=(.+)$", open(cache).read(), re.M)
        if m:
            cxx = m.group(1).strip()
    include = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "include")
    src = ("#include <kolo/kolo.hpp>\n"
           "int main() {\n"
           "  auto comm = kolo::Communicator<>::from_env();\n"
           "  float x[4] = {1, 2, 3, 4};\n"
           "  comm.allreduce(std::span<float>(x), kolo::ReduceOp::sum);\n"
           "  return x[0] > 0 ? 0 : 1;\n"
           "}\n")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "uses_kolo.cpp")
        with open(path, "w") as f:
            f.write(src)
        times, cpu = [], []
        for _ in range(repeats):
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            subprocess.run([cxx, "-std=c++20", "-O2", "-I", include, "-c", path, "-o",
                            os.path.join(d, "uses_kolo.o")], check=True)
            times.append(time.perf_counter() - t0)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu.append(r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
    # Wall time is the target; CPU time says how much of it a busy machine added.
    return {"compiler": cxx, "seconds": statistics.median(times), "all": times,
            "cpu_seconds": statistics.median(cpu)}


# ------------------------------------------------------------------------------- aggregation


def merge_rows(docs):
    """Rows of several kolo-bench JSON files (the bands of one run), by size."""
    rows = {}
    for d in docs:
        for r in d["rows"]:
            rows[r["size"]] = r
    return rows


def median_table(runs, n):
    """runs[rep] = {size: row}; returns {size: {'oop': us, 'ip': us, 'busbw':…}} of medians."""
    sizes = sorted(set().union(*[set(r) for r in runs])) if runs else []
    out = {}
    for s in sizes:
        entry = {}
        for key, name in (("out_of_place", "oop"), ("in_place", "ip")):
            ts = [r[s][key]["time_us"] for r in runs if s in r and "time_us" in r[s][key]]
            if ts:
                t = statistics.median(ts)
                entry[name] = {"time_us": t, "busbw": s / (t * 1e3) * busbw_factor(n),
                               "algbw": s / (t * 1e3), "repeats": ts}
        if entry:
            out[s] = entry
    return out


def get(results, impl, n, size, what="busbw", place="oop"):
    try:
        return results[impl][str(n)][size][place][what]
    except KeyError:
        return None


# ---------------------------------------------------------------------------------- targets


def gpu_row_detail(gpu):
    """The GPU target's figures, from a kolo-gpu-kernels-bench --json file (or None)."""
    if not gpu:
        return "CPU-only script; no GPU kernels results file (--gpu-results)"

    def band(kind):  # "compress" or "decompress": the fp16 and bf16 rows of one tensor
        pcts = sorted(round(100 * r["fraction_of_d2d"]) for r in gpu["rows"]
                      if f"({kind}), 1 tensor" in r["name"])
        if not pcts:
            return "not measured"
        return f"{pcts[0]}%" if pcts[0] == pcts[-1] else f"{pcts[0]}-{pcts[-1]}%"

    return (f"CPU-only script; kolo-gpu-kernels-bench on an {gpu['gpu']}: pack+compress "
            f"{band('compress')}, unpack+decompress {band('decompress')} (see the GPU section "
            "below, docs/gpu.md)")


def targets(results, memcpy_m, compile_s, extra, gpu=None):
    def ratio_row(what, target, measured, passed, detail):
        return {"what": what, "target": target, "measured": measured,
                "status": "N/A" if passed is None else ("PASS" if passed else "SHORT"),
                "detail": detail}

    rows = []
    S64 = 64 * MiB
    k = get(results, "kolo-shm", 2, S64)
    m = get(results, "mpi", 2, S64)
    if k and m:
        r1, r2 = k / m, k / memcpy_m
        rows.append(ratio_row(
            "shared memory, N=2, fp32, 64 MiB allreduce", "busbw >= 2x Open MPI, >= 0.3 M",
            f"{r1:.2f}x Open MPI, {r2:.2f} M", r1 >= 2 and r2 >= 0.3,
            f"kolo {k:.2f} GB/s, Open MPI {m:.2f} GB/s, M {memcpy_m:.2f} GB/s"))
    else:
        rows.append(ratio_row("shared memory, N=2, fp32, 64 MiB allreduce",
                              "busbw >= 2x Open MPI, >= 0.3 M", "not measured", None, ""))

    k = get(results, "kolo-shm", 2, 8, "time_us")
    m = get(results, "mpi", 2, 8, "time_us")
    rows.append(ratio_row("shared memory, N=2, 8 B allreduce latency", "<= Open MPI's",
                          f"{k / m:.2f}x Open MPI" if k and m else "not measured",
                          (k <= m) if k and m else None,
                          f"kolo {k:.2f} us, Open MPI {m:.2f} us" if k and m else ""))

    k8 = get(results, "kolo-shm", 8, MiB, "time_us")
    k2 = get(results, "kolo-shm", 2, MiB, "time_us")
    rows.append(ratio_row("shared memory, N=8 on 2 cores, 1 MiB",
                          "completes, <= 4x the N=2 time",
                          f"{k8 / k2:.2f}x the N=2 time" if k8 and k2 else "not measured",
                          (k8 / k2 <= 4) if k8 and k2 else None,
                          f"N=8 {k8:.1f} us, N=2 {k2:.1f} us" if k8 and k2 else ""))

    k = get(results, "kolo-tcp", 2, S64)
    g = get(results, "gloo-ring-chunked", 2, S64)
    rows.append(ratio_row("TCP loopback, N=2, 64 MiB", "busbw >= 2x Gloo ring-chunked",
                          f"{k / g:.2f}x Gloo ring-chunked" if k and g else "not measured",
                          (k / g >= 2) if k and g else None,
                          f"kolo {k:.2f} GB/s, Gloo {g:.2f} GB/s" if k and g else ""))

    k = get(results, "kolo-tcp", 2, 8, "time_us")
    gs = [t for t in (get(results, "gloo", 2, 8, "time_us"),
                      get(results, "gloo-ring-chunked", 2, 8, "time_us")) if t]
    g = min(gs) if gs else None
    rows.append(ratio_row("TCP loopback, N=2, 8 B latency", "<= 0.1x Gloo's (the faster Gloo)",
                          f"{k / g:.3f}x Gloo" if k and g else "not measured",
                          (k / g <= 0.1) if k and g else None,
                          f"kolo {k:.2f} us, Gloo {g:.2f} us" if k and g else ""))

    if extra.get("fusion"):
        f = extra["fusion"]
        rows.append(ratio_row("fusion: 1024 tensors x 4 KiB through the engine",
                              "<= 1.2x one 4 MiB allreduce", f"{f['ratio']:.2f}x",
                              f["ratio"] <= 1.2,
                              f"N=2 shm, interleaved, median of 5 (worst {f['worst_ratio']:.2f}x): "
                              f"fused step {f['fused_us']:.0f} us, one 4 MiB allreduce "
                              f"{f['one_us']:.0f} us, one 4 MiB tensor via the engine "
                              f"{f['engine_one_us']:.0f} us"))
        if f.get("coalesced_ratio") is not None:
            rows.append(ratio_row(
                "fusion: the same 1024 tensors as one coalesced submission",
                "<= 1.2x one 4 MiB allreduce", f"{f['coalesced_ratio']:.2f}x",
                f["coalesced_ratio"] <= 1.2,
                f"N=2 shm, same runs (worst {f['coalesced_worst_ratio']:.2f}x): "
                f"Engine::allreduce_coalesced_async, {f['coalesced_us']:.0f} us"))
    else:
        rows.append(ratio_row("fusion: 1024 tensors x 4 KiB through the engine",
                              "<= 1.2x one 4 MiB allreduce", "not measured", None,
                              "kolo-fusion-bench not built or failed"))
    k = get(results, "kolo-tcp", 2, S64, "time_us")
    c = extra.get("fp16_tcp_64M_us")
    rows.append(ratio_row("fp16 compression over TCP, 64 MiB fp32",
                          "wall time <= 0.6x uncompressed",
                          f"{c / k:.2f}x" if k and c else "not measured",
                          (c / k <= 0.6) if k and c else None,
                          f"N=2: fp16 {c / 1e3:.1f} ms, uncompressed {k / 1e3:.1f} ms "
                          "(kolo-bench --compression fp16: compress, allreduce the 16-bit wire, "
                          "decompress)" if k and c else ""))
    rows.append(ratio_row("GPU: fp16 compress, fusion pack", ">= 80% of device copy bandwidth",
                          "not measured by this script", None, gpu_row_detail(gpu)))
    rows.append(ratio_row("compile: a .cpp including <kolo/kolo.hpp>, -O2", "<= 3 s",
                          f"{compile_s['seconds']:.2f} s", compile_s["seconds"] <= 3.0,
                          f"median of 3 (wall); {compile_s['cpu_seconds']:.2f} s CPU; a "
                          "Communicator<> allreduce instantiated"))
    return rows


# ------------------------------------------------------------------------------------ output


def fmt_size(s):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if s >= div and s % div == 0:
            return f"{s // div} {unit}"
    return f"{s} B"


def markdown_tables(results, ranks, impls, memcpy_m):
    out = []
    for n in ranks:
        sizes = sorted(set().union(*[set(results.get(i, {}).get(str(n), {})) for i in impls]))
        if not sizes:
            continue
        present = [i for i in impls if results.get(i, {}).get(str(n))]
        zero_copy = 2 * memcpy_m / (3 * n - 1) * busbw_factor(n)
        copy_io = 2 * memcpy_m / (9 * (n - 1)) * busbw_factor(n)
        out.append(f"#### N = {n}: allreduce, float32, sum, out-of-place — busbw GB/s "
                   f"(time µs)\n")
        out.append(f"memcpy bounds as busbw: zero-copy 2M/(3N-1) → {zero_copy:.2f}, "
                   f"copy-in/copy-out 2M/(9(N-1)) → {copy_io:.2f} GB/s\n")
        out.append("| size | " + " | ".join(LABELS[i] for i in present) + " |")
        out.append("| ---: | " + " | ".join("---:" for _ in present) + " |")
        for s in sizes:
            cells = []
            for i in present:
                bw = get(results, i, n, s)
                t = get(results, i, n, s, "time_us")
                cells.append(f"{bw:.2f} ({t:.1f})" if bw is not None else "—")
            out.append(f"| {fmt_size(s)} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def target_table(rows):
    lines = ["| what | target | measured | status | numbers |",
             "| --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['what']} | {r['target']} | {r['measured']} | **{r['status']}** | "
                     f"{r['detail']} |")
    return "\n".join(lines)


def plot(results, ranks, impls, memcpy_m, out_dir):
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        log("matplotlib missing: pip install matplotlib")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "matplotlib"],
                       check=True)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    styles = {"kolo-shm": ("C0", "-"), "kolo-tcp": ("C0", "--"), "mpi": ("C3", "-"),
              "gloo": ("C2", "-"), "gloo-ring-chunked": ("C2", "--"),
              "kolo-mpi": ("C1", "-"), "kolo-mpi-native": ("C1", "--")}
    paths = []
    for kind in ("busbw", "latency"):
        fig, axes = plt.subplots(1, len(ranks), figsize=(5.2 * len(ranks), 4.4), squeeze=False)
        for ax, n in zip(axes[0], ranks):
            for i in impls:
                table = results.get(i, {}).get(str(n), {})
                sizes = sorted(s for s in table if "oop" in table[s])
                if kind == "latency":
                    sizes = [s for s in sizes if s <= 64 * 1024]
                if not sizes:
                    continue
                ys = [table[s]["oop"]["busbw" if kind == "busbw" else "time_us"] for s in sizes]
                color, ls = styles.get(i, ("k", "-"))
                ax.plot(sizes, ys, ls, color=color, marker=".", label=LABELS[i])
            if kind == "busbw":
                f = busbw_factor(n)
                ax.axhline(2 * memcpy_m / (3 * n - 1) * f, color="grey", ls=":",
                           label="zero-copy bound 2M/(3N-1)")
                ax.axhline(2 * memcpy_m / (9 * (n - 1)) * f, color="grey", ls="-.",
                           label="copy-in/out bound 2M/(9(N-1))")
                ax.set_ylabel("busbw (GB/s, GB = 1e9)")
            else:
                ax.set_yscale("log")
                ax.set_ylabel("time per allreduce (µs)")
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(ticker.LogLocator(base=16))
            ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: fmt_size(int(v))))
            ax.set_xlabel("size")
            ax.set_title(f"allreduce float32 sum, N = {n}")
            ax.grid(True, which="both", alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.suptitle(f"kolo vs Open MPI vs Gloo on {platform.node()} "
                     f"({os.cpu_count()} cores, memcpy M = {memcpy_m:.1f} GB/s); medians")
        fig.tight_layout()
        path = os.path.join(out_dir, f"allreduce_{kind}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def update_doc(doc, generated, section):
    text = open(doc).read()
    tag = "compare.py" + (":" + section if section else "")
    begin, end = f"<!-- {tag}:begin -->", f"<!-- {tag}:end -->"
    if begin not in text or end not in text:
        log(f"{doc}: no {begin} … {end} markers; left unchanged")
        return
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    with open(doc, "w") as f:
        f.write(head + begin + "\n" + generated.strip() + "\n" + end + tail)
    log(f"updated {doc}")


def load_results(path):
    """A results.json as main() wrote it, with the sizes back as numbers."""
    d = json.load(open(path))
    d["allreduce"] = {i: {n: {int(sz): v for sz, v in t.items()} for n, t in by_n.items()}
                      for i, by_n in d["allreduce"].items()}
    return d


def extra_of(d):
    """The targets' extra measurements (fusion, fp16 over TCP) as medians of their runs."""
    extra = {}
    fusion_runs, fp16_runs = d.get("fusion_runs") or [], d.get("fp16_tcp_64M_us_runs") or []
    if fusion_runs:
        extra["fusion"] = {k: statistics.median(r[k] for r in fusion_runs)
                           for k in ("ratio", "worst_ratio", "fused_us", "one_us",
                                     "engine_one_us")}
        if all("coalesced_ratio" in r for r in fusion_runs):
            extra["fusion"].update({k: statistics.median(r[k] for r in fusion_runs)
                                    for k in ("coalesced_ratio", "coalesced_worst_ratio",
                                              "coalesced_us")})
    if fp16_runs:
        extra["fp16_tcp_64M_us"] = statistics.median(fp16_runs)
    return extra


def render(d, img_dir, gpu):
    """The generated section (targets, tables) from a results document: numbers only from it
    and from the GPU kernels' results (gpu)."""
    results = d["allreduce"]
    memcpy_m = d["memcpy"]["M_gbps"]
    comp = d["compile"]
    trows = targets(results, memcpy_m, comp, extra_of(d), gpu)
    tables = markdown_tables(results, d["ranks"], d["impls"], memcpy_m)
    summary = (f"Measured {d['generated']} on {d['host']}: {d['cpus']} cores, "
               f"load average {d['load_before'][0]:.2f} before / {d['load_after'][0]:.2f} after; "
               f"{d['repeats']} repeat(s), medians; "
               f"{'quick' if d['quick'] else 'full'} size range.\n\n"
               f"memcpy bandwidth M = {memcpy_m:.2f} GB/s (one thread, {d['memcpy']['size']}); "
               f"two threads at once: {d['memcpy']['two_threads_aggregate_gbps']:.2f} GB/s "
               f"together. Compile time of a .cpp including <kolo/kolo.hpp> at -O2: "
               f"{comp['seconds']:.2f} s wall, {comp['cpu_seconds']:.2f} s CPU "
               f"({os.path.basename(comp['compiler'])}).\n")
    ttable = target_table(trows)
    generated = ("### Targets\n\n" + summary + "\n" + ttable +
                 "\n\n### Allreduce, side by side\n\n" +
                 f"![busbw vs size]({img_dir}/allreduce_busbw.png)\n\n" +
                 f"![latency vs size]({img_dir}/allreduce_latency.png)\n\n" + tables)
    return generated, summary, ttable, tables, trows


def doc_section(doc, section):
    """The text between a file's compare.py markers (None without them)."""
    text = open(doc).read()
    tag = "compare.py" + (":" + section if section else "")
    begin, end = f"<!-- {tag}:begin -->", f"<!-- {tag}:end -->"
    if begin not in text or end not in text:
        return None
    return text.split(begin, 1)[1].split(end, 1)[0]


def check_doc(doc, generated, section):
    """0 when the file's generated section is what render() gives; else 1 and a diff."""
    import difflib
    have = doc_section(doc, section)
    if have is None:
        log(f"{doc}: no compare.py markers")
        return 1
    want = "\n" + generated.strip() + "\n"
    if have == want:
        log(f"{doc}: the generated section matches its results")
        return 0
    sys.stdout.writelines(difflib.unified_diff(want.splitlines(True), have.splitlines(True),
                                               "generated", doc))
    log(f"{doc}: the generated section differs from what its results give (diff above)")
    return 1


# -------------------------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build-bench", help="build directory (default build-bench)")
    ap.add_argument("--out", default="docs/perf", help="output directory (default docs/perf)")
    ap.add_argument("--quick", action="store_true", help="fewer sizes, iterations and repeats")
    ap.add_argument("--repeats", type=int, help="runs per configuration (default 3, quick 1)")
    ap.add_argument("--ranks", default="2,4,8", help="rank counts (default 2,4,8)")
    ap.add_argument("--impls", default=",".join(DEFAULT_IMPLS),
                    help="comma-separated subset of " + ",".join(IMPLS) +
                    " (default: the first five)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per kolo-bench run")
    ap.add_argument("--doc", help="markdown file whose generated section to replace")
    ap.add_argument("--section", default="",
                    help="name of the generated section (markers <!-- compare.py:NAME:begin -->"
                         " ... :end -->); default: the unnamed one")
    ap.add_argument("--gpu-results",
                    default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                         "gpu_kernels_h100.json"),
                    help="kolo-gpu-kernels-bench --json file for the GPU target's row "
                         "(default benchmarks/gpu_kernels_h100.json; '' for none)")
    ap.add_argument("--render", metavar="RESULTS_JSON",
                    help="run nothing: render the section from this results.json")
    ap.add_argument("--check", action="store_true",
                    help="with --render and --doc: compare instead of writing")
    args = ap.parse_args()
    gpu = json.load(open(args.gpu_results)) if args.gpu_results else None

    def image_dir():  # image links relative to the document that shows them
        return os.path.relpath(args.out, os.path.dirname(os.path.abspath(args.doc))
                               if args.doc else args.out) if args.doc else "."

    if args.render:
        generated = render(load_results(args.render), image_dir(), gpu)[0]
        if args.check:
            if not args.doc:
                sys.exit("compare.py: --check needs --doc")
            return check_doc(args.doc, generated, args.section)
        if args.doc:
            update_doc(args.doc, generated, args.section)
        else:
            print(generated)
        return 0

    ranks = [int(x) for x in args.ranks.split(",")]
    impls = [i for i in args.impls.split(",") if i]
    for i in impls:
        if i not in IMPLS:
            sys.exit(f"compare.py: unknown implementation {i} (expected {', '.join(IMPLS)})")
    repeats = args.repeats or (1 if args.quick else 3)
    bands = QUICK_BANDS if args.quick else FULL_BANDS
    os.makedirs(args.out, exist_ok=True)
    runner = Runner(args)
    started = datetime.datetime.now().isoformat(timespec="seconds")
    load_before = os.getloadavg()

    ok = []
    skipped = {}
    for i in impls:
        avail, why = runner.available(i)
        if avail:
            ok.append(i)
        else:
            skipped[i] = why
            log(f"skipping {i}: {why}")
    impls = ok

    # memcpy first and last: M is the one bound every ratio refers to.
    m_runs = {1: [], 2: []}
    size = "64M" if args.quick else "256M"

    def measure_memcpy():
        for t in (1, 2):
            d = runner.memcpy(t, size)
            m_runs[t].append((d["M_gbps"], d["M_aggregate_gbps"]))

    measure_memcpy()
    raw = {i: {str(n): [] for n in ranks} for i in impls}
    failures = []
    fusion_runs, fp16_runs = [], []
    for rep in range(repeats):
        # The targets' extra measurements, inside the same repeat loop as the sweep.
        try:
            fusion_runs.append(runner.fusion(2))
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            failures.append({"impl": "kolo-fusion-bench", "ranks": 2, "repeat": rep,
                             "error": str(e)})
            log(f"FAILED kolo-fusion-bench: {e}")
        if "kolo-tcp" in impls:
            try:
                d = runner.bench_json(runner.command("kolo-tcp", 2) +
                                      ["--compression", "fp16", "-b", "64M", "-e", "64M",
                                       "-n", "3", "-w", "1"])
                fp16_runs.append(d["rows"][0]["out_of_place"]["time_us"])
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                failures.append({"impl": "kolo-tcp fp16", "ranks": 2, "repeat": rep,
                                 "error": str(e)})
                log(f"FAILED kolo-tcp --compression fp16: {e}")
        for n in ranks:
            for i in impls:
                docs = []
                t0 = time.time()
                try:
                    for band in bands:
                        docs.append(runner.bench_json(runner.command(i, n) + band))
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    failures.append({"impl": i, "ranks": n, "repeat": rep, "error": str(e)})
                    log(f"FAILED {i} N={n}: {e}")
                    continue
                raw[i][str(n)].append(merge_rows(docs))
                log(f"repeat {rep + 1}/{repeats}  N={n}  {i:18s} {time.time() - t0:6.1f} s")
    measure_memcpy()

    memcpy_m = statistics.median(x[0] for x in m_runs[1])
    memcpy_agg2 = statistics.median(x[1] for x in m_runs[2])
    results = {i: {str(n): median_table(raw[i][str(n)], n) for n in ranks} for i in impls}
    comp = compile_time(runner.build)
    load_after = os.getloadavg()
    doc = {
        "generated": started, "host": platform.node(), "cpus": os.cpu_count(),
        "load_before": load_before, "load_after": load_after, "repeats": repeats,
        "quick": args.quick, "bands": bands, "ranks": ranks, "impls": impls,
        "skipped": skipped, "failures": failures,
        "memcpy": {"size": size, "M_gbps": memcpy_m, "two_threads_aggregate_gbps": memcpy_agg2,
                   "runs": m_runs},
        "compile": comp, "fusion_runs": fusion_runs,
        "fp16_tcp_64M_us_runs": fp16_runs,
        "allreduce": results,
    }
    # The section is rendered from this document alone (as --render does from the file).
    generated, summary, ttable, tables, trows = render(doc, image_dir(), gpu)
    doc["targets"] = trows
    doc["allreduce"] = {i: {n: {str(s): v for s, v in t.items()} for n, t in results[i].items()}
                        for i in impls}
    doc["raw"] = {i: {n: [{str(s): r for s, r in run.items()} for run in raw[i][n]]
                      for n in raw[i]} for i in impls}
    # tables.md lies in --out beside the plots, so its image links are "." (the section in
    # --doc links them relative to that document).
    with open(os.path.join(args.out, "tables.md"), "w") as f:
        f.write(render(doc, ".", gpu)[0])
    pngs = plot(results, ranks, impls, memcpy_m, args.out)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(doc, f, indent=1)

    print(summary)
    print(ttable)
    print()
    print(tables)
    print("wrote " + ", ".join([os.path.join(args.out, "results.json"),
                                os.path.join(args.out, "tables.md")] + pngs))
    if args.doc:
        update_doc(args.doc, generated, args.section)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
