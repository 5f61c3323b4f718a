"""A Python function as a rank: ``python -m kolo_spark.fnrank``, a fresh interpreter per rank.

The task (or the local-mode driver) writes the cloudpickled ``(fn, args, kwargs)`` to a file and
starts this module with the rank's environment (the kolo contract and torchrun's variables). It
loads the function, calls it, and writes the pickled return value to the result file, or, when
anything fails, a JSON error record (what failed, exception type, message, traceback) to the
error file. Exit status 0 means a result was written. The rank then ends like a
``multiprocessing`` child (threads joined, ``atexit`` handlers run, ``os._exit``), without the
interpreter's finalisation.

Variables (removed from ``os.environ`` before the function runs, so that nothing the function
starts inherits them): ``KOLO_SPARK_FN`` (payload path), ``KOLO_SPARK_RESULT`` (result path;
the error record goes to the same path plus ``.error``), ``KOLO_SPARK_MAX_RESULT`` (bytes),
``KOLO_SPARK_TRACE`` (where to write this rank's timeline events, when there is a timeline).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback


def _qualified(exc: BaseException) -> str:
    t = type(exc)
    return t.__qualname__ if t.__module__ in ("builtins", "__main__") else \
        f"{t.__module__}.{t.__qualname__}"


def _write_atomic(path: str, data: bytes) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _causes(exc: BaseException, limit: int = 8) -> list:
    """The exceptions ``exc`` was raised from or while handling (``__cause__``,
    ``__context__``), nearest first: the driver judges from them too whether the rank's failure
    is the consequence of another rank's (a kolo error wrapped in the function's own)."""
    out, seen = [], {id(exc)}
    cur = exc.__cause__ or exc.__context__
    while cur is not None and id(cur) not in seen and len(out) < limit:
        seen.add(id(cur))
        out.append({"type": _qualified(cur), "message": str(cur)[:2048]})
        cur = cur.__cause__ or cur.__context__
    return out


def _error(path: str, kind: str, exc: BaseException = None, at: float = None, **extra) -> int:
    """Writes the error record. ``at``: ``time.time()`` when the failure was caught (the driver
    names the rank that failed first by it); now, when not given."""
    record = {"kind": kind, "time": time.time() if at is None else at}
    if exc is not None:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        record.update(type=_qualified(exc), message=str(exc)[:8192],
                      traceback=tb[-65536:], causes=_causes(exc))
        if isinstance(exc, ImportError) and getattr(exc, "name", None):
            record["module"] = exc.name
    record.update(extra)
    try:
        _write_atomic(path + ".error", json.dumps(record).encode())
    except OSError:
        pass
    return 1


def _pickler():
    # The module the driver pickled with (KOLO_SPARK_PICKLER): pyspark's copy on a cluster
    # (executors always have it), the standalone package in local mode when the driver has it.
    if os.environ.pop("KOLO_SPARK_PICKLER", "") == "cloudpickle":
        import cloudpickle
        return cloudpickle
    from pyspark import cloudpickle
    return cloudpickle


def main() -> int:
    launched = float(os.environ.pop("KOLO_SPARK_LAUNCHED", "0") or 0)
    fn_path = os.environ.pop("KOLO_SPARK_FN")
    result_path = os.environ.pop("KOLO_SPARK_RESULT")
    limit = int(os.environ.pop("KOLO_SPARK_MAX_RESULT", "0") or 0)
    trace_path = os.environ.pop("KOLO_SPARK_TRACE", "")
    from . import timeline
    try:
        cp = _pickler()
    except BaseException as e:  # noqa: B902
        return _error(result_path, "unpickle", e)

    timeline.begin_rank(trace_path, launched)
    for stream in (sys.stdout, sys.stderr):  # lines reach the driver as they are printed
        try:
            stream.reconfigure(line_buffering=True)
        except (AttributeError, ValueError):
            pass

    with timeline.span("load function", tid=timeline.KOLO_TID):
        try:
            with open(fn_path, "rb") as f:
                fn, args, kwargs = cp.loads(f.read())
        except BaseException as e:  # noqa: B902 (reported, whatever it is)
            timeline.end_rank()
            return _error(result_path, "unpickle", e)

    ok = True
    with timeline.span("function", tid=timeline.KOLO_TID):
        try:
            value = fn(*args, **kwargs)
        except SystemExit as e:  # sys.exit() in the function: 0/None is a normal return
            if e.code in (None, 0):
                value = None
            else:
                ok, err, failed_at = False, e, time.time()
        except BaseException as e:  # noqa: B902
            ok, err, failed_at = False, e, time.time()  # the moment it failed: first clock read
    if not ok:
        timeline.end_rank()
        return _error(result_path, "raise", err, at=failed_at)

    with timeline.span("pickle result", tid=timeline.KOLO_TID):
        try:
            blob = cp.dumps(value)
        except BaseException as e:  # noqa: B902
            timeline.end_rank()
            return _error(result_path, "result", e)
    if limit and len(blob) > limit:
        timeline.end_rank()
        return _error(result_path, "too_large", size=len(blob), limit=limit,
                      type=type(value).__name__)
    _write_atomic(result_path, blob)
    timeline.end_rank()
    sys.stdout.flush()
    sys.stderr.flush()
    return 0


EXIT_GRACE = 10.0  # seconds the interpreter may take to exit after the function's outcome


def _exit_watchdog(code: int) -> None:
    """Non-daemon threads the function left (a data loader's, a server's) would keep the
    interpreter from exiting after its result is written: give it EXIT_GRACE seconds (atexit
    handlers, flushing), then end the process."""
    import threading

    def guard():
        time.sleep(EXIT_GRACE)
        try:
            sys.stderr.write(f"kolo_spark: the rank's interpreter had not exited {EXIT_GRACE:g} s "
                             "after the function ended (threads it started still run): "
                             "ending it\n")
            sys.stderr.flush()
        finally:
            os._exit(code)

    threading.Thread(target=guard, name="kolo_spark-exit-watchdog", daemon=True).start()


def _end(code: int) -> None:
    """Ends the rank the way a ``multiprocessing`` child ends, once its outcome is on disk: wait
    for the threads the function left (under the watchdog), run the ``atexit`` handlers, flush,
    then ``os._exit``. The interpreter's own finalisation is skipped: it would also run the C++
    static destructors of the native libraries the function loaded (torch's Gloo and store
    threads among them), and a crash there ("terminate called without an active exception")
    would turn a rank whose result is written into a failed one."""
    import atexit
    import threading

    _exit_watchdog(code)
    try:
        shutdown = getattr(threading, "_shutdown", None)
        if shutdown is not None:
            shutdown()  # joins the non-daemon threads, as the interpreter does at exit
        else:
            for t in threading.enumerate():
                if t is not threading.current_thread() and not t.daemon:
                    t.join()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


if __name__ == "__main__":
    _end(main())
