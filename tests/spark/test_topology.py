"""The topology computation as a pure function, and the task-side rendezvous with a fake
allGather (no Spark)."""

import json
import os
import random
import sys

import pytest

from kolo_spark import (ConfigurationError, SetupError, TaskInfo, compute_topology, peers_string,
                        rendezvous)
from kolo_spark.driver import check_conf, local_master_slots, python_problem, slots_problem
from kolo_spark.errors import RankFailedError
from kolo_spark.task import (CONTRACT_VARS, build_env, error_from_text, raise_task_failure,
                             TaskFailure)


def info(rank, host, port=None, gpus=(), ip=None, error=""):
    return TaskInfo(rank, host, ip or f"10.0.0.{hash(host) % 200 + 1}", port or 40000 + rank,
                    tuple(gpus), error)


def layout(topo):
    return [(t.rank, t.local_rank, t.local_size, t.cross_rank, t.cross_size) for t in topo]


def test_one_host():
    topo = compute_topology([info(r, "h") for r in range(4)])
    assert layout(topo) == [(r, r, 4, 0, 1) for r in range(4)]
    assert all(t.size == 4 for t in topo)


def test_interleaved_hosts_cross_rank_follows_lowest_rank():
    # hosts b, a, b, c, a: b is host 0 (rank 0), a is host 1 (rank 1), c is host 2 (rank 3)
    topo = compute_topology([info(r, h) for r, h in enumerate("babca")])
    assert layout(topo) == [(0, 0, 2, 0, 3), (1, 0, 2, 1, 3), (2, 1, 2, 0, 3), (3, 0, 1, 2, 3),
                            (4, 1, 2, 1, 3)]


