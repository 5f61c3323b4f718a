"""Exceptions raised on the driver by :func:`kolo_spark.run`."""

from __future__ import annotations

import re
import signal
from typing import Iterable, List, Optional


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
    rank failed only after its result was written), ``failed_at`` (``time.time()`` on the
    rank's host when it failed: when its function's exception was caught, else when its process
    was seen to exit; None when unknown), ``consequent`` (True when the failure is the
    consequence of another rank's: kolo's "rank N exited or was killed", "connection to rank N
    lost", PeerLostError ...; ``origin`` is that rank, when named) and ``others`` (the other
    ranks' failures that reached the driver, in rank order: see :func:`first_failure`).
    """

    def __init__(self, rank: int, exit_code: Optional[int], output_tail: str = "",
                 host: str = "", reason: str = "exit", detail: str = "",
                 failed_at: Optional[float] = None):
        self.rank = rank
        self.exit_code = exit_code
        self.output_tail = output_tail
        self.host = host
        self.reason = reason
        self.detail = detail
        self.failed_at = float(failed_at) if failed_at is not None else None
        self.others: List["RankFailedError"] = []
        super().__init__(self._full_message())

    def _full_message(self) -> str:
        return self._message() + self._others_text()

    def _others_text(self) -> str:
        if not self.others:
            return ""
        lines = [f"\n--- the other ranks' failures ({len(self.others)}; kolo_spark names the "
                 "rank that failed first) ---"]
        for o in self.others:
            what = " ".join(o.summary().split())
            if len(what) > 300:
                what = what[:300] + " ..."
            lines.append(f"rank {o.rank}: {what}"
                         + (" [consequence of another rank's failure]" if o.consequent else ""))
        return "\n".join(lines)

    def summary(self) -> str:
        """One line: what failed (the first line of the message, without the prefix)."""
        return self._message().split("\n", 1)[0].replace("kolo_spark: ", "", 1)

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

    # --- is this failure a consequence of another rank's? ---
    def _evidence(self) -> List[str]:
        """The texts that say what the rank died of: a native rank's last output lines."""
        if self.reason != "exit":
            return []
        return self.output_tail.rstrip("\n").splitlines()[-5:]

    def _kinds(self) -> List[str]:
        return []

    @property
    def origin(self) -> Optional[int]:
        """The other rank this failure names as its cause (None: none named)."""
        return consequence_origin(self.rank, self._kinds(), self._evidence())[1]

    @property
    def consequent(self) -> bool:
        return consequence_origin(self.rank, self._kinds(), self._evidence())[0]

    def set_others(self, others: Iterable["RankFailedError"]) -> None:
        self.others = sorted((o for o in others if o is not self), key=lambda o: o.rank)
        self.args = (self._full_message(),)

    def __reduce__(self):  # keep the attributes through pickling
        return (RankFailedError, (self.rank, self.exit_code, self.output_tail, self.host,
                                  self.reason, self.detail, self.failed_at),
                {"others": self.others})

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.args = (self._full_message(),)


# kolo's wording for a failure that another rank caused (the group: the rank it names).
_CONSEQUENCE = [re.compile(p) for p in (
    r"\brank (\d+) \(pid \d+\) exited or was killed\b",   # mesh: a peer's process is gone
    r"\bconnection to rank (\d+) lost\b",                  # mesh: a peer's socket closed
    r"\brank (\d+) left during\b",                         # MPI transport
    r"\[reported by rank (\d+)\]",                         # another rank's error, forwarded
    r"\brank (\d+) aborted the communicator\b",            # kolo_comm_abort elsewhere
    r"^(?:[\w.:]+: )?kolo: rank (\d+)\b",                  # the torch backend's RuntimeError
    r"\bstore \S+ (?:was lost during|is unreachable)()",   # the store (rank 0's) is gone
    r"\bconnection to \S+ closed by the peer()",
)]


def consequence_origin(rank: int, kinds: Iterable[str], texts: Iterable[str]):
    """(consequent, origin): whether a failure of ``rank`` whose exception types are ``kinds``
    and whose messages (or last output lines) are ``texts`` is the consequence of another
    rank's failure, and that rank when named. A kolo text naming ``rank`` itself is not."""
    named_self = False
    for text in texts:
        for pattern in _CONSEQUENCE:
            for m in pattern.finditer(text or ""):
                who = m.group(1)
                if not who:
                    return True, None
                if int(who) != rank:
                    return True, int(who)
                named_self = True
    if not named_self and any((k or "").rsplit(".", 1)[-1] == "PeerLostError" for k in kinds):
        return True, None
    return False, None


def first_failure(errors: Iterable[RankFailedError]) -> Optional[RankFailedError]:
    """The failure ``run()`` raises, from every rank's that reached the driver (one per rank;
    both runners, Spark and local mode, decide here).

    A failure that is the consequence of another rank's (``.consequent``) never wins over one
    that is not; among the rest the earliest ``failed_at`` (each rank's own clock, taken when
    the function's exception was caught or the process was seen to exit) wins, unknown times
    last, then the lower rank. The others are attached, in rank order, as ``.others``."""
    by_rank = {}
    for e in errors:
        if e is None:
            continue
        have = by_rank.get(e.rank)
        if have is None or (have.failed_at is None and e.failed_at is not None):
            by_rank[e.rank] = e
    if not by_rank:
        return None

    def key(e: RankFailedError):
        return (e.consequent, e.failed_at is None, e.failed_at or 0.0, e.rank)

    chosen = min(by_rank.values(), key=key)
    chosen.set_others(by_rank.values())
    return chosen


def note_too_few(error: RankFailedError, left: int, num_proc: int, min_np: int) -> None:
    """Adds to ``error`` (the failure an elastic run raises) that the run ended because only
    ``left`` of ``num_proc`` ranks were left, below ``min_np``."""
    note = f"(elastic run: {left} of {num_proc} ranks left, below min_np={min_np})"
    error.detail = f"{error.detail} {note}" if error.detail else note
    error.args = (error._full_message(),)


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
    (the missing module, for ``"unpickle"``). ``failed_at`` is the ``time.time()`` at which
    the rank caught the exception; ``consequent`` judges the exception's type (and those it was
    raised from) and message."""

    def __init__(self, rank: int, record: dict, output_tail: str = "", host: str = "",
                 exit_code: Optional[int] = 1, failed_at: Optional[float] = None):
        self.record = dict(record)
        self.exc_type = self.record.get("type", "")
        self.exc_message = self.record.get("message", "")
        self.remote_traceback = self.record.get("traceback", "")
        self.module = self.record.get("module")
        at = self.record.get("time")
        super().__init__(rank, exit_code, output_tail, host, self.record.get("kind", "raise"),
                         failed_at=at if at is not None else failed_at)

    # the exception, then the ones it was raised from or while handling (fnrank: "causes")
    def _kinds(self) -> List[str]:
        return [self.exc_type] + [str(c.get("type", "")) for c in self._causes()]

    def _evidence(self) -> List[str]:
        if self.reason != "raise":
            return []
        return [self.exc_message] + [str(c.get("message", "")) for c in self._causes()]

    def _causes(self) -> List[dict]:
        causes = self.record.get("causes") or []
        return [c for c in causes if isinstance(c, dict)]

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

    def summary(self) -> str:
        if self.reason == "raise":
            return f"{self.exc_type}: {self.exc_message}" if self.exc_message else self.exc_type
        return super().summary()

    def __reduce__(self):
        return (type(self), (self.rank, self.record, self.output_tail, self.host, self.exit_code,
                             self.failed_at), {"others": self.others})


class ResultTooLargeError(RankFunctionError):
    """A rank's return value is larger (pickled) than ``max_result_bytes``: ``size``, ``limit``."""

    @property
    def size(self) -> int:
        return int(self.record.get("size", 0))

    @property
    def limit(self) -> int:
        return int(self.record.get("limit", 0))


def function_error(rank: int, record: dict, output_tail: str = "", host: str = "",
                   exit_code: Optional[int] = 1, failed_at: Optional[float] = None
                   ) -> RankFunctionError:
    cls = ResultTooLargeError if record.get("kind") == "too_large" else RankFunctionError
    return cls(rank, record, output_tail, host, exit_code, failed_at)
