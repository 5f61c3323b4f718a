"""The driver's hub: one authenticated TCP connection from every rank's task, which carries the
rank's log lines and timeline to the driver while the job runs, and tells the driver when every
rank's processes are really gone.

Liveness: Spark reports a cancelled Python task as ended before it kills the task's Python worker
(up to ``spark.python.task.killTimeout`` plus a poll later), and the rank dies with that worker.
So each task opens its connection before launching its rank and hands the socket to the rank's
supervisor as well (an inherited fd the program never touches). The connection closes when the
worker, the supervisor and the rank (and anything that inherited it) are all gone: after a
failure or an interrupt, ``run()`` waits (bounded) for that before it raises.

Wire format: a nonce challenge-response handshake first (``_HELLO`` below: fresh nonces from
both sides, HMAC-SHA256 of both, the purpose and the rank under the job's secret, each side
proving itself; a connection that cannot prove it within ``auth_timeout`` is closed), then the
task sends frames ``kind (1 byte), length
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
import re
import secrets
import select
import selectors
import socket
import struct
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

_FRAME = struct.Struct("!cI")
_MAX_FRAME = {b"L": 1 << 16, b"T": 256 << 20, b"F": 16 << 20}

# The handshake (nonces from both sides, HMAC-SHA256 over both, the purpose and the rank, as
# kolo's C++ net/auth.hpp does): the hub sends ``_HELLO`` and its 32-byte nonce (hex) on a
# line; the task answers ``"<rank> <its nonce, hex> <proof, hex>\n"``; the hub answers with its
# own proof on a line. A recorded handshake is worth nothing on another connection (the hub's
# nonce is fresh), and a task streams to a hub that proved the secret, never to a stranger.
_HELLO = b"kolo_spark-hub-1"
_NONCE_BYTES = 32
_MAX_HELLO = 256  # bytes of an answer line: more is not one of ours


def _proof(secret: str, side: bytes, hub_nonce: bytes, task_nonce: bytes, rank: int) -> bytes:
    msg = b"\0".join((b"kolo_spark-hub", side, hub_nonce, task_nonce, str(rank).encode()))
    return hmac.new(secret.encode(), msg, hashlib.sha256).hexdigest().encode()


LineSink = Callable[[int, str], None]

_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def escape_controls(text: str) -> str:
    """``text`` with terminal control characters (C0 but tab, DEL, C1: escape sequences, a
    carriage return that overwrites the line) written as ``\\xNN``: a rank's line cannot
    drive the driver's terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def print_line(rank: int, line: str, stream=None) -> None:
    """The default log sink: ``[kolo rank R] line`` on the driver's stdout, control characters
    escaped (escape_controls)."""
    out = stream or sys.stdout
    try:
        out.write(f"[kolo rank {rank}] {escape_controls(line)}\n")
        out.flush()
    except (OSError, ValueError):
        pass


def hub_bind_host(conf_get: Callable[[str], Optional[str]], master: str) -> str:
    """Where the hub listens: loopback when Spark runs in local mode (every task is on this
    machine), else ``spark.driver.bindAddress`` or ``spark.driver.host`` (the address Spark
    itself serves the executors on), never every interface."""
    if (master or "").startswith("local"):
        return "127.0.0.1"
    return conf_get("spark.driver.bindAddress") or conf_get("spark.driver.host") or "127.0.0.1"


class _Pending:
    """An accepted connection that has not proven the secret yet."""

    __slots__ = ("nonce", "deadline", "buf", "out")

    def __init__(self, nonce: bytes, deadline: float, out: bytes):
        self.nonce, self.deadline, self.buf, self.out = nonce, deadline, bytearray(), out


