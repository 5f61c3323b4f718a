#!/usr/bin/env python3
""".ci/ninja_report.py — where a Ninja build's time went, per target: reads BUILD_DIR/.ninja_log
and prints the build steps' seconds summed per CMake target (the CMakeFiles/<target>.dir of each
object; links and other steps under their own output), the N largest, and the total.

    ninja_report.py BUILD_DIR [--top N] [--name NAME]

The seconds are each step's own wall time, so at `-j 2` they sum to about twice the build's wall
time; the share of each target is what counts. Only the last entry of each output is read (a
rebuilt object replaces its earlier entry), and the outputs of one multi-output step are counted
once. tests/run.sh runs it after each build so that the CI log says which targets cost the most.
"""

import argparse
import collections
import os
import re
import sys

TARGET_DIR = re.compile(r"CMakeFiles/([^/]+)\.dir/")


def read_log(path):
    """{output: (start_ms, end_ms, command_hash)} of the log's last entry per output."""
    entries = {}
    with open(path) as f:
        header = f.readline()
        if not header.startswith("# ninja log"):
            raise ValueError(f"{path} is not a ninja log")
        for line in f:
            fields = line.rstrip("\n").split("\t")
            if len(fields) != 5:
                continue
            start, end, _mtime, output, command_hash = fields
            entries[output] = (int(start), int(end), command_hash)
    return entries


def target_of(output):
    """The CMake target a step belongs to: its object directory's, else the output's name."""
    m = TARGET_DIR.search(output)
    if m:
        return m.group(1)
    return os.path.basename(output) + " (link/other)"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build_dir")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--name", default="build")
    args = parser.parse_args()
    log = os.path.join(args.build_dir, ".ninja_log")
    if not os.path.exists(log):
        print(f"{args.name}: no {log}")
        return 0
    seconds = collections.Counter()
    steps = collections.Counter()
    seen = set()
    for output, (start, end, command_hash) in read_log(log).items():
        key = (start, end, command_hash)
        if key in seen:  # another output of the same step
            continue
        seen.add(key)
        target = target_of(output)
        seconds[target] += (end - start) / 1000.0
        steps[target] += 1
    total = sum(seconds.values())
    print(f"{args.name}: {total:.0f} s of build steps ({sum(steps.values())} steps, "
          f"{len(seconds)} targets); the {min(args.top, len(seconds))} largest:")
    for target, s in seconds.most_common(args.top):
        share = 100.0 * s / total if total else 0.0
        print(f"  {s:8.1f} s {share:5.1f} %  {steps[target]:4d} steps  {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
