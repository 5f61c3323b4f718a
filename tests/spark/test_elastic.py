"""Surviving a lost rank on real Spark (master local[4], barrier tasks): run(..., elastic=True)
with a rank process SIGKILLed while the C++ ranks run exact collectives (the survivors shrink
through the driver's store and finish; the dead rank's task ends without failing the stage);
fewer than min_np left (the run fails naming the lost rank); a function that reads the lost
ranks through kolo_spark.elastic; run(..., max_attempts=2) resuming a retried attempt from what
a rank committed; and, with kolo_torch (CTest's spark/kolo_torch), a torch function on the kolo
backend that loses a rank, shrink_group()s it away and trains on. Every case checks that no
rank process and no /dev/shm object is left. One SparkSession for the module."""

import os
import re
import signal
import sys
import threading

import pytest

import kolo_spark
from conftest import spark_session, wait_gone

import pyspark  # noqa: F401,E402  (a missing pyspark is an error, never a skip)
from pyspark import cloudpickle  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def spark():
    session = spark_session("local[4]", "kolo_spark-elastic")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def elastic_bin():
    path = os.environ.get("KOLO_ELASTIC_WORKER_BIN", "")
    if not path or not os.access(path, os.X_OK):
        pytest.fail("KOLO_ELASTIC_WORKER_BIN is not set to the built kolo_elastic_worker "
                    "(run through CTest or run_pytest.sh)")
    return os.path.abspath(path)


def _shm():
    return set(os.listdir("/dev/shm"))


class _Killer:
    """A stream_logs sink: collects the ranks' pids from their KOLO_PID lines and SIGKILLs
    ``victim`` once every rank printed KOLO_LOOP (all are inside their loop of collectives)."""

    def __init__(self, n, victim):
        self.n, self.victim = n, victim
        self.pids, self.looping, self.lines = {}, set(), []
        self.killed = False
        self.lock = threading.Lock()

    def __call__(self, rank, line):
        with self.lock:
            self.lines.append((rank, line))
            m = re.search(r"KOLO_PID rank=(\d+) pid=(\d+)", line)
            if m:
                self.pids[int(m.group(1))] = int(m.group(2))
            if "KOLO_LOOP" in line:
                self.looping.add(rank)
            if not self.killed and len(self.looping) == self.n and self.victim in self.pids:
                self.killed = True
                os.kill(self.pids[self.victim], signal.SIGKILL)


def test_a_killed_rank_is_lost_and_the_others_shrink_and_finish(spark, elastic_bin):
    before = _shm()
    killer = _Killer(4, 2)
    result = kolo_spark.run(spark, 4, elastic_bin, ["7"], elastic=True, min_np=3,
                            stream_logs=killer, collect_output="all",
                            env={"KOLO_TIMEOUT_SECONDS": "30"}, timeout=120)
    assert killer.killed
    assert result.exit_codes == [0, 0, -signal.SIGKILL, 0]
    assert result.lost == [2]
    lost = result.ranks[2].lost
    assert lost["rank"] == 2 and lost["exit_code"] == -signal.SIGKILL and lost["attempt"] == 0
    assert [a.number for a in result.attempts] == [0] and result.attempts[0].lost == (2,)
    assert result.attempts[0].error is None
    # every survivor shrank to 3 ranks without rank 2, renumbered in order, and then ran 100
    # exact operations (the worker checks each element and exits 5 on a wrong one)
    for r, new_rank in ((0, 0), (1, 1), (3, 2)):
        out = result.ranks[r].output
        assert re.search(rf"KOLO_SHRUNK rank={r} new_rank={new_rank} size=3 gen=1 excluded=2 "
                         r"caught=PeerLostError", out), out
        assert f"KOLO_ELASTIC_OK rank={r} new_rank={new_rank} ops=100" in out, out
    assert wait_gone(list(killer.pids.values())) == []
    assert _shm() - before == set()


def test_fewer_than_min_np_left_fails_naming_the_lost_rank(elastic_bin):
    # local mode: the same elastic rules on the driver's subprocesses, and fast
    before = _shm()
    killer = _Killer(4, 1)
    with pytest.raises(kolo_spark.RankFailedError) as info:
        kolo_spark.run(None, 4, elastic_bin, ["7"], local_mode=True, elastic=True, min_np=4,
                       stream_logs=killer, env={"KOLO_TIMEOUT_SECONDS": "30"}, timeout=120)
    e = info.value
    assert e.rank == 1 and e.exit_code == -signal.SIGKILL, e
    assert "3 of 4 ranks left, below min_np=4" in str(e), e
    assert len(e.attempts) == 1 and "rank 1 was killed by signal 9" in e.attempts[0].error
    assert wait_gone(list(killer.pids.values())) == []
    assert _shm() - before == set()


