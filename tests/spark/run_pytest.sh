#!/usr/bin/env bash
# tests/spark/run_pytest.sh — the Spark backend's pytest suite (CTest: spark/pytest).
#
# Installs what is missing (Java 17 from Debian, pyspark and pytest from PyPI), puts the
# kolo_spark sources on PYTHONPATH and runs tests/spark with the native binaries CTest built:
#   KOLO_DEMO_BIN       examples/allreduce_demo
#   KOLO_SHARD_SUM_BIN  examples/spark/shard_sum (target kolo_spark_shard_sum)
# Exit 77 (CTest: skipped) when Java or pyspark cannot be had (no network, not root).
# Knobs: PYTHON (default python3), KOLO_PYSPARK_VERSION (default 3.5.7), KOLO_SPARK_PYDEPS
# (where pip puts pyspark/pytest when the interpreter lacks them; default
# ~/.cache/kolo/spark-pydeps-VERSION), extra pytest arguments on the command line
# (e.g. -k local_mode).
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
py=${PYTHON:-python3}
pyspark_version=${KOLO_PYSPARK_VERSION:-3.5.7}

skip() {
  echo "run_pytest.sh: SKIP: $*" >&2
  exit 77
}

command -v "$py" >/dev/null || skip "no $py"

# --- Java 17 (pyspark 3.5 runs on Java 8/11/17) ---
if ! command -v java >/dev/null; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "run_pytest.sh: installing openjdk-17-jre-headless"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends openjdk-17-jre-headless >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null 2>&1 &&
        apt-get install -y -q --no-install-recommends openjdk-17-jre-headless >/dev/null 2>&1; } ||
      skip "java is missing and openjdk-17-jre-headless could not be installed"
  else
    skip "java is missing (install openjdk-17-jre-headless)"
  fi
fi

# --- pyspark (>= 3.3: the first line that supports Java 17) and pytest ---
# Installed with --target into a cache directory, not into the interpreter: that works on a
# Debian python3 that refuses "pip install" (PEP 668) and changes nothing system-wide.
deps=${KOLO_SPARK_PYDEPS:-${XDG_CACHE_HOME:-$HOME/.cache}/kolo/spark-pydeps-$pyspark_version}
have_pyspark() {
  PYTHONPATH="$deps${PYTHONPATH:+:$PYTHONPATH}" "$py" - <<'PY' 2>/dev/null
import pyspark, pytest
major, minor = (int(x) for x in pyspark.__version__.split(".")[:2])
raise SystemExit(0 if (major, minor) >= (3, 3) else 1)
PY
}
if ! have_pyspark; then
  echo "run_pytest.sh: installing pyspark==$pyspark_version and pytest into $deps"
  mkdir -p "$deps" &&
    "$py" -m pip install -q --disable-pip-version-check --upgrade --target "$deps" \
      "pyspark==$pyspark_version" pytest ||
    skip "pyspark/pytest could not be installed (no network?)"
  have_pyspark || skip "pyspark still not importable after pip install"
fi
export PYTHONPATH="$deps${PYTHONPATH:+:$PYTHONPATH}"

# --- kolo_spark from the source tree; binaries from CTest ---
export PYTHONPATH="$repo/backends/spark${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
for var in KOLO_DEMO_BIN KOLO_SHARD_SUM_BIN; do
  if [[ -n ${!var:-} ]]; then
    export "$var=$(realpath "${!var}")"  # the tests run in a scratch directory
  else
    echo "run_pytest.sh: $var is not set: the tests needing it are skipped" >&2
  fi
done
# Short-lived JVMs on 2 cores: C1 only, serial GC (the driver's own JVM gets it through
# spark.driver.extraJavaOptions in conftest.py; the standalone daemons through this).
export SPARK_DAEMON_JAVA_OPTS="${SPARK_DAEMON_JAVA_OPTS:-} -XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

# Spark writes spark-warehouse/ and derby logs into the working directory: use a scratch one.
work=$(mktemp -d "${TMPDIR:-/tmp}/kolo-spark-tests.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
"$py" -m pytest -p no:cacheprovider -q -rs --durations=15 "$here" "$@"
