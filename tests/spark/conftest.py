"""Shared pieces of the Spark backend's tests.

Native binaries come from the environment (run_pytest.sh passes the CTest-built ones):
KOLO_DEMO_BIN (examples/allreduce_demo), KOLO_SHARD_SUM_BIN (examples/spark/shard_sum).
In CI (CI set) every skip is a failure (tests/common/kolo_skip.py): a missing dependency is
never a skip, here or anywhere in the suite.
"""

import os
import signal
import sys
import time

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "common"))
import kolo_skip  # noqa: E402
try:
    import kolo_spark  # noqa: F401
except ImportError:  # not pip-installed: use the source tree
    sys.path.insert(0, os.path.join(REPO, "backends", "spark"))


# Every skip a failure in CI unless allow-listed (the hooks live in kolo_skip.py).
from kolo_skip import pytest_make_collect_report, pytest_runtest_makereport  # noqa: E402,F401


def pytest_configure(config):
    config.addinivalue_line("markers", "kolo_torch: needs kolo_torch installed (CTest runs these "
                            "in spark/kolo_torch, after torch/install)")
    config.addinivalue_line("markers", "estimator: kolo_spark.torch's estimator suite (CTest "
                            "spark/kolo_torch, after torch/install)")


def _binary(var):
    path = os.environ.get(var, "")
    if not path or not os.path.isfile(path) or not os.access(path, os.X_OK):
        pytest.fail(f"{var} is not set to a built binary (run through CTest or run_pytest.sh)")
    return os.path.abspath(path)  # executors run in their own working directories


@pytest.fixture(scope="session")
def demo_bin():
    return _binary("KOLO_DEMO_BIN")


@pytest.fixture(scope="session")
def shard_sum_bin():
    return _binary("KOLO_SHARD_SUM_BIN")


def process_gone(pid):
    """True when pid is no longer a live process (a zombie waiting for its reaper is dead)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True
    return state in ("Z", "X")


def wait_gone(pids, limit=5.0):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        alive = [p for p in pids if not process_gone(p)]
        if not alive:
            return []
        time.sleep(0.1)
    return [p for p in pids if not process_gone(p)]


def read_pids(directory, n):
    pids = {}
    for r in range(n):
        path = os.path.join(directory, f"pid.{r}")
        if os.path.exists(path):
            with open(path) as f:
                pids[r] = int(f.read().strip())
    return pids


def kill_leftovers(pids):
    for p in pids:
        if not process_gone(p):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


_JVM_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def spark_session(master, app, **conf):
    """A SparkSession for one test module (stop it in the fixture's teardown).

    Built from an explicit SparkConf, not SparkSession.builder, whose options are class-level
    and would leak into the next module's session. Keys that some module changes get an explicit
    default here: Spark reloads the JVM's system properties (the first session's settings) into
    every later SparkConf."""
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    # The Python workers (and so the ranks, which use the worker's interpreter) run this
    # interpreter: PySpark takes it from PYSPARK_PYTHON, not from spark.pyspark.python.
    os.environ["PYSPARK_PYTHON"] = sys.executable

    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.pyspark.python": sys.executable,
        "spark.sql.shuffle.partitions": "4",
        "spark.dynamicAllocation.enabled": "false",
        # short-lived JVMs on 2 cores: C1 only, serial GC
        "spark.driver.extraJavaOptions": _JVM_OPTS,
        "spark.executor.extraJavaOptions": _JVM_OPTS,
    }
    settings.update({k.replace("__", "."): v for k, v in conf.items()})
    spark_conf = SparkConf().setMaster(master).setAppName(app)
    for k, v in settings.items():
        spark_conf.set(k, v)
    sc = SparkContext(conf=spark_conf)
    sc.setLogLevel("ERROR")
    return SparkSession(sc)


# The demo's line: "rank R/N (local l/L, host c/C): ... correct; ..."
DEMO_LINE = r"rank (\d+)/(\d+) \(local (\d+)/(\d+), host (\d+)/(\d+)\): (.*)"
