"""Knowing on the driver when every rank's process is really gone.

Spark reports a cancelled Python task as ended before it kills the task's Python worker (up to
``spark.python.task.killTimeout`` plus a poll later), and the rank dies with that worker. So
each task opens a TCP connection to the driver before launching its rank and hands the socket
to the native process as well (an inherited fd the program never touches). The connection
closes when the worker and the rank (and anything the rank started that inherited it) are all
gone: after a failure, ``run()`` waits (bounded) for that before it raises.
"""

from __future__ import annotations

import hashlib
import hmac
import select
import socket
import threading
import time
from typing import Dict, Optional, Tuple


def _token(secret: str, rank: int) -> bytes:
    return hmac.new(secret.encode(), f"kolo_spark-alive-{rank}".encode(),
                    hashlib.sha256).hexdigest().encode()


class LivenessServer:
    """Driver side: counts open connections per rank."""

    def __init__(self, secret: str, bind_host: str = "0.0.0.0"):
        self._secret = secret
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((bind_host, 0))
        self._sock.listen(1024)
        self.port = self._sock.getsockname()[1]
        self._lock = threading.Lock()
        self._open: Dict[socket.socket, Optional[int]] = {}  # conn -> rank (None: not yet said)
        self._buf: Dict[socket.socket, bytes] = {}
        self.seen = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="kolo_spark-liveness",
                                        daemon=True)
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
                        self._buf[c] = b""
                    continue
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                with self._lock:
                    if not data:
                        self._open.pop(s, None)
                        self._buf.pop(s, None)
                        s.close()
                        continue
                    if self._open.get(s) is None:
                        self._buf[s] += data
                        if b"\n" in self._buf[s]:
                            self._hello(s, self._buf[s].split(b"\n", 1)[0])
                        elif len(self._buf[s]) > 256:
                            self._open.pop(s, None)
                            s.close()

    def _hello(self, s: socket.socket, line: bytes) -> None:
        try:
            rank_text, token = line.split(b" ", 1)
            rank = int(rank_text)
        except ValueError:
            rank, token = -1, b""
        if rank < 0 or not hmac.compare_digest(token, _token(self._secret, rank)):
            self._open.pop(s, None)  # not one of ours
            s.close()
            return
        self._open[s] = rank
        self.seen.add(rank)

    def alive_ranks(self):
        with self._lock:
            return sorted(r for r in self._open.values() if r is not None)

    def wait_all_gone(self, limit: float) -> bool:
        end = time.monotonic() + limit
        while time.monotonic() < end:
            if not self.alive_ranks():
                return True
            time.sleep(0.1)
        return not self.alive_ranks()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        with self._lock:
            for s in list(self._open):
                s.close()
            self._open.clear()
        self._sock.close()


def connect(address: Optional[Tuple[str, int]], secret: str, rank: int,
            timeout: float = 5.0) -> Optional[socket.socket]:
    """Task side: best effort (a driver the executors cannot reach only loses the wait)."""
    if not address:
        return None
    try:
        s = socket.create_connection(address, timeout=timeout)
        s.sendall(f"{rank} ".encode() + _token(secret, rank) + b"\n")
        s.settimeout(None)
        return s
    except OSError:
        return None
