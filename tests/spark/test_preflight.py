"""Driver-side checks against a real SparkSession with dynamic allocation switched on: a local
master ignores it (and so does Spark's barrier check), so kolo_spark must not refuse the job;
on cluster masters the refusal is checked as a pure function (test_topology.py)."""

import time

import pytest

import pyspark  # noqa: F401  (a missing pyspark is an error, never a skip)

import kolo_spark
from conftest import spark_session


@pytest.fixture(scope="module")
def spark():
    session = spark_session("local[2]", "kolo_spark-preflight",
                            spark__dynamicAllocation__enabled="true")
    yield session
    session.stop()


def test_dynamic_allocation_is_ignored_on_a_local_master(spark):
    result = kolo_spark.run(spark, 2, ["sh", "-c", 'echo "rank $KOLO_RANK of $KOLO_SIZE"'],
                            collect_output="all", stream_logs=False)
    assert result.exit_codes == [0, 0]
    assert [r.output for r in result.ranks] == ["rank 0 of 2", "rank 1 of 2"]


def test_gpu_problem_reported_quickly(spark):
    # Refused on the driver before any barrier task is asked for: without the check the job
    # would wait for GPU slots until start_timeout. So the bound is a fraction of that deadline
    # (a missed check costs all of it), not a wall-clock constant.
    start_timeout = 60.0
    t0 = time.monotonic()
    with pytest.raises(kolo_spark.ConfigurationError) as e:
        kolo_spark.run(spark, 2, "true", use_gpu=True, start_timeout=start_timeout)
    assert time.monotonic() - t0 < start_timeout / 4
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []
    assert "spark.task.resource.gpu.amount" in str(e.value)
    assert "dynamicAllocation" not in str(e.value)
