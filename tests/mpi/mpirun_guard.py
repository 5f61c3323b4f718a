#!/usr/bin/env python3
"""Runs an mpirun/mpiexec command for tests/mpi (used by tests/common/run_expect.cmake).

    mpirun_guard.py [--timeout S] [--grace S] -- mpiexec ...

The command's stdout and stderr are merged and passed through as they arrive. The guard exits
with the command's exit status, except:

  * Open MPI 4.1's mpiexec can hang in its own teardown (orte_finalize / PMIx) after it has
    printed its end-of-job report ("mpiexec detected that one or more processes exited with
    non-zero status", "mpiexec noticed that process rank N ... exited on signal", ...). ORTE
    prints that report only once every process of the job has ended, so the job is over: the
    guard gives mpiexec --grace seconds to exit, then kills it and exits 1, a non-zero end of
    the job (the earlier "Per user-direction, the job has been aborted" line is printed while
    the other ranks are still being killed, so it does not count as the report).
  * mpiexec killed by a signal: a line "-- mpirun_guard: mpiexec was killed by signal N (NAME)"
    and exit status 128 + N.
  * the job still running after --timeout seconds (a hang): everything is killed, a line
    "-- mpirun_guard: the job did not end within S s" and exit status 124.

mpiexec runs in a session of its own; Open MPI puts each rank in a process group of its own,
but the ranks stay in that session, so the guard kills the whole session (and anything still
descending from mpiexec), never leaving an orphaned rank behind, whichever way the job ends;
when mpiexec did not exit by itself, its session directory goes too.
"""
import argparse
import glob
import os
import re
import signal
import shutil
import subprocess
import sys
import threading
import time

# Open MPI's end-of-job report (help-orterun.txt, printed by orte_quit once the job is over);
# the first word is mpiexec's own name (mpiexec, mpirun, orterun, mpiexec.openmpi, ...).
END_OF_JOB = re.compile(
    rb"\S+ (?:noticed that (?:process rank \d+|the job aborted)"
    rb"|detected that one or more processes exited with non-zero status"
    rb"|has exited due to (?:process rank \d+|a process exiting without))")

TIMEOUT_EXIT = 124
TEARDOWN_HANG_EXIT = 1

_out_lock = threading.Lock()


def emit(data):
    with _out_lock:
        try:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        except OSError:  # our reader went away: keep draining the job's output regardless
            pass


def say(text):
    emit(text.encode() + b"\n")


class Reader(threading.Thread):
    """Copies the command's output to our stdout and notes when the end-of-job report appears."""

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream = stream
        self.report_at = None  # time.monotonic() when the end-of-job report was first seen

    def run(self):
        partial = b""
        fd = self.stream.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            emit(chunk)
            lines = (partial + chunk).split(b"\n")
            partial = lines[-1][-4096:]
            if self.report_at is None and any(END_OF_JOB.search(line) for line in lines):
                self.report_at = time.monotonic()
        if partial:
            emit(b"\n")


def job_pids(leader, leader_alive):
    """Live (non-zombie) processes of the job: those in the session of mpiexec (the leader) and,
    while mpiexec lives, its descendants. Empty when there is no /proc (kill_job then relies on
    killpg alone)."""
    procs = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return set()
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry, "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp session ...; comm may contain spaces and parentheses
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) < 4:
            continue
        procs[int(entry)] = (fields[0], int(fields[1]), int(fields[3]))
    found = {pid for pid, (_, _, sid) in procs.items() if sid == leader}
    if leader_alive and leader in procs:
        found.add(leader)
    grew = leader_alive
    while grew:
        grew = False
        for pid, (_, ppid, _) in procs.items():
            if ppid in found and pid not in found:
                found.add(pid)
                grew = True
    found.discard(os.getpid())
    return {pid for pid in found if procs[pid][0] not in (b"Z", b"X")}


def kill_job(proc, gentle):
    """Ends every process of the job: SIGTERM first when gentle (mpiexec then kills its ranks
    and removes its session directory), SIGKILL for whatever is left."""
    steps = [(signal.SIGTERM, 3.0)] if gentle else []
    steps.append((signal.SIGKILL, 5.0))
    for sig, patience in steps:
        alive = proc.poll() is None
        targets = job_pids(proc.pid, alive)
        if alive:
            targets.add(proc.pid)
        for pid in targets:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        if alive:  # (once mpiexec is reaped, its pid, and so its group's id, may be reused)
            try:
                os.killpg(proc.pid, sig)
            except OSError:
                pass
        end = time.monotonic() + patience
        while time.monotonic() < end:
            if proc.poll() is not None and not job_pids(proc.pid, False):
                return
            time.sleep(0.05)


def remove_session_dir(pid):
    """Removes what a killed or crashed mpiexec leaves in its ORTE session directory
    ($TMPDIR/ompi.<host>.<uid>/pid.<pid>: PMIx's shared-memory stores, some MB each)."""
    base = os.environ.get("TMPDIR") or "/tmp"
    for top in glob.glob(os.path.join(base, "ompi.*.%d" % os.getuid())):
        shutil.rmtree(os.path.join(top, "pid.%d" % pid), ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="kill the job after this many seconds (default 600)")
    ap.add_argument("--grace", type=float, default=5.0,
                    help="seconds mpiexec may take to exit after its end-of-job report")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        ap.error("no command given")

    start = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as e:
        say("-- mpirun_guard: cannot run %s: %s" % (cmd[0], e))
        return 127
    reader = Reader(proc.stdout)
    reader.start()

    stop = []

    def on_signal(signum, _frame):
        stop.append(signum)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)

    verdict = None
    while True:
        try:
            proc.wait(timeout=0.1)
            break
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if stop:
            verdict = "signal"
            kill_job(proc, gentle=True)
            break
        if reader.report_at is not None and now - reader.report_at >= args.grace:
            verdict = "teardown"
            kill_job(proc, gentle=False)
            break
        if now - start >= args.timeout:
            verdict = "timeout"
            kill_job(proc, gentle=True)
            break

    # mpiexec is gone; leave nothing of the job behind (ranks of a crashed mpiexec included).
    kill_job(proc, gentle=False)
    reader.join(timeout=5.0)
    if verdict is not None or proc.returncode < 0:
        remove_session_dir(proc.pid)
    elapsed = time.monotonic() - start

    if verdict == "teardown":
        say("-- mpiexec hung in its own teardown after reporting the job's end: killed after a "
            "%g s grace, counted as a non-zero exit (%d)" % (args.grace, TEARDOWN_HANG_EXIT))
        return TEARDOWN_HANG_EXIT
    if verdict == "timeout":
        say("-- mpirun_guard: the job did not end within %g s: killed (%.1f s)"
            % (args.timeout, elapsed))
        return TIMEOUT_EXIT
    if verdict == "signal":
        say("-- mpirun_guard: interrupted by signal %d: the job was killed" % stop[0])
        return 128 + stop[0]
    rc = proc.returncode
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = "?"
        say("-- mpirun_guard: mpiexec was killed by signal %d (%s)" % (-rc, name))
        return 128 - rc
    return rc


if __name__ == "__main__":
    sys.exit(main())
