#!/usr/bin/env bash
# tests/run.sh — the test command (README's second command; .ci/run calls it): on a fresh
# Debian 12 machine, install what is missing, build kolo (Release) into build-ci, run every CTest
# test and print ctest's summary, the 20 slowest tests and the seconds per label; after each build
# the 15 targets that took the most build seconds (.ci/ninja_report.py), and at the end the seconds
# of each phase (docs/testing.md "CI time" reads them). The exit code is
# ctest's, or 1 where ctest passed but a registered test did not run, or skipped without being on
# tests/common/skip_allowlist.txt (.ci/ctest_report.py; KOLO_TEST_REQUIRE_GPU=1, on a GPU
# machine, takes the GPU tests off that list). The configure makes the test dependencies
# REQUIRED (KOLO_REQUIRE_TEST_DEPS=ON): a missing MPI, Gloo, Google Benchmark or libFuzzer fails
# it instead of registering fewer tests.
#
# Knobs (environment): CI_JOBS (default 2: CI machines have 2 cores and tests run 8 ranks),
# CI_BUILD_DIR (default build-ci), CI_BUILD_TYPE (default Release), KOLO_TIMEOUT_SECONDS
# (default 30), CI_CTEST_ARGS (extra ctest arguments, e.g. "-L package" or "-E mp/"),
# CI_FUZZ_SECONDS (default 0: each libFuzzer target in CTest, label "fuzz", replays its corpus and
# runs a fixed number of inputs from a fixed seed; N > 0 runs each for N seconds instead),
# KOLO_CI_SANITIZERS (default 1: after the main tests, build and run the CI-sized ASan+UBSan and
# TSan suites of CMakePresets.json (asan-ci, tsan-ci: the compiled core and the multi-process,
# engine and in-process algorithm suites built on it, the optimizer, launcher and soak tests) in
# build-asan and build-tsan; 0 skips them; their runs are judged the same way).
# With the sanitizers on, the exit code is the first non-zero of the main run and the suites.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

jobs=${CI_JOBS:-2}
build_dir=${CI_BUILD_DIR:-build-ci}
build_type=${CI_BUILD_TYPE:-Release}

# Every wait in kolo has this deadline; CI keeps it explicit so a hang fails in bounded time.
export KOLO_TIMEOUT_SECONDS=${KOLO_TIMEOUT_SECONDS:-30}
# CI runs as root; Open MPI refuses that unless told it is intended.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

section() { printf '\n==== %s ====\n' "$*"; }

# phase NAME: the time since the previous call (or the start) was NAME's; the result section
# lists them.
phase_names=()
phase_seconds=()
phase_mark=$SECONDS
phase() {
  phase_names+=("$1")
  phase_seconds+=($((SECONDS - phase_mark)))
  phase_mark=$SECONDS
}

# seed_costs BUILD_DIR: a build tree without ctest's cost file gets .ci/ctest_costs.txt as one,
# so the long tests start first instead of in registration order (only the order changes).
seed_costs() {
  local file=$1/Testing/Temporary/CTestCostData.txt
  [[ -s $file ]] && return 0
  mkdir -p "$(dirname "$file")"
  { awk '!/^#/ && NF == 2 { print $1, 1, $2 }' "$repo/.ci/ctest_costs.txt"; echo "---"; } >"$file"
}

# ctest_judged NAME SLOWEST CTEST-ARGS...: runs ctest with the arguments (behind the command in
# the array ctest_prefix, if any), then .ci/ctest_report.py on its JUnit file against what the
# same selection registers (ctest --show-only=json-v1), printing the SLOWEST slowest tests and the
# seconds per label (0: neither). Returns ctest's exit code, or 1 where ctest's was 0 and the
# report failed.
ctest_prefix=()
ctest_judged() {
  local name=$1 slowest=$2 out rc=0 report_rc=0
  shift 2
  out=$(mktemp -d "${TMPDIR:-/tmp}/kolo-ctest-report.XXXXXX")
  "${ctest_prefix[@]}" ctest --output-junit "$out/run.xml" "$@" || rc=$?
  # The same arguments list what the selection registers (-j and output options do not matter).
  ctest --show-only=json-v1 "$@" >"$out/tests.json" 2>/dev/null || true
  if [[ -s $out/run.xml && -s $out/tests.json ]]; then
    python3 "$repo/.ci/ctest_report.py" --name "$name" --slowest "$slowest" \
      --junit "$out/run.xml" --tests "$out/tests.json" || report_rc=$?
  else
    echo "$name: FAILED: no JUnit file or no test list from ctest"
    report_rc=1
  fi
  rm -rf "$out"
  if ((rc == 0 && report_rc != 0)); then rc=1; fi
  return "$rc"
}

# --- dependencies: only what dpkg says is missing ---
# shellcheck source=.ci/install-deps.sh
source "$repo/.ci/install-deps.sh"
install_deps
phase "dependencies"

