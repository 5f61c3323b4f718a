"""One rank process: started with the environment contract under a supervisor, its output
streamed line by line with a tail kept, and never left behind.

* The rank runs under :mod:`kolo_spark.supervisor`, which the task starts in a session of its own
  (``start_new_session``) with ``PR_SET_PDEATHSIG=SIGTERM``: a Spark executor that SIGKILLs the
  Python worker makes the supervisor stop the rank and everything it started, detached daemons
  included (the supervisor is their child subreaper).
* Every output line goes to ``on_line(line)`` (echo into the executor log, the driver's log
  stream) and into a tail of ``tail_lines`` lines.
* The supervisor's exit is observed with ``waitid(WNOWAIT)``, so its pid (the session's id)
  stays reserved until the session has been signalled; only then is it reaped.
* The parent's ``os.environ`` is never touched (Spark reuses Python workers): the rank gets an
  explicit environment.
"""

from __future__ import annotations

import collections
import ctypes
import ctypes.util
import errno
import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Callable, Deque, List, Mapping, Optional, Sequence, TextIO

_PR_SET_PDEATHSIG = 1
_MAX_LINE = 64 * 1024  # a longer line is kept in pieces

_libc = None


def _load_libc():
    # Loaded before any fork: the child only calls an already-resolved function.
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    return _libc


def _die_with_parent(parent_pid: int, sig: int = signal.SIGKILL) -> Optional[Callable[[], None]]:
    prctl = getattr(_load_libc(), "prctl", None)
    if prctl is None:  # not Linux: no parent-death signal, the process group kill remains
        return None

    def preexec() -> None:
        # `sig` when the parent (thread) dies; if it is already gone, do not start at all.
        if prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            os._exit(125)
        if os.getppid() != parent_pid:
            os._exit(125)

    return preexec


def package_parent() -> str:
    """The directory (or zip, when shipped with sc.addPyFile) that holds kolo_spark."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class StartError(OSError):
    """The rank's program could not be started (missing, not executable, ...)."""


def _python() -> str:
    return sys.executable or "python3"


