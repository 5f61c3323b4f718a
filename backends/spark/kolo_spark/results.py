"""What run() returns: the result types (RankResult, RunResult, FunctionResults) and turning
the ranks' outcomes into them (each rank's result dict, its pickled return value).

Shared by both runners (:mod:`kolo_spark.spark_job`, :mod:`kolo_spark.local_job`) and
:mod:`kolo_spark.api`; it imports nothing of kolo_spark's.
"""

from __future__ import annotations

import pickle
import time
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from .errors import KoloSparkError


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
    # Elastic runs: a rank whose process failed while the others went on, with what its task
    # recorded (the failure: exit_code, failed_at, tail ...); None for a rank that finished.
    lost: Optional[dict] = None


@dataclass
class Attempt:
    """One attempt of a run (``run(..., max_attempts=N)`` makes up to N): its number (0, 1,
    ...), seconds, the ranks it lost and went on without (elastic runs), and the error that
    ended it (None: it finished; the text of what ``run()`` would have raised otherwise)."""

    number: int
    elapsed: float = 0.0
    lost: Tuple[int, ...] = ()
    error: Optional[str] = None
    error_type: Optional[str] = None


@dataclass
class RunResult:
    ranks: List[RankResult] = field(default_factory=list)
    elapsed: float = 0.0
    timeline: Optional[str] = None  # the merged timeline's path, when one was written
    attempts: List[Attempt] = field(default_factory=list)  # every attempt, the last one included
    committed: Optional[Tuple[int, object]] = None  # (version, state): kolo_spark.elastic.commit

    @property
    def lost(self) -> List[int]:
        """The ranks of the last attempt that were lost while the others went on."""
        return [r.rank for r in self.ranks if r.lost is not None]

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
    ``data_rows``, ``output``, ``leftovers``, ``lost``), ``elapsed`` (seconds), ``timeline`` (the
    merged timeline's path, or None), ``attempts`` (:class:`Attempt` each), ``committed``
    (``(version, state)`` of the last kolo_spark.elastic.commit, or None) and ``lost`` (the
    ranks an elastic run went on without; their values are None)."""

    ranks: List[RankResult]
    elapsed: float
    timeline: Optional[str]
    attempts: List[Attempt]
    committed: Optional[Tuple[int, object]]

    def __init__(self, values=(), ranks=(), elapsed: float = 0.0, timeline: Optional[str] = None,
                 attempts=(), committed: Optional[Tuple[int, object]] = None):
        super().__init__(values)
        self.ranks = list(ranks)
        self.elapsed = elapsed
        self.timeline = timeline
        self.attempts = list(attempts)
        self.committed = committed

    @property
    def lost(self) -> List[int]:
        """The ranks of the last attempt that were lost while the others went on."""
        return [r.rank for r in self.ranks if r.lost is not None]


def rank_result(result: dict) -> RankResult:
    """The RankResult of a rank's result dict (:func:`kolo_spark.task.result_of`, or its JSON
    from a barrier task: lists become tuples)."""
    result["devices"] = tuple(result.get("devices") or ())
    result["leftovers"] = tuple(result.get("leftovers") or ())
    return RankResult(**result)


def finish(result: RunResult, is_fn: bool, started_at: float, timeline_path: Optional[str],
           values: List[Optional[bytes]]):
    """run()'s return value: ``result`` with its elapsed time and timeline for a program; for a
    function, the ranks' unpickled return values (``values``) as a FunctionResults.
    ``started_at``: ``time.monotonic()`` when run() began."""
    elapsed = time.monotonic() - started_at
    if not is_fn:
        result.elapsed = elapsed
        result.timeline = timeline_path
        return result
    # A lost rank of an elastic run returned nothing: its value is None.
    out = []
    for rank, blob in zip(result.ranks, values):
        try:  # pickled by the ranks with the job's cloudpickle, which pickle finds by name
            out.append(pickle.loads(blob) if blob is not None else None)
        except Exception as e:
            raise KoloSparkError(f"kolo_spark: rank {rank.rank}'s return value cannot be "
                                 f"unpickled on the driver: {type(e).__name__}: {e}") from None
    return FunctionResults(out, result.ranks, elapsed, timeline_path, result.attempts,
                           result.committed)
