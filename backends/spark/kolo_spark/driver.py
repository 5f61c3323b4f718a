"""The driver side: checks, submission of the barrier stage, results and failures, the log
stream and the timeline; and ``local_mode``, which runs the ranks as subprocesses of the driver
without a Spark job."""

from __future__ import annotations

import atexit
import functools
import json
import os
import pickle
import re
import secrets
import select
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import data as data_mod
from . import timeline as tl
from .errors import (ConfigurationError, KoloSparkError, RankFailedError, StartTimeoutError,
                     first_failure)
from .liveness import LivenessServer, hub_bind_host, print_line
from .process import NativeProcess, StartError
from .task import (CONTRACT_VARS, TORCHRUN_VARS, HostKey, RankLaunch, TaskSpec,
                   barrier_partition, default_host_key, error_from_payload, error_from_text,
                   listen_socket, python_path, reserve_port, scratch_dir)
from .topology import TaskInfo, compute_topology

DEFAULT_MAX_RESULT_BYTES = 64 << 20


@dataclass
class RankResult:
    rank: int
    exit_code: int
    host: str
    ip: str
    port: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    devices: Tuple[str, ...] = ()
    data_rows: Optional[int] = None
    output: str = ""  # the tail of the rank's output (rank 0 always; every rank with "all")
    leftovers: Tuple[dict, ...] = ()  # processes the rank left running, ended by kolo_spark


@dataclass
class RunResult:
    ranks: List[RankResult] = field(default_factory=list)
    elapsed: float = 0.0
    timeline: Optional[str] = None  # the merged timeline's path, when one was written

    @property
    def exit_codes(self) -> List[int]:
        return [r.exit_code for r in self.ranks]

    @property
    def output(self) -> str:
        """Rank 0's output tail."""
        return self.ranks[0].output if self.ranks else ""


class FunctionResults(list):
    """What ``run(spark, n, fn, ...)`` returns: the list of every rank's return value, in rank
    order, with ``ranks`` (each rank's RankResult: ``rank``, ``exit_code``, ``host``, ``ip``,
    ``port``, ``local_rank``, ``local_size``, ``cross_rank``, ``cross_size``, ``devices``,
    ``data_rows``, ``output``, ``leftovers``), ``elapsed`` (seconds) and ``timeline`` (the merged
    timeline's path, or None)."""

    ranks: List[RankResult]
    elapsed: float
    timeline: Optional[str]

    def __init__(self, values=(), ranks=(), elapsed: float = 0.0, timeline: Optional[str] = None):
        super().__init__(values)
        self.ranks = list(ranks)
        self.elapsed = elapsed
        self.timeline = timeline


# --- driver-side checks ---
_LOCAL_MASTER = re.compile(r"^local(?:\[(\*|\d+)(?:\s*,\s*\d+)?\])?$")


def local_master_slots(master: str, cpus_per_task: int = 1) -> Optional[int]:
    """Task slots of a ``local``/``local[N]``/``local[*]``/``local[N,F]`` master; None for
    anything else (standalone, YARN, k8s, local-cluster: executors come and go)."""
    m = _LOCAL_MASTER.match(master.strip())
    if not m:
        return None
    n = m.group(1)
    cores = 1 if n is None else (os.cpu_count() or 1) if n == "*" else int(n)
    return cores // max(1, cpus_per_task)


def _truthy(v: Optional[str]) -> bool:
    return v is not None and v.strip().lower() == "true"


def python_problem(pyspark_version: str, python: Tuple[int, int] = sys.version_info[:2]
                   ) -> Optional[str]:
    """The message for a pyspark that cannot run Python jobs on this interpreter, else None.
    pyspark before 3.4 supports Python up to 3.10: its bundled cloudpickle fails on 3.11's code
    objects ("IndexError: tuple index out of range"), in kolo_spark's pickling and in Spark's own
    task serialization alike, so every job would fail with that obscure error."""
    m = re.match(r"(\d+)\.(\d+)", pyspark_version or "")
    if m and (int(m.group(1)), int(m.group(2))) < (3, 4) and tuple(python) >= (3, 11):
        return (f"pyspark {pyspark_version} does not support Python {python[0]}.{python[1]} "
                "(pyspark before 3.4 supports Python up to 3.10: its cloudpickle cannot pickle "
                "3.11's functions, and every Python job would fail). Use Python 3.10 or older "
                "with this Spark, or pyspark 3.4 or later.")
    return None


def _pyspark_problem() -> Optional[str]:
    """python_problem for the pyspark this process uses (imported already, or importable);
    None without pyspark."""
    mod = sys.modules.get("pyspark")
    if mod is None:
        try:
            import pyspark as mod
        except ImportError:
            return None
    return python_problem(getattr(mod, "__version__", ""))


