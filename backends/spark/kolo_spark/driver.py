"""The driver side: checks, submission of the barrier stage, results and failures; and
``local_mode``, which runs the ranks as subprocesses of the driver without a Spark job."""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import secrets
import select
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import data as data_mod
from .liveness import LivenessServer
from .errors import ConfigurationError, RankFailedError, StartTimeoutError
from .process import NativeProcess
from .task import (CONTRACT_VARS, HostKey, TaskSpec, barrier_partition, build_env,
                   default_host_key, error_from_text, listen_socket, result_of)
from .topology import TaskInfo, compute_topology, peers_string


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


@dataclass
class RunResult:
    ranks: List[RankResult] = field(default_factory=list)
    elapsed: float = 0.0

    @property
    def exit_codes(self) -> List[int]:
        return [r.exit_code for r in self.ranks]

    @property
    def output(self) -> str:
        """Rank 0's output tail."""
        return self.ranks[0].output if self.ranks else ""


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


def check_conf(conf: Mapping[str, str], use_gpu: Optional[bool]) -> List[str]:
    """Problems of the Spark configuration for a barrier job, as messages (empty: fine)."""
    problems = []
    if _truthy(conf.get("spark.dynamicAllocation.enabled")):
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
    return (f"num_proc={num_proc} but the Spark application has only {slots} task slot"
            f"{'s' if slots != 1 else ''}{after} ({', '.join(how)}). A barrier stage starts "
            f"all {num_proc} tasks at once, so Spark would wait for slots that never come and "
            "fail only after spark.scheduler.barrier.maxConcurrentTasksCheck.* (about 10 "
            f"minutes). Use num_proc <= {slots}, or give the application more "
            + (f"cores (master local[{num_proc}])." if local_master_slots(master) is not None else
               "executors or cores (spark.executor.instances, spark.executor.cores, "
               "spark.cores.max; for GPUs, more GPUs per executor)."))


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


_JOB_PROPERTIES = ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel")


