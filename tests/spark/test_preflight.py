"""Driver-side checks against a real SparkSession with dynamic allocation switched on: a local
master ignores it (and so does Spark's barrier check), so kolo_spark must not refuse the job;
on cluster masters the refusal is checked as a pure function (test_topology.py)."""

import time

import pytest

import kolo_spark
from conftest import spark_session

pytest.importorskip("pyspark")


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
    t0 = time.monotonic()
    with pytest.raises(kolo_spark.ConfigurationError) as e:
        kolo_spark.run(spark, 2, "true", use_gpu=True)
    assert time.monotonic() - t0 < 2
    assert "spark.task.resource.gpu.amount" in str(e.value)
    assert "dynamicAllocation" not in str(e.value)