def check_conf(conf: Mapping[str, str], use_gpu: Optional[bool],
               master: Optional[str] = None) -> List[str]:
    """Problems of the Spark configuration for a barrier job, as messages (empty: fine).
    ``master``: the application's master (a local master ignores dynamic allocation, and so
    does Spark's barrier check)."""
    problems = []
    local = master is not None and local_master_slots(master) is not None
    if _truthy(conf.get("spark.dynamicAllocation.enabled")) and not local:
        problems.append(
            "spark.dynamicAllocation.enabled=true: a barrier stage needs all of its tasks "
            "running at once on executors that stay; Spark refuses barrier stages under dynamic "
            "allocation. Start the session with spark.dynamicAllocation.enabled=false and a "
            "fixed number of executors (spark.executor.instances or spark.cores.max).")
    task_gpu = conf.get("spark.task.resource.gpu.amount")
    exec_gpu = conf.get("spark.executor.resource.gpu.amount")
    if not task_gpu:
        if use_gpu:
            problems.append(
                "GPUs were requested (use_gpu=True) but spark.task.resource.gpu.amount is not "
                "set, so tasks would get no GPU and KOLO_DEVICES would be empty. Set "
                "spark.task.resource.gpu.amount (e.g. 1) together with "
                "spark.executor.resource.gpu.amount and a discovery script.")
        elif use_gpu is None and exec_gpu:
            problems.append(
                f"executors have GPUs (spark.executor.resource.gpu.amount={exec_gpu}) but "
                "spark.task.resource.gpu.amount is not set, so tasks would get no GPU and "
                "KOLO_DEVICES would be empty. Set spark.task.resource.gpu.amount (e.g. 1), or "
                "pass use_gpu=False to run without GPUs.")
    return problems


def slots_problem(num_proc: int, slots: int, master: str, conf: Mapping[str, str],
                  waited: float = 0.0) -> Optional[str]:
    """The message for too few task slots, or None."""
    if slots >= num_proc:
        return None
    how = [f"master {master}"]
    if conf.get("spark.task.cpus", "1") not in ("1", ""):
        how.append(f"spark.task.cpus={conf.get('spark.task.cpus')}")
    if conf.get("spark.task.resource.gpu.amount"):
        how.append(f"spark.task.resource.gpu.amount={conf.get('spark.task.resource.gpu.amount')}")
    after = f" after waiting {waited:.0f}s for executors" if waited >= 1 else ""
    if local_master_slots(master) is not None:
        cpus = int(conf.get("spark.task.cpus", "1") or 1)
        more = (f"cores (master local[{num_proc * cpus}]"
                + (f", or spark.task.cpus=1 with local[{num_proc}]" if cpus > 1 else "") + ").")
    else:
        more = ("executors or cores (spark.executor.instances, spark.executor.cores, "
                "spark.cores.max; for GPUs, more GPUs per executor).")
    return (f"num_proc={num_proc} but the Spark application has only {slots} task slot"
            f"{'s' if slots != 1 else ''}{after} ({', '.join(how)}). A barrier stage starts "
            f"all {num_proc} tasks at once, so Spark would wait for slots that never come and "
            "fail only after spark.scheduler.barrier.maxConcurrentTasksCheck.* (about 10 "
            f"minutes). Use num_proc <= {slots}, or give the application more " + more)


def _spark_context(spark):
    return getattr(spark, "sparkContext", spark)


def task_slots(sc) -> int:
    """How many tasks the application can run at once now (honours spark.task.cpus and task
    resources such as GPUs)."""
    try:
        jsc = sc._jsc.sc()
        rp = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(rp))
    except Exception:  # older/newer Spark without this internal method
        cpus = int(sc.getConf().get("spark.task.cpus", "1"))
        local = local_master_slots(sc.master, cpus)
        return local if local is not None else int(sc.defaultParallelism) // max(1, cpus)