def test_local_mode_elastic_goes_on_without_the_lost_rank(elastic_bin):
    killer = _Killer(3, 0)  # rank 0 too: the store is the driver's, not rank 0's
    result = kolo_spark.run(None, 3, elastic_bin, ["11"], local_mode=True, elastic=True,
                            stream_logs=killer, collect_output="all",
                            env={"KOLO_TIMEOUT_SECONDS": "30"}, timeout=120)
    assert result.exit_codes == [-signal.SIGKILL, 0, 0] and result.lost == [0]
    assert "KOLO_ELASTIC_OK rank=1 new_rank=0 ops=100" in result.ranks[1].output
    assert "KOLO_ELASTIC_OK rank=2 new_rank=1 ops=100" in result.ranks[2].output
    assert wait_gone(list(killer.pids.values())) == []


def _lose_the_last_rank():
    import os
    import time

    from kolo_spark import elastic

    rank, n = int(os.environ["KOLO_RANK"]), elastic.num_proc()
    assert elastic.enabled() and elastic.min_np() == 2 and elastic.attempt() == 0
    if rank == n - 1:
        os._exit(7)
    lost = elastic.lost_ranks(wait=30)
    deadline = time.monotonic() + 30
    while elastic.size() != n - 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    return {"rank": rank, "lost": lost, "size": elastic.size(), "alive": elastic.alive_ranks(),
            "info": elastic.lost_info(n - 1)["exit_code"]}


def test_a_function_reads_the_lost_ranks(spark):
    result = kolo_spark.run(spark, 4, _lose_the_last_rank, elastic=True, min_np=2,
                            stream_logs=False, timeout=120)
    assert result.lost == [3]
    assert result[3] is None  # a lost rank returns nothing
    for r in range(3):
        assert result[r] == {"rank": r, "lost": [3], "size": 3, "alive": [0, 1, 2], "info": 7}


def _commit_then_fail(directory):
    import os
    import time

    from kolo_spark import elastic

    rank = int(os.environ["KOLO_RANK"])
    state = elastic.restore({"step": 0})
    with open(os.path.join(directory, f"pid.{elastic.attempt()}.{rank}"), "w") as f:
        f.write(str(os.getpid()))
    if elastic.attempt() == 0:
        if rank == 0:
            elastic.commit({"step": 3})
            elastic.commit({"step": 7})  # the last commit wins
        deadline = time.monotonic() + 30
        while elastic.restore({"step": 0})["step"] != 7 and time.monotonic() < deadline:
            time.sleep(0.02)
        if rank == 1:
            os._exit(3)  # after the commit: a lost rank of a run without elastic
        time.sleep(60)  # the others are ended when the stage fails
    return (elastic.attempt(), state["step"])


def test_a_retried_attempt_resumes_from_the_last_commit(spark, tmp_path):
    before = _shm()
    result = kolo_spark.run(spark, 4, _commit_then_fail, args=(str(tmp_path),), max_attempts=2,
                            stream_logs=False, timeout=120)
    assert list(result) == [(1, 7)] * 4
    assert [a.number for a in result.attempts] == [0, 1]
    first = result.attempts[0]
    assert first.error_type == "RankFailedError" and "rank 1 exited with code 3" in first.error
    assert result.attempts[1].error is None
    assert result.committed == (2, {"step": 7})
    pids = [int(p.read_text()) for p in tmp_path.glob("pid.*")]
    assert len(pids) == 8
    assert wait_gone(pids) == []
    assert _shm() - before == set()


def _fails_every_time():
    import os
    if os.environ["KOLO_RANK"] == "2":
        os._exit(4)
    return 0


def _exits_without_returning():
    import os
    os._exit(0)


def test_the_last_attempts_error_is_raised_with_every_attempt(spark):
    with pytest.raises(kolo_spark.RankFailedError) as info:
        kolo_spark.run(spark, 4, _fails_every_time, max_attempts=2, stream_logs=False,
                       timeout=120)
    assert info.value.rank == 2 and info.value.exit_code == 4
    assert [a.number for a in info.value.attempts] == [0, 1]
    assert all("rank 2 exited with code 4" in a.error for a in info.value.attempts)


def test_a_function_that_exits_without_returning_is_named(spark):
    with pytest.raises(kolo_spark.RankFailedError, match="nothing was returned"):
        kolo_spark.run(None, 2, _exits_without_returning, local_mode=True, stream_logs=False)


def test_elastic_arguments_are_checked():
    with pytest.raises(kolo_spark.ConfigurationError, match="min_np is for elastic=True"):
        kolo_spark.run(None, 2, "/bin/true", local_mode=True, min_np=1)
    with pytest.raises(kolo_spark.ConfigurationError, match="min_np=3 must be an integer from 1"):
        kolo_spark.run(None, 2, "/bin/true", local_mode=True, elastic=True, min_np=3)
    with pytest.raises(kolo_spark.ConfigurationError, match="max_attempts=0"):
        kolo_spark.run(None, 2, "/bin/true", local_mode=True, max_attempts=0)
    with pytest.raises(RuntimeError, match="not a rank of a run with a driver store"):
        kolo_spark.elastic.commit({"x": 1})