class LivenessServer:
    """Driver side: counts open connections per rank, hands log lines to ``on_line(rank, line)``
    (on the hub's thread) and keeps each rank's timeline in ``traces``.

    Against strangers: it listens on ``bind_host`` only; a connection must answer the nonce
    challenge within ``auth_timeout`` seconds or it is closed; at most ``max_pending``
    connections may be unproven at once (a new one closes the oldest unproven one: counted in
    ``refused``, so a flood evicts itself while a rank's answer, a round trip after its
    connect, gets through); it waits with ``selectors`` (epoll), so no fd number is too large
    for it."""

    def __init__(self, secret: str, bind_host: str = "127.0.0.1",
                 on_line: Optional[LineSink] = None, auth_timeout: float = 3.0,
                 max_pending: int = 128):
        self._secret = secret
        self._on_line = on_line
        self.auth_timeout = float(auth_timeout)
        self.max_pending = int(max_pending)
        family = socket.getaddrinfo(bind_host, 0, type=socket.SOCK_STREAM)[0]
        self._sock = socket.socket(family[0], socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(family[4])
        self._sock.listen(1024)
        self._sock.setblocking(False)
        self.bind_host = family[4][0]
        self.port = self._sock.getsockname()[1]
        self._lock = threading.Lock()
        self._open: Dict[socket.socket, int] = {}  # proven conn -> rank
        self._pending: Dict[socket.socket, _Pending] = {}
        self._buf: Dict[socket.socket, bytearray] = {}
        self.refused = 0  # connections closed at accept: too many unproven ones at once
        self.rejected = 0  # connections closed for a wrong answer or none within auth_timeout
        self.seen = set()
        self.traces: Dict[int, list] = {}
        self.first_line_at: Dict[int, float] = {}  # rank -> time.time() of its first log line
        self.failures: Dict[int, dict] = {}  # rank -> its failure payload (an F frame)
        self.gone = set()  # ranks whose connection has closed
        self._stop = threading.Event()
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._sock, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._serve, name="kolo_spark-hub", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            wait = 0.2
            if self._pending:
                wait = max(0.0, min(wait, min(p.deadline for p in self._pending.values()) - now))
            try:
                events = self._sel.select(wait)
            except (OSError, ValueError):
                if self._stop.is_set():
                    return
                time.sleep(0.01)
                continue
            listener = False
            for key, _ in events:  # answers first: an accept burst may evict the oldest
                s = key.fileobj
                if s is self._sock:
                    listener = True
                    continue
                if s not in self._pending and s not in self._open:
                    continue  # evicted or dropped earlier in this round
                try:
                    self._readable(s)
                except Exception:  # one bad connection never ends the hub
                    self._drop(s)
            if listener:
                self._accept()
            now = time.monotonic()
            for s in [s for s, p in self._pending.items() if p.deadline <= now]:
                self.rejected += 1
                self._drop(s)

    def _accept(self) -> None:
        for _ in range(max(1, self.max_pending // 2)):  # then the answers: a connection
            # accepted now lives at least two rounds before a flood can evict it
            try:
                c, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of fds, or the peer went: try again on the next wake-up
                time.sleep(0.001)
                return
            if len(self._pending) >= self.max_pending:  # the oldest unproven one makes room:
                self.refused += 1  # a flood evicts itself, a rank's quick answer gets through
                self._drop(next(iter(self._pending)))
            c.setblocking(False)
            nonce = secrets.token_bytes(_NONCE_BYTES)
            p = _Pending(nonce, time.monotonic() + self.auth_timeout,
                         _HELLO + b" " + nonce.hex().encode() + b"\n")
            try:
                c.send(p.out)  # a few dozen bytes into an empty socket buffer
            except OSError:
                c.close()
                continue
            self._pending[c] = p
            self._sel.register(c, selectors.EVENT_READ)

    def _readable(self, s: socket.socket) -> None:
        try:
            data = s.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(s)
            return
        p = self._pending.get(s)
        if p is not None:
            p.buf += data
            nl = p.buf.find(b"\n")
            if nl < 0:
                if len(p.buf) > _MAX_HELLO:
                    raise ValueError("no answer")
                return
            answer = self._answer(p, bytes(p.buf[:nl]))
            if answer is None:
                self.rejected += 1
                raise ValueError("not one of ours")
            rank, task_nonce = answer
            rest = p.buf[nl + 1:]
            del self._pending[s]
            proof = _proof(self._secret, b"hub", p.nonce, task_nonce, rank) + b"\n"
            if s.send(proof) != len(proof):  # 65 bytes into an empty socket buffer
                raise ValueError("could not answer")
            with self._lock:
                self._open[s] = rank
                self._buf[s] = bytearray(rest)
            self.seen.add(rank)
        else:
            self._buf[s] += data
        self._parse(s)

    def _answer(self, p: _Pending, line: bytes) -> Optional[Tuple[int, bytes]]:
        try:
            rank_text, nonce_hex, proof = line.split(b" ")
            rank = int(rank_text)
            task_nonce = bytes.fromhex(nonce_hex.decode("ascii"))
        except ValueError:
            return None
        if rank < 0 or len(task_nonce) != _NONCE_BYTES:
            return None
        if not hmac.compare_digest(proof, _proof(self._secret, b"task", p.nonce, task_nonce,
                                                 rank)):
            return None
        return rank, task_nonce

    def _drop(self, s: socket.socket) -> None:
        try:
            self._sel.unregister(s)
        except (KeyError, ValueError):
            pass
        self._pending.pop(s, None)
        with self._lock:
            rank = self._open.pop(s, None)
            self._buf.pop(s, None)
            if rank is not None and rank not in self._open.values():
                self.gone.add(rank)
        s.close()

    def _parse(self, s: socket.socket) -> None:
        buf = self._buf[s]
        rank = self._open[s]
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

    def alive_ranks(self) -> List[int]:
        with self._lock:
            return sorted(self._open.values())

    def alive(self) -> bool:
        """Whether the hub's thread still serves."""
        return self._thread.is_alive()

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
            for s in list(self._open) + list(self._pending):
                s.close()
            self._open.clear()
            self._pending.clear()
        self._sel.close()
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
    """Task side: best effort (a driver the executors cannot reach, or a listener that cannot
    prove the secret, only loses the logs and the wait)."""
    if not address:
        return None
    end = time.monotonic() + timeout
    for _ in range(20):  # a connection the hub closed unproven (a flood evicting it): again
        hub, again = _connect_once(address, secret, rank, max(0.1, end - time.monotonic()),
                                   limits)
        if hub is not None or not again or time.monotonic() + 0.05 >= end:
            return hub
        time.sleep(0.05)
    return None


def _connect_once(address, secret, rank, timeout, limits) -> Tuple[Optional[HubClient], bool]:
    """(the client, or None; whether the hub closed the connection mid-handshake)."""
    s = None
    try:
        s = socket.create_connection(address, timeout=timeout)
        f = s.makefile("rb")
        line = f.readline(_MAX_HELLO)
        if not line:
            s.close()
            return None, True
        hello = line.rstrip(b"\n").split(b" ")
        if len(hello) != 2 or hello[0] != _HELLO:
            raise OSError("not a kolo_spark hub")
        hub_nonce = bytes.fromhex(hello[1].decode("ascii"))
        task_nonce = secrets.token_bytes(_NONCE_BYTES)
        s.sendall(f"{rank} {task_nonce.hex()} ".encode() +
                  _proof(secret, b"task", hub_nonce, task_nonce, rank) + b"\n")
        answer = f.readline(_MAX_HELLO)
        f.close()
        if not answer:
            s.close()
            return None, True
        if not hmac.compare_digest(answer.rstrip(b"\n"),
                                   _proof(secret, b"hub", hub_nonce, task_nonce, rank)):
            raise OSError("the hub did not prove the job's secret")
        return HubClient(s, **limits), False
    except (ConnectionResetError, BrokenPipeError):
        s.close()
        return None, True
    except (OSError, ValueError):
        if s is not None:
            s.close()
        return None, False
