"""kolo's rendezvous store in Python: a server the driver hosts for an elastic run (it outlives
every rank, so the survivors of a lost rank can still agree and shrink) and a client for the
tasks and function ranks (lost ranks, committed state).

It speaks the C++ store's wire protocol (include/kolo/topology/store/protocol.hpp), so a C++
rank's ``Communicator::from_env()`` with ``KOLO_STORE=<driver>:<port>`` meets its peers here:

- the handshake (include/kolo/net/auth.hpp): the server sends magic(8) + nonce_s(32); the
  client answers magic + nonce_c(32) + hello(16) + HMAC-SHA256(key, "kolo-c" nonce_s nonce_c
  hello); the server proves itself with HMAC(key, "kolo-s" nonce_c nonce_s hello). ``key`` is
  :func:`job_key` (the secret bound to the job id). A client that fails is closed unanswered;
- frames: len:u32 | tag:u8 | payload, little-endian; SET, GET (with a wait), ADD (decimal
  counters), WAIT, ERASE, CAS (torch's compareSet semantics); replies OK, MISSING (the keys still
  absent), FAILED (message). Anything malformed closes that connection.

The server runs one thread per authenticated connection (a job has a few per rank), at most
:data:`MAX_PENDING_HANDSHAKES` handshakes at once, each bounded by ``auth_timeout`` seconds: a
stranger connecting to the port learns nothing and holds nothing for long.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
import threading
import time
from typing import Dict, List, Optional, Sequence, Tuple

MAGIC = b"KOLOAU1\0"
NONCE = 32
MAC = 32
PURPOSE_STORE = 1
MAX_KEY_BYTES = 4096
MAX_VALUE_BYTES = 64 << 20
MAX_FRAME_BYTES = MAX_VALUE_BYTES + MAX_KEY_BYTES + 64
MAX_WAIT_MS = 10_000_000_000
MAX_PENDING_HANDSHAKES = 64

SET, GET, ADD, WAIT, ERASE, CAS = 1, 2, 3, 4, 5, 6
OK, MISSING, FAILED = 0, 1, 2


class StoreError(Exception):
    """A store call failed: the connection is gone, the server refused us, or a reply was
    malformed (the message says which)."""


class StoreTimeout(StoreError):
    """A get/wait ran out of time: the keys named were not set."""


def job_key(secret: str, job: str) -> bytes:
    """The key every handshake of a job uses: the secret itself without a job id, else the
    lower-case hex of HMAC-SHA256(secret, "kolo-job:" + job) (the C++ ``net::job_key``)."""
    if not job:
        return secret.encode()
    return hmac.new(secret.encode(), b"kolo-job:" + job.encode(), hashlib.sha256).hexdigest() \
        .encode()


def _mac(key: bytes, label: bytes, n1: bytes, n2: bytes, hello: bytes) -> bytes:
    return hmac.new(key, label + n1 + n2 + hello, hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(min(n - len(out), 1 << 20))
        if not chunk:
            raise ConnectionError("connection closed")
        out += chunk
    return bytes(out)


def _string(s: bytes) -> bytes:
    return struct.pack("<I", len(s)) + s


def _frame(tag: int, payload: bytes) -> bytes:
    return struct.pack("<IB", len(payload) + 1, tag) + payload


class _Reader:
    """Bounds-checked reading of one frame's payload: an overrun raises ValueError."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError("frame overrun")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def string(self, limit: int) -> bytes:
        n = self.u32()
        if n > limit:
            raise ValueError("string too long")
        return self.take(n)

    def rest(self) -> bytes:
        out = self.data[self.pos:]
        self.pos = len(self.data)
        return out

    def end(self) -> None:
        if self.pos != len(self.data):
            raise ValueError("trailing bytes")


