"""The public entry point: :func:`run` — checks its arguments, describes the job (a
:class:`~kolo_spark.task.TaskSpec`: argv or the pickled function, environment, limits) and hands
it to one of the two runners, :mod:`kolo_spark.spark_job` (barrier tasks) or
:mod:`kolo_spark.local_job` (``local_mode``), then builds the result
(:mod:`kolo_spark.results`).
"""

from __future__ import annotations

import functools
import os
import secrets
import sys
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from . import data as data_mod
from . import local_job, spark_job
from . import timeline as tl
from .elastic import DriverStore
from .errors import ConfigurationError, ResultTooLargeError
from .liveness import print_line
from .preflight import pyspark_problem
from .results import Attempt, FunctionResults, RunResult, finish
from .task import CONTRACT_VARS, TORCHRUN_VARS, HostKey, TaskSpec

DEFAULT_MAX_RESULT_BYTES = 64 << 20


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
        elastic: bool = False, min_np: Optional[int] = None, max_attempts: int = 1,
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
    elastic: a rank whose process fails is lost, not fatal: its task ends without failing the
        stage and the others go on (they shrink their communicator: Communicator::shrink,
        dist.shrink_group; kolo_spark.elastic.lost_ranks names whom), while at least
        ``min_np`` ranks (default 1) are left; below it the run fails as without elastic. The
        driver hosts kolo's rendezvous store (the ranks' KOLO_STORE), so it outlives every
        rank. The result's ``lost`` lists the lost ranks, their RankResult.lost what failed.
    max_attempts: run the job up to this many times when an attempt fails (a rank's failure
        outside an elastic run, a lost executor, Spark failing the stage); each attempt is a
        fresh barrier job, and a function resumes from kolo_spark.elastic.restore() (what a
        rank committed with kolo_spark.elastic.commit in an earlier attempt). The result's
        ``attempts`` reports each; the last attempt's error is raised with ``.attempts`` set.
        Configuration errors, a result over max_result_bytes and Ctrl-C are not retried.

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
    if not isinstance(elastic, bool):
        raise ConfigurationError(f"kolo_spark: elastic={elastic!r} must be True or False")
    if min_np is not None and not elastic:
        raise ConfigurationError("kolo_spark: min_np is for elastic=True runs")
    if min_np is None:
        min_np = 1
    if not isinstance(min_np, int) or isinstance(min_np, bool) or not 1 <= min_np <= num_proc:
        raise ConfigurationError(f"kolo_spark: min_np={min_np!r} must be an integer from 1 to "
                                 f"num_proc={num_proc}")
    if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1:
        raise ConfigurationError(f"kolo_spark: max_attempts={max_attempts!r} must be a positive "
                                 "integer")

    spec = TaskSpec(num_proc=num_proc, argv=argv, secret=secrets.token_hex(32), env=user_env,
                    timeout=timeout, tail_lines=tail_lines, echo=echo is not False,
                    collect_output=collect_output, kill_grace=kill_grace, host_key=host_key,
                    data_dir=data_dir, timeline=bool(timeline_path), stream_logs=sink is not None,
                    log_lines_per_second=log_lines_per_second, log_line_bytes=log_line_bytes,
                    max_result_bytes=max_result_bytes, elastic=elastic,
                    min_np=min_np if elastic else 0)
    if is_fn:
        spec.pickler, cp = _pickle_module(local_mode)
        try:
            spec.fn_payload = cp.dumps((command, tuple(args), dict(kwargs or {})))
        except Exception as e:
            why = pyspark_problem() if spec.pickler == "pyspark" else None
            raise ConfigurationError(f"kolo_spark: the function or its arguments cannot be "
                                     f"pickled on the driver: {type(e).__name__}: {e}"
                                     + (f" ({why})" if why else "")) from None

    def one_attempt(store: Optional[DriverStore]):
        if local_mode:
            traces: Dict[int, List[dict]] = {}
            hosts: Dict[int, str] = {}
            try:
                return local_job.run_local(spec, spark, df, data_format, local_gpus, sink,
                                           traces, hosts, store)
            finally:
                if timeline_path:
                    tl.write_merged(timeline_path, traces, origin_us, num_proc, hosts,
                                    [tl.complete("run (local mode)", origin_us, tl.now_us(),
                                                 tl.KOLO_TID)])
        return spark_job.run_job(spark, spec, df=df, data_format=data_format, use_gpu=use_gpu,
                                 echo=echo, sink=sink, start_timeout=start_timeout, ship=ship,
                                 is_fn=is_fn, timeline_path=timeline_path, origin_us=origin_us,
                                 driver_store=store)

    if not elastic and max_attempts == 1:
        result, values = one_attempt(None)
        result.attempts = [Attempt(0, time.monotonic() - started_at)]
        return finish(result, is_fn, started_at, timeline_path, values)
    return _attempts(spec, one_attempt, max_attempts, is_fn, started_at, timeline_path)


def _summary(e: BaseException) -> str:
    """One line on why an attempt failed: a kolo_spark error's summary, or for Spark's own
    failure (a Py4JJavaError whose first line says nothing) the line saying why the job was
    aborted (a lost executor, a failed stage)."""
    if hasattr(e, "summary"):
        return e.summary()
    lines = str(e).splitlines()
    for line in lines:
        if "Job aborted" in line or "ExecutorLostFailure" in line:
            line = line.split("SparkException: ", 1)[-1].strip()
            return line[:300] + (" ..." if len(line) > 300 else "")
    return (lines[0] if lines else type(e).__name__)[:300]


# Not retried: the job cannot run as configured, a result too large, or the user's Ctrl-C.
_NOT_RETRIED = (ConfigurationError, ResultTooLargeError)


def _attempts(spec: TaskSpec, one_attempt, max_attempts: int, is_fn: bool, started_at: float,
              timeline_path: Optional[str]):
    """Runs ``one_attempt(store)`` up to ``max_attempts`` times over one driver store (its
    commit carried from each attempt to the next) until one finishes; returns its result with
    every attempt reported, or raises the last attempt's error with ``.attempts`` set."""
    store = DriverStore(spec.secret, secrets.token_hex(6))
    attempts: List[Attempt] = []
    for number in range(max_attempts):
        spec.attempt = number
        t0 = time.monotonic()
        try:
            result, values = one_attempt(store)
        except _NOT_RETRIED:
            raise
        except Exception as e:
            summary = _summary(e)
            attempts.append(Attempt(number, time.monotonic() - t0, tuple(sorted(store.last_lost)),
                                    str(e), type(e).__name__))
            if number + 1 >= max_attempts:
                e.attempts = attempts
                raise
            done = store.committed()
            print(f"kolo_spark: attempt {number + 1} of {max_attempts} failed ({summary}); "
                  f"running attempt {number + 2}"
                  + (f", which resumes from commit {done[0]}" if done else
                     " (no kolo_spark.elastic commit to resume from)"), file=sys.stderr)
            continue
        attempts.append(Attempt(number, time.monotonic() - t0, tuple(result.lost)))
        result.attempts = attempts
        result.committed = store.committed()
        return finish(result, is_fn, started_at, timeline_path, values)
    raise AssertionError("unreachable")
