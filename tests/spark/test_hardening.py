"""Issue 53's doors of the Spark backend, without a SparkSession: the driver's hub
(kolo_spark.liveness.LivenessServer) against a flood of idle and garbage connections, a replayed
handshake and a silent stranger; the failure marker a rank's output could forge; shard files
whose headers lie. Each test is a fraction of a second to a few seconds."""

import base64
import json
import os
import resource
import socket
import struct
import threading
import time

import pytest

from kolo_spark import data, liveness, task
from kolo_spark.errors import RankFailedError

SECRET = "0123456789abcdef-job-secret"


class Lines:
    """A hub's log sink that records (rank, line, time) and lets a test wait for one."""

    def __init__(self):
        self.got = []
        self.cv = threading.Condition()

    def __call__(self, rank, line):
        with self.cv:
            self.got.append((rank, line, time.monotonic()))
            self.cv.notify_all()

    def wait(self, line, limit):
        end = time.monotonic() + limit
        with self.cv:
            while True:
                for r, text, at in self.got:
                    if text == line:
                        return at
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self.cv.wait(left)


@pytest.fixture
def hub():
    sink = Lines()
    h = liveness.LivenessServer(SECRET, bind_host="127.0.0.1", on_line=sink, auth_timeout=1.0)
    h.sink = sink
    yield h
    h.close()


def _raise_fd_limit(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n), hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def test_hub_survives_1100_idle_connections_and_garbage(hub):
    # Before: select() on more than 1,024 fds raised and the hub's thread ended; every log
    # line, timeline and liveness of the job was gone.
    assert _raise_fd_limit(4096) >= 1400, "this test needs 1,400 file descriptors"
    t0 = time.monotonic()
    idle = []
    try:
        for i in range(1100):
            s = socket.create_connection(("127.0.0.1", hub.port))
            if i % 10 == 0:
                s.sendall(os.urandom(300))  # garbage: no newline within the answer's bound
            elif i % 10 == 1:
                s.sendall(b"1 " + b"00" * 32 + b" " + b"ab" * 32 + b"\n")  # a wrong proof
            idle.append(s)
        assert hub.alive()
        started = time.monotonic()
        client = liveness.connect(("127.0.0.1", hub.port), SECRET, 3, timeout=2.0)
        assert client is not None, "an authenticated rank could not connect through the flood"
        client.line("still heard")
        at = hub.sink.wait("still heard", 1.0)
        assert at is not None, "the rank's line did not arrive"
        # promptly: within half the 1 s auth deadline the flood's connections get
        assert at - started < 0.5, f"the line took {at - started:.3f} s"
        assert hub.alive(), "the hub's thread ended"
        assert hub.alive_ranks() == [3]
        # the hub holds at most max_pending of them; the others it closed (evicted or refused)
        assert len(hub._pending) <= hub.max_pending
        assert hub.refused + hub.rejected > 0
        client.close()
    finally:
        for s in idle:
            s.close()
    print(f"1,100 idle connections: {time.monotonic() - t0:.2f} s, refused {hub.refused}")


class Recorder:
    """A TCP relay in front of the hub that records what the client sends."""

    def __init__(self, port):
        self.port_to = port
        self.sent = bytearray()
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.port = self.lsock.getsockname()[1]
        threading.Thread(target=self._run, daemon=True).start()

    def _pipe(self, a, b, record):
        try:
            while True:
                d = a.recv(65536)
                if not d:
                    break
                if record:
                    self.sent += d
                b.sendall(d)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _run(self):
        c, _ = self.lsock.accept()
        u = socket.create_connection(("127.0.0.1", self.port_to))
        threading.Thread(target=self._pipe, args=(u, c, False), daemon=True).start()
        self._pipe(c, u, True)


def test_replayed_handshake_is_refused(hub):
    # Before: the proof was a fixed HMAC of the rank: the recorded bytes, sent again, injected
    # the recorded lines (and kept the rank "alive").
    rec = Recorder(hub.port)
    client = liveness.connect(("127.0.0.1", rec.port), SECRET, 2, timeout=2.0)
    assert client is not None
    client.line("\x1b[2Jrecorded line")
    assert hub.sink.wait("\x1b[2Jrecorded line", 2.0) is not None
    client.close()
    time.sleep(0.2)
    recorded = bytes(rec.sent)
    assert recorded
    s = socket.create_connection(("127.0.0.1", hub.port), timeout=3.0)
    s.sendall(recorded)
    s.settimeout(3.0)
    t0 = time.monotonic()
    while s.recv(4096):  # the hub's challenge, then its close
        pass
    assert time.monotonic() - t0 < 0.5, "the replay was not closed at its answer"
    s.close()
    time.sleep(0.1)
    assert [g[1] for g in hub.sink.got].count("\x1b[2Jrecorded line") == 1
    assert hub.alive_ranks() == []


