"""kolo_spark.elastic: what a rank of an elastic or retried run sees of it, and the names the
driver and the tasks share (see docs/spark.md, "Surviving a lost rank").

Inside a rank (a Python function, or any Python program kolo_spark starts)::

    from kolo_spark import elastic
    state = elastic.restore({"step": 0})       # the last commit of this run(), or the default
    for step in range(state["step"], 100):
        try:
            ...                                  # collectives over kolo
        except PeerLostError:                    # a peer died: kolo_torch's, kolo's C++ ...
            lost = elastic.lost_ranks(wait=10)   # whom the tasks reported lost
            ...                                  # shrink: dist.shrink_group(lost), comm.shrink()
        if rank == 0 and step % 10 == 0:
            elastic.commit({"step": step + 1})   # the state a retried attempt resumes from

The store behind it is the one the driver hosts for the run (``KOLO_STORE``): it outlives every
rank, and a commit outlives an attempt (``run(..., max_attempts=N)`` gives the next attempt the
last commit). Without ``elastic=True`` or ``max_attempts > 1`` there is no such store and
:func:`commit` raises.
"""

from __future__ import annotations

import json
import os
import pickle
import time
from typing import Any, Dict, List, Optional, Tuple

# Environment of the ranks (set by kolo_spark, never by env=).
ELASTIC_VAR = "KOLO_SPARK_ELASTIC"      # "1" under run(..., elastic=True)
MIN_NP_VAR = "KOLO_SPARK_MIN_NP"        # the run's min_np
ATTEMPT_VAR = "KOLO_SPARK_ATTEMPT"      # 0 for the first attempt, 1 for the first retry ...
RANK_VARS = (ELASTIC_VAR, MIN_NP_VAR, ATTEMPT_VAR)

# Keys in the driver's store.
COMMIT_PREFIX = "kolo_spark/commit"
COMMIT_KEY = "kolo_spark/commit"           # pickled (version, state) of the last commit
COMMIT_VERSION_KEY = "kolo_spark/commit_version"
# Spark attempts of one barrier stage that each get a store namespace of their own (Spark's
# spark.stage.maxConsecutiveAttempts is 4 by default).
STAGE_ATTEMPTS = 16


def lost_prefix(attempt: int) -> str:
    """The store keys under which attempt ``attempt``'s tasks record their lost ranks."""
    return f"kolo_spark/attempt/{attempt}/lost/"


_client = None


def _store():
    """The client of the run's store (made on first use), or a RuntimeError saying why not."""
    global _client
    if _client is None:
        addr = os.environ.get("KOLO_STORE", "")
        if not addr or ATTEMPT_VAR not in os.environ:
            raise RuntimeError(
                "kolo_spark.elastic: this process is not a rank of a run with a driver store "
                "(run(..., elastic=True) or max_attempts > 1): there is nowhere to commit to or "
                "read lost ranks from")
        from .kvstore import KvStoreClient
        host, _, port = addr.rpartition(":")
        _client = KvStoreClient((host.strip("[]"), int(port)), os.environ.get("KOLO_SECRET", ""),
                                os.environ.get("KOLO_JOB_ID", ""),
                                rank=int(os.environ.get("KOLO_RANK", "-1")))
    return _client


def enabled() -> bool:
    """True in a rank of ``run(..., elastic=True)``: a lost peer does not end the run."""
    return os.environ.get(ELASTIC_VAR) == "1"


def attempt() -> int:
    """This attempt's number: 0, then 1 for the first retry of ``max_attempts`` ..."""
    return int(os.environ.get(ATTEMPT_VAR, "0"))


def min_np() -> int:
    """The run's ``min_np``: below it the driver ends the run (0 outside an elastic run)."""
    return int(os.environ.get(MIN_NP_VAR, "0"))


def num_proc() -> int:
    """The number of ranks this attempt started with (``KOLO_SIZE``)."""
    return int(os.environ.get("KOLO_SIZE", "1"))


def lost_ranks(wait: float = 0.0, at_least: int = 1) -> List[int]:
    """The ranks (as numbered at the start of this attempt) whose process the tasks saw end
    with a failure, sorted. With ``wait`` > 0, waits up to that many seconds until at least
    ``at_least`` are recorded (a survivor that caught a lost peer calls it before shrinking: the
    dead rank's task records it a moment after the survivors notice), then returns what is
    recorded, possibly fewer."""
    store = _store()
    prefix = lost_prefix(attempt())
    n = num_proc()
    deadline = time.monotonic() + max(0.0, wait)
    while True:
        lost = [r for r in range(n) if store.try_get(prefix + str(r)) is not None]
        if len(lost) >= at_least or time.monotonic() >= deadline:
            return lost
        time.sleep(0.02)


def lost_info(rank: int) -> Optional[Dict[str, Any]]:
    """What the task of lost rank ``rank`` recorded (exit code, ``failed_at``, output tail), or
    None when it is not lost."""
    blob = _store().try_get(lost_prefix(attempt()) + str(rank))
    return json.loads(blob) if blob is not None else None


