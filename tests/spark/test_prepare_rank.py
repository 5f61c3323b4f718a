"""Both runners set a rank up through the one kolo_spark.task.prepare_rank(): local mode, and
the barrier task (run here in this process with a stand-in BarrierTaskContext, without a Spark
job); the same rank gets the same environment contract from either."""

import json

import pytest

import pyspark  # noqa: F401  (a missing pyspark is an error, never a skip)

import kolo_spark
from kolo_spark import task

# The contract variables a rank prints (sorted); ports, fds and the secret differ per run.
SHOW_ENV = ("env | grep -E '^(KOLO_|MASTER_ADDR|RANK|WORLD_SIZE|LOCAL_|GROUP_|ROLE_)' | "
            "grep -vE '^(KOLO_PEERS|KOLO_SECRET|KOLO_LISTEN_FD)=' | sort")


@pytest.fixture
def calls(monkeypatch):
    """The ranks prepare_rank() was called for, in order."""
    seen = []
    real = task.prepare_rank

    def recording(spec, out, *args, **kwargs):
        seen.append(out.rank)
        return real(spec, out, *args, **kwargs)

    monkeypatch.setattr(task, "prepare_rank", recording)
    return seen


def _env_of(output: str) -> dict:
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


class _Context:
    """The part of pyspark's BarrierTaskContext that barrier_partition uses, for one task."""

    def partitionId(self):
        return 0

    def allGather(self, message):
        return [message]

    def resources(self):
        return {}

    def stageAttemptNumber(self):
        return 0


def test_both_runners_prepare_a_rank_the_same_way(calls, monkeypatch):
    local = kolo_spark.run(None, 1, ["sh", "-c", SHOW_ENV], local_mode=True, echo=False,
                           stream_logs=False)
    assert calls == [0]

    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")  # the address the task advertises
    monkeypatch.setattr(pyspark.BarrierTaskContext, "get", staticmethod(lambda: _Context()))
    spec = task.TaskSpec(num_proc=1, argv=["sh", "-c", SHOW_ENV], secret="00" * 32, echo=False,
                         stream_logs=False)
    [(meta, value)] = list(task.barrier_partition(spec, iter(())))
    assert calls == [0, 0]
    assert value is None

    barrier = _env_of(json.loads(meta)["output"])
    assert _env_of(local.output) == barrier
    assert barrier["KOLO_RANK"] == "0" and barrier["KOLO_SIZE"] == "1"
    assert barrier["MASTER_ADDR"] == "127.0.0.1" and barrier["WORLD_SIZE"] == "1"
    assert barrier["KOLO_HOST_KEY"] == task.default_host_key()


def test_local_mode_prepares_every_rank_in_order(calls):
    result = kolo_spark.run(None, 3, ["sh", "-c", SHOW_ENV], local_mode=True, echo=False,
                            stream_logs=False, collect_output="all")
    assert calls == [0, 1, 2]
    assert [_env_of(r.output)["KOLO_RANK"] for r in result.ranks] == ["0", "1", "2"]
    assert {_env_of(r.output)["KOLO_SIZE"] for r in result.ranks} == {"3"}