class NativeProcess:
    """A rank's process, under a supervisor. ``start()``, then ``wait()`` (or ``pump()``/
    ``exited()`` from an event loop over several processes), and always ``terminate()`` in a
    ``finally``.

    ``pid`` is the supervisor's (the id of the session and process group it leads); ``rank_pid``
    the program's. ``returncode`` is the program's exit status (negative: killed by that
    signal). ``leftovers`` lists the processes the program left running when it exited, which
    the supervisor ended (``{"pid", "name", "detached"}``)."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], *, pass_fds: Sequence[int] = (),
                 label: str = "", echo: bool = True, tail_lines: int = 100,
                 stream: Optional[TextIO] = None,
                 on_line: Optional[Callable[[str], None]] = None, kill_grace: float = 2.0,
                 start_timeout: float = 60.0, hold_fds: Sequence[int] = ()):
        self.argv = [str(a) for a in argv]
        self.env = dict(env)
        self.pass_fds = tuple(pass_fds)
        self.hold_fds = tuple(hold_fds)
        self.label = label
        self.echo = echo
        self.stream = stream
        self.on_line = on_line
        self.kill_grace = kill_grace
        self.start_timeout = start_timeout
        self.tail: Deque[str] = collections.deque(maxlen=max(1, tail_lines))
        self.proc: Optional[subprocess.Popen] = None
        self.pid: Optional[int] = None
        self.rank_pid: Optional[int] = None
        self.returncode: Optional[int] = None
        self.timed_out = False
        self.leftovers: List[dict] = []
        self.started_at: Optional[float] = None  # wall clock (time.time()) of the launch
        self.ended_at: Optional[float] = None
        # time.time() when the supervisor reaped the program (before ending what it left)
        self.exited_at: Optional[float] = None
        self._fd: Optional[int] = None
        self._status_fd: Optional[int] = None
        self._status_buf = b""
        self._final: Optional[dict] = None
        self._partial = b""
        self._status: Optional[int] = None
        self._reaped = False

    # --- life cycle ---
    def start(self) -> "NativeProcess":
        """Starts the supervisor and, through it, the program. Raises StartError when the
        program cannot be started (the supervisor is gone again by then)."""
        status_r, status_w = os.pipe()
        env = {"PATH": os.environ.get("PATH", os.defpath), "PYTHONPATH": package_parent(),
               "PYTHONDONTWRITEBYTECODE": "1"}
        self.started_at = time.time()
        try:
            self.proc = subprocess.Popen(
                [_python(), "-S", "-m", "kolo_spark.supervisor", str(status_w)], env=env,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                pass_fds=(status_w, *self.pass_fds), close_fds=True, start_new_session=True,
                preexec_fn=_die_with_parent(os.getpid(), signal.SIGTERM))
        finally:
            os.close(status_w)
        self.pid = self.proc.pid
        self._status_fd = status_r
        self._fd = self.proc.stdout.fileno()
        os.set_blocking(self._fd, False)
        spec = {"argv": self.argv, "env": self.env, "pass_fds": list(self.pass_fds),
                "hold_fds": list(self.hold_fds), "grace": self.kill_grace, "label": self.label or "the rank"}
        try:
            self.proc.stdin.write((json.dumps(spec) + "\n").encode())
            self.proc.stdin.flush()  # stays open: its end of file tells the supervisor we are gone
        except OSError:
            pass
        deadline = time.monotonic() + self.start_timeout
        while self.rank_pid is None:
            msg = self._read_status(max(0.0, deadline - time.monotonic()))
            if msg is None:  # the supervisor died or never answered
                self.terminate(0.5)
                raise StartError(errno.EIO, "the rank supervisor did not start the program "
                                 f"(supervisor {describe_status(self._status)})")
            if "start_error" in msg:
                self.terminate(0.5)
                raise StartError(errno.ENOENT, msg["start_error"])
            if "started" in msg:
                self.rank_pid = int(msg["started"])
        return self

    def _read_status(self, timeout: float) -> Optional[dict]:
        """The next status message, waiting up to ``timeout``; None at end of file/timeout."""
        end = time.monotonic() + timeout
        while b"\n" not in self._status_buf:
            if self._status_fd is None:
                return None
            fds = [self._status_fd] + ([self._fd] if self._fd is not None else [])
            ready, _, _ = select.select(fds, [], [], max(0.0, end - time.monotonic()))
            if self._fd is not None and self._fd in ready:
                self.pump()
            if self._status_fd in ready:
                try:
                    chunk = os.read(self._status_fd, 65536)
                except OSError:
                    chunk = b""
                if not chunk:
                    os.close(self._status_fd)
                    self._status_fd = None
                    continue
                self._status_buf += chunk
            elif time.monotonic() >= end:
                return None
        line, self._status_buf = self._status_buf.split(b"\n", 1)
        try:
            msg = json.loads(line)
        except ValueError:
            return {}
        if "exit" in msg:
            self._final = msg
        return msg

    def fileno(self) -> Optional[int]:
        return self._fd

    def exited(self) -> bool:
        """True once the supervisor has exited (it is not reaped yet: see terminate)."""
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
        """Streams output until the program exits; returns its status (negative: signal), or
        None if ``timeout`` seconds passed (``timed_out`` is then set) or ``should_stop()``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self.exited():
                self._drain_after_exit()
                self._finish()
                return self.returncode
            if deadline is not None and time.monotonic() >= deadline:
                self.timed_out = True
                return None
            if should_stop():
                return None
            wait_s = 0.1 if deadline is None else max(0.0, min(0.1, deadline - time.monotonic()))
            fds = [fd for fd in (self._fd, self._status_fd) if fd is not None]
            if fds:
                ready, _, _ = select.select(fds, [], [], wait_s)
                if self._fd is not None and self._fd in ready:
                    self.pump()
                if self._status_fd is not None and self._status_fd in ready:
                    self._read_status(0)
            else:
                time.sleep(wait_s)

    def terminate(self, grace: Optional[float] = None) -> Optional[int]:
        """Stops the program and everything it started: SIGTERM to the supervisor, which sends
        SIGTERM to the program's group and SIGKILL after ``grace`` seconds to whatever is left,
        detached processes included; SIGKILL to the supervisor's group if it does not finish
        within ``grace`` + 5 s. Then reaps, reads the last status and closes the pipes.
        Idempotent; returns the program's status."""
        if self.proc is None:
            return None
        if self._reaped:
            return self.returncode
        grace = self.kill_grace if grace is None else grace
        if not self.exited():
            self._signal(signal.SIGTERM)
            end = time.monotonic() + grace + 5.0
            while time.monotonic() < end and not self.exited():
                fds = [fd for fd in (self._fd, self._status_fd) if fd is not None]
                if fds:
                    ready, _, _ = select.select(fds, [], [], 0.05)
                    if self._fd is not None and self._fd in ready:
                        self.pump()
                    if self._status_fd is not None and self._status_fd in ready:
                        self._read_status(0)
                else:
                    time.sleep(0.05)
        # The supervisor has exited (or is about to be killed); its pid still holds the group
        # id until it is reaped, so this cannot hit an unrelated group.
        self._signal_group(signal.SIGKILL)
        self.proc.wait()
        self._reaped = True
        if self._status is None:
            self._status = self.proc.returncode
        self._drain_after_exit()
        self._finish()
        if self._fd is not None:
            self.pump()
            self._flush_partial()
            self._close_pipe()
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        if self._status_fd is not None:
            os.close(self._status_fd)
            self._status_fd = None
        return self.returncode

    def _finish(self) -> None:
        """The program's status, once the supervisor has exited."""
        if self._final is None:
            while self._status_fd is not None and self._final is None:
                if self._read_status(0.5) is None:
                    break
        if self._final is not None:
            self.returncode = int(self._final["exit"])
            self.leftovers = list(self._final.get("leftovers") or ())
            if self._final.get("exited_at") is not None:
                self.exited_at = float(self._final["exited_at"])
        elif self.returncode is None:
            self.returncode = self._status
        if self.ended_at is None:
            self.ended_at = time.time()
        if self.exited_at is None:
            self.exited_at = self.ended_at

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
        if self.on_line is not None:
            self.on_line(line)

    def _flush_partial(self) -> None:
        if self._partial:
            self._emit(self._partial)
            self._partial = b""

    def _drain_after_exit(self) -> None:
        # Output still in the pipe. The supervisor ends everything the program left before it
        # exits, so end of file comes at once; half a second bounds it all the same.
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

    def _signal(self, sig: int) -> None:
        try:
            os.kill(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def describe_status(status: Optional[int]) -> str:
    if status is None:
        return "status unknown"
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exited with code {status}"
