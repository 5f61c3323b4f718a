"""The driver's hub: one authenticated TCP connection from every rank's task, which carries the
rank's log lines and timeline to the driver while the job runs, and tells the driver when every
rank's processes are really gone.

Liveness: Spark reports a cancelled Python task as ended before it kills the task's Python worker
(up to ``spark.python.task.killTimeout`` plus a poll later), and the rank dies with that worker.
So each task opens its connection before launching its rank and hands the socket to the rank's
supervisor as well (an inherited fd the program never touches). The connection closes when the
worker, the supervisor and the rank (and anything that inherited it) are all gone: after a
failure or an interrupt, ``run()`` waits (bounded) for that before it raises.

Wire format: the task sends ``"<rank> <hmac>\\n"`` (HMAC-SHA256 of the rank under the job's
secret: a connection that cannot prove it is closed), then frames ``kind (1 byte), length
(4 bytes, big endian), payload``: ``L`` a log line (UTF-8), ``T`` the rank's timeline (JSON),
``F`` the rank's failure (JSON: kolo_spark.task.failure_payload), sent as soon as the task knows
it, before the task fails the Spark stage.

Logs are bounded on the task side: at most ``lines_per_second`` lines per second per rank (a
burst of one second's worth), each cut to ``line_bytes`` bytes, and at most ``buffer_bytes``
waiting to be sent; what does not fit is counted and reported in one line when the stream has
room again. The executor log keeps every line. Sending never blocks the rank's output.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import select
import socket
import struct
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

_FRAME = struct.Struct("!cI")
_MAX_FRAME = {b"L": 1 << 16, b"T": 256 << 20, b"F": 16 << 20}


def _token(secret: str, rank: int) -> bytes:
    return hmac.new(secret.encode(), f"kolo_spark-alive-{rank}".encode(),
                    hashlib.sha256).hexdigest().encode()


LineSink = Callable[[int, str], None]


def print_line(rank: int, line: str, stream=None) -> None:
    """The default log sink: ``[kolo rank R] line`` on the driver's stdout."""
    out = stream or sys.stdout
    try:
        out.write(f"[kolo rank {rank}] {line}\n")
        out.flush()
    except (OSError, ValueError):
        pass


class LivenessServer:
    """Driver side: counts open connections per rank, hands log lines to ``on_line(rank, line)``
    (on the hub's thread) and keeps each rank's timeline in ``traces``."""

    def __init__(self, secret: str, bind_host: str = "0.0.0.0",
                 on_line: Optional[LineSink] = None):
        self._secret = secret
        self._on_line = on_line
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((bind_host, 0))
        self._sock.listen(1024)
        self.port = self._sock.getsockname()[1]
        self._lock = threading.Lock()
        self._open: Dict[socket.socket, Optional[int]] = {}  # conn -> rank (None: not yet said)
        self._buf: Dict[socket.socket, bytearray] = {}
        self.seen = set()
        self.traces: Dict[int, list] = {}
        self.first_line_at: Dict[int, float] = {}  # rank -> time.time() of its first log line
        self.failures: Dict[int, dict] = {}  # rank -> its failure payload (an F frame)
        self.gone = set()  # ranks whose connection has closed
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="kolo_spark-hub", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                conns = list(self._open)
            try:
                ready, _, _ = select.select([self._sock] + conns, [], [], 0.2)
            except (OSError, ValueError):
                return
            for s in ready:
                if s is self._sock:
                    try:
                        c, _ = self._sock.accept()
                    except OSError:
                        continue
                    with self._lock:
                        self._open[c] = None
                        self._buf[c] = bytearray()
                    continue
                try:
                    data = s.recv(1 << 16)
                except OSError:
                    data = b""
                if not data:
                    self._drop(s)
                    continue
                self._buf[s] += data
                try:
                    self._parse(s)
                except ValueError:
                    self._drop(s)

    def _drop(self, s: socket.socket) -> None:
        with self._lock:
            rank = self._open.pop(s, None)
            self._buf.pop(s, None)
            if rank is not None and rank not in self._open.values():
                self.gone.add(rank)
        s.close()

    def _parse(self, s: socket.socket) -> None:
        buf = self._buf[s]
        if self._open.get(s) is None:
            nl = buf.find(b"\n")
            if nl < 0:
                if len(buf) > 256:
                    raise ValueError("no hello")
                return
            self._hello(s, bytes(buf[:nl]))
            del buf[:nl + 1]
        rank = self._open.get(s)
        while len(buf) >= _FRAME.size:
            kind, n = _FRAME.unpack_from(buf)
            if kind not in _MAX_FRAME or n > _MAX_FRAME[kind]:
                raise ValueError(f"bad frame {kind!r} of {n} bytes")
            if len(buf) < _FRAME.size + n:
                return
            payload = bytes(buf[_FRAME.size:_FRAME.size + n])
            del buf[:_FRAME.size + n]
            if kind == b"L":
                self.first_line_at.setdefault(rank, time.time())
                if self._on_line is not None:
                    try:
                        self._on_line(rank, payload.decode("utf-8", "replace"))
                    except Exception:  # a failing sink must not stop the hub
                        pass
            elif kind == b"T":
                try:
                    self.traces[rank] = json.loads(payload)
                except ValueError:
                    pass
            elif kind == b"F":
                try:
                    report = json.loads(payload)
                except ValueError:
                    continue
                if isinstance(report, dict) and report.get("rank") == rank:
                    with self._lock:  # a retried stage's report replaces the earlier one
                        self.failures[rank] = report

    def _hello(self, s: socket.socket, line: bytes) -> None:
        try:
            rank_text, token = line.split(b" ", 1)
            rank = int(rank_text)
        except ValueError:
            rank, token = -1, b""
        if rank < 0 or not hmac.compare_digest(token, _token(self._secret, rank)):
            raise ValueError("not one of ours")
        with self._lock:
            self._open[s] = rank
        self.seen.add(rank)

    def alive_ranks(self) -> List[int]:
        with self._lock:
            return sorted(r for r in self._open.values() if r is not None)

    def wait_reports(self, num_proc: int, limit: float) -> bool:
        """Waits until every rank has reported its failure or its connection has closed (a
        rank that returned, or whose task Spark killed), at most ``limit`` seconds; True when
        all have."""
        end = time.monotonic() + limit
        while True:
            with self._lock:
                pending = [r for r in range(num_proc)
                           if r not in self.failures and r not in self.gone]
            if not pending:
                return True
            if time.monotonic() >= end:
                return False
            time.sleep(0.02)

    def wait_all_gone(self, limit: float) -> bool:
        end = time.monotonic() + limit
        while time.monotonic() < end:
            if not self.alive_ranks():
                return True
            time.sleep(0.05)
        return not self.alive_ranks()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        with self._lock:
            for s in list(self._open):
                s.close()
            self._open.clear()
        self._sock.close()