# --- start-timeout monitor ---
class _StartMonitor(threading.Thread):
    """Cancels the job when its barrier stage has not got all tasks running within
    ``start_timeout`` seconds of no progress elsewhere in the job (a shuffle that feeds the
    barrier stage, e.g. df.repartition, restarts the clock while it runs)."""

    def __init__(self, sc, group: str, num_proc: int, start_timeout: float):
        super().__init__(name="kolo_spark-start-monitor", daemon=True)
        self.sc, self.group, self.num_proc, self.start_timeout = sc, group, num_proc, start_timeout
        self.stop_event = threading.Event()
        self.all_started = threading.Event()
        self.timed_out = False
        self.message = ""
        self.stage_ids: List[int] = []

    def run(self) -> None:
        tracker = self.sc.statusTracker()
        clock = time.monotonic()
        last_progress = None
        started = 0
        while not self.stop_event.wait(0.25):
            try:
                stages = []
                for jid in tracker.getJobIdsForGroup(self.group):
                    info = tracker.getJobInfo(jid)
                    if info is not None:
                        stages.extend(info.stageIds)
                if not stages:
                    continue
                self.stage_ids = sorted(set(stages))
                barrier = self.stage_ids[-1]  # the result stage is created last
                progress = []
                started = 0
                for sid in self.stage_ids:
                    st = tracker.getStageInfo(sid)
                    if st is None:
                        continue
                    if sid == barrier:
                        started = st.numActiveTasks + st.numCompletedTasks + st.numFailedTasks
                    else:
                        progress.append((sid, st.numActiveTasks, st.numCompletedTasks))
                        if st.numActiveTasks:
                            clock = time.monotonic()
                if progress != last_progress:
                    last_progress, clock = progress, time.monotonic()
                if started >= self.num_proc:
                    self.all_started.set()
                    return
            except Exception:  # the gateway is going away: nothing left to watch
                return
            if time.monotonic() - clock > self.start_timeout:
                try:
                    slots = task_slots(self.sc)
                except Exception:
                    slots = -1
                self.timed_out = True
                self.message = (
                    f"kolo_spark: only {started} of {self.num_proc} barrier tasks started within "
                    f"start_timeout={self.start_timeout:g}s (the application has {slots} task "
                    "slots now). A barrier stage needs all its slots free at once: are other jobs "
                    "holding them, are executors lost, or is start_timeout too short for "
                    "executors to start?")
                self.sc.cancelJobGroup(self.group)
                return

    def stop(self) -> None:
        self.stop_event.set()


_shipped: Dict[str, str] = {}  # application id -> path of the zip it was given


def ship_package(sc) -> str:
    """Gives the executors this kolo_spark (sc.addPyFile of a zip of the package), once per
    SparkContext and version: tasks then run the driver's code even where kolo_spark is not
    installed, or installed in another version."""
    import hashlib
    import zipfile

    pkg_dir = os.path.dirname(os.path.abspath(__file__))
    sources = sorted(f for f in os.listdir(pkg_dir) if f.endswith(".py"))
    digest = hashlib.sha256()
    for name in sources:
        with open(os.path.join(pkg_dir, name), "rb") as f:
            digest.update(name.encode() + b"\0" + f.read())
    tag = digest.hexdigest()[:12]
    key = str(sc.applicationId)  # unique per SparkContext, unlike id(sc) after a stop()
    if _shipped.get(key, "").endswith(f"-{tag}.zip"):
        return _shipped[key]
    out_dir = tempfile.mkdtemp(prefix="kolo-spark-pkg-")
    atexit.register(shutil.rmtree, out_dir, True)
    path = os.path.join(out_dir, f"kolo_spark-{tag}.zip")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name in sources:
            z.write(os.path.join(pkg_dir, name), f"kolo_spark/{name}")
    sc.addPyFile(path)
    _shipped[key] = path
    return path


def _pickle_module(local: bool):
    """(name, module) of the cloudpickle that pickles the function: pyspark's copy for barrier
    tasks (every executor has it), the standalone package in local mode when installed (the
    ranks then start without importing pyspark)."""
    if local:
        try:
            import cloudpickle
            return "cloudpickle", cloudpickle
        except ImportError:
            pass
    try:
        from pyspark import cloudpickle
        return "pyspark", cloudpickle
    except ImportError:
        raise ConfigurationError(
            "kolo_spark: running a function needs cloudpickle (pip install cloudpickle, or "
            "pyspark, which ships it)") from None


def _log_sink(stream_logs) -> Optional[Callable[[int, str], None]]:
    if stream_logs is None or stream_logs is False:
        return None
    if stream_logs is True:
        return print_line
    if callable(stream_logs):
        return stream_logs
    if hasattr(stream_logs, "write"):
        return functools.partial(print_line, stream=stream_logs)
    raise ConfigurationError(f"kolo_spark: stream_logs={stream_logs!r}: True, False, a file-like "
                             "object or a callable(rank, line)")


def _spark_size(text: Optional[str]) -> int:
    """Bytes of a Spark size ("1g", "512m", "0"); 0 for none/unlimited/unparsable."""
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)b?\s*", (text or "").lower())
    if not m:
        return 0
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[m.group(2)]


