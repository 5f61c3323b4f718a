#!/usr/bin/env bash
# tests/common/test_skip.sh — the skip helpers' own test: the shell (skip.sh) and Python
# (kolo_skip.py) helpers, and a pytest run through kolo_skip.fail_skips_in_ci, decide as
# skip_allowlist.txt says: outside CI a skip is a skip (77); in CI a reason off the list fails (1),
# no-gpu stays a skip, and KOLO_TEST_REQUIRE_GPU=1 makes no-gpu fail too; a pytest importorskip
# of a missing module is a skip outside CI and a failure in CI. Then .ci/ctest_report.py on a
# made-up JUnit file: a skipped test off the list, and a registered test missing from the run,
# each fail the report.
#
#   test_skip.sh [PYTHON]   PYTHON runs kolo_skip.py and pytest (default: the test venv of
#                           tests/pyenv.sh, which has pytest)
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
py=${1:-}
if [[ -z $py ]]; then
  py=$(bash "$repo/tests/pyenv.sh") || {
    echo "FAILED: the Python test environment (tests/pyenv.sh) could not be had"
    exit 1
  }
fi
failures=0
work=$(mktemp -d "${TMPDIR:-/tmp}/kolo-skip-test.XXXXXX")
trap 'rm -rf "$work"' EXIT

# expect WANT WHAT CMD...: the command's exit status must be WANT ("!0": any but 0); with
# EXPECT_TEXT set, each of its |-separated strings must be in the output too.
expect() {
  local want=$1 what=$2 got ok=1 text
  shift 2
  "$@" >"$work/out" 2>&1
  got=$?
  if [[ $want == "!0" ]]; then ((got != 0)) || ok=0; else [[ $got == "$want" ]] || ok=0; fi
  if [[ -n ${EXPECT_TEXT:-} ]]; then
    IFS='|' read -ra text <<<"$EXPECT_TEXT"
    for t in "${text[@]}"; do grep -qF -- "$t" "$work/out" || ok=0; done
  fi
  if ((ok)); then
    echo "ok: $what: exit $got"
  else
    echo "FAILED: $what: exit $got, want $want; output:"
    sed 's/^/  /' "$work/out"
    failures=$((failures + 1))
  fi
}

# shellcheck disable=SC2016 # the inner bash expands them
sh_skip() { env "$@" bash -c 'source "$0" && kolo_skip "$1" "test_skip.sh"' "$here/skip.sh" "$reason"; }
py_skip() {
  env "$@" "$py" -c 'import sys; sys.path.insert(0, sys.argv[1]); import kolo_skip
kolo_skip.exit_skip(sys.argv[2], "test_skip.sh")' "$here" "$reason"
}

for helper in sh_skip py_skip; do
  reason=no-netns
  expect 77 "$helper $reason outside CI" "$helper" -u CI -u KOLO_TEST_REQUIRE_GPU
  expect 77 "$helper $reason with CI=false" "$helper" -u KOLO_TEST_REQUIRE_GPU CI=false
  expect 1 "$helper $reason with CI=true" "$helper" -u KOLO_TEST_REQUIRE_GPU CI=true
  reason=no-gpu
  expect 77 "$helper $reason with CI=true" "$helper" -u KOLO_TEST_REQUIRE_GPU CI=true
  expect 1 "$helper $reason with CI=true KOLO_TEST_REQUIRE_GPU=1" "$helper" CI=true \
    KOLO_TEST_REQUIRE_GPU=1
  expect 1 "$helper $reason outside CI with KOLO_TEST_REQUIRE_GPU=1" "$helper" -u CI \
    KOLO_TEST_REQUIRE_GPU=1
  reason=gpu-present
  expect 77 "$helper $reason with CI=true KOLO_TEST_REQUIRE_GPU=1" "$helper" CI=true \
    KOLO_TEST_REQUIRE_GPU=1
done

# pytest: a module-level importorskip and a test's pytest.skip, through the conftest hooks.
if "$py" -c 'import pytest' 2>/dev/null; then
  mkdir -p "$work/suite"
  cat >"$work/suite/conftest.py" <<EOF
