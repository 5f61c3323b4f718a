"""The rank supervisor: a small process between the task (or local-mode driver) and each rank.

    task ──▶ supervisor (own session; child subreaper) ──▶ rank program (own process group)

Why a process of its own: Spark ends a cancelled task by SIGKILLing its Python worker, so no
``finally`` of the task runs; ``PR_SET_PDEATHSIG`` takes the worker's direct child along, but not
what that child started, and not the daemons a rank detaches with ``setsid`` (they leave its
process group and session). The supervisor

* is a **child subreaper** (``PR_SET_CHILD_SUBREAPER``): every process the rank starts, detached
  or not, is re-parented to it when its own parent exits, so it can find them all;
* gets ``SIGTERM`` when the thread that started it dies (``PR_SET_PDEATHSIG``) and sees end of
  file on its stdin (a pipe the task holds): either way it stops the rank (SIGTERM, then SIGKILL
  after the grace period) and every descendant, and exits;
* when the rank exits by itself, ends what the rank left running and reports each such process
  by pid and name (``detached`` when it had left the rank's session) on the output stream.

Protocol (stdlib only: it runs as ``python -S -m kolo_spark.supervisor STATUS_FD``):

* stdin: one JSON line ``{"argv", "env", "pass_fds", "hold_fds", "grace", "label"}``, then
  nothing; end of file means the task is gone. ``pass_fds`` go to the rank; the supervisor keeps
  its own copies of ``hold_fds`` only (the driver's liveness connection: it closes when the
  supervisor, the last process of the rank, is gone).
* stdout/stderr: the output pipe, shared with the rank (the task streams it).
* STATUS_FD: JSON lines for the task: ``{"started": pid}`` or ``{"start_error": text}``, then
  ``{"exit": status, "leftovers": [...], "exited_at": t}`` (status: exit code, or -signal;
  ``t``: ``time.time()`` when the program was reaped, before its leftovers were ended).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import select
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _prctl():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):  # not Linux
        return None


def _proc_table():
    """{pid: (ppid, sid, comm, live)} of every process we can see; ``live`` is False for a zombie
    (or a thread group whose leader has exited while other threads still run: its children keep
    it as their parent until the last thread is gone, so the tree walk must go through it)."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                raw = f.read().decode("utf-8", "replace")
        except OSError:
            continue
        head, _, tail = raw.rpartition(")")
        fields = tail.split()
        if len(fields) < 4:
            continue
        table[int(name)] = (int(fields[1]), int(fields[3]), head.partition("(")[2],
                            fields[0] not in ("Z", "X"))
    return table


