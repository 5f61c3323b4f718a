"""HorovodRunner and TorchDistributor shapes, as thin layers over :func:`kolo_spark.run`.

    kolo_spark.Runner(np=-2).run(main, lr=0.1)           # 2 processes on the driver
    kolo_spark.Runner(np=4).run(main, lr=0.1)            # 4 barrier tasks
    kolo_spark.Distributor(num_processes=4, local_mode=False, use_gpu=False).run(train, 0.1)
    kolo_spark.Distributor(num_processes=2, use_gpu=False).run("/shared/train.py", "--lr", "0.1")
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional, Union

from .api import run
from .results import FunctionResults, RunResult
from .errors import ConfigurationError
from .task import PYTHON


def _active_session(what: str):
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise ConfigurationError(f"kolo_spark: {what} needs pyspark (or local mode)") from None
    spark = SparkSession.getActiveSession()
    if spark is None:
        raise ConfigurationError(f"kolo_spark: {what}: there is no active SparkSession; pass "
                                 "spark=... or create one first")
    return spark


class Runner:
    """HorovodRunner's shape: ``Runner(np).run(main, **kwargs)``.

    ``np > 0``: ``np`` ranks as Spark barrier tasks (the active SparkSession, or ``spark=``);
    ``np < 0``: ``-np`` ranks as processes on the driver (local mode, no Spark job). ``run``
    returns rank 0's return value, as HorovodRunner does; every rank's is in ``results``
    afterwards. Other keyword arguments go to :func:`kolo_spark.run` (``timeout``,
    ``stream_logs``, ``timeline``, ``env``, ...)."""

    def __init__(self, np: int, *, spark=None, **options: Any):
        if not isinstance(np, int) or isinstance(np, bool) or np == 0:
            raise ConfigurationError(f"kolo_spark.Runner: np={np!r}: a positive number of barrier "
                                     "tasks, or a negative number of processes on the driver")
        for key in ("local_mode", "args", "kwargs"):
            if key in options:
                raise ConfigurationError(f"kolo_spark.Runner: {key}= is set by the Runner")
        self.np = np
        self.spark = spark
        self.options = options
        self.results: Optional[FunctionResults] = None

    def run(self, main: Callable, **kwargs: Any) -> Any:
        local = self.np < 0
        spark = self.spark if (self.spark is not None or local) else _active_session("Runner")
        self.results = run(spark, abs(self.np), main, kwargs=kwargs, local_mode=local,
                           **self.options)
        return self.results[0]


class Distributor:
    """TorchDistributor's shape: ``Distributor(num_processes, local_mode, use_gpu).run(f, *args)``.

    ``local_mode=True`` (the default, as TorchDistributor's): the processes run on the driver,
    with the driver's GPUs (``spark.driver.resource.gpu``, else ``CUDA_VISIBLE_DEVICES``) split
    among them when ``use_gpu``; ``False``: barrier tasks, one GPU set per task from Spark.
    ``run`` takes a function (returns rank 0's return value; every rank's in ``results``) or
    the path of a Python script on the executors plus its arguments (run with the executor's
    Python and torchrun's environment; returns None, the RunResult is in ``result``). Other
    keyword arguments go to :func:`kolo_spark.run`."""

    def __init__(self, num_processes: int = 1, local_mode: bool = True, use_gpu: bool = True, *,
                 spark=None, **options: Any):
        if not isinstance(num_processes, int) or isinstance(num_processes, bool) or \
                num_processes < 1:
            raise ConfigurationError(f"kolo_spark.Distributor: num_processes={num_processes!r} "
                                     "must be a positive integer")
        for key in ("local_mode", "use_gpu", "local_gpus", "args", "kwargs"):
            if key in options:
                raise ConfigurationError(f"kolo_spark.Distributor: {key}= is the Distributor's")
        self.num_processes = num_processes
        self.local_mode = bool(local_mode)
        self.use_gpu = bool(use_gpu)
        self.spark = spark
        self.options = options
        self.results: Optional[FunctionResults] = None
        self.result: Optional[RunResult] = None

    def _driver_gpus(self, spark):
        if spark is not None:
            sc = getattr(spark, "sparkContext", spark)
            res = getattr(sc, "resources", {}).get("gpu")
            if res is not None and res.addresses:
                return list(res.addresses)
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
        if visible and visible != "-1":
            return [g.strip() for g in visible.split(",") if g.strip()]
        raise ConfigurationError(
            "kolo_spark.Distributor: use_gpu=True in local mode but the driver has no GPUs "
            "(neither spark.driver.resource.gpu nor CUDA_VISIBLE_DEVICES): pass use_gpu=False")

    def run(self, train_object: Union[Callable, str], *args: Any) -> Any:
        spark = self.spark
        if spark is None and not self.local_mode:
            spark = _active_session("Distributor")
        if spark is None and self.local_mode:
            try:
                from pyspark.sql import SparkSession
                spark = SparkSession.getActiveSession()
            except ImportError:
                pass
        opts = dict(self.options)
        if self.local_mode:
            opts["local_mode"] = True
            if self.use_gpu:
                opts["local_gpus"] = self._driver_gpus(spark)
        else:
            opts["use_gpu"] = self.use_gpu
        if callable(train_object):
            self.results = run(spark, self.num_processes, train_object, args=args, **opts)
            return self.results[0]
        if not isinstance(train_object, (str, os.PathLike)):
            raise ConfigurationError("kolo_spark.Distributor.run: a function or the path of a "
                                     f"Python script, not {type(train_object).__name__}")
        self.result = run(spark, self.num_processes, [PYTHON, os.fspath(train_object)],
                          [str(a) for a in args], **opts)
        return None
