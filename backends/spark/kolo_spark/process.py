"""One native rank process: started with the environment contract, its output streamed line
by line with a tail kept, and never left behind.

* The child gets its own session, hence its own process group (``start_new_session``): the
  group is what ``terminate`` signals, so helpers the program starts go with it.
* ``PR_SET_PDEATHSIG`` (set in the child between fork and exec) kills the child when the thread
  that started it dies: a Spark executor that kills a Python worker takes the rank with it,
  even when no ``finally`` gets to run.
* The child's exit is observed with ``waitid(WNOWAIT)`` so its pid, which is the group id, stays
  reserved until the group has been signalled; only then is it reaped.
* The parent's ``os.environ`` is never touched (Spark reuses Python workers): the child gets an
  explicit environment.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import errno
import os
import select
import signal
import subprocess
import sys
import time
from typing import Callable, Deque, Mapping, Optional, Sequence, TextIO

_PR_SET_PDEATHSIG = 1
_MAX_LINE = 64 * 1024  # a longer line is kept in pieces

_libc = None


def _load_libc():
    # Loaded before any fork: the child only calls an already-resolved function.
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    return _libc


def _die_with_parent(parent_pid: int) -> Optional[Callable[[], None]]:
    prctl = getattr(_load_libc(), "prctl", None)
    if prctl is None:  # not Linux: no parent-death signal, the process group kill remains
        return None

    def preexec() -> None:
        # SIGKILL when the parent (thread) dies; if it is already gone, do not start at all.
        if prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            os._exit(125)
        if os.getppid() != parent_pid:
            os._exit(125)

    return preexec


class NativeProcess:
    """A rank's native process. ``start()``, then ``wait()`` (or ``pump()``/``exited()`` from an
    event loop over several processes), and always ``terminate()`` in a ``finally``."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], *, pass_fds: Sequence[int] = (),
                 label: str = "", echo: bool = True, tail_lines: int = 100,
                 stream: Optional[TextIO] = None):
        self.argv = [str(a) for a in argv]
        self.env = dict(env)
        self.pass_fds = tuple(pass_fds)
        self.label = label
        self.echo = echo
        self.stream = stream
        self.tail: Deque[str] = collections.deque(maxlen=max(1, tail_lines))
        self.proc: Optional[subprocess.Popen] = None
        self.pid: Optional[int] = None
        self.returncode: Optional[int] = None
        self.timed_out = False
        self._fd: Optional[int] = None
        self._partial = b""
        self._exit_seen_at: Optional[float] = None
        self._status: Optional[int] = None
        self._reaped = False

    # --- life cycle ---
    def start(self) -> "NativeProcess":
        self.proc = subprocess.Popen(
            self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, pass_fds=self.pass_fds, close_fds=True,
            start_new_session=True, preexec_fn=_die_with_parent(os.getpid()))
        self.pid = self.proc.pid
        self._fd = self.proc.stdout.fileno()
        os.set_blocking(self._fd, False)
        return self

    def fileno(self) -> Optional[int]:
        return self._fd

    def exited(self) -> bool:
        """True once the main process has exited (it is not reaped yet: see terminate)."""
        if self._status is not None:
            return True
        if self.proc is None:
            return True
        try:
            info = os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = None
            self._status = self.proc.returncode if self.proc.returncode is not None else -1
            return True
        if info is None:
            return False
        if info.si_code == os.CLD_EXITED:
            self._status = info.si_status
        else:  # CLD_KILLED, CLD_DUMPED
            self._status = -info.si_status
        self._exit_seen_at = time.monotonic()
        return True

    def pump(self) -> bool:
        """Reads what the pipe has; returns False at end of file."""
        if self._fd is None:
            return False
        while True:
            try:
                chunk = os.read(self._fd, 65536)
            except BlockingIOError:
                return True
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                chunk = b""
            if not chunk:
                self._flush_partial()
                self._close_pipe()
                return False
            data = self._partial + chunk
            lines = data.split(b"\n")
            self._partial = lines.pop()
            for line in lines:
                self._emit(line)
            while len(self._partial) > _MAX_LINE:
                self._emit(self._partial[:_MAX_LINE])
                self._partial = self._partial[_MAX_LINE:]

    def wait(self, timeout: Optional[float] = None, should_stop: Callable[[], bool] = lambda: False,
             ) -> Optional[int]:
        """Streams output until the process exits; returns its status (negative: signal), or
        None if ``timeout`` seconds passed (``timed_out`` is then set) or ``should_stop()``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.exited():
                self._drain_after_exit()
                return self._status
            if deadline is not None and time.monotonic() >= deadline:
                self.timed_out = True
                return None
            if should_stop():
                return None
            wait_s = 0.1 if deadline is None else max(0.0, min(0.1, deadline - time.monotonic()))
            if self._fd is not None:
                ready, _, _ = select.select([self._fd], [], [], wait_s)
                if ready:
                    self.pump()
            else:
                time.sleep(wait_s)

    def terminate(self, grace: float = 2.0) -> Optional[int]:
        """SIGTERM to the process group, SIGKILL after ``grace`` seconds, then SIGKILL to the
        group again (helpers the program left behind), reap, close the pipe. Idempotent."""
        if self.proc is None:
            return None
        if self._reaped:
            return self.returncode
        if not self.exited():
            self._signal_group(signal.SIGTERM)
            end = time.monotonic() + grace
            while time.monotonic() < end and not self.exited():
                if self._fd is not None:
                    ready, _, _ = select.select([self._fd], [], [], 0.05)
                    if ready:
                        self.pump()
                else:
                    time.sleep(0.05)
        # The main process has exited (or is about to be killed); its pid still holds the group
        # id until it is reaped, so this cannot hit an unrelated group.
        self._signal_group(signal.SIGKILL)
        self.proc.wait()
        self._reaped = True
        if self._status is None:
            self._status = self.proc.returncode
        self.returncode = self._status
        if self._fd is not None:
            self.pump()
            self._flush_partial()
            self._close_pipe()
        return self.returncode

    # --- output ---
    def output_tail(self) -> str:
        return "\n".join(self.tail)

    def _emit(self, raw: bytes) -> None:
        line = raw.decode("utf-8", errors="replace").rstrip("\r")
        self.tail.append(line)
        if self.echo:
            stream = self.stream or sys.stdout
            try:
                stream.write(f"[{self.label}] {line}\n" if self.label else line + "\n")
                stream.flush()
            except (OSError, ValueError):
                pass

    def _flush_partial(self) -> None:
        if self._partial:
            self._emit(self._partial)
            self._partial = b""

    def _drain_after_exit(self) -> None:
        # Output still in the pipe; a helper of the program may keep the pipe open, so stop
        # waiting for end of file half a second after the exit.
        end = time.monotonic() + 0.5
        while self._fd is not None and time.monotonic() < end:
            ready, _, _ = select.select([self._fd], [], [], max(0.0, end - time.monotonic()))
            if ready and not self.pump():
                break

    def _close_pipe(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            try:
                self.proc.stdout.close()
            except OSError:
                pass
        self._fd = None

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