def _walk(root: int):
    """[(pid, sid, comm, live)] of every descendant of ``root``, zombies included."""
    table = _proc_table()
    children = {}
    for pid, (ppid, _, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        if pid in table:
            _, sid, comm, live = table[pid]
            out.append((pid, sid, comm, live))
            todo.extend(children.get(pid, ()))
    return out


def descendants(root: int):
    """[(pid, sid, comm)] of the live descendants of ``root`` (zombies excluded, but walked
    through: a multi-threaded rank killed by a signal shows as a zombie while its last threads
    exit, and the daemons it started are still its children then)."""
    return [(pid, sid, comm) for pid, sid, comm, live in _walk(root) if live]


def _names(procs) -> str:
    return ", ".join(f"{p['pid']} ({p['name']}"
                     f"{', detached from the session' if p['detached'] else ''})" for p in procs)


class Supervisor:
    def __init__(self, status_fd: int):
        self.status_fd = status_fd
        self.stop_reason = ""
        self.rank = None
        self.rank_status = None
        self.rank_exited_at = None  # time.time() when the program was reaped
        self.me = os.getpid()
        self.sid = os.getsid(0)
        self.wake_r, self.wake_w = os.pipe()
        self.stdin_closed = False
        os.set_blocking(self.wake_w, False)

    def status(self, **msg) -> None:
        try:
            os.write(self.status_fd, (json.dumps(msg) + "\n").encode())
        except OSError:
            pass

    def say(self, text: str) -> None:
        try:
            os.write(1, (text + "\n").encode("utf-8", "replace"))
        except OSError:
            pass

    def _on_stop(self, signum, frame) -> None:
        if not self.stop_reason:
            self.stop_reason = signal.Signals(signum).name

    def reap(self) -> bool:
        """Reaps every exited child (the rank and adopted orphans) without blocking; True while
        any child is left. As the child subreaper, the supervisor inherits every orphan of the
        rank's tree: no child left means no process of the rank left."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return False
            except InterruptedError:
                continue
            if pid == 0:
                return True
            if self.rank is not None and pid == self.rank.pid:
                self.rank_status = (os.WEXITSTATUS(status) if os.WIFEXITED(status)
                                    else -os.WTERMSIG(status) if os.WIFSIGNALED(status) else -1)
                self.rank_exited_at = time.time()

    def wait_events(self, timeout: float) -> None:
        """Sleeps until a signal (SIGCHLD, SIGTERM, ...), stdin activity, or ``timeout``. Stdin
        is watched until its end of file (then it would be ready at once, every time)."""
        watch = [self.wake_r] if self.stdin_closed else [0, self.wake_r]
        try:
            ready, _, _ = select.select(watch, [], [], max(0.0, timeout))
        except InterruptedError:
            return
        if self.wake_r in ready:
            try:
                os.read(self.wake_r, 512)
            except OSError:
                pass
        if 0 in ready:
            try:
                data = os.read(0, 512)
            except OSError:
                data = b""
            if not data:
                self.stdin_closed = True
                if not self.stop_reason:
                    self.stop_reason = "task gone"

    def signal_all(self, sig: int) -> list:
        """``sig`` to every descendant, zombies too (a zombie leader whose other threads still
        run takes a signal for the whole process; a real zombie ignores it, and its pid cannot
        be reused before it is reaped). Returns the live ones it found."""
        procs = _walk(self.me)
        for pid, _, _, _ in procs:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        return [(pid, sid, comm) for pid, sid, comm, live in procs if live]

    def end_all(self, grace: float) -> None:
        """SIGTERM to every descendant, SIGKILL after ``grace`` seconds, until no child is left.

        Done means no child at all, not "no live process in the walk": a process that is
        exiting (a multi-threaded rank whose main thread is gone) is not live, yet it still runs
        threads and holds its children, which come to the supervisor only when its last thread
        has exited."""
        if self.signal_all(signal.SIGTERM):
            end = time.monotonic() + grace
            while time.monotonic() < end:
                if not self.reap():
                    break
                if not descendants(self.me):
                    self.wait_events(0.01)  # exiting: wait for it to be reaped
                    continue
                self.wait_events(min(0.1, end - time.monotonic()))
        end = time.monotonic() + 10.0  # bounded: a process forking as fast as we kill
        while self.reap() and time.monotonic() < end:
            self.signal_all(signal.SIGKILL)
            time.sleep(0.01)

    def run(self, spec: dict) -> int:
        prctl = _prctl()
        if prctl is not None:
            prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, self._on_stop)
        signal.signal(signal.SIGCHLD, lambda s, f: None)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)

        label = spec.get("label", "rank")
        grace = float(spec.get("grace", 2.0))
        pass_fds = tuple(int(fd) for fd in spec.get("pass_fds", ()))
        me = self.me

        def preexec() -> None:
            os.setpgid(0, 0)  # its own group inside our session: signalled without us
            if prctl is not None:
                prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != me:
                os._exit(125)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])

        try:
            self.rank = subprocess.Popen(
                spec["argv"], env=spec["env"], stdin=subprocess.DEVNULL, stdout=1, stderr=2,
                pass_fds=pass_fds, close_fds=True, preexec_fn=preexec)
        except (OSError, subprocess.SubprocessError) as e:
            text = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            self.status(start_error=text)
            return 127
        hold = {int(fd) for fd in spec.get("hold_fds", ())}
        for fd in set(pass_fds) - hold:  # the rank holds them now; ours would keep them alive
            try:
                os.close(fd)
            except OSError:
                pass
        self.status(started=self.rank.pid)

        while self.rank_status is None and not self.stop_reason:
            self.reap()
            if self.rank_status is not None:
                break
            self.wait_events(5.0)
            if os.getppid() == 1 and not self.stop_reason:  # adopted by init: the task is gone
                self.stop_reason = "task gone"

        leftovers = []
        if self.rank_status is None:  # told to stop: the rank first, then everything else
            detached = [{"pid": pid, "name": comm, "detached": True}
                        for pid, sid, comm in descendants(me) if sid != self.sid]
            if detached:
                self.say(f"kolo_spark: stopping {label} ({self.stop_reason}) and the processes "
                         f"it detached: {_names(detached)}")
            leftovers = detached
            try:
                os.killpg(self.rank.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass
            self.end_all(grace)
        else:
            procs = descendants(me)
            if procs:
                leftovers = [{"pid": pid, "name": comm, "detached": sid != self.sid}
                             for pid, sid, comm in procs]
                self.say(f"kolo_spark: {label} exited but left {len(procs)} process"
                         f"{'es' if len(procs) != 1 else ''} running: {_names(leftovers)}; "
                         "ending them")
                self.end_all(min(grace, 1.0))
            elif self.reap():  # only exiting processes (zombie leaders) left: end them too
                self.end_all(min(grace, 1.0))
        self.reap()
        status = self.rank_status if self.rank_status is not None else -signal.SIGKILL
        self.status(exit=status, leftovers=leftovers, stopped=self.stop_reason,
                    exited_at=self.rank_exited_at)
        return 0


def main(argv) -> int:
    status_fd = int(argv[1])
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(0, 65536)
        if not chunk:
            return 125  # the task went away before saying what to run
        line += chunk
    spec = json.loads(line)
    return Supervisor(status_fd).run(spec)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