import sys
import pytest
sys.path.insert(0, "$here")
from kolo_skip import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401
EOF
  printf 'import pytest\npytest.importorskip("kolo_no_such_module")\n\n\ndef test_x():\n    pass\n' \
    >"$work/suite/test_missing.py"
  printf 'import pytest\n\n\ndef test_skips():\n    pytest.skip("no reason")\n' >"$work/suite/test_skips.py"
  printf 'import kolo_skip\n\n\ndef test_no_gpu():\n    kolo_skip.pytest_skip("no-gpu", "none here")\n' \
    >"$work/suite/test_gpu.py"
  pytest_run() {
    env "$@" PYTHONDONTWRITEBYTECODE=1 "$py" -m pytest -p no:cacheprovider -q -rA \
      --continue-on-collection-errors "$work/suite"
  }
  EXPECT_TEXT="3 skipped" expect 0 "pytest: importorskip, pytest.skip, no-gpu outside CI (skips)" \
    pytest_run -u CI -u KOLO_TEST_REQUIRE_GPU
  EXPECT_TEXT="1 failed|1 skipped|1 error|test_missing.py - FAILED: this test would skip|test_skips.py::test_skips - FAILED: this test would skip" \
    expect '!0' "pytest: the same with CI=true (importorskip, pytest.skip fail; no-gpu skips)" \
    pytest_run -u KOLO_TEST_REQUIRE_GPU CI=true
  EXPECT_TEXT="2 failed|test_no_gpu - Failed: FAILED: this test would skip (no-gpu: none here), and a skip is a failure here (KOLO_TEST_REQUIRE_GPU=1)" \
    expect '!0' "pytest: no-gpu with CI=true KOLO_TEST_REQUIRE_GPU=1 (fails)" \
    pytest_run CI=true KOLO_TEST_REQUIRE_GPU=1
else
  echo "FAILED: $py has no pytest (pass the test venv's python: tests/pyenv.sh)"
  failures=$((failures + 1))
fi

# .ci/ctest_report.py: what tests/run.sh makes of a run.
cat >"$work/tests.json" <<'EOF'
{"kind": "ctestInfo", "tests": [
 {"name": "a/ran", "properties": [{"name": "LABELS", "value": ["x"]}]},
 {"name": "torch/cuda/device", "properties": [{"name": "SKIP_RETURN_CODE", "value": 77}]},
 {"name": "netns/selftest", "properties": []},
 {"name": "b/never", "properties": []}]}
EOF
junit() {
  echo '<?xml version="1.0" encoding="UTF-8"?><testsuite>'
  echo '<testcase name="a/ran" time="1.5" status="run"/>'
  echo '<testcase name="torch/cuda/device" time="0.1" status="notrun"><skipped message="SKIP_RETURN_CODE=77"/></testcase>'
  [[ $1 == *netns* ]] && echo '<testcase name="netns/selftest" time="0.1" status="notrun"><skipped message="SKIP_RETURN_CODE=77"/></testcase>'
  [[ $1 == *netns* ]] || echo '<testcase name="netns/selftest" time="0.2" status="run"/>'
  [[ $1 == *never* ]] || echo '<testcase name="b/never" time="0.2" status="run"/>'
  echo '</testsuite>'
}
report() {
  env "$@" "$py" "$repo/.ci/ctest_report.py" --slowest 0 --junit "$work/run.xml" \
    --tests "$work/tests.json"
}
junit all >"$work/run.xml"
expect 0 "ctest_report: everything ran, torch/cuda/device skipped (allowed)" report -u \
  KOLO_TEST_REQUIRE_GPU
expect 1 "ctest_report: the same with KOLO_TEST_REQUIRE_GPU=1" report KOLO_TEST_REQUIRE_GPU=1
junit netns >"$work/run.xml"
expect 1 "ctest_report: netns/selftest skipped (not on the list)" report -u KOLO_TEST_REQUIRE_GPU
junit never >"$work/run.xml"
expect 1 "ctest_report: b/never registered but not in the run" report -u KOLO_TEST_REQUIRE_GPU

if ((failures > 0)); then
  echo "test_skip.sh: $failures FAILED"
  exit 1
fi
echo "test_skip.sh: all passed"