def _torch_loses_a_rank(steps_after, directory):
    import os
    import signal
    import time

    import torch
    import torch.distributed as dist

    import kolo_torch  # noqa: F401  (registers the backend)
    from kolo_spark import elastic

    dist.init_process_group("kolo")
    r, n = dist.get_rank(), dist.get_world_size()
    with open(os.path.join(directory, f"pid.{r}"), "w") as f:
        f.write(str(os.getpid()))
    victim = n - 1  # torch's store lives on rank 0 (MASTER_ADDR): lose another one
    step = 0
    try:
        while True:
            t = torch.full((4096,), float(r + 1))
            dist.all_reduce(t)
            assert torch.all(t == n * (n + 1) / 2), t
            step += 1
            if step == 10 and r == victim:
                os.kill(os.getpid(), signal.SIGKILL)
            if step > 2000:
                raise AssertionError("no peer was lost")
            time.sleep(0.002)
    except RuntimeError:
        pass
    lost = elastic.lost_ranks(wait=30)
    dist.shrink_group(lost)
    m, nr = dist.get_world_size(), dist.get_rank()
    sums = []
    for i in range(steps_after):
        t = torch.arange(1000, dtype=torch.float64) * (nr + 1) + i
        dist.all_reduce(t)
        want = torch.arange(1000, dtype=torch.float64) * (m * (m + 1) / 2) + m * i
        assert torch.equal(t, want), (i, t[:4], want[:4])
        sums.append(float(t.sum()))
    dist.destroy_process_group()
    return {"rank": r, "new_rank": nr, "size": m, "lost": lost, "sums": sums}


@pytest.mark.kolo_torch
def test_a_torch_function_shrinks_the_group_and_trains_on(spark, tmp_path):
    before = _shm()
    result = kolo_spark.run(spark, 4, _torch_loses_a_rank, args=(20, str(tmp_path)),
                            elastic=True, min_np=3, stream_logs=False, env={"KOLO_TIMEOUT_SECONDS": "30"}, timeout=300)
    assert result.lost == [3] and result[3] is None
    want = [6 * 499500 + 3000.0 * i for i in range(20)]  # sum over k of 6k + 3i, k < 1000
    for r in range(3):
        assert result[r]["new_rank"] == r and result[r]["size"] == 3 and result[r]["lost"] == [3]
        assert result[r]["sums"] == want
    pids = [int(p.read_text()) for p in tmp_path.glob("pid.*")]
    assert len(pids) == 4 and wait_gone(pids) == []
    assert _shm() - before == set()


def test_the_drivers_store_refuses_strangers_and_keeps_namespaces_apart():
    import socket
    import time

    from kolo_spark.kvstore import KvStoreClient, KvStoreServer, StoreError

    secret = "s" * 64
    with KvStoreServer(secret, "job", namespaces=2, shared_prefixes=("shared/",),
                       auth_timeout=0.5) as srv:
        addr = ("127.0.0.1", srv.port)
        # a wrong secret, and a wrong job id: refused, nothing written
        for bad_secret, bad_job in (("x" * 64, "job-s0"), (secret, "other-s0")):
            with pytest.raises(StoreError, match="refused our authentication|failed to prove"):
                KvStoreClient(addr, bad_secret, bad_job, timeout=2).set("k", b"v")
        # garbage and a silent stranger: closed (the silent one after auth_timeout)
        with socket.create_connection(addr) as s:
            s.recv(40)
            s.sendall(b"GET / HTTP/1.0\r\n" * 8)
            s.settimeout(5)
            try:
                assert s.recv(100) == b""  # closed, no answer
            except ConnectionResetError:  # closed with the garbage unread
                pass
        silent = socket.create_connection(addr)
        silent.settimeout(5)
        silent.recv(40)
        t0 = time.monotonic()
        assert silent.recv(100) == b"" and time.monotonic() - t0 < 3
        silent.close()
        assert srv.keys() == []
        # two Spark attempts of a stage: their own keys, the shared ones in common
        a = KvStoreClient(addr, secret, "job-s0", rank=0, timeout=5)
        b = KvStoreClient(addr, secret, "job-s1", rank=0, timeout=5)
        a.set("kolo/0/x", b"first")
        assert b.try_get("kolo/0/x") is None
        b.set("kolo/0/x", b"second")
        assert a.get("kolo/0/x") == b"first" and b.get("kolo/0/x") == b"second"
        a.set("shared/commit", b"c")
        assert b.get("shared/commit") == b"c"
        assert a.add("n", 2) == 2 and a.add("n", 3) == 5 and b.add("n", 1) == 1
        assert a.compare_set("cas", b"", b"one") == b"one"
        assert a.compare_set("cas", b"zzz", b"two") == b"one"
        assert a.compare_set("cas", b"one", b"two") == b"two"
        with pytest.raises(StoreError, match="not set within"):
            a.get("never", wait=0.2)
        # a malformed frame from an authenticated client closes only that connection
        a._sock.sendall(b"\x00\x00\x00\x00")
        with pytest.raises(StoreError):
            a.get("kolo/0/x")
        assert b.get("kolo/0/x") == b"second"
        assert srv.highest_namespace == 1
        assert srv.get_local("s0/kolo/0/x") == b"first" and srv.get_local("shared/commit") == b"c"
        a.close()
        b.close()