section "toolchain"
cmake --version | head -1
echo "ninja $(ninja --version)"
g++ --version | head -1
echo "cores: $(nproc), jobs: $jobs, KOLO_TIMEOUT_SECONDS=$KOLO_TIMEOUT_SECONDS"

section "python test environment (tests/pyenv.sh: torch, pyspark, pytest; cached)"
# Installed here, before CTest, so the minutes of its first install are not taken out of a test's
# timeout. The Python suites (spark/, torch/) call the same script and find it ready.
started=$SECONDS
if ! KOLO_PYTHON_ENV=$(bash "$repo/tests/pyenv.sh"); then
  echo "tests/pyenv.sh failed: the Python suites (torch/, spark/) will fail" >&2
fi
echo "python: ${KOLO_PYTHON_ENV:-none} ($((SECONDS - started)) s)"
phase "python environment"

section "configure ($build_type) into $build_dir"
# -O2: the level the suite is developed and timed at (Release defaults to -O3).
# The libtorch example (examples/libtorch) builds against the venv's torch wheel.
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="$build_type" \
  -DCMAKE_CXX_FLAGS_RELEASE="${CI_CXX_FLAGS_RELEASE:--O2 -DNDEBUG}" \
  -DKOLO_FUZZ_SECONDS="${CI_FUZZ_SECONDS:-0}" -DKOLO_REQUIRE_TEST_DEPS=ON \
  -DKOLO_WITH_LIBTORCH=ON -DKOLO_TORCH_PYTHON="${KOLO_PYTHON_ENV:-python3}"
phase "configure"

section "build"
cmake --build "$build_dir" -j "$jobs"
phase "build"
python3 "$repo/.ci/ninja_report.py" "$build_dir" --top 15 --name "build ($build_dir)" || true

section "test"
# ctest's own summary lists the failures; its exit code is this script's, so no `set -e` here.
set +e
seed_costs "$build_dir"
# shellcheck disable=SC2086 # CI_CTEST_ARGS is a list of words on purpose
ctest_judged ctest 20 --test-dir "$build_dir" --output-on-failure -j "$jobs" ${CI_CTEST_ARGS:-}
rc=$?
set -e
phase "ctest"

# --- sanitizers: a CI-sized subset (CMakePresets.json, asan-ci / tsan-ci), own build dirs ---
sanitizers=()
sanitizer_rcs=()
if [[ ${KOLO_CI_SANITIZERS:-1} != 0 ]]; then
  for preset in asan tsan; do
    section "sanitizers: $preset (presets $preset / $preset-ci)"
    started=$SECONDS
    # TSan's runtime maps its shadow at fixed addresses; kernels with more mmap randomisation
    # than it expects (vm.mmap_rnd_bits > 28) break that, so TSan runs with ASLR off.
    ctest_prefix=()
    if [[ $preset == tsan ]] && command -v setarch >/dev/null; then
      ctest_prefix=(setarch "$(uname -m)" -R)
    fi
    set +e
    (
      set -e
      cmake --preset "$preset" >/dev/null
      cmake --build --preset "$preset-ci" -j "$jobs"
    )
    sanitizer_rc=$?
    phase "$preset build"
    python3 "$repo/.ci/ninja_report.py" "build-$preset" --top 15 --name "$preset build" || true
    if ((sanitizer_rc == 0)); then
      seed_costs "build-$preset"
      ctest_judged "$preset" 0 --preset "$preset-ci" -j "$jobs"
      sanitizer_rc=$?
    fi
    phase "$preset tests"
    set -e
    echo "$preset: exit code $sanitizer_rc after $((SECONDS - started)) s"
    sanitizers+=("$preset")
    sanitizer_rcs+=("$sanitizer_rc")
  done
fi

section "time per phase (seconds)"
for i in "${!phase_names[@]}"; do
  printf '%6d  %s\n' "${phase_seconds[i]}" "${phase_names[i]}"
done
echo "$SECONDS in all"

section "result"
failed_log="$build_dir/Testing/Temporary/LastTestsFailed.log"
if ((rc == 0)); then
  echo "all tests passed"
else
  echo "ctest exit code $rc"
  if [[ -s $failed_log ]]; then
    echo "failed tests:"
    sed 's/^/  /' "$failed_log"
  fi
fi
for i in "${!sanitizers[@]}"; do
  name=${sanitizers[i]}
  if ((sanitizer_rcs[i] == 0)); then
    echo "$name: all tests passed"
  else
    echo "$name: exit code ${sanitizer_rcs[i]}"
    if [[ -s build-$name/Testing/Temporary/LastTestsFailed.log ]]; then
      echo "$name: failed tests:"
      sed 's/^/  /' "build-$name/Testing/Temporary/LastTestsFailed.log"
    fi
    ((rc != 0)) || rc=${sanitizer_rcs[i]}
  fi
done
exit "$rc"
