#!/usr/bin/env bash
# tests/spark/run_pytest.sh — the Spark backend's pytest suite (CTest: spark/pytest, spark/kolo_torch).
#
# Runs tests/spark with the cached Python test environment (tests/pyenv.sh: pyspark 3.5.7,
# torch, cloudpickle, pytest), the kolo_spark sources on PYTHONPATH, and the native binaries
# CTest built:
#   KOLO_DEMO_BIN       examples/allreduce_demo
#   KOLO_SHARD_SUM_BIN  examples/spark/shard_sum (target kolo_spark_shard_sum)
#   KOLO_ELASTIC_WORKER_BIN  tests/faults/elastic_worker (target kolo_elastic_worker)
# Java 17 is installed from Debian when missing (as root). A missing dependency is a failure,
# never a skip; in CI (CI set) every skip is a failure (conftest.py, tests/common/kolo_skip.py). Extra arguments go to pytest (e.g. -k local_mode, -m kolo_torch).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

fail() {
  echo "run_pytest.sh: FAIL: $*" >&2
  exit 1
}

# --- Java 17 (pyspark 3.5 runs on Java 8/11/17) ---
if ! command -v java >/dev/null; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "run_pytest.sh: installing openjdk-17-jre-headless"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends openjdk-17-jre-headless >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null 2>&1 &&
        apt-get install -y -q --no-install-recommends openjdk-17-jre-headless >/dev/null 2>&1; } ||
      fail "java is missing and openjdk-17-jre-headless could not be installed"
  else
    fail "java is missing (install openjdk-17-jre-headless)"
  fi
fi

py=$(bash "$repo/tests/pyenv.sh") || fail "the Python test environment (tests/pyenv.sh) could not be had"

# --- kolo_spark from the source tree; binaries from CTest ---
export PYTHONPATH="$repo/backends/spark${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
for var in KOLO_DEMO_BIN KOLO_SHARD_SUM_BIN KOLO_ELASTIC_WORKER_BIN; do
  [[ -n ${!var:-} ]] || fail "$var is not set (run through CTest, or export it)"
  export "$var=$(realpath "${!var}")"  # the tests run in a scratch directory
done
# Short-lived JVMs on 2 cores: C1 only, serial GC (the driver's own JVM gets it through
# spark.driver.extraJavaOptions in conftest.py; the standalone daemons through this).
export SPARK_DAEMON_JAVA_OPTS="${SPARK_DAEMON_JAVA_OPTS:-} -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

# Spark writes spark-warehouse/ and derby logs into the working directory: use a scratch one,
# and pytest's tmp_path directories (stores, Parquet files, checkpoints) go under it too
# (--basetemp) rather than into /tmp/pytest-of-$USER, which pytest keeps after the run.
work=$(mktemp -d "${TMPDIR:-/tmp}/kolo-spark-tests.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
# torch (the estimator tests) keeps its compile cache in /tmp/torchinductor_$USER otherwise.
export TORCHINDUCTOR_CACHE_DIR="$work/torchinductor"
"$py" -m pytest -p no:cacheprovider -q -rs --durations=15 --basetemp="$work/pytest" "$here" "$@"