def run(spark, num_proc: int, command: Union[str, Sequence[str]], args: Sequence = (),
        env: Optional[Mapping[str, str]] = None, *, timeout: Optional[float] = None,
        start_timeout: float = 120.0, df=None, data_format: str = "csv",
        data_dir: Optional[str] = None, local_mode: bool = False, use_gpu: Optional[bool] = None,
        host_key: HostKey = "host", tail_lines: int = 100, echo: bool = True,
        collect_output: str = "rank0", kill_grace: float = 2.0,
        local_gpus: Optional[Sequence] = None, ship: bool = True) -> RunResult:
    """Runs ``command args...`` as ``num_proc`` kolo ranks, one per Spark barrier task.

    spark: a SparkSession or SparkContext (may be None with ``local_mode=True`` and no ``df``).
    command: path of the native program on the executors (or an argv list); ``args`` appended.
    env: extra environment for the ranks (KOLO_TIMEOUT_SECONDS, ...); the contract variables
        (KOLO_RANK, KOLO_PEERS, ...) are kolo_spark's and may not be set here.
    timeout: seconds a rank may run before it is killed and the job fails (None: no limit).
    start_timeout: seconds the barrier tasks may take to start, and (non-local masters) to wait
        for enough executors before giving up.
    df: a DataFrame; rank r gets partition r (repartitioned to num_proc when the count differs)
        written to a local file, path in KOLO_DATA_FILE (layouts: kolo_spark.data).
    data_format: "csv" or "f64". data_dir: parent of the shard files (default: SPARK_LOCAL_DIRS).
    local_mode: run the ranks as subprocesses of the driver, no Spark job.
    use_gpu: True requires spark.task.resource.gpu.amount; None: GPUs when tasks get them.
    host_key: "host" (hostname + network namespace, as the C++ default), "executor" (each
        executor counts as a host), a fixed string, or a callable(BarrierTaskContext) -> str.
    tail_lines: lines of output kept per rank. echo: print the ranks' output lines (prefixed)
        in the executor logs (local_mode: on the driver's stdout).
    collect_output: "rank0" (only rank 0's tail is returned) or "all".
    kill_grace: seconds between SIGTERM and SIGKILL when a rank must be stopped.
    local_gpus: local_mode only: GPU ids split evenly among the ranks.
    ship: give the executors this kolo_spark with sc.addPyFile (else it must be importable
        there already).

    Returns a RunResult (per-rank exit codes, rank 0's output tail, each rank's topology).
    Raises ConfigurationError before submitting anything for a job that cannot run,
    RankFailedError naming the first failing rank, StartTimeoutError.
    """
    started_at = time.monotonic()
    if not isinstance(num_proc, int) or isinstance(num_proc, bool) or num_proc < 1:
        raise ConfigurationError(f"kolo_spark: num_proc={num_proc!r} must be a positive integer")
    argv = [str(command)] if isinstance(command, (str, os.PathLike)) else [str(c) for c in command]
    if not argv or not argv[0]:
        raise ConfigurationError("kolo_spark: command is empty")
    argv += [str(a) for a in args]
    user_env = {str(k): str(v) for k, v in (env or {}).items()}
    reserved = sorted(set(user_env) & set(CONTRACT_VARS))
    if reserved:
        raise ConfigurationError(f"kolo_spark: env sets {', '.join(reserved)}, which kolo_spark "
                                 "sets for every rank (the environment contract)")
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

    spec = TaskSpec(num_proc=num_proc, argv=argv, secret=secrets.token_hex(32), env=user_env,
                    timeout=timeout, tail_lines=tail_lines, echo=echo,
                    collect_output=collect_output, kill_grace=kill_grace, host_key=host_key,
                    data_dir=data_dir)

    if local_mode:
        result = _run_local(spec, spark, df, data_format, local_gpus)
        result.elapsed = time.monotonic() - started_at
        return result

    if spark is None:
        raise ConfigurationError("kolo_spark: spark is None (pass a SparkSession, or "
                                 "local_mode=True to run the ranks on the driver)")
    sc = _spark_context(spark)
    conf = dict(sc.getConf().getAll())
    problems = check_conf(conf, use_gpu)
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

    spec.driver_host = conf.get("spark.driver.host")
    if ship:
        ship_package(sc)
    if df is not None:
        if df.rdd.getNumPartitions() != num_proc:
            df = df.repartition(num_proc)
        rdd = df.rdd
        spec.data_format = data_format
        spec.data_columns = tuple(df.columns)
    else:
        rdd = sc.parallelize(range(num_proc), num_proc)
    alive = LivenessServer(spec.secret)
    spec.liveness = (spec.driver_host or "127.0.0.1", alive.port)
    job = rdd.barrier().mapPartitions(functools.partial(barrier_partition, spec))

    group = f"kolo_spark-{uuid.uuid4().hex[:12]}"
    saved = {k: sc.getLocalProperty(k) for k in _JOB_PROPERTIES}
    monitor = _StartMonitor(sc, group, num_proc, start_timeout)
    try:
        sc.setJobGroup(group, f"kolo_spark: {num_proc} ranks of {os.path.basename(argv[0])}",
                       interruptOnCancel=True)
        monitor.start()
        rows = job.collect()
    except Exception as e:
        monitor.stop()
        if monitor.is_alive():
            monitor.join(5)
        if monitor.timed_out:
            raise StartTimeoutError(monitor.message) from None
        err = error_from_text(str(e))
        if err is None:
            raise
        # Spark reports cancelled tasks as ended before their Python workers (and with them the
        # ranks) are killed: wait until every rank's process is really gone.
        alive.wait_all_gone(kill_grace + 15.0)
        raise err from None
    except BaseException:  # KeyboardInterrupt and the like: take the job down with us
        sc.cancelJobGroup(group)
        raise
    finally:
        monitor.stop()
        alive.close()
        for k, v in saved.items():
            sc.setLocalProperty(k, v)
    ranks = sorted((RankResult(**_tupled(json.loads(r))) for r in rows), key=lambda r: r.rank)
    return RunResult(ranks=ranks, elapsed=time.monotonic() - started_at)


