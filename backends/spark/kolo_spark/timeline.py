"""Timelines: each rank records Chrome-trace events, the driver merges them into one file that
Perfetto (ui.perfetto.dev) and chrome://tracing open, one process row per rank.

``run(..., timeline="job.json")`` (or ``KOLO_TIMELINE`` in the driver's environment or in
``env=``) turns it on. What a rank's row holds:

* thread "kolo_spark" — the barrier task's steps (writing the data shard, the rendezvous), the
  rank process from launch to exit; for a Python function also the interpreter start, loading
  the function, the function itself and pickling its result;
* thread "function" — the spans the function records with :func:`span` / :func:`instant`;
* the kolo engine's tracks, when the program uses kolo's engine (each rank's process gets
  ``KOLO_TIMELINE`` pointing at a file of its own, which the task reads after the exit).

Every event carries wall-clock time, so rows of different hosts line up as well as their clocks
agree (NTP: typically within milliseconds). The engine's events count from the engine's start,
which is placed at the rank process's launch (off by the program's start-up time). Times in the
merged file are microseconds since ``run()`` was called; the driver's own row (``driver``) shows
the submission and the wait for the results.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from typing import Dict, Iterable, List, Optional

KOLO_TID = 1  # kolo_spark's own events
USER_TID = 2  # spans the function records
ENGINE_TID_BASE = 100  # the engine's tracks keep their numbers above this

_events: Optional[List[dict]] = None  # this process's events, when a timeline is on
_path = ""


def now_us() -> float:
    return time.time_ns() / 1000.0


def enabled() -> bool:
    """True inside a rank whose job records a timeline."""
    return _events is not None


def complete(name: str, start_us: float, end_us: float, tid: int = USER_TID, **args) -> dict:
    e = {"name": name, "ph": "X", "ts": start_us, "dur": max(0.0, end_us - start_us), "tid": tid}
    if args:
        e["args"] = args
    return e


@contextlib.contextmanager
def span(name: str, tid: int = USER_TID, **args):
    """Records the ``with`` block as one event of this rank's row (a no-op without timeline)::

        with kolo_spark.timeline.span("epoch", epoch=3):
            train_one_epoch()
    """
    if _events is None:
        yield
        return
    start = now_us()
    try:
        yield
    finally:
        _events.append(complete(name, start, now_us(), tid, **args))


def instant(name: str, **args) -> None:
    """A point in time on this rank's row (a no-op without timeline)."""
    if _events is not None:
        e = {"name": name, "ph": "i", "s": "t", "ts": now_us(), "tid": USER_TID}
        if args:
            e["args"] = args
        _events.append(e)


def begin_rank(path: str, launched_s: float = 0.0) -> None:
    """In a function rank: starts recording when ``path`` is set."""
    global _events, _path
    if not path:
        return
    _events, _path = [], path
    if launched_s:
        _events.append(complete("start interpreter", launched_s * 1e6, now_us(), KOLO_TID))


def end_rank() -> None:
    """Writes this rank's events to the file the task reads."""
    if _events is None:
        return
    try:
        tmp = _path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(_events, f, separators=(",", ":"))
        os.replace(tmp, _path)
    except OSError:
        pass


def read_events(path: str) -> List[dict]:
    """A Chrome-trace file (array or ``{"traceEvents": [...]}``), tolerating a writer that was
    killed before closing the array."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return []
    text = text.strip()
    if not text:
        return []
    try:
        data = json.loads(text)
    except ValueError:
        body = text.rstrip().rstrip(",")
        if not body.startswith("["):
            return []
        try:
            data = json.loads(body + "]")
        except ValueError:
            return []
    if isinstance(data, dict):
        data = data.get("traceEvents", [])
    return [e for e in data if isinstance(e, dict)]


def engine_events(path: str, origin_us: float) -> List[dict]:
    """The kolo engine's timeline of one rank (KOLO_TIMELINE), moved onto the wall clock with
    its start at ``origin_us``; its tracks numbered from ENGINE_TID_BASE."""
    out = []
    for e in read_events(path):
        if e.get("ph") == "M" and e.get("name") == "process_name":
            continue  # the merge names the row
        e = dict(e)
        e["tid"] = ENGINE_TID_BASE + int(e.get("tid", 0) or 0)
        if "ts" in e:
            e["ts"] = origin_us + float(e["ts"])
        out.append(e)
    return out


def merge(path: str, traces: Dict[int, List[dict]], origin_us: float, num_proc: int,
          hosts: Optional[Dict[int, str]] = None, driver: Iterable[dict] = ()) -> int:
    """Writes one Chrome-trace file: a process row per rank (pid = rank), in rank order, and the
    driver's row (pid = num_proc). Times become microseconds since ``origin_us``. Returns the
    number of events written."""
    hosts = hosts or {}
    out: List[dict] = []
    rows = [(r, f"rank {r}" + (f" ({hosts[r]})" if hosts.get(r) else ""), traces.get(r, []))
            for r in range(num_proc)]
    rows.append((num_proc, "driver", list(driver)))
    for pid, label, events in rows:
        out.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
                    "args": {"name": label}})
        out.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0,
                    "args": {"sort_index": pid}})
        tids = {int(e.get("tid", 0) or 0) for e in events}
        for tid, name in ((KOLO_TID, "kolo_spark"), (USER_TID, "function")):
            if tid in tids:
                out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                            "args": {"name": name}})
        for e in events:
            e = dict(e)
            e["pid"] = pid
            if "ts" in e:
                e["ts"] = round(float(e["ts"]) - origin_us, 3)
            out.append(e)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"traceEvents": out, "displayTimeUnit": "ms"}, f, separators=(",", ":"))
    os.replace(tmp, path)
    return len(out)


def write_merged(path: str, traces: Dict[int, List[dict]], origin_us: float, num_proc: int,
                 hosts: Optional[Dict[int, str]] = None, driver: Iterable[dict] = ()) -> None:
    """:func:`merge` for run(): a file that cannot be written is a line on stderr, not an
    error (the job's results matter more than its timeline)."""
    try:
        merge(path, traces, origin_us, num_proc, hosts, driver)
    except OSError as e:
        print(f"kolo_spark: could not write the timeline {path}: {e}", file=sys.stderr)
