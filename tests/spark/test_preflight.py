"""Driver-side checks against a real SparkSession: clear errors before anything is submitted,
in well under a second (Spark itself would hold a barrier stage that cannot start for about
10 minutes before failing)."""

import time

import pytest

import kolo_spark
from conftest import spark_session

pytest.importorskip("pyspark")


@pytest.fixture(scope="module")
def spark():
    # Dynamic allocation is ignored by local masters, which makes it safe to switch on here.
    session = spark_session("local[2]", "kolo_spark-preflight",
                            spark__dynamicAllocation__enabled="true")
    yield session
    session.stop()


def test_dynamic_allocation_is_refused_quickly(spark):
    t0 = time.monotonic()
    with pytest.raises(kolo_spark.ConfigurationError,
                       match=r"spark.dynamicAllocation.enabled=true: a barrier stage needs") as e:
        kolo_spark.run(spark, 2, "true")
    assert time.monotonic() - t0 < 2
    assert "spark.dynamicAllocation.enabled=false" in str(e.value)  # says what to do


def test_all_problems_reported_at_once(spark):
    with pytest.raises(kolo_spark.ConfigurationError) as e:
        kolo_spark.run(spark, 2, "true", use_gpu=True)
    assert "dynamicAllocation" in str(e.value) and "spark.task.resource.gpu.amount" in str(e.value)