class HubClient:
    """Task side: the connection to the driver's hub. Log lines are rate-limited and sent
    without blocking; what cannot be sent is counted and reported."""

    def __init__(self, sock: socket.socket, lines_per_second: float = 100.0,
                 line_bytes: int = 2048, buffer_bytes: int = 1 << 20):
        self.sock = sock
        self.rate = float(lines_per_second)
        self.line_bytes = max(16, int(line_bytes))
        self.buffer_bytes = buffer_bytes
        self._tokens = max(1.0, self.rate)
        self._last = time.monotonic()
        self._out = bytearray()
        self.dropped = 0  # lines not streamed (rate or buffer), since the last notice
        self.dropped_total = 0
        self.sent = 0
        sock.setblocking(False)

    def fileno(self) -> int:
        return self.sock.fileno()

    def _frame(self, kind: bytes, payload: bytes) -> bytes:
        return _FRAME.pack(kind, len(payload)) + payload

    def line(self, text: str) -> None:
        now = time.monotonic()
        if self.rate > 0:
            self._tokens = min(max(1.0, self.rate), self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self.rate <= 0 or self._tokens < 1.0 or len(self._out) > self.buffer_bytes:
            self.dropped += 1
            self.dropped_total += 1
            return
        self._tokens -= 1.0
        if self.dropped:
            notice = (f"kolo_spark: {self.dropped} line{'s' if self.dropped != 1 else ''} of "
                      f"this rank not streamed to the driver (over {self.rate:g} lines/s); the "
                      "executor log has every line")
            self._out += self._frame(b"L", notice.encode())
            self.dropped = 0
        data = text.encode("utf-8", "replace")
        if len(data) > self.line_bytes:
            cut = data[:self.line_bytes].decode("utf-8", "ignore")
            data = f"{cut} [... line cut at {self.line_bytes} of {len(data)} bytes]".encode()
        self._out += self._frame(b"L", data)
        self.sent += 1
        self.flush(0.0)

    def failure(self, payload: dict, limit: float = 2.0) -> bool:
        """Sends this rank's failure report (flushed, waiting up to ``limit`` seconds)."""
        data = json.dumps(payload).encode()
        if len(data) > _MAX_FRAME[b"F"]:  # only the output tail is unbounded
            data = json.dumps(dict(payload, tail=str(payload.get("tail", ""))[-65536:])).encode()
        if len(data) > _MAX_FRAME[b"F"]:
            return False
        self._out += self._frame(b"F", data)
        return self.flush(limit)

    def trace(self, events: list) -> None:
        data = json.dumps(events, separators=(",", ":")).encode()
        if len(data) <= _MAX_FRAME[b"T"]:
            self._out += self._frame(b"T", data)

    def flush(self, limit: float) -> bool:
        """Sends what is pending, waiting up to ``limit`` seconds; True when all went out."""
        end = time.monotonic() + limit
        while self._out:
            try:
                n = self.sock.send(self._out)
                del self._out[:n]
                continue
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self._out.clear()  # the driver is gone: nothing more to send
                return False
            left = end - time.monotonic()
            if left <= 0:
                return False
            select.select([], [self.sock], [], left)
        return True

    def close(self, limit: float = 2.0) -> None:
        if self.dropped:
            notice = (f"kolo_spark: {self.dropped} line{'s' if self.dropped != 1 else ''} of "
                      f"this rank not streamed to the driver (over {self.rate:g} lines/s); the "
                      "executor log has every line")
            self._out += self._frame(b"L", notice.encode())
            self.dropped = 0
        self.flush(limit)
        self.sock.close()


def connect(address: Optional[Tuple[str, int]], secret: str, rank: int, timeout: float = 5.0,
            **limits) -> Optional[HubClient]:
    """Task side: best effort (a driver the executors cannot reach only loses the logs and the
    wait)."""
    if not address:
        return None
    try:
        s = socket.create_connection(address, timeout=timeout)
        s.sendall(f"{rank} ".encode() + _token(secret, rank) + b"\n")
        return HubClient(s, **limits)
    except OSError:
        return None