def _tupled(d: dict) -> dict:
    d["devices"] = tuple(d.get("devices") or ())
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


def _run_local(spec: TaskSpec, spark, df, data_format: str,
               local_gpus: Optional[Sequence]) -> RunResult:
    n = spec.num_proc
    host = spec.host_key if isinstance(spec.host_key, str) and spec.host_key not in (
        "host", "executor") else default_host_key()
    gpus = _split_gpus(local_gpus, n)
    listeners = []
    procs: List[NativeProcess] = []
    tmp = None
    try:
        for _ in range(n):
            listeners.append(listen_socket("127.0.0.1"))
        infos = [TaskInfo(r, host, "127.0.0.1", listeners[r].getsockname()[1], gpus[r])
                 for r in range(n)]
        topology = compute_topology(infos)
        peers = peers_string(topology)
        data: List[Optional[Dict[str, str]]] = [None] * n
        if df is not None:
            tmp = tempfile.mkdtemp(prefix="kolo-spark-local-", dir=spec.data_dir)
            columns = tuple(df.columns)
            for r, rows in enumerate(_local_partitions(spark, df, n)):
                path = os.path.join(tmp, data_mod.shard_file_name(r, data_format))
                count = data_mod.write_rows(rows, path, data_format, columns)
                data[r] = data_mod.data_env(path, data_format, count, columns)
        for r in range(n):
            env = build_env(os.environ, spec.env, topology[r], peers, spec.secret,
                            listeners[r].fileno(), data[r])
            p = NativeProcess(spec.argv, env, pass_fds=(listeners[r].fileno(),),
                              label=f"kolo rank {r}", echo=spec.echo, tail_lines=spec.tail_lines)
            try:
                p.start()
            except OSError as e:
                raise RankFailedError(r, None, "", host, "start",
                                      f"{spec.argv[0]}: {e.strerror or e}") from None
            procs.append(p)
            listeners[r].close()
        failure = _supervise(procs, spec, host)
        if failure is not None:
            raise failure
        return RunResult(ranks=[
            RankResult(**_tupled(result_of(spec, topology[r], p.returncode, p.output_tail(),
                                           data[r])))
            for r, p in enumerate(procs)])
    finally:
        for p in procs:
            p.terminate(spec.kill_grace)
        for s in listeners:
            s.close()
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def _supervise(procs: List[NativeProcess], spec: TaskSpec, host: str,
               failure_grace: float = 3.0) -> Optional[RankFailedError]:
    """Streams every rank's output until all exit. After the first failure the others get
    ``failure_grace`` seconds to stop on their own (kolo turns a lost peer into an error), then
    are terminated, as kolo-run does. Returns the first failure."""
    deadline = None if spec.timeout is None else time.monotonic() + spec.timeout
    failure: Optional[RankFailedError] = None
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
            code = p.terminate(spec.kill_grace)  # exited: reaps it and kills leftovers
            if code != 0 and failure is None:
                failure = RankFailedError(r, code, p.output_tail(), host)
                stop_at = time.monotonic() + failure_grace
        now = time.monotonic()
        if failure is None and deadline is not None and now >= deadline:
            r = next(i for i, d in enumerate(done) if not d)
            procs[r].terminate(spec.kill_grace)
            failure = RankFailedError(r, procs[r].returncode, procs[r].output_tail(), host,
                                      "timeout", f"timeout={spec.timeout:g}s")
            stop_at = now
        if stop_at is not None and now >= stop_at:
            for r, p in enumerate(procs):
                if not done[r]:
                    p.terminate(spec.kill_grace)
                    done[r] = True
    return failure