def run(spark, num_proc: int, command: Union[str, Sequence[str], Callable], args: Sequence = (),
        env: Optional[Mapping[str, str]] = None, *, kwargs: Optional[Mapping[str, Any]] = None,
        timeout: Optional[float] = None, start_timeout: float = 120.0, df=None,
        data_format: str = "csv", data_dir: Optional[str] = None, local_mode: bool = False,
        use_gpu: Optional[bool] = None, host_key: HostKey = "host", tail_lines: int = 100,
        echo: Optional[bool] = None, collect_output: str = "rank0", kill_grace: float = 2.0,
        local_gpus: Optional[Sequence] = None, ship: bool = True,
        stream_logs: Union[bool, Any, Callable[[int, str], None]] = True,
        log_lines_per_second: float = 100.0, log_line_bytes: int = 2048,
        timeline: Optional[str] = None, max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        ) -> Union[RunResult, FunctionResults]:
    """Runs ``num_proc`` kolo ranks, one per Spark barrier task: a native program, or a Python
    function.

    spark: a SparkSession or SparkContext (may be None with ``local_mode=True`` and no ``df``).
    command: a program path on the executors (or an argv list; ``args`` are appended): returns
        a RunResult. Or a callable: each rank calls ``command(*args, **kwargs)`` in a fresh
        Python interpreter (the function and its arguments travel cloudpickled) and run()
        returns the list of the return values in rank order (a FunctionResults).
    env: extra environment for the ranks (KOLO_TIMEOUT_SECONDS, ...); the contract variables
        (KOLO_RANK, KOLO_PEERS, ..., and torchrun's RANK, MASTER_PORT, ...) are kolo_spark's.
    kwargs: keyword arguments of the function (functions only).
    timeout: seconds a rank may run before it is killed and the job fails (None: no limit).
    start_timeout: seconds the barrier tasks may take to start, and (non-local masters) to wait
        for enough executors before giving up.
    df: a DataFrame; rank r gets partition r (repartitioned to num_proc when the count differs)
        written to a local file, path in KOLO_DATA_FILE (layouts: kolo_spark.data).
    data_format: "csv", "f64" or "bin". data_dir: parent of the ranks' scratch directories
        (default: SPARK_LOCAL_DIRS).
    local_mode: run the ranks as subprocesses of the driver, no Spark job.
    use_gpu: True requires spark.task.resource.gpu.amount; None: GPUs when tasks get them.
    host_key: "host" (hostname + network namespace, as the C++ default), "executor" (each
        executor counts as a host), a fixed string, or a callable(BarrierTaskContext) -> str.
    tail_lines: lines of output kept per rank. echo: print every output line (prefixed) into
        the executor logs (Spark mode). Default: yes, except under a local[N] master, whose
        executor log is the driver's own console (with stream_logs the lines would show twice).
    collect_output: "rank0" (only rank 0's tail is returned) or "all".
    kill_grace: seconds between SIGTERM and SIGKILL when a rank must be stopped.
    local_gpus: local_mode only: GPU ids split evenly among the ranks.
    ship: give the executors this kolo_spark with sc.addPyFile (else it must be importable
        there already).
    stream_logs: the ranks' output lines on the driver while the job runs, prefixed
        "[kolo rank R] ": True (the driver's stdout), a file-like object, a callable(rank,
        line), or False. Bounded per rank: log_lines_per_second lines per second, each cut to
        log_line_bytes bytes (the executor log keeps every line).
    timeline: path of the merged Chrome-trace file (default: KOLO_TIMELINE in env= or in the
        driver's environment; None: no timeline).
    max_result_bytes: functions only: the largest pickled return value a rank may send (capped
        at spark.driver.maxResultSize / num_proc); a larger one is a ResultTooLargeError.

    Raises ConfigurationError before submitting anything for a job that cannot run,
    RankFailedError naming the rank that failed first (RankFunctionError for a function that
    raised, with its remote traceback; chosen by errors.first_failure: a failure caused by
    another rank's never wins, then the ranks' own timestamps), with the other ranks' failures
    in its ``others``; StartTimeoutError. KeyboardInterrupt while the job runs cancels it and
    returns only once every rank's processes are gone (bounded wait); that needs run() on the
    main thread (elsewhere Ctrl-C does not reach it: docs/spark.md).
    """
    started_at = time.monotonic()
    origin_us = tl.now_us()
    is_fn = callable(command) and not isinstance(command, (str, bytes, os.PathLike))
    if not isinstance(num_proc, int) or isinstance(num_proc, bool) or num_proc < 1:
        raise ConfigurationError(f"kolo_spark: num_proc={num_proc!r} must be a positive integer")
    if is_fn:
        name = getattr(command, "__qualname__", None) or type(command).__name__
        argv = [f"{name} (python function)"]
        if isinstance(args, (str, bytes)):
            raise ConfigurationError("kolo_spark: args must be a tuple or list of the function's "
                                     f"positional arguments, not {type(args).__name__}")
    else:
        if kwargs:
            raise ConfigurationError("kolo_spark: kwargs= is for functions; a program takes "
                                     "its arguments in args")
        argv = [str(command)] if isinstance(command, (str, os.PathLike)) else \
            [str(c) for c in command]
        if not argv or not argv[0]:
            raise ConfigurationError("kolo_spark: command is empty")
        argv += [str(a) for a in args]
    user_env = {str(k): str(v) for k, v in (env or {}).items()}
    reserved = sorted(set(user_env) & set(CONTRACT_VARS + TORCHRUN_VARS))
    if reserved:
        raise ConfigurationError(f"kolo_spark: env sets {', '.join(reserved)}, which kolo_spark "
                                 "sets for every rank (the environment contract)")
    timeline_path = timeline or user_env.pop("KOLO_TIMELINE", "") or \
        os.environ.get("KOLO_TIMELINE", "") or None
    if collect_output not in ("rank0", "all"):
        raise ConfigurationError(f"kolo_spark: collect_output={collect_output!r}: 'rank0' or 'all'")
    if df is not None and data_format not in data_mod.FORMATS:
        raise ConfigurationError(f"kolo_spark: data_format={data_format!r}: expected one of "
                                 f"{', '.join(data_mod.FORMATS)}")
    if timeout is not None and timeout <= 0:
        raise ConfigurationError(f"kolo_spark: timeout={timeout!r} must be positive (or None)")
    if start_timeout is None or start_timeout <= 0:
        raise ConfigurationError(f"kolo_spark: start_timeout={start_timeout!r} must be positive")
    if not (isinstance(host_key, str) and host_key) and not callable(host_key):
        raise ConfigurationError(f"kolo_spark: host_key={host_key!r}")
    if not isinstance(max_result_bytes, int) or max_result_bytes < 1:
        raise ConfigurationError(f"kolo_spark: max_result_bytes={max_result_bytes!r} must be a "
                                 "positive number of bytes")
    sink = _log_sink(stream_logs)

    spec = TaskSpec(num_proc=num_proc, argv=argv, secret=secrets.token_hex(32), env=user_env,
                    timeout=timeout, tail_lines=tail_lines, echo=echo is not False,
                    collect_output=collect_output, kill_grace=kill_grace, host_key=host_key,
                    data_dir=data_dir, timeline=bool(timeline_path), stream_logs=sink is not None,
                    log_lines_per_second=log_lines_per_second, log_line_bytes=log_line_bytes,
                    max_result_bytes=max_result_bytes)
    if is_fn:
        spec.pickler, cp = _pickle_module(local_mode)
        try:
            spec.fn_payload = cp.dumps((command, tuple(args), dict(kwargs or {})))
        except Exception as e:
            why = _pyspark_problem() if spec.pickler == "pyspark" else None
            raise ConfigurationError(f"kolo_spark: the function or its arguments cannot be "
                                     f"pickled on the driver: {type(e).__name__}: {e}"
                                     + (f" ({why})" if why else "")) from None

    if local_mode:
        traces: Dict[int, List[dict]] = {}
        hosts: Dict[int, str] = {}
        try:
            result, values = _run_local(spec, spark, df, data_format, local_gpus, sink, traces,
                                        hosts)
        finally:
            if timeline_path:
                _write_timeline(timeline_path, traces, origin_us, num_proc, hosts,
                                [tl.complete("run (local mode)", origin_us, tl.now_us(),
                                             tl.KOLO_TID)])
        return _finish(result, is_fn, started_at, timeline_path, values)

    if spark is None:
        raise ConfigurationError("kolo_spark: spark is None (pass a SparkSession, or "
                                 "local_mode=True to run the ranks on the driver)")
    sc = _spark_context(spark)
    conf = dict(sc.getConf().getAll())
    if echo is None:
        spec.echo = sink is None or local_master_slots(sc.master) is None
    problems = check_conf(conf, use_gpu, sc.master)
    bad_python = _pyspark_problem()
    if bad_python:
        problems.insert(0, bad_python)
    if problems:
        raise ConfigurationError("kolo_spark: cannot run a barrier job:\n  - " +
                                 "\n  - ".join(problems))
    # Slots: a local master has them all now; a cluster's executors may still be registering.
    slots = task_slots(sc)
    waited = 0.0
    if slots < num_proc and local_master_slots(sc.master) is None:
        t0 = time.monotonic()
        while slots < num_proc and time.monotonic() - t0 < start_timeout:
            time.sleep(0.5)
            slots = task_slots(sc)
        waited = time.monotonic() - t0
    problem = slots_problem(num_proc, slots, sc.master, conf, waited)
    if problem:
        raise ConfigurationError("kolo_spark: " + problem)
    if is_fn:
        total = _spark_size(conf.get("spark.driver.maxResultSize", "1g"))
        if total:
            spec.max_result_bytes = min(spec.max_result_bytes, max(1, total // num_proc))

    spec.driver_host = conf.get("spark.driver.host")
    if ship:
        ship_package(sc)
    if df is not None:
        if df.rdd.getNumPartitions() != num_proc:
            df = df.repartition(num_proc)
        rdd = df.rdd
        spec.data_format = data_format
        spec.data_columns = tuple(df.columns)
        spec.data_types = data_mod.column_types(df.schema)
    else:
        rdd = sc.parallelize(range(num_proc), num_proc)
    hub = LivenessServer(spec.secret, bind_host=hub_bind_host(conf.get, sc.master), on_line=sink)
    spec.liveness = ("127.0.0.1" if hub.bind_host.startswith("127.") else
                     spec.driver_host or hub.bind_host, hub.port)
    job = rdd.barrier().mapPartitions(functools.partial(barrier_partition, spec))
    group = f"kolo_spark-{uuid.uuid4().hex[:12]}"
    description = f"kolo_spark: {num_proc} ranks of {os.path.basename(argv[0])}"
    driver_events: List[dict] = []
    try:
        rows = _collect(sc, job, group, description, num_proc, start_timeout, hub,
                        kill_grace, driver_events)
        hub.wait_all_gone(2.0)  # the tasks have ended: their last lines and timelines
    finally:
        hub.close()
        if timeline_path:
            driver_events.append(tl.complete("run", origin_us, tl.now_us(), tl.KOLO_TID))
            hosts = {r: "" for r in range(num_proc)}
            _write_timeline(timeline_path, hub.traces, origin_us, num_proc, hosts, driver_events)
    ranks, values = [], []
    for meta, blob in sorted(((json.loads(m), b) for m, b in rows), key=lambda x: x[0]["rank"]):
        ranks.append(RankResult(**_tupled(meta)))
        values.append(blob)
    return _finish(RunResult(ranks=ranks), is_fn, started_at, timeline_path, values)


def _write_timeline(path, traces, origin_us, num_proc, hosts, driver_events) -> None:
    try:
        tl.merge(path, traces, origin_us, num_proc, hosts, driver_events)
    except OSError as e:
        print(f"kolo_spark: could not write the timeline {path}: {e}", file=sys.stderr)


def _finish(result: RunResult, is_fn: bool, started_at: float, timeline_path: Optional[str],
            values: List[Optional[bytes]]):
    elapsed = time.monotonic() - started_at
    if not is_fn:
        result.elapsed = elapsed
        result.timeline = timeline_path
        return result
    out = []
    for rank, blob in zip(result.ranks, values):
        try:  # pickled by the ranks with the job's cloudpickle, which pickle finds by name
            out.append(pickle.loads(blob) if blob is not None else None)
        except Exception as e:
            raise KoloSparkError(f"kolo_spark: rank {rank.rank}'s return value cannot be "
                                 f"unpickled on the driver: {type(e).__name__}: {e}") from None
    return FunctionResults(out, result.ranks, elapsed, timeline_path)


def _collect(sc, job, group: str, description: str, num_proc: int, start_timeout: float,
             hub: LivenessServer, kill_grace: float, driver_events: List[dict]):
    """job.collect() under kolo's job group, in a helper thread while this one waits.

    Waiting here instead of inside the py4j call is what makes Ctrl-C work: PySpark's own
    SIGINT handler calls into the JVM on the connection the blocked collect() holds, which
    fails ("reentrant call") and leaves the job and every rank running. While run() waits,
    SIGINT raises KeyboardInterrupt here; kolo's job group is cancelled, and run() returns only
    once the ranks' hub connections have closed, i.e. every rank process is gone."""
    box: Dict[str, Any] = {}
    done = threading.Event()
    t_submit = tl.now_us()

    def target():
        try:
            sc.setJobGroup(group, description, interruptOnCancel=True)
            box["rows"] = job.collect()
        except BaseException as e:  # noqa: B902 (handed to the waiting thread)
            box["error"] = e
        finally:
            done.set()

    try:
        from pyspark import InheritableThread  # carries the caller's local properties (pool)
        thread = InheritableThread(target=target, name="kolo_spark-collect")
    except ImportError:
        thread = threading.Thread(target=target, name="kolo_spark-collect")
    thread.daemon = True
    monitor = _StartMonitor(sc, group, num_proc, start_timeout)
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if main else None
    try:
        if main:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        monitor.start()
        thread.start()
        try:
            while not done.wait(0.2):
                pass
        except KeyboardInterrupt:
            _cancel_after_interrupt(sc, group, done, hub, kill_grace)
            raise
    finally:
        monitor.stop()
        if main and previous is not None:
            try:
                signal.signal(signal.SIGINT, previous)
            except (TypeError, ValueError):
                pass
    driver_events.append(tl.complete("barrier job (submit to results)", t_submit, tl.now_us(),
                                     tl.KOLO_TID))
    if "error" in box:
        e = box["error"]
        if monitor.is_alive():
            monitor.join(5)
        if monitor.timed_out:
            raise StartTimeoutError(monitor.message) from None
        err = error_from_text(str(e))
        if err is None:
            # Not a rank's failure: the job was cancelled from outside (sc.cancelAllJobs, which
            # is what PySpark's own Ctrl-C handler does while run() waits on another thread
            # than the main one), or Spark itself failed. Raised as it is, once the ranks are
            # gone.
            hub.wait_all_gone(kill_grace + 15.0)
            raise e
        if isinstance(err, RankFailedError):
            # The task that failed the stage is not always the rank that failed first (a
            # survivor's "rank 1 exited" can fail it before rank 1's own task reports): wait a
            # moment for every rank's report on the hub.
            hub.wait_reports(num_proc, FAILURE_GRACE)
        # Spark reports cancelled tasks as ended before their Python workers (and with them the
        # ranks' supervisors) are killed: wait until every rank's process is really gone.
        hub.wait_all_gone(kill_grace + 15.0)
        if isinstance(err, RankFailedError):
            err = first_failure([err] + _reported_failures(hub))
        raise err from None
    return box["rows"]


# Seconds the driver waits, after a barrier job failed, for the ranks' failure reports that
# have not arrived yet (each rank's task sends its own as soon as its rank has ended).
FAILURE_GRACE = 2.0


def _reported_failures(hub: LivenessServer) -> List[RankFailedError]:
    """The ranks' failures from their reports on the hub, of the stage attempt that failed last
    (a retried barrier stage runs every rank again)."""
    reports = list(hub.failures.values())
    if not reports:
        return []
    last = max(int(p.get("attempt", 0) or 0) for p in reports)
    out = []
    for p in reports:
        if int(p.get("attempt", 0) or 0) != last:
            continue
        err = error_from_payload(p)
        if isinstance(err, RankFailedError):
            out.append(err)
    return out


def _cancel_after_interrupt(sc, group: str, done: threading.Event, hub: LivenessServer,
                            kill_grace: float) -> None:
    print(f"kolo_spark: interrupted: cancelling Spark job group {group} and waiting for the "
          "ranks to end", file=sys.stderr)
    try:
        sc.cancelJobGroup(group)
    except Exception as e:  # the gateway is gone: the ranks die with their executors
        print(f"kolo_spark: could not cancel job group {group}: {e}", file=sys.stderr)
    limit = kill_grace + 20.0
    end = time.monotonic() + limit
    done.wait(max(0.0, end - time.monotonic()))
    if not hub.wait_all_gone(max(0.0, end - time.monotonic())):
        print(f"kolo_spark: after {limit:g}s, ranks {hub.alive_ranks()} still hold their "
              "connection to the driver (their executors may be unreachable)", file=sys.stderr)


def _tupled(d: dict) -> dict:
    d["devices"] = tuple(d.get("devices") or ())
    d["leftovers"] = tuple(d.get("leftovers") or ())
    return d


# --- local mode ---
def _split_gpus(local_gpus: Optional[Sequence], num_proc: int) -> List[Tuple[str, ...]]:
    if not local_gpus:
        return [()] * num_proc
    ids = [str(g) for g in local_gpus]
    per = len(ids) // num_proc
    if per == 0:
        raise ConfigurationError(f"kolo_spark: local_gpus has {len(ids)} ids for {num_proc} "
                                 "ranks: every rank needs at least one")
    return [tuple(ids[r * per:(r + 1) * per]) for r in range(num_proc)]


def _local_partitions(spark, df, num_proc: int):
    """Partition r of df, one partition at a time (local mode with a DataFrame)."""
    if spark is None:
        spark = df.sparkSession
    sc = _spark_context(spark)
    if df.rdd.getNumPartitions() != num_proc:
        df = df.repartition(num_proc)
    rdd = df.rdd
    for r in range(num_proc):
        yield sc.runJob(rdd, lambda it: list(it), [r])


class _LocalLines:
    """Local mode: a rank's lines to the driver's sink, with the same bounds as the hub."""

    def __init__(self, rank: int, sink, spec: TaskSpec):
        self.rank, self.sink = rank, sink
        self.rate = float(spec.log_lines_per_second)
        self.line_bytes = max(16, int(spec.log_line_bytes))
        self.tokens = max(1.0, self.rate)
        self.last = time.monotonic()
        self.dropped = 0

    def __call__(self, text: str) -> None:
        now = time.monotonic()
        if self.rate > 0:
            self.tokens = min(max(1.0, self.rate), self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.rate <= 0 or self.tokens < 1.0:
            self.dropped += 1
            return
        self.tokens -= 1.0
        self.flush_notice()
        raw = text.encode("utf-8", "replace")
        if len(raw) > self.line_bytes:
            text = (raw[:self.line_bytes].decode("utf-8", "ignore") +
                    f" [... line cut at {self.line_bytes} of {len(raw)} bytes]")
        self.sink(self.rank, text)

    def flush_notice(self) -> None:
        if self.dropped:
            self.sink(self.rank, f"kolo_spark: {self.dropped} line"
                      f"{'s' if self.dropped != 1 else ''} of this rank not shown (over "
                      f"{self.rate:g} lines/s)")
            self.dropped = 0


def _run_local(spec: TaskSpec, spark, df, data_format: str, local_gpus: Optional[Sequence],
               sink, traces: Dict[int, List[dict]], hosts: Dict[int, str]
               ) -> Tuple[RunResult, List[Optional[bytes]]]:
    n = spec.num_proc
    host = spec.host_key if isinstance(spec.host_key, str) and spec.host_key not in (
        "host", "executor") else default_host_key()
    gpus = _split_gpus(local_gpus, n)
    listeners: List[socket.socket] = []
    procs: List[NativeProcess] = []
    launches: List[RankLaunch] = []
    lines: List[_LocalLines] = []
    workdirs: List[str] = []
    reserved = None
    try:
        for _ in range(n):
            listeners.append(listen_socket("127.0.0.1"))
        reserved = reserve_port("0.0.0.0")
        infos = [TaskInfo(r, host, "127.0.0.1", listeners[r].getsockname()[1], gpus[r],
                          torch_port=reserved.getsockname()[1] if r == 0 else 0)
                 for r in range(n)]
        topology = compute_topology(infos)
        for r in range(n):
            workdirs.append(scratch_dir(spec.data_dir or tempfile.gettempdir(), r))
            hosts[r] = host
        data: List[Optional[Dict[str, str]]] = [None] * n
        if df is not None:
            columns = tuple(df.columns)
            types = data_mod.column_types(df.schema)
            for r, rows in enumerate(_local_partitions(spark, df, n)):
                path = os.path.join(workdirs[r], data_mod.shard_file_name(r, data_format))
                count = data_mod.write_rows(rows, path, data_format, columns, types)
                data[r] = data_mod.data_env(path, data_format, count, columns, types)
        pypath = python_path() if spec.fn_payload is not None else None
        for r in range(n):
            launch = RankLaunch(spec, topology, r, listeners[r].fileno(), data[r], workdirs[r],
                                python_path_value=pypath)
            launches.append(launch)
            out = _LocalLines(r, sink, spec) if sink is not None else None
            lines.append(out)
            # No executor log here: a line goes to the sink, or (without one) to stdout as echo
            p = launch.process((listeners[r].fileno(),), (), f"kolo rank {r}", out,
                               echo=out is None and spec.echo)
            try:
                p.start()
            except StartError as e:
                raise launch.start_error(e) from None
            finally:
                listeners[r].close()
            procs.append(p)
        failure = _supervise(procs, launches, spec)
        if failure is not None:
            raise failure
        runs = [launch.outcome(p) for launch, p in zip(launches, procs)]
        return RunResult(ranks=[RankResult(**_tupled(run.result)) for run in runs]), \
            [run.value for run in runs]
    finally:
        for p in procs:
            p.terminate()
        for r, (launch, p) in enumerate(zip(launches, procs)):
            traces[r] = launch.events(p)
        for out in lines:
            if out is not None:
                out.flush_notice()
        for s in listeners:
            s.close()
        if reserved is not None:
            reserved.close()
        for d in workdirs:
            shutil.rmtree(d, ignore_errors=True)


def _supervise(procs: List[NativeProcess], launches: List[RankLaunch], spec: TaskSpec,
               failure_grace: float = 3.0) -> Optional[RankFailedError]:
    """Streams every rank's output until all exit. After the first failure the others get
    ``failure_grace`` seconds to stop on their own (kolo turns a lost peer into an error), then
    are terminated, as kolo-run does. Returns the failure to raise: :func:`first_failure` of
    every rank that failed by itself (the ranks terminated here are not failures of theirs)."""
    deadline = None if spec.timeout is None else time.monotonic() + spec.timeout
    failures: Dict[int, RankFailedError] = {}
    stop_at = None
    done = [False] * len(procs)
    while not all(done):
        fds = {p.fileno(): p for p in procs if p.fileno() is not None}
        ready, _, _ = select.select(list(fds), [], [], 0.1) if fds else ([], [], [])
        if not fds:
            time.sleep(0.05)
        for fd in ready:
            fds[fd].pump()
        for r, p in enumerate(procs):
            if done[r] or not p.exited():
                continue
            done[r] = True
            code = p.terminate()  # exited: reaps it, reads its status
            if code != 0:
                try:
                    launches[r].outcome(p)
                except RankFailedError as e:
                    failures[r] = e
                if stop_at is None:
                    stop_at = time.monotonic() + failure_grace
        now = time.monotonic()
        if not failures and deadline is not None and now >= deadline:
            r = next(i for i, d in enumerate(done) if not d)
            at = time.time()
            procs[r].terminate()
            failures[r] = launches[r].timeout_error(procs[r], at)
            stop_at = now
        if stop_at is not None and now >= stop_at:
            for r, p in enumerate(procs):
                if not done[r]:
                    p.terminate()
                    done[r] = True
    return first_failure(failures.values())