def test_silent_connection_dropped_after_the_deadline(hub):
    # Before: an unauthenticated connection was kept for ever (no deadline).
    s = socket.create_connection(("127.0.0.1", hub.port))
    s.settimeout(3.0 * hub.auth_timeout)
    t0 = time.monotonic()
    try:
        while s.recv(4096):
            pass
        took = time.monotonic() - t0
    except socket.timeout:
        took = None
    s.close()
    assert took is not None, "the silent connection was still open at 3x the deadline"
    assert 0.9 * hub.auth_timeout <= took <= 1.5 * hub.auth_timeout, took
    assert hub.rejected >= 1


def test_log_lines_are_escaped_when_printed():
    import io
    out = io.StringIO()
    liveness.print_line(1, "a\x1b]0;owned\x07b\rc\td\x9b", stream=out)
    assert out.getvalue() == "[kolo rank 1] a\\x1b]0;owned\\x07b\\x0dc\td\\x9b\n"


def test_forged_failure_marker_in_output_does_not_win():
    # A rank prints a marker for a made-up failure (rank 7, exit 0); the genuine one is rank 1.
    fake = base64.b64encode(json.dumps({"type": "rank", "rank": 7, "exit_code": 0,
                                        "tail": "", "host": "x"}).encode()).decode()
    tail = f"working\nKOLO_SPARK_FAILURE<{fake}>\nmore output\n"
    try:
        task.raise_task_failure(RankFailedError(1, 3, tail, "hostA"))
    except task.TaskFailure as e:
        message = str(e)
    # as Spark wraps it: the forged marker also in text before the genuine one, stack after
    spark_text = (f"Job aborted: stage failure: ... {tail} ... PythonException: Traceback ...\n"
                  f"kolo_spark.task.TaskFailure: {message}\n\n\tat org.apache.spark.Foo(x:1)\n")
    err = task.error_from_text(spark_text)
    assert isinstance(err, RankFailedError)
    assert (err.rank, err.exit_code) == (1, 3)
    assert message.rstrip().splitlines()[-1].startswith("KOLO_SPARK_FAILURE<")
    assert message.count("KOLO_SPARK_FAILURE<") == 1  # the tail's copy is defused


def _f64(path, rows, cols, nvalues=0):
    with open(path, "wb") as f:
        f.write(struct.pack("<8sQQ", data.F64_MAGIC, rows, cols) + b"\0" * (8 * nvalues))


def _bin(path, rows, columns, cells):
    with open(path, "wb") as f:
        body = struct.pack("<8sQQQ", data.BIN_MAGIC, rows, len(columns),
                           sum(w for _, w, _ in columns))
        for code, width, name in columns:
            body += struct.pack("<B3xII", code, width, len(name)) + name
        body += b"\0" * (-len(body) % 8) + b"\0" * (8 * cells)
        f.write(body)


def test_lying_shard_headers_are_clear_errors(tmp_path):
    # Before: the Python readers believed the header (2^62 rows of no column: a 2^62-step loop;
    # garbage columns: a struct.error, not a message naming the file).
    p = str(tmp_path / "s.f64")
    t0 = time.monotonic()
    for rows, cols, n, want in [(0, 1 << 40, 0, "more than 65536 cells"),
                                (1 << 60, 0, 0, "rows without a single column"),
                                (1 << 61, 4, 2, "holds 16 bytes")]:
        _f64(p, rows, cols, n)
        with pytest.raises(ValueError, match=want) as e:
            data.read_f64(p)
        assert p in str(e.value)
    _f64(p, 0, 3)
    assert data.read_f64(p) == (0, 3, [])
    b = str(tmp_path / "s.bin")
    for rows, cols, cells, want in [(1 << 62, [], 0, "rows without a single column"),
                                    (0, [(3, 1 << 31, b"v")], 0, "more than 65536 cells"),
                                    (3, [(1, 1, b"x")], 2, "holds 16 bytes")]:
        _bin(b, rows, cols, cells)
        with pytest.raises(ValueError, match=want) as e:
            data.read_bin(b)
        assert b in str(e.value)
    with open(b, "wb") as f:
        f.write(struct.pack("<8sQQQ", data.BIN_MAGIC, 0, 1 << 50, 0))
    with pytest.raises(ValueError, match="more than its header can hold"):
        data.read_bin(b)
    assert time.monotonic() - t0 < 0.1 * 10  # no allocation or loop the header asked for


def test_rank_result_size_checked_before_reading(tmp_path):
    p = tmp_path / "result.pickle"
    p.write_bytes(b"x" * 1000)
    assert task.read_bounded(str(p), 1000, "result") == b"x" * 1000
    with pytest.raises(task.SetupError, match="1,000 bytes, more than the 999"):
        task.read_bounded(str(p), 999, "result")
