#!/usr/bin/env bash
# run_fuzzer.sh FUZZER SEEDS WORKDIR SECONDS [libFuzzer options...]
#
# One libFuzzer run: time-boxed to SECONDS (a long run by hand: `run_fuzzer.sh FUZZER SEEDS
# /tmp/w 3600`), or with SECONDS 0 bounded by the options instead (CTest's fuzz/<name> tests pass
# 0 -runs=N -seed=S: a fixed, repeatable amount of work). The seed corpus (read-only, in the
# repository) plus a working corpus in WORKDIR (new inputs land there, never in the
# repository), crash/timeout/leak artifacts in WORKDIR/artifacts. Prints libFuzzer's start and
# final statistics (executions, exec/s, coverage); on a finding, the report and the artifact's
# path, and the exit code is libFuzzer's (non-zero).
#
# To grow the repository corpus after a long run, minimise into it:
#   FUZZER -merge=1 tests/fuzz/corpus/<name> WORKDIR/corpus
set -uo pipefail

if (($# < 4)); then
  echo "usage: $0 FUZZER SEEDS WORKDIR SECONDS [libFuzzer options...]" >&2
  exit 2
fi
fuzzer=$1 seeds=$2 work=$3 seconds=$4
shift 4

rm -rf "$work"
mkdir -p "$work/corpus" "$work/artifacts"
log=$work/fuzz.log

# -timeout: one input taking this long is a finding (a hang); the harnesses' own deadlines are
# 8 s. -rss_limit_mb bounds memory (the store accepts 64 MiB values: give it room).
# OpenSSL's own process-wide state is not a leak of ours (lsan.supp).
export LSAN_OPTIONS=${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$(cd "$(dirname "$0")" && pwd)/lsan.supp
# -max_total_time=0: no time limit (the options bound the run).
"$fuzzer" -max_total_time="$seconds" -timeout=25 -rss_limit_mb=3072 -max_len=4096 \
  -print_final_stats=1 -artifact_prefix="$work/artifacts/" "$@" "$work/corpus" "$seeds" \
  >"$log" 2>&1
rc=$?

grep -E '^(INFO: Seed:|INFO: seed corpus|#[0-9]+[[:space:]]+(INITED|DONE))' "$log" | head -4
grep -E '^stat::' "$log"
if ((rc != 0)); then
  echo "---- libFuzzer exit code $rc; the end of $log:"
  tail -n 80 "$log"
  ls -l "$work/artifacts" 2>/dev/null
fi
exit "$rc"
