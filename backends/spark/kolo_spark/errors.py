"""Exceptions raised on the driver by :func:`kolo_spark.run`."""

from __future__ import annotations

import signal
from typing import Optional


class KoloSparkError(RuntimeError):
    """Base class of every error kolo_spark raises on purpose."""


class ConfigurationError(KoloSparkError, ValueError):
    """The job cannot run as configured (found before anything is submitted, or by every task
    alike, e.g. a GPU id given to two ranks of one host)."""


class StartTimeoutError(KoloSparkError, TimeoutError):
    """The barrier tasks did not all start within ``start_timeout`` seconds."""


def describe_exit(exit_code: Optional[int]) -> str:
    """'exited with code 3', 'was killed by signal 9 (SIGKILL)', 'could not be started'."""
    if exit_code is None:
        return "could not be started"
    if exit_code < 0:
        try:
            name = signal.Signals(-exit_code).name
        except ValueError:
            name = "unknown signal"
        return f"was killed by signal {-exit_code} ({name})"
    return f"exited with code {exit_code}"


class RankFailedError(KoloSparkError):
    """A rank's native process failed: non-zero exit, signal, timeout, or it could not start.

    Attributes: ``rank``, ``exit_code`` (negative: killed by that signal; None: never started),
    ``output_tail`` (the last lines the process printed, stdout and stderr interleaved),
    ``host`` (the rank's host key), ``reason`` (``"exit"``, ``"timeout"``, ``"start"``),
    ``detail`` (what else is known: the timeout, why it could not start, or that a function's
    rank failed only after its result was written).
    """

    def __init__(self, rank: int, exit_code: Optional[int], output_tail: str = "",
                 host: str = "", reason: str = "exit", detail: str = ""):
        self.rank = rank
        self.exit_code = exit_code
        self.output_tail = output_tail
        self.host = host
        self.reason = reason
        self.detail = detail
        super().__init__(self._message())

    def _message(self) -> str:
        if self.reason == "timeout":
            what = f"rank {self.rank} timed out ({self.detail}) and was killed"
        elif self.reason == "start":
            what = f"rank {self.rank} could not be started: {self.detail}"
        else:
            what = f"rank {self.rank} {describe_exit(self.exit_code)}"
            if self.detail:
                what += f" {self.detail}"
        where = f" on host '{self.host}'" if self.host else ""
        text = f"kolo_spark: {what}{where}"
        if self.reason == "timeout" and self.exit_code is not None:
            text += f" (exit code {self.exit_code})"
        tail = self.output_tail.rstrip("\n")
        if tail:
            text += f"\n--- last lines of rank {self.rank}'s output ---\n{tail}"
        else:
            text += f"\n(rank {self.rank} printed nothing)"
        return text

    def __reduce__(self):  # keep the attributes through pickling
        return (RankFailedError, (self.rank, self.exit_code, self.output_tail, self.host,
                                  self.reason, self.detail))


class SetupError(KoloSparkError):
    """A rank failed before its native process was launched (e.g. writing its data shard).
    Every rank sees it through the allGather, so all of them stop instead of waiting."""


class RankFunctionError(RankFailedError):
    """A rank's Python function failed (``run(spark, n, fn, ...)``).

    ``reason``: ``"raise"`` (the function raised), ``"unpickle"`` (the function or its arguments
    could not be loaded in the rank's interpreter, typically a module the executors lack),
    ``"result"`` (the return value cannot be pickled), ``"too_large"`` (see
    :class:`ResultTooLargeError`). Attributes besides RankFailedError's: ``exc_type`` (qualified
    name of the remote exception), ``exc_message``, ``remote_traceback`` (its text), ``module``
    (the missing module, for ``"unpickle"``)."""

    def __init__(self, rank: int, record: dict, output_tail: str = "", host: str = "",
                 exit_code: Optional[int] = 1):
        self.record = dict(record)
        self.exc_type = self.record.get("type", "")
        self.exc_message = self.record.get("message", "")
        self.remote_traceback = self.record.get("traceback", "")
        self.module = self.record.get("module")
        super().__init__(rank, exit_code, output_tail, host, self.record.get("kind", "raise"))

    def _message(self) -> str:
        r = self.rank
        where = f" on host '{self.host}'" if self.host else ""
        what = f"{self.exc_type}: {self.exc_message}" if self.exc_message else self.exc_type
        if self.reason == "unpickle":
            text = (f"kolo_spark: rank {r} could not load the function in its Python process"
                    f"{where}: {what}")
            if self.module:
                top = self.module.split(".")[0]
                text += (f". The function or its arguments refer to module '{self.module}', "
                         "which the rank's Python cannot import: install it on the executors, "
                         "ship it with spark.sparkContext.addPyFile(...), or have cloudpickle "
                         f"pickle it by value (cloudpickle.register_pickle_by_value({top}))")
        elif self.reason == "result":
            text = f"kolo_spark: rank {r}'s return value cannot be pickled{where}: {what}"
        elif self.reason == "too_large":
            text = (f"kolo_spark: rank {r}'s return value ({self.record.get('type', '?')}) is "
                    f"{self.record.get('size', 0):,} bytes pickled, over the limit of "
                    f"{self.record.get('limit', 0):,} bytes (max_result_bytes){where}: return "
                    "less (write large outputs to shared storage and return their paths), or "
                    "raise max_result_bytes and spark.driver.maxResultSize, which bounds the "
                    "results of all ranks together")
        else:
            text = f"kolo_spark: rank {r} raised {what}{where}"
        if self.remote_traceback and self.reason != "too_large":
            text += f"\n--- traceback of rank {r} ---\n{self.remote_traceback.rstrip()}"
        tail = "\n".join(self.output_tail.rstrip("\n").splitlines()[-20:])
        if tail:
            text += f"\n--- last lines of rank {r}'s output ---\n{tail}"
        return text

    def __reduce__(self):
        return (type(self), (self.rank, self.record, self.output_tail, self.host, self.exit_code))


class ResultTooLargeError(RankFunctionError):
    """A rank's return value is larger (pickled) than ``max_result_bytes``: ``size``, ``limit``."""

    @property
    def size(self) -> int:
        return int(self.record.get("size", 0))

    @property
    def limit(self) -> int:
        return int(self.record.get("limit", 0))


def function_error(rank: int, record: dict, output_tail: str = "", host: str = "",
                   exit_code: Optional[int] = 1) -> RankFunctionError:
    cls = ResultTooLargeError if record.get("kind") == "too_large" else RankFunctionError
    return cls(rank, record, output_tail, host, exit_code)
