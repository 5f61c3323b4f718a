"""The Spark job: one barrier stage of ``num_proc`` tasks (each runs
:func:`kolo_spark.task.barrier_partition`), submitted under a job group of its own and watched
until every rank's process is gone — the start timeout, Ctrl-C and outside cancellation, the
ranks' failure reports on the driver's hub, their log lines and timelines — and the shipping of
this package to the executors.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

from . import data as data_mod
from . import timeline as tl
from .elastic import DriverStore, LostWatch
from .errors import (ConfigurationError, RankFailedError, StartTimeoutError, first_failure,
                     note_too_few)
from .liveness import LivenessServer, hub_bind_host
from .preflight import check_spark, local_master_slots, spark_size, task_slots
from .results import RunResult, rank_result
from .task import TaskSpec, barrier_partition, error_from_payload, error_from_text


def spark_context(spark):
    """The SparkContext of a SparkSession (or ``spark`` itself, a SparkContext)."""
    return getattr(spark, "sparkContext", spark)


def run_job(spark, spec: TaskSpec, *, df, data_format: str, use_gpu: Optional[bool],
            echo: Optional[bool], sink, start_timeout: float, ship: bool, is_fn: bool,
            timeline_path: Optional[str], origin_us: float,
            driver_store: Optional[DriverStore] = None
            ) -> Tuple[RunResult, List[Optional[bytes]]]:
    """Runs ``spec``'s ranks as one barrier stage of ``spark``: the pre-flight checks
    (:func:`kolo_spark.preflight.check_spark`), then the job; returns the RunResult and each
    rank's pickled return value (None for a program). ``sink``: the driver's log sink (or
    None); ``timeline_path``: where the merged timeline goes (None: none); ``driver_store``:
    an elastic or retried run's store, opened here for this attempt (on the hub's address) and
    closed when its ranks are gone. In an elastic run more than ``num_proc - min_np`` lost
    ranks cancel the job and raise the first of their failures."""
    if spark is None:
        raise ConfigurationError("kolo_spark: spark is None (pass a SparkSession, or "
                                 "local_mode=True to run the ranks on the driver)")
    num_proc, kill_grace = spec.num_proc, spec.kill_grace
    sc = spark_context(spark)
    conf = dict(sc.getConf().getAll())
    if echo is None:
        spec.echo = sink is None or local_master_slots(sc.master) is None
    check_spark(sc, conf, num_proc, use_gpu, start_timeout)
    if is_fn:
        total = spark_size(conf.get("spark.driver.maxResultSize", "1g"))
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
    watch = None
    if driver_store is not None:
        try:
            driver_store.open(spec, hub.bind_host, spec.liveness[0])
        except BaseException:
            hub.close()
            raise
        if spec.elastic:
            watch = LostWatch(driver_store, num_proc, spec.min_np)
    job = rdd.barrier().mapPartitions(functools.partial(barrier_partition, spec))
    group = f"kolo_spark-{uuid.uuid4().hex[:12]}"
    description = f"kolo_spark: {num_proc} ranks of {os.path.basename(spec.argv[0])}"
    driver_events: List[dict] = []
    try:
        rows = _collect(sc, job, group, description, num_proc, start_timeout, hub,
                        kill_grace, driver_events, watch)
        hub.wait_all_gone(2.0)  # the tasks have ended: their last lines and timelines
        if watch is not None and watch.too_few():  # lost at the very end
            raise _too_few(driver_store, num_proc, spec.min_np)
    finally:
        hub.close()
        if driver_store is not None:
            driver_store.close()
        if timeline_path:
            driver_events.append(tl.complete("run", origin_us, tl.now_us(), tl.KOLO_TID))
            hosts = {r: "" for r in range(num_proc)}
            tl.write_merged(timeline_path, hub.traces, origin_us, num_proc, hosts, driver_events)
    ranks, values = [], []
    for meta, blob in sorted(((json.loads(m), b) for m, b in rows), key=lambda x: x[0]["rank"]):
        ranks.append(rank_result(meta))
        values.append(blob)
    return RunResult(ranks=ranks), values


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


def _too_few(store: DriverStore, num_proc: int, min_np: int) -> RankFailedError:
    """The failure an elastic run raises when too few ranks are left: the first of the lost
    ranks' (errors.first_failure), noted with the count."""
    lost = store.lost()
    errors = [e for e in (error_from_payload(p) for p in lost.values())
              if isinstance(e, RankFailedError)]
    err = first_failure(errors)
    if err is None:
        err = RankFailedError(min(lost) if lost else 0, None, detail="lost")
    note_too_few(err, num_proc - len(lost), num_proc, min_np)
    return err


def _collect(sc, job, group: str, description: str, num_proc: int, start_timeout: float,
             hub: LivenessServer, kill_grace: float, driver_events: List[dict],
             watch: Optional[LostWatch] = None):
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
                if watch is not None and not watch.triggered and watch.too_few():
                    # Fewer than min_np left: the job ends, as kolo-run --elastic=MIN_NP ends.
                    sc.cancelJobGroup(group)
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
    if "error" in box and watch is not None and watch.triggered:
        hub.wait_all_gone(kill_grace + 15.0)
        raise _too_few(watch.store, num_proc, watch.min_np)
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