def test_deterministic_in_any_message_order():
    infos = [info(r, f"h{r % 3}", gpus=[str(r // 3)]) for r in range(9)]
    expected = compute_topology(infos)
    for seed in range(5):
        shuffled = infos[:]
        random.Random(seed).shuffle(shuffled)
        assert compute_topology(shuffled) == expected


def test_gpu_given_twice_on_one_host_is_refused():
    with pytest.raises(ConfigurationError, match=r"GPU 1 on host 'h0' is assigned to both "
                                                 r"rank 0 and rank 2"):
        compute_topology([info(0, "h0", gpus=["0", "1"]), info(1, "h1", gpus=["1"]),
                          info(2, "h0", gpus=["1"])])


def test_same_gpu_id_on_different_hosts_is_fine():
    topo = compute_topology([info(0, "h0", gpus=["0"]), info(1, "h1", gpus=["0"])])
    assert [t.gpus for t in topo] == [("0",), ("0",)]


def test_gpu_listed_twice_for_one_rank_and_non_index_gpu():
    with pytest.raises(ConfigurationError, match="rank 0 twice"):
        compute_topology([info(0, "h", gpus=["3", "3"])])
    with pytest.raises(ConfigurationError, match="not a device index"):
        compute_topology([info(0, "h", gpus=["GPU-1234"])])


def test_missing_and_repeated_ranks():
    with pytest.raises(ConfigurationError, match=r"repeated: \[1\]"):
        compute_topology([info(0, "h"), info(1, "h"), info(1, "h", port=5)])
    with pytest.raises(ConfigurationError, match=r"missing: \[1\]"):
        compute_topology([info(0, "h"), info(2, "h")])


def test_same_address_twice_and_bad_port():
    with pytest.raises(ConfigurationError, match="both listen at"):
        compute_topology([info(0, "h", port=1234), info(1, "h", port=1234)])
    with pytest.raises(ConfigurationError, match="port 0"):
        compute_topology([TaskInfo(0, "h", "1.2.3.4", 0)])


def test_a_rank_error_stops_everyone():
    with pytest.raises(SetupError, match=r"rank 1 \(host 'h'\) failed before launch: boom"):
        compute_topology([info(0, "h"), info(1, "h", error="boom")])


def test_peers_in_rank_order():
    topo = compute_topology([TaskInfo(1, "b", "10.0.0.2", 2000), TaskInfo(0, "a", "10.0.0.1", 1000),
                             TaskInfo(2, "c", "::1", 3000)])
    assert peers_string(topo) == "10.0.0.1:1000,10.0.0.2:2000,[::1]:3000"


class FakeBarrier:
    """n tasks' allGather: every call returns all messages (partition order), counting calls."""

    def __init__(self, others):
        self.others = others
        self.calls = 0

    def all_gather(self, message):
        self.calls += 1
        mine = TaskInfo.from_message(message)
        msgs = {i.rank: i.to_message() for i in self.others}
        msgs[mine.rank] = message
        return [msgs[r] for r in sorted(msgs)]


def test_rendezvous_calls_all_gather_once():
    others = [info(r, "h" + str(r // 2), gpus=[str(r % 2)]) for r in range(4)]
    fake = FakeBarrier(others)
    topo = rendezvous(fake.all_gather, others[3])
    assert fake.calls == 1
    assert layout(topo) == [(0, 0, 2, 0, 2), (1, 1, 2, 0, 2), (2, 0, 2, 1, 2), (3, 1, 2, 1, 2)]
    msg = json.loads(others[3].to_message())
    assert set(msg) == {"rank", "host", "ip", "port", "gpus", "error", "torch_port"}


def test_build_env_contract_and_no_mutation():
    topo = compute_topology([info(0, "a", gpus=["0"]), info(1, "b", gpus=["1", "2"])])
    base = {"PATH": "/bin", "KOLO_STORE": "stale:1", "KOLO_ADDR": "stale", "KOLO_RANK": "9"}
    before = dict(base)
    env = build_env(base, {"KOLO_TIMEOUT_SECONDS": "7"}, topo[1], peers_string(topo),
                    "s" * 64, 11, {"KOLO_DATA_FILE": "/x"})
    assert base == before
    assert env["PATH"] == "/bin" and "KOLO_STORE" not in env and "KOLO_ADDR" not in env
    assert env["KOLO_RANK"] == "1" and env["KOLO_SIZE"] == "2"
    assert (env["KOLO_LOCAL_RANK"], env["KOLO_LOCAL_SIZE"]) == ("0", "1")
    assert (env["KOLO_CROSS_RANK"], env["KOLO_CROSS_SIZE"]) == ("1", "2")
    assert env["KOLO_PEERS"] == peers_string(topo) and env["KOLO_LISTEN_FD"] == "11"
    assert env["KOLO_DEVICES"] == "1,2" and env["KOLO_HOST_KEY"] == "b"
    assert env["KOLO_SECRET"] == "s" * 64 and env["KOLO_TIMEOUT_SECONDS"] == "7"
    assert env["KOLO_DATA_FILE"] == "/x"
    assert "KOLO_RANK" in CONTRACT_VARS


def test_failure_payload_round_trip():
    err = RankFailedError(2, 3, "line 1\nline 2 \u00e9", "host-a")
    with pytest.raises(TaskFailure) as caught:
        raise_task_failure(err)
    text = "Job aborted ... PythonException: Traceback ...\n" + str(caught.value) + "\n\tat ..."
    back = error_from_text(text)
    assert isinstance(back, RankFailedError)
    assert (back.rank, back.exit_code, back.output_tail, back.host) == (2, 3, "line 1\nline 2 \u00e9",
                                                                      "host-a")
    assert "rank 2 exited with code 3" in str(back) and "line 2" in str(back)
    assert error_from_text("no marker here") is None


def test_driver_checks_as_pure_functions():
    assert local_master_slots("local") == 1
    assert local_master_slots("local[4]") == 4
    assert local_master_slots("local[4, 2]") == 4
    assert local_master_slots("local[4]", cpus_per_task=2) == 2
    assert local_master_slots("local[*]") == (os.cpu_count() or 1)
    assert local_master_slots("spark://h:7077") is None
    assert local_master_slots("local-cluster[2,2,1024]") is None

    assert check_conf({}, None) == []
    [p] = check_conf({"spark.dynamicAllocation.enabled": "true"}, None)
    assert "spark.dynamicAllocation.enabled=true" in p
    [p] = check_conf({"spark.dynamicAllocation.enabled": "true"}, None, "spark://h:7077")
    assert "spark.dynamicAllocation.enabled=false" in p  # says what to do
    # local masters ignore dynamic allocation (and so does Spark's own barrier check)
    assert check_conf({"spark.dynamicAllocation.enabled": "true"}, None, "local[4]") == []
    [p] = check_conf({}, True)
    assert "spark.task.resource.gpu.amount is not set" in p
    [p] = check_conf({"spark.executor.resource.gpu.amount": "2"}, None)
    assert "spark.task.resource.gpu.amount is not set" in p
    assert check_conf({"spark.executor.resource.gpu.amount": "2"}, False) == []
    assert check_conf({"spark.task.resource.gpu.amount": "1"}, True) == []

    assert slots_problem(4, 4, "local[4]", {}) is None
    msg = slots_problem(5, 4, "local[4]", {})
    assert "num_proc=5" in msg and "only 4 task slots" in msg
    assert "master local[5]" in msg
    # local[4] with 2 cpus per task: 2 slots; the advice is not the master already in use
    msg = slots_problem(4, 2, "local[4]", {"spark.task.cpus": "2"})
    assert "only 2 task slots" in msg and "local[8]" in msg and "spark.task.cpus=1" in msg
    assert "master local[4])" not in msg


def test_pyspark_before_3_4_on_python_3_11_is_refused_by_name():
    # pyspark 3.3's cloudpickle cannot pickle Python 3.11 functions: the job would fail with
    # "IndexError: tuple index out of range" (checked by hand with pyspark 3.3.4, docs/spark.md)
    msg = python_problem("3.3.4", (3, 11))
    assert msg.startswith("pyspark 3.3.4 does not support Python 3.11")
    assert "Python 3.10 or older" in msg and "pyspark 3.4 or later" in msg
    assert python_problem("3.3.4", (3, 10)) is None
    assert python_problem("3.4.4", (3, 11)) is None
    assert python_problem("4.0.1", (3, 13)) is None
    assert python_problem("", (3, 12)) is None


def test_the_pyspark_in_use_is_the_one_checked(monkeypatch):
    # run() asks about the pyspark this process imported (both where it refuses a barrier job
    # and where a pickling error gets its reason): here the installed one, then a stand-in.
    import types
    import pyspark
    from kolo_spark import driver
    assert driver._pyspark_problem() == python_problem(pyspark.__version__)
    monkeypatch.setitem(sys.modules, "pyspark", types.SimpleNamespace(__version__="3.3.4"))
    msg = driver._pyspark_problem()
    if sys.version_info[:2] >= (3, 11):
        assert msg is not None and msg.startswith("pyspark 3.3.4 does not support Python")
    else:
        assert msg is None
