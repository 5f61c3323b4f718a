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
    ``host`` (the rank's host key), ``reason`` (``"exit"``, ``"timeout"``, ``"start"``).
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
