#!/usr/bin/env python3
"""Self-test of mpirun_guard.py with fake mpiexecs (no MPI needed):

    mpirun_guard_selftest.py [--cmake CMAKE]

Each case runs the guard on a small Python program that behaves like mpiexec would, and checks
the guard's exit status, its lines, how long it took and that no process of the fake job (a
"rank" in a process group of its own, as Open MPI's launcher makes them) is left. With --cmake,
the teardown hang also goes through tests/common/run_expect.cmake, as the mpi/faults tests do.
"""
import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GUARD = os.path.join(HERE, "mpirun_guard.py")

REPORT = """\
--------------------------------------------------------------------------
mpiexec detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[14732,1],2]
  Exit code:    2
--------------------------------------------------------------------------
"""
USER_DIRECTION = """\
--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
"""

# The fake mpiexec: starts a "rank" (sleeps, in a process group of its own) when asked, says
# "rank pid N", prints its text to stderr, then does what it is told.
FAKE = r"""
import os, signal, subprocess, sys, time
text, then, rank = sys.argv[1], sys.argv[2], sys.argv[3] == "rank"
if rank:
    r = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                         preexec_fn=lambda: os.setpgid(0, 0))
    print("rank pid %d" % r.pid, flush=True)
sys.stderr.write(text)
sys.stderr.flush()
if then == "hang":
    time.sleep(300)
elif then == "sigkill":
    os.kill(os.getpid(), signal.SIGKILL)
else:
    sys.exit(int(then))
"""


def fake(text, then, rank=False):
    return [sys.executable, "-c", FAKE, text, then, "rank" if rank else "none"]


def gone(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rfind(")") + 2] in "ZX"


failures = []


def case(name, cmd, rc, says=(), not_says=(), max_s=None, min_s=None, guard_args=()):
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, GUARD] + list(guard_args) + ["--"] + cmd,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    secs = time.monotonic() - t0
    out = p.stdout.decode(errors="replace")
    problems = []
    if p.returncode != rc:
        problems.append("exit status %d, expected %d" % (p.returncode, rc))
    problems += ["no %r in the output" % s for s in says if s not in out]
    problems += ["%r in the output" % s for s in not_says if s in out]
    if max_s is not None and secs > max_s:
        problems.append("took %.1f s, more than %g s" % (secs, max_s))
    if min_s is not None and secs < min_s:
        problems.append("took %.1f s, less than %g s" % (secs, min_s))
    for line in out.splitlines():
        if line.startswith("rank pid "):
            pid = int(line.split()[2])
            deadline = time.monotonic() + 2
            while not gone(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not gone(pid):
                problems.append("the rank (pid %d) was left running" % pid)
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass
    print("%s %s (%.1f s)" % ("FAIL" if problems else "ok  ", name, secs))
    if problems:
        print("    " + "\n    ".join(problems))
        print("    output:\n      " + "\n      ".join(out.splitlines()))
        failures.append(name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cmake", help="also run the teardown hang through run_expect.cmake")
    args = ap.parse_args()

    hung = "hung in its own teardown after reporting the job's end"
    case("exit status passed through", fake("hello\n", "7"), 7, says=["hello"],
         not_says=["-- mpi"], max_s=10)
    case("end-of-job report, then a prompt exit", fake(REPORT, "2"), 2, says=["Exit code:    2"],
         not_says=[hung], max_s=4)
    case("teardown hang after the end-of-job report (default 5 s grace)",
         fake(USER_DIRECTION + REPORT, "hang"), 1, says=[REPORT, hung], max_s=15, min_s=4.5)
    case("'Per user-direction' alone is no end of the job: a hang at the limit",
         fake(USER_DIRECTION, "hang", rank=True), 124,
         says=["Per user-direction", "-- mpirun_guard: the job did not end within 4 s"],
         not_says=[hung], max_s=15, min_s=3.5, guard_args=["--timeout", "4", "--grace", "1"])
    case("a real hang: killed at the limit, rank included", fake("", "hang", rank=True), 124,
         says=["-- mpirun_guard: the job did not end within 3 s"], max_s=12, min_s=2.5,
         guard_args=["--timeout", "3"])
    case("mpiexec killed by a signal: reported, its rank killed", fake("", "sigkill", rank=True),
         137, says=["-- mpirun_guard: mpiexec was killed by signal 9 (SIGKILL)"], max_s=10)

    if args.cmake:
        t0 = time.monotonic()
        p = subprocess.run([args.cmake, "-DEXPECT=nonzero", "-DREGEX=" + hung, "-DMAX_SECONDS=15",
                            "-DPYTHON=" + sys.executable, "-DMPI_GUARD=" + GUARD, "-P",
                            os.path.join(HERE, "..", "common", "run_expect.cmake"), "--"]
                           + fake(REPORT, "hang"),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        secs = time.monotonic() - t0
        ok = p.returncode == 0 and secs < 15
        print("%s run_expect.cmake passes a teardown hang as a non-zero end (%.1f s)"
              % ("ok  " if ok else "FAIL", secs))
        if not ok:
            print("    exit status %d; output:\n      " % p.returncode
                  + "\n      ".join(p.stdout.decode(errors="replace").splitlines()))
            failures.append("cmake")

    if failures:
        print("%d case(s) failed" % len(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
