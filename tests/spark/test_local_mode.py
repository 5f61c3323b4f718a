"""local_mode=True: the ranks run as subprocesses of the driver (no Spark job), through the same
environment contract and process handling as the barrier tasks."""

import json
import os
import re
import subprocess
import sys
import time

import pytest

import kolo_spark
from conftest import DEMO_LINE, kill_leftovers, process_gone, read_pids, wait_gone

ENV = {"KOLO_TIMEOUT_SECONDS": "60"}


def test_demo_exact_on_every_rank(demo_bin):
    environ_before = dict(os.environ)
    result = kolo_spark.run(None, 4, demo_bin, ["4099"], env=ENV, local_mode=True, echo=False,
                            collect_output="all")
    assert os.environ == environ_before
    assert result.exit_codes == [0, 0, 0, 0]
    for r, rank in enumerate(result.ranks):
        m = re.search(DEMO_LINE, rank.output)
        assert m, rank.output
        assert [int(x) for x in m.groups()[:6]] == [r, 4, r, 4, 0, 1]
        assert "correct" in m.group(7) and "expected 10" in m.group(7)
        assert (rank.local_rank, rank.local_size, rank.cross_rank, rank.cross_size) == (r, 4, 0, 1)
    assert result.output == result.ranks[0].output


def test_rank_exit_3_raises_and_leaves_nothing(demo_bin, tmp_path):
    script = (f'echo $$ > {tmp_path}/pid.$KOLO_RANK; '
              'if [ "$KOLO_RANK" = 1 ]; then echo "rank 1 gives up"; exit 3; fi; '
              'exec "$0" "$@"')
    t0 = time.monotonic()
    with pytest.raises(kolo_spark.RankFailedError) as caught:
        kolo_spark.run(None, 3, ["sh", "-c", script, demo_bin], ["1000"], env=ENV,
                       local_mode=True, echo=False, kill_grace=1.0)
    err = caught.value
    assert (err.rank, err.exit_code, err.reason) == (1, 3, "exit")
    assert "rank 1 exited with code 3" in str(err) and "rank 1 gives up" in str(err)
    assert time.monotonic() - t0 < 30
    pids = read_pids(tmp_path, 3)
    assert 1 in pids  # the others may be killed before their shell writes its pid: fine
    left = wait_gone(pids.values(), 0.5)
    kill_leftovers(left)
    assert left == []


