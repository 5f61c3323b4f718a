#!/usr/bin/env python3
""".ci/ctest_report.py — judges and summarises one ctest run for tests/run.sh: every registered test
must have run, and only the allow-listed ones may skip; then the slowest tests and the seconds
per label.

    ctest_report.py --junit RUN.xml --tests TESTS.json [--allowlist FILE] [--slowest N] [--name NAME]

RUN.xml     ctest --output-junit of the run
TESTS.json  ctest --show-only=json-v1 with the same selection (-R, -L, --preset...): what is
            registered, with each test's labels
FILE        tests/common/skip_allowlist.txt: CTest name globs and the reason each may skip for;
            with KOLO_TEST_REQUIRE_GPU=1 the no-gpu entries do not count
--slowest   print the N slowest tests and the seconds per label (0: neither)

Exit status 1 when a registered test is missing from the run or did not run (skipped, not run,
disabled) without being an allow-listed skip (a missing program or a failed fixture never is);
0 otherwise (failed tests are ctest's own exit code's
business and are only counted here).
"""

import argparse
import fnmatch
import json
import os
import sys
import xml.etree.ElementTree as ET

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_allowlist(path, require_gpu):
    entries = []
    with open(path) as f:
        for line in f:
            words = line.split()
            if len(words) < 2 or words[0].startswith("#"):
                continue
            if require_gpu and words[1] == "no-gpu":
                continue
            entries.append((words[0], words[1]))
    return entries


def allowed(name, entries):
    for pattern, reason in entries:
        if fnmatch.fnmatchcase(name, pattern):
            return reason
    return None


def registered_tests(path):
    with open(path) as f:
        data = json.load(f)
    tests = {}
    for t in data.get("tests", []):
        labels = []
        for p in t.get("properties", []):
            if p.get("name") == "LABELS":
                labels = list(p.get("value") or [])
        tests[t["name"]] = labels
    return tests


def junit_results(path):
    """{name: (status, seconds, message)}; status is ctest's: run, fail, notrun, disabled."""
    results = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        skipped = case.find("skipped")
        message = skipped.get("message", "") if skipped is not None else ""
        results[case.get("name")] = (case.get("status", ""), float(case.get("time") or 0), message)
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--junit", required=True)
    ap.add_argument("--tests", required=True)
    ap.add_argument("--allowlist", default=os.path.join(REPO, "tests", "common", "skip_allowlist.txt"))
    ap.add_argument("--slowest", type=int, default=20)
    ap.add_argument("--name", default="ctest")
    args = ap.parse_args()

    require_gpu = os.environ.get("KOLO_TEST_REQUIRE_GPU") == "1"
    entries = read_allowlist(args.allowlist, require_gpu)
    registered = registered_tests(args.tests)
    results = junit_results(args.junit)

    problems = []
    missing = sorted(n for n in registered if n not in results)
    for n in missing:
        problems.append(f"{n}: registered but not in the run")
    ran = failed = 0
    allowed_skips = []
    for name, (status, _, message) in sorted(results.items()):
        if status == "run":
            ran += 1
        elif status == "fail":
            ran += 1
            failed += 1
        else:
            # A skip is the test's own word (SKIP_RETURN_CODE, SKIP_REGULAR_EXPRESSION); a test
            # whose program is missing or whose fixture failed is "notrun" too, never allowed.
            reason = allowed(name, entries) if message.startswith("SKIP_") else None
            if reason:
                allowed_skips.append(f"{name} ({reason})")
            else:
                if message.startswith("SKIP_"):
                    problems.append(f"{name}: skipped ({message}), and it is not on "
                                    "tests/common/skip_allowlist.txt" +
                                    (" (KOLO_TEST_REQUIRE_GPU=1: the no-gpu entries do not count)"
                                     if require_gpu else ""))
                else:
                    problems.append(f"{name}: {status}" + (f" ({message})" if message else ""))

    if args.slowest > 0 and results:
        print(f"{args.name}: the {min(args.slowest, len(results))} slowest tests (seconds)")
        for name, (status, secs, _) in sorted(results.items(), key=lambda kv: -kv[1][1])[:args.slowest]:
            print(f"  {secs:8.1f}  {name}" + ("" if status == "run" else f"  [{status}]"))
        totals = {}
        counts = {}
        for name, (_, secs, _) in results.items():
            for label in registered.get(name) or ["(no label)"]:
                totals[label] = totals.get(label, 0.0) + secs
                counts[label] = counts.get(label, 0) + 1
        print(f"{args.name}: seconds per label (a test with several labels counts in each)")
        for label, secs in sorted(totals.items(), key=lambda kv: -kv[1]):
            print(f"  {secs:8.1f}  {label} ({counts[label]} test{'s' * (counts[label] != 1)})")
        print(f"  {sum(s for _, s, _ in results.values()):8.1f}  all ({len(results)} tests)")

    print(f"{args.name}: {len(registered)} registered, {ran} ran ({failed} failed), "
          f"{len(allowed_skips)} allowed skips" +
          (": " + ", ".join(allowed_skips) if allowed_skips else ""))
    if problems:
        print(f"{args.name}: FAILED: {len(problems)} registered tests did not run and may not skip:")
        for p in problems:
            print(f"  {p}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
