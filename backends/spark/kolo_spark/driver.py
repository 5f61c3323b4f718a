"""The old module path ``kolo_spark.driver``, kept for code that imports from it: the names it
had, now defined by :mod:`~kolo_spark.api` (run), :mod:`~kolo_spark.results`,
:mod:`~kolo_spark.preflight`, :mod:`~kolo_spark.spark_job` and :mod:`~kolo_spark.local_job`."""

from .api import DEFAULT_MAX_RESULT_BYTES, run  # noqa: F401
from .local_job import run_local as _run_local  # noqa: F401
from .preflight import (_pyspark_problem, check_conf, local_master_slots,  # noqa: F401
                        python_problem, slots_problem, task_slots)
from .preflight import spark_size as _spark_size  # noqa: F401
from .results import FunctionResults, RankResult, RunResult  # noqa: F401
from .spark_job import FAILURE_GRACE, ship_package  # noqa: F401