def test_timeout_kills_the_ranks(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(kolo_spark.RankFailedError, match=r"timed out \(timeout=1s\)") as caught:
        kolo_spark.run(None, 2, ["sh", "-c", f"echo $$ > {tmp_path}/pid.$KOLO_RANK; exec sleep 60"],
                       local_mode=True, echo=False, timeout=1, kill_grace=0.5)
    assert caught.value.reason == "timeout"
    assert time.monotonic() - t0 < 10
    assert wait_gone(read_pids(tmp_path, 2).values(), 0.5) == []


def test_helpers_of_a_rank_die_with_its_process_group(tmp_path):
    # The rank exits at once but leaves a helper behind in its process group.
    script = f"sleep 60 & echo $! > {tmp_path}/pid.$KOLO_RANK; exit 0"
    result = kolo_spark.run(None, 2, ["sh", "-c", script], local_mode=True, echo=False)
    assert result.exit_codes == [0, 0]
    pids = read_pids(tmp_path, 2)
    left = wait_gone(pids.values(), 2.0)
    kill_leftovers(left)
    assert left == []


def test_rank_dies_with_its_parent(tmp_path):
    # PR_SET_PDEATHSIG: SIGKILL the Python process that started a rank (as Spark kills a Python
    # worker) and the rank goes too, although no finally ran.
    code = ("import os, sys, time\n"
            f"sys.path.insert(0, {os.path.dirname(kolo_spark.__path__[0])!r})\n"
            "from kolo_spark.process import NativeProcess\n"
            "p = NativeProcess(['sleep', '60'], dict(os.environ), echo=False).start()\n"
            "print(p.pid, flush=True)\n"
            "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert not process_gone(child)
        assert os.getpgid(child) == child  # its own process group
        parent.kill()
        parent.wait()
        left = wait_gone([child], 3.0)
        kill_leftovers(left)
        assert left == []
    finally:
        parent.kill()
        parent.wait()


def test_gpus_split_among_ranks():
    result = kolo_spark.run(None, 2, ["sh", "-c", 'echo "devices=$KOLO_DEVICES"'], local_mode=True,
                            echo=False, collect_output="all", local_gpus=[0, 1, 2, 3])
    assert [r.devices for r in result.ranks] == [("0", "1"), ("2", "3")]
    assert [r.output for r in result.ranks] == ["devices=0,1", "devices=2,3"]
    with pytest.raises(kolo_spark.ConfigurationError, match="every rank needs at least one"):
        kolo_spark.run(None, 3, "true", local_mode=True, local_gpus=[0, 1])


def test_contract_seen_by_the_program():
    shown = "KOLO_RANK KOLO_SIZE KOLO_LOCAL_RANK KOLO_LOCAL_SIZE KOLO_CROSS_RANK KOLO_CROSS_SIZE " \
            "KOLO_PEERS KOLO_LISTEN_FD KOLO_HOST_KEY"
    script = "; ".join(f'echo "{v}=${v}"' for v in shown.split()) + \
        '; echo "secret=$KOLO_SECRET"; ' \
        'if [ -S /proc/self/fd/$KOLO_LISTEN_FD ]; then echo listen_is_socket=yes; fi'
    result = kolo_spark.run(None, 2, ["bash", "-c", script], local_mode=True, echo=False,
                            collect_output="all", tail_lines=50)
    again = kolo_spark.run(None, 2, ["bash", "-c", script], local_mode=True, echo=False,
                           collect_output="all", tail_lines=50)
    secrets = {line for r in result.ranks for line in r.output.splitlines()
               if line.startswith("secret=")}
    assert len(secrets) == 1  # one job secret, the same on every rank
    assert re.fullmatch(r"secret=[0-9a-f]{64}", secrets.pop())
    assert not ({line for line in again.ranks[0].output.splitlines() if line.startswith("secret=")}
                & {line for line in result.ranks[0].output.splitlines()})  # fresh per run
    for r, rank in enumerate(result.ranks):
        env = dict(line.split("=", 1) for line in rank.output.splitlines() if "=" in line)
        assert env["KOLO_RANK"] == str(r) and env["KOLO_SIZE"] == "2"
        assert env["KOLO_LOCAL_RANK"] == str(r) and env["KOLO_LOCAL_SIZE"] == "2"
        assert env["KOLO_CROSS_RANK"] == "0" and env["KOLO_CROSS_SIZE"] == "1"
        assert env["KOLO_PEERS"] == ",".join(f"127.0.0.1:{x.port}" for x in result.ranks)
        assert env.get("listen_is_socket") == "yes"  # inherited, open, a socket


def test_bad_calls_fail_before_anything_runs():
    with pytest.raises(kolo_spark.ConfigurationError, match="KOLO_RANK"):
        kolo_spark.run(None, 2, "true", env={"KOLO_RANK": "0"}, local_mode=True)
    with pytest.raises(kolo_spark.ConfigurationError, match="num_proc=0"):
        kolo_spark.run(None, 0, "true", local_mode=True)
    with pytest.raises(kolo_spark.ConfigurationError, match="spark is None"):
        kolo_spark.run(None, 2, "true")
    with pytest.raises(kolo_spark.RankFailedError, match="could not be started") as caught:
        kolo_spark.run(None, 2, "/nonexistent/kolo-program", local_mode=True)
    assert caught.value.reason == "start"


# --- Python functions as ranks, on the driver ---
def _whoami(base, scale=1):
    import os
    import sys

    env = os.environ
    return (base * scale + int(env["RANK"]),
            [env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                              "MASTER_ADDR")],
            os.getpid(), sys.modules["__main__"].__spec__.name)


def test_function_values_in_rank_order():
    import cloudpickle  # local mode pickles with the standalone package

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    offset = 100  # captured

    def fn(base, scale=1):
        v, env, pid, main = _whoami(base, scale)
        return v + offset, env, pid, main

    for n in (1, 2, 3, 4):
        values = kolo_spark.run(None, n, fn, args=(10,), kwargs={"scale": 2}, local_mode=True,
                                stream_logs=False)
        assert [v for v, _, _, _ in values] == [120 + r for r in range(n)]
        assert [e for _, e, _, _ in values] == [[str(r), str(n), str(r), str(n), "0", "127.0.0.1"]
                                                for r in range(n)]
        assert len({pid for _, _, pid, _ in values}) == n and os.getpid() not in \
            {pid for _, _, pid, _ in values}
        assert {m for _, _, _, m in values} == {"kolo_spark.fnrank"}


def _raise_on_rank_2(directory):
    import os
    import subprocess
    import time

    rank = os.environ["RANK"]
    subprocess.Popen(["setsid", "sleep", f"3600.{5100 + int(rank)}"])
    with open(os.path.join(directory, f"pid.{rank}"), "w") as f:
        f.write(str(os.getpid()))
    if rank == "2":
        raise KeyError("no such shard")
    time.sleep(60)


def test_function_raising_in_local_mode(tmp_path):
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with pytest.raises(kolo_spark.RankFunctionError) as caught:
        kolo_spark.run(None, 3, _raise_on_rank_2, args=(str(tmp_path),), local_mode=True,
                       stream_logs=False, kill_grace=0.5)
    err = caught.value
    assert (err.rank, err.exc_type, err.reason) == (2, "KeyError", "raise")
    assert "in _raise_on_rank_2" in err.remote_traceback
    pids = read_pids(tmp_path, 3)
    left = wait_gone(pids.values(), 1.0)
    daemons = subprocess.run(["pgrep", "-f", "sleep 3600.51"], capture_output=True, text=True)
    left += [int(p) for p in daemons.stdout.split()]
    kill_leftovers(left)
    assert 2 in pids and left == []


def test_detached_daemons_are_found_and_reported(tmp_path):
    # The rank exits at once but leaves a daemon in a session of its own: its supervisor (the
    # child subreaper) finds it, ends it and reports it by pid and name.
    script = f"setsid sleep 3600.61 & echo $! > {tmp_path}/pid.$KOLO_RANK; sleep 0.3; exit 0"
    lines = []
    result = kolo_spark.run(None, 2, ["sh", "-c", script], local_mode=True,
                            stream_logs=lambda r, line: lines.append((r, line)),
                            collect_output="all")
    assert result.exit_codes == [0, 0]
    pids = read_pids(tmp_path, 2)
    for r, rank in enumerate(result.ranks):
        [left] = rank.leftovers
        assert left["pid"] == pids[r] and left["name"] == "sleep" and left["detached"]
        assert f"kolo rank {r} exited but left 1 process running: {pids[r]} (sleep, detached " \
               "from the session); ending them" in rank.output
    assert any("left 1 process running" in line for _, line in lines)
    left = wait_gone(pids.values(), 1.0)
    kill_leftovers(left)
    assert left == []


# A rank whose main thread has exited while another thread lives on (what a multi-threaded
# program looks like for a moment while a signal ends it): /proc shows the process as a zombie,
# and the daemon it started is still its child until its last thread is gone. SIGTERM is blocked,
# so only the supervisor's SIGKILL ends it.
_EXITING_RANK = """
import ctypes, os, platform, signal, subprocess, sys, threading, time
daemon = subprocess.Popen(["setsid", "sleep", "3600.63"])
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
threading.Thread(target=time.sleep, args=(600,)).start()
with open(os.path.join(sys.argv[1], "pids"), "w") as f:
    f.write(f"{os.getpid()} {daemon.pid}")
ctypes.CDLL(None).syscall({"x86_64": 60, "aarch64": 93}[platform.machine()], 0)  # exit(2)
"""


def test_a_zombie_leader_does_not_hide_the_daemons_it_started(tmp_path):
    # timeout=4: time for the interpreter to start and write its pids on a busy machine
    with pytest.raises(kolo_spark.RankFailedError, match="timed out"):
        kolo_spark.run(None, 1, [sys.executable, "-c", _EXITING_RANK, str(tmp_path)],
                       local_mode=True, echo=False, timeout=4, kill_grace=0.5)
    rank, daemon = map(int, (tmp_path / "pids").read_text().split())
    # run() returned: both are gone already (the daemon was found through the zombie leader)
    left = [p for p in (rank, daemon) if _threads_alive(p)]
    kill_leftovers(left)
    assert left == []


def _threads_alive(pid):
    """True while any thread of pid runs (process_gone counts a zombie leader as gone)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return False
    return any(not process_gone(f"{pid}/task/{t}") for t in tids)


_EXITING_HELPER = """
import ctypes, os, platform, signal, sys, threading, time
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
threading.Thread(target=time.sleep, args=(600,)).start()
with open(os.path.join(sys.argv[1], "pid"), "w") as f:
    f.write(str(os.getpid()))
ctypes.CDLL(None).syscall({"x86_64": 60, "aarch64": 93}[platform.machine()], 0)  # exit(2)
"""


def test_a_helper_left_exiting_is_ended_when_the_rank_exits(tmp_path):
    # The rank exits by itself and leaves a helper whose main thread has exited: no live process
    # in the walk, but the supervisor still has a child, and it ends it.
    script = '"$0" -c "$1" "$2" & while [ ! -s "$2/pid" ]; do sleep 0.05; done; sleep 0.3'
    result = kolo_spark.run(None, 1, ["sh", "-c", script, sys.executable, _EXITING_HELPER,
                                      str(tmp_path)], local_mode=True, echo=False, kill_grace=0.5)
    assert result.exit_codes == [0]
    helper = int((tmp_path / "pid").read_text())
    left = [helper] if _threads_alive(helper) else []
    kill_leftovers(left)
    assert left == []


def test_local_mode_timeline_and_torchrun_port(tmp_path):
    path = tmp_path / "t.json"
    script = 'echo "port=$MASTER_PORT addr=$MASTER_ADDR"'
    result = kolo_spark.run(None, 2, ["sh", "-c", script], local_mode=True, timeline=str(path),
                            stream_logs=False, collect_output="all")
    ports = {r.output for r in result.ranks}
    assert len(ports) == 1 and ports.pop().endswith("addr=127.0.0.1")
    events = json.loads(path.read_text())["traceEvents"]
    for r in range(2):
        assert any(e["name"] == "rank process" and e["pid"] == r for e in events)
    assert result.timeline == str(path)


def _sized(n):
    import os

    return b"x" * n if os.environ["RANK"] == "1" else None


def test_function_results_up_to_the_limit_come_back_whole():
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    values = kolo_spark.run(None, 2, _sized, args=(50_000,), local_mode=True,
                            max_result_bytes=100_000, stream_logs=False)
    assert values == [None, b"x" * 50_000]
    with pytest.raises(kolo_spark.ResultTooLargeError, match="rank 1's return value"):
        kolo_spark.run(None, 2, _sized, args=(150_000,), local_mode=True,
                       max_result_bytes=100_000, stream_logs=False)