def alive_ranks() -> List[int]:
    """The ranks of this attempt not recorded lost (see :func:`lost_ranks`)."""
    lost = set(lost_ranks())
    return [r for r in range(num_proc()) if r not in lost]


def size() -> int:
    """How many ranks of this attempt are not recorded lost: the world size after shrinking
    away every lost one."""
    return len(alive_ranks())


def commit(state: Any) -> int:
    """Keeps ``state`` (pickled; at most 64 MiB) in the driver's store as the run's last commit
    and returns its version (1, 2, ...). Call it from one rank (rank 0 of the current group):
    the last commit of any rank wins. It outlives the attempt: a retried attempt's
    :func:`restore` returns it, and so does ``run()``'s result (``committed``)."""
    store = _store()
    version = store.add(COMMIT_VERSION_KEY, 1)
    store.set(COMMIT_KEY, pickle.dumps((version, state)))
    return version


def restore(default: Any = None) -> Any:
    """The state of the run's last :func:`commit` (of this attempt or an earlier one), or
    ``default`` when nothing was committed."""
    found = committed()
    return default if found is None else found[1]


def committed() -> Optional[Tuple[int, Any]]:
    """``(version, state)`` of the last commit, or None."""
    blob = _store().try_get(COMMIT_KEY)
    return pickle.loads(blob) if blob is not None else None


# --- the tasks' side ---
def record_lost(address: Tuple[str, int], secret: str, job: str, attempt_no: int, rank: int,
                payload: Dict[str, Any]) -> None:
    """Records rank ``rank`` lost in the driver's store (a task, after its rank's process
    ended with a failure in an elastic run; ``job``: the rank's KOLO_JOB_ID)."""
    from .kvstore import KvStoreClient
    with KvStoreClient(address, secret, job, rank=-1, timeout=10.0) as c:
        c.set(lost_prefix(attempt_no) + str(rank), json.dumps(payload).encode())


# --- the driver's side ---
class DriverStore:
    """The store the driver hosts for an elastic or retried run: a fresh
    :class:`~kolo_spark.kvstore.KvStoreServer` for each attempt (kolo's rendezvous keys start
    afresh with each attempt's ranks), with the run's last commit carried from one attempt's
    store into the next."""

    def __init__(self, secret: str, run_token: str):
        self.secret, self.run_token = secret, run_token
        self.carry: Dict[str, bytes] = {}
        self.server = None
        self.attempt = 0
        self.last_lost: Dict[int, Dict[str, Any]] = {}  # the lost ranks of the attempt closed last

    def open(self, spec, bind_host: str, advertise: str) -> None:
        """Starts attempt ``spec.attempt``'s store on ``bind_host`` and points ``spec`` at it
        (``advertise``: the address the ranks reach it by)."""
        from .kvstore import KvStoreServer
        self.close()
        self.attempt = spec.attempt
        job = f"kolo_spark-{self.run_token}-a{spec.attempt}"
        # A namespace per Spark attempt of the barrier stage (the ranks' job id ends in
        # "-s<stage attempt>": task.store_env); the commit is shared by all of them.
        self.server = KvStoreServer(self.secret, job, bind_host=bind_host,
                                    namespaces=STAGE_ATTEMPTS, shared_prefixes=(COMMIT_PREFIX,))
        for k, v in self.carry.items():
            self.server.set_local(k, v)
        spec.store, spec.job_id = (advertise, self.server.port), job

    def lost(self) -> Dict[int, Dict[str, Any]]:
        """This attempt's lost ranks so far: rank -> what its task recorded."""
        if self.server is None:
            return {}
        prefix = self.server.ns_key(self.server.highest_namespace, lost_prefix(self.attempt))
        out = {}
        for key in self.server.keys(prefix):
            blob = self.server.get_local(key)
            if blob is not None:
                out[int(key[len(prefix):])] = json.loads(blob)
        return out

    def committed(self) -> Optional[Tuple[int, Any]]:
        """(version, state) of the run's last commit, or None (unpickled on the driver)."""
        blob = self.server.get_local(COMMIT_KEY) if self.server is not None else \
            self.carry.get(COMMIT_KEY)
        return pickle.loads(blob) if blob is not None else None

    def close(self) -> None:
        """Stops this attempt's store, keeping its commit for the next. Idempotent."""
        if self.server is None:
            return
        self.last_lost = self.lost()
        for key in (COMMIT_KEY, COMMIT_VERSION_KEY):
            v = self.server.get_local(key)
            if v is not None:
                self.carry[key] = v
        self.server.close()
        self.server = None


class LostWatch:
    """Watches an elastic attempt's lost ranks on the driver: :meth:`too_few` says when more
    than ``num_proc - min_np`` are lost (the run must end)."""

    def __init__(self, store: DriverStore, num_proc: int, min_np: int):
        self.store, self.num_proc, self.min_np = store, num_proc, max(1, min_np)
        self.triggered = False

    def too_few(self) -> bool:
        if not self.triggered and len(self.store.lost()) > self.num_proc - self.min_np:
            self.triggered = True
        return self.triggered