class KvStoreServer:
    """The rendezvous store, served from a background thread on ``(bind_host, port)`` (port 0:
    an ephemeral one; :attr:`port` says which). ``secret`` and ``job`` give the handshake key
    (:func:`job_key`). :meth:`close` stops it and closes every connection. The data is also
    readable in-process (:meth:`get_local`, :meth:`keys`) for the driver's own use."""

    def __init__(self, secret: str, job: str = "", bind_host: str = "127.0.0.1", port: int = 0,
                 auth_timeout: float = 10.0, namespaces: int = 0,
                 shared_prefixes: Sequence[str] = ()):
        # namespaces > 0: clients of job ids "<job>-s0" .. "<job>-s<namespaces-1>" each see the
        # keys of their own namespace ("s<k>/" in front of every key), except those that start
        # with one of shared_prefixes (kolo_spark: a Spark retry of the barrier stage runs the
        # ranks again, whose rendezvous must not meet the failed stage's keys; commits are
        # shared). namespaces = 0: one job id, no prefix (the C++ server's behaviour).
        if namespaces > 0:
            self.keys_by_ns = [job_key(secret, f"{job}-s{k}") for k in range(namespaces)]
        else:
            self.keys_by_ns = [job_key(secret, job)]
        self.namespaced = namespaces > 0
        self.shared = tuple(p.encode() for p in shared_prefixes)
        self.highest_namespace = 0  # the highest namespace a client authenticated in
        self.auth_timeout = auth_timeout
        family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((bind_host, port))
            self._listener.listen(128)
        except OSError:
            self._listener.close()
            raise
        self.bind_host = bind_host
        self.port = self._listener.getsockname()[1]
        self._data: Dict[bytes, bytes] = {}
        self._cond = threading.Condition()
        self._conns: List[socket.socket] = []
        self._pending = 0
        self._closed = False
        self._threads: List[threading.Thread] = []
        self._accept_thread = threading.Thread(target=self._accept_loop, daemon=True,
                                               name=f"kolo_spark-store:{self.port}")
        self._accept_thread.start()

    # --- in-process access (the driver) ---
    def get_local(self, key: str) -> Optional[bytes]:
        """The value of ``key`` now, or None."""
        with self._cond:
            return self._data.get(key.encode())

    def set_local(self, key: str, value: bytes) -> None:
        """Stores ``value`` under ``key`` (waiters wake) without a connection."""
        with self._cond:
            self._data[key.encode()] = bytes(value)
            self._cond.notify_all()

    def keys(self, prefix: str = "") -> List[str]:
        """The keys that start with ``prefix``, sorted (decoded as UTF-8, bad bytes replaced)."""
        p = prefix.encode()
        with self._cond:
            return sorted(k.decode(errors="replace") for k in self._data if k.startswith(p))

    # --- serving ---
    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._cond:
                if self._closed or self._pending >= MAX_PENDING_HANDSHAKES:
                    conn.close()
                    continue
                self._pending += 1
                self._conns.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True,
                                 name=f"kolo_spark-store-conn:{self.port}")
            self._threads = [x for x in self._threads if x.is_alive()] + [t]
            t.start()

    def ns_key(self, namespace: int, key: str) -> str:
        """How ``key`` of a client in ``namespace`` is stored (for :meth:`get_local`)."""
        b = key.encode()
        if not self.namespaced or b.startswith(self.shared):
            return key
        return f"s{namespace}/{key}"

    def _handshake(self, conn: socket.socket) -> Optional[bytes]:
        """The connection's key prefix once it proved a job key (None: refused)."""
        nonce_s = os.urandom(NONCE)
        try:
            conn.settimeout(self.auth_timeout)
            conn.sendall(MAGIC + nonce_s)
            resp = _recv_exact(conn, 8 + NONCE + 16 + MAC)
        except (OSError, ConnectionError):
            return None
        finally:
            with self._cond:
                self._pending -= 1
        if resp[:8] != MAGIC:
            return None
        nonce_c, hello, mac = resp[8:8 + NONCE], resp[8 + NONCE:8 + NONCE + 16], resp[-MAC:]
        found = None
        for ns, key in enumerate(self.keys_by_ns):
            if hmac.compare_digest(_mac(key, b"kolo-c", nonce_s, nonce_c, hello), mac):
                found = ns
                break
        if found is None or struct.unpack("<I", hello[:4])[0] != PURPOSE_STORE:
            return None
        try:
            conn.sendall(_mac(self.keys_by_ns[found], b"kolo-s", nonce_c, nonce_s, hello))
            conn.settimeout(None)
        except OSError:
            return None
        with self._cond:
            self.highest_namespace = max(self.highest_namespace, found)
        return f"s{found}/".encode() if self.namespaced else b""

    def _serve(self, conn: socket.socket) -> None:
        try:
            prefix = self._handshake(conn)
            if prefix is None:
                return
            while True:
                head = _recv_exact(conn, 4)
                (length,) = struct.unpack("<I", head)
                if length < 1 or length > MAX_FRAME_BYTES:
                    return
                body = _recv_exact(conn, length)
                reply = self._answer(body[0], _Reader(body[1:]), prefix)
                if reply is None:
                    return  # malformed: closed without a reply
                conn.sendall(reply)
        except (OSError, ConnectionError):
            pass
        finally:
            with self._cond:
                if conn in self._conns:
                    self._conns.remove(conn)
            conn.close()

    def _wait_keys(self, keys: Sequence[bytes], wait_ms: int) -> List[bytes]:
        """Waits (holding the condition) up to wait_ms for every key; returns those absent."""
        deadline = time.monotonic() + wait_ms / 1000.0
        while True:
            missing = [k for k in keys if k not in self._data]
            if not missing or self._closed:
                return missing
            left = deadline - time.monotonic()
            if left <= 0:
                return missing
            self._cond.wait(min(left, 1.0))

    @staticmethod
    def _missing(keys: Sequence[bytes], prefix: bytes = b"") -> bytes:
        keys = [k[len(prefix):] if prefix and k.startswith(prefix) else k for k in keys]
        return _frame(MISSING, struct.pack("<I", len(keys)) + b"".join(_string(k) for k in keys))

    def _answer(self, op: int, r: _Reader, prefix: bytes = b"") -> Optional[bytes]:
        def name(key: bytes) -> bytes:
            return key if not prefix or key.startswith(self.shared) else prefix + key

        try:
            if op == SET:
                key = name(r.string(MAX_KEY_BYTES))
                value = r.rest()
                with self._cond:
                    self._data[key] = value
                    self._cond.notify_all()
                return _frame(OK, b"")
            if op == GET:
                wait_ms = r.u64()
                key = name(r.string(MAX_KEY_BYTES))
                r.end()
                if wait_ms > MAX_WAIT_MS:
                    return None
                with self._cond:
                    if self._wait_keys([key], wait_ms):
                        return self._missing([key], prefix)
                    return _frame(OK, self._data[key])
            if op == ADD:
                key = name(r.string(MAX_KEY_BYTES))
                (delta,) = struct.unpack("<q", r.take(8))
                r.end()
                with self._cond:
                    old = self._data.get(key, b"0")
                    try:
                        new = int(old.decode()) + delta
                    except ValueError:
                        return _frame(FAILED, b"add on a value that is not an integer")
                    self._data[key] = str(new).encode()
                    self._cond.notify_all()
                return _frame(OK, struct.pack("<q", new))
            if op == WAIT:
                wait_ms = r.u64()
                n = r.u32()
                keys = [name(r.string(MAX_KEY_BYTES)) for _ in range(n)]
                r.end()
                if wait_ms > MAX_WAIT_MS:
                    return None
                with self._cond:
                    missing = self._wait_keys(keys, wait_ms)
                return self._missing(missing, prefix) if missing else _frame(OK, b"")
            if op == ERASE:
                key = name(r.string(MAX_KEY_BYTES))
                r.end()
                with self._cond:
                    self._data.pop(key, None)
                    self._cond.notify_all()
                return _frame(OK, b"")
            if op == CAS:
                key = name(r.string(MAX_KEY_BYTES))
                expected = r.string(MAX_VALUE_BYTES)
                desired = r.rest()
                with self._cond:
                    now = self._data.get(key)
                    if (now is None and not expected) or (now is not None and now == expected):
                        self._data[key] = desired
                        self._cond.notify_all()
                        now = desired
                    elif now is None:
                        now = expected
                return _frame(OK, now)
        except ValueError:
            return None
        return None  # an unknown op

    def close(self) -> None:
        """Stops serving: the listener and every connection are closed, waiters wake and the
        connection threads end. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            conns, self._conns = list(self._conns), []
            self._cond.notify_all()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._accept_thread.join(5)
        for t in self._threads:
            t.join(5)

    def __enter__(self) -> "KvStoreServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class KvStoreClient:
    """One authenticated connection to a kolo store (the C++ StoreServer, kolo-run's, or a
    :class:`KvStoreServer`), one request at a time. ``address``: (host, port); ``timeout``:
    seconds for the connect and for each call's wait; ``rank``: who we are (-1 for tools)."""

    def __init__(self, address: Tuple[str, int], secret: str, job: str = "", rank: int = -1,
                 timeout: float = 30.0):
        self.address, self.timeout = (address[0], int(address[1])), timeout
        key = job_key(secret, job)
        deadline = time.monotonic() + timeout
        last: Optional[BaseException] = None
        while True:  # the server may not listen yet
            try:
                self._sock = socket.create_connection(self.address, timeout=max(0.1, min(
                    5.0, deadline - time.monotonic())))
                break
            except OSError as e:
                last = e
                if time.monotonic() >= deadline:
                    raise StoreError(f"kolo store {self.where}: cannot connect within "
                                     f"{timeout:g} s: {last}") from None
                time.sleep(0.05)
        self._lock = threading.Lock()
        try:
            self._sock.settimeout(max(0.1, deadline - time.monotonic()))
            challenge = _recv_exact(self._sock, 8 + NONCE)
            if challenge[:8] != MAGIC:
                raise StoreError(f"kolo store {self.where}: not a kolo endpoint (bad magic)")
            nonce_c = os.urandom(NONCE)
            hello = struct.pack("<IiQ", PURPOSE_STORE, rank, 0)
            self._sock.sendall(MAGIC + nonce_c + hello +
                               _mac(key, b"kolo-c", challenge[8:], nonce_c, hello))
            proof = _recv_exact(self._sock, MAC)
            if not hmac.compare_digest(proof, _mac(key, b"kolo-s", nonce_c, challenge[8:],
                                                   hello)):
                raise StoreError(f"kolo store {self.where} failed to prove the job secret")
        except (OSError, ConnectionError) as e:
            self._sock.close()
            raise StoreError(f"kolo store {self.where} refused our authentication (the secret "
                             f"or job id differs from the job's): {e}") from None
        except StoreError:
            self._sock.close()
            raise

    @property
    def where(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    def _call(self, what: str, request: bytes, wait: float = 0.0) -> Tuple[int, _Reader]:
        with self._lock:
            try:
                self._sock.settimeout(self.timeout + wait + 5.0)
                self._sock.sendall(request)
                (length,) = struct.unpack("<I", _recv_exact(self._sock, 4))
                if length < 1 or length > MAX_FRAME_BYTES:
                    raise StoreError(f"kolo store {self.where}: {what}: malformed reply")
                body = _recv_exact(self._sock, length)
            except (OSError, ConnectionError) as e:
                raise StoreError(f"kolo store {self.where}: {what} failed: {e}") from None
        return body[0], _Reader(body[1:])

    @staticmethod
    def _ms(seconds: float) -> int:
        return max(0, min(MAX_WAIT_MS, int(seconds * 1000)))

    def set(self, key: str, value: bytes) -> None:
        """Stores ``value`` (bytes, up to 64 MiB) under ``key``."""
        status, _ = self._call(f"set({key!r})", _frame(SET, _string(key.encode()) + bytes(value)))
        if status != OK:
            raise StoreError(f"kolo store {self.where}: set({key!r}) refused")

    def get(self, key: str, wait: Optional[float] = None) -> bytes:
        """The value of ``key``, waiting up to ``wait`` seconds (default: the client's timeout)
        for it to be set; StoreTimeout when it is not."""
        wait = self.timeout if wait is None else wait
        status, r = self._call(f"get({key!r})", _frame(GET, struct.pack("<Q", self._ms(wait)) +
                                                      _string(key.encode())), wait)
        if status == MISSING:
            raise StoreTimeout(f"kolo store {self.where}: key {key!r} was not set within "
                               f"{wait:g} s")
        return r.rest()

    def try_get(self, key: str) -> Optional[bytes]:
        """The value of ``key`` now, or None (no wait)."""
        try:
            return self.get(key, 0.0)
        except StoreTimeout:
            return None

    def add(self, key: str, delta: int) -> int:
        """Adds ``delta`` to the decimal counter under ``key`` (absent: 0) and returns it."""
        status, r = self._call(f"add({key!r})", _frame(ADD, _string(key.encode()) +
                                                      struct.pack("<q", delta)))
        if status != OK:
            raise StoreError(f"kolo store {self.where}: add({key!r}): {r.rest().decode()}")
        return struct.unpack("<q", r.take(8))[0]

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """Stores ``desired`` if ``key`` holds ``expected`` (or is absent and ``expected`` is
        empty); returns the value stored now (torch's compareSet)."""
        status, r = self._call(f"compare_set({key!r})", _frame(
            CAS, _string(key.encode()) + _string(bytes(expected)) + bytes(desired)))
        if status != OK:
            raise StoreError(f"kolo store {self.where}: compare_set({key!r}) refused")
        return r.rest()

    def erase(self, key: str) -> None:
        """Removes ``key`` (absent: nothing happens)."""
        self._call(f"erase({key!r})", _frame(ERASE, _string(key.encode())))

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> "KvStoreClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
