"""Local mode: the ranks as subprocesses of the driver, without a Spark job — each set up by
:func:`kolo_spark.task.prepare_rank` and started by :class:`kolo_spark.task.RankLaunch` as a
barrier task does, then watched together until all have ended.

The differences from a barrier job are only where it runs: the ranks listen on loopback, the
topology is computed here (no ``allGather``), a DataFrame's partitions are fetched to the driver
one at a time, and the ranks' lines go straight to the driver's sink with the hub's bounds.
"""

from __future__ import annotations

import select
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

from . import data as data_mod
from . import task
from .elastic import DriverStore
from .errors import ConfigurationError, RankFailedError, first_failure, note_too_few
from .process import NativeProcess
from .results import RunResult, rank_result
from .task import PreparedRank, RankLaunch, TaskSpec, default_host_key, python_path
from .topology import compute_topology


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
    sc = getattr(spark, "sparkContext", spark)
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


def run_local(spec: TaskSpec, spark, df, data_format: str, local_gpus: Optional[Sequence],
              sink, traces: Dict[int, List[dict]], hosts: Dict[int, str],
              driver_store: Optional[DriverStore] = None
              ) -> Tuple[RunResult, List[Optional[bytes]]]:
    """Runs ``spec``'s ranks on the driver; returns the RunResult and each rank's pickled return
    value (None for a program), or raises the first failure. ``df``'s partition r (``spark``:
    its session, or None) becomes rank r's shard in ``data_format``; ``local_gpus`` are split
    evenly among the ranks; ``sink``: the driver's log sink (None: echo to stdout when
    ``spec.echo``). Fills ``traces`` and ``hosts`` (rank -> events, host key) for the timeline,
    also when it raises. ``driver_store``: an elastic or retried run's store, opened on
    loopback for this attempt and closed when its ranks are gone. Every rank's processes are
    gone when it returns."""
    n = spec.num_proc
    host = spec.host_key if isinstance(spec.host_key, str) and spec.host_key not in (
        "host", "executor") else default_host_key()
    gpus = _split_gpus(local_gpus, n)
    prepared: List[PreparedRank] = []
    procs: List[NativeProcess] = []
    launches: List[RankLaunch] = []
    lines: List[Optional[_LocalLines]] = []
    if driver_store is not None:
        driver_store.open(spec, "127.0.0.1", "127.0.0.1")
    try:
        partitions = None
        if df is not None:
            spec.data_format = data_format
            spec.data_columns = tuple(df.columns)
            spec.data_types = data_mod.column_types(df.schema)
            partitions = _local_partitions(spark, df, n)
        for r in range(n):
            hosts[r] = host

        def where(out: PreparedRank) -> None:
            out.host, out.ip, out.gpus = host, "127.0.0.1", gpus[out.rank]

        for r in range(n):
            prepared.append(PreparedRank(r))
            task.prepare_rank(spec, prepared[r], where,
                              next(partitions) if partitions is not None else None,
                              bind_host="127.0.0.1", reserve_host="0.0.0.0",
                              scratch_parent=spec.data_dir or tempfile.gettempdir())
        topology = compute_topology([me.info() for me in prepared])
        pypath = python_path() if spec.fn_payload is not None else None
        for r, me in enumerate(prepared):
            launch = RankLaunch(spec, topology, r, me.listener.fileno(), me.data, me.workdir,
                                python_path_value=pypath)
            launches.append(launch)
            out = _LocalLines(r, sink, spec) if sink is not None else None
            lines.append(out)
            listener, me.listener = me.listener, None
            # No executor log here: a line goes to the sink, or (without one) to stdout as echo
            procs.append(launch.start(listener, (), f"kolo rank {r}", out,
                                      echo=out is None and spec.echo))
        failure, lost = _supervise(procs, launches, spec)
        if failure is not None:
            raise failure
        runs = [lost[r] if r in lost else launch.outcome(p)
                for r, (launch, p) in enumerate(zip(launches, procs))]
        return RunResult(ranks=[rank_result(run.result) for run in runs]), \
            [run.value for run in runs]
    finally:
        for p in procs:
            p.terminate()
        for r, (launch, p) in enumerate(zip(launches, procs)):
            traces[r] = launch.events(p)
        for out in lines:
            if out is not None:
                out.flush_notice()
        for me in prepared:
            me.release()
        if driver_store is not None:
            driver_store.close()


def _supervise(procs: List[NativeProcess], launches: List[RankLaunch], spec: TaskSpec,
               failure_grace: float = 3.0
               ) -> Tuple[Optional[RankFailedError], Dict[int, task.RankRun]]:
    """Streams every rank's output until all exit. After the first failure the others get
    ``failure_grace`` seconds to stop on their own (kolo turns a lost peer into an error), then
    are terminated, as kolo-run does (its --grace, 3 s by default). Ending a rank is always
    :meth:`NativeProcess.terminate <kolo_spark.process.NativeProcess.terminate>` (its
    supervisor's SIGTERM, then SIGKILL after ``kill_grace``: the one implementation, which a
    barrier task uses too); a timeout is :meth:`RankLaunch.stop_for_timeout`, as in a barrier
    task. Returns the failure to raise: :func:`first_failure` of every rank that failed by
    itself (the ranks terminated here are not failures of theirs), and the lost ranks' runs.

    In an elastic run (``spec.elastic``) a rank that fails (other than by the timeout) is lost
    instead (:func:`kolo_spark.task.lost_run`, recorded in the store at once) and the others go
    on, until more than ``num_proc - min_np`` are lost: then the grace and the failure as
    above, noted with the count (:func:`kolo_spark.errors.note_too_few`)."""
    deadline = None if spec.timeout is None else time.monotonic() + spec.timeout
    failures: Dict[int, RankFailedError] = {}
    lost: Dict[int, task.RankRun] = {}
    too_few = False
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
                    if spec.elastic and stop_at is None:
                        lost[r] = task.lost_run(spec, launches[r].me, launches[r].data, e)
                        if len(lost) <= len(procs) - max(1, spec.min_np):
                            continue
                        too_few = True
                if stop_at is None:
                    stop_at = time.monotonic() + failure_grace
        now = time.monotonic()
        if not failures and deadline is not None and now >= deadline:
            r = next(i for i, d in enumerate(done) if not d)
            failures[r] = launches[r].stop_for_timeout(procs[r])
            stop_at = now
        if stop_at is not None and now >= stop_at:
            for r, p in enumerate(procs):
                if not done[r]:
                    p.terminate()
                    done[r] = True
    if spec.elastic and not too_few and stop_at is None:
        return None, lost
    failure = first_failure(failures.values())
    if too_few and failure is not None:
        note_too_few(failure, len(procs) - len(lost), len(procs), spec.min_np)
    return failure, lost
