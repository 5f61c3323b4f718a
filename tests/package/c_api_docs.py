#!/usr/bin/env python3
"""package/c_api_docs: the C ABI's examples of docs/c_api.md, run as written from an install
prefix outside the loader's path, without LD_LIBRARY_PATH.

A fenced block is taken from the page when the line right before its fence is
    <!-- c_api example: FILE -->                  the block is written to FILE
    <!-- c_api example: FILE.sh expects OUT -->   ... a script whose output is checked against OUT
Every block lands in one scratch directory, in which `build` is a link to the already-built
kolo build tree (the page's `cmake --install build ...` installs it) and $HOME is a directory of
its own (the page installs into "$HOME/kolo"). The .sh blocks then run in page order in one bash
shell (`set -e`, so exports carry from one block to the next), with no LD_LIBRARY_PATH,
LD_RUN_PATH, PKG_CONFIG_PATH, CMAKE_PREFIX_PATH or KOLO_* variable of the caller. A script NAME.sh
with a block NAME.out (or `expects OUT`) passes only if the lines it printed that start with a
rank ("[R] ...") are those of the .out block, in any order; any other script only has to
succeed. Afterwards the installed shared libraries must carry the RUNPATH $ORIGIN.

    c_api_docs.py --doc docs/c_api.md --build-dir BUILD --work SCRATCH [--libdir lib]
                  [--cmake CMAKE_COMMAND]

--libdir is the build's CMAKE_INSTALL_LIBDIR: where it is not `lib` (lib64, lib/<multiarch>),
"$HOME/kolo/lib/" in the scripts is read as "$HOME/kolo/<libdir>/", as the page says."""
import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import time

MARKER = re.compile(r"^<!--\s*c_api example:\s*(\S+)(?:\s+expects\s+(\S+))?\s*-->\s*$")
ANY_MARKER = re.compile(r"^<!--\s*c_api example\b")
RANK_LINE = re.compile(r"^\[\d+\] ")
REQUIRED = ("allreduce.c", "allreduce.py")  # the page's C and ctypes examples
SEPARATOR = "@@@ c_api_docs block "


def extract(page):
    """[(file, expects, text, line)] of the page's marked blocks, or exits naming the problem."""
    lines = open(page, encoding="utf-8").read().splitlines()
    blocks, errors = [], []
    for i, line in enumerate(lines):
        if not ANY_MARKER.match(line):
            continue
        m = MARKER.match(line)
        if not m or os.path.basename(m.group(1)) != m.group(1):
            errors.append(f"{page}:{i + 1}: malformed marker: {line.strip()}")
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("```"):
            errors.append(f"{page}:{i + 1}: a marker must be followed by a ``` fence")
            continue
        end = i + 2
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if end >= len(lines):
            errors.append(f"{page}:{i + 2}: unterminated block")
            continue
        blocks.append((m.group(1), m.group(2), "\n".join(lines[i + 2:end]) + "\n", i + 1))
    names = [b[0] for b in blocks]
    for n, k in collections.Counter(names).items():
        if k > 1:
            errors.append(f"{page}: {n} is marked {k} times")
    for n in REQUIRED:
        if n not in names:
            errors.append(f"{page}: no block is marked {n}")
    for name, expects, _, line in blocks:
        if expects and expects not in names:
            errors.append(f"{page}:{line}: {name} expects {expects}, which no block is")
    if not any(b[0].endswith(".sh") for b in blocks):
        errors.append(f"{page}: no script (.sh) is marked: nothing would run")
    if errors:
        sys.exit("\n".join(errors))
    return blocks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--doc", required=True)
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--libdir", default="lib")
    ap.add_argument("--cmake", help="the build's cmake, put first on PATH (it installs the build)")
    ap.add_argument("--timeout", type=float, default=300)
    args = ap.parse_args()
    start = time.monotonic()

    blocks = extract(args.doc)
    work = os.path.abspath(args.work)
    shutil.rmtree(work, ignore_errors=True)
    home = os.path.join(work, "home")
    os.makedirs(home)
    os.symlink(os.path.abspath(args.build_dir), os.path.join(work, "build"))
    texts = {}
    for name, _, text, _ in blocks:
        if name.endswith(".sh") and args.libdir != "lib":
            text = text.replace("$HOME/kolo/lib/", f"$HOME/kolo/{args.libdir}/")
        texts[name] = text
        with open(os.path.join(work, name), "w", encoding="utf-8") as f:
            f.write(text)

    scripts = [(n, e) for n, e, _, _ in blocks if n.endswith(".sh")]
    driver = ["set -e"]
    for name, _ in scripts:
        driver += [f"echo '{SEPARATOR}{name}'", "set -x", f". ./{name}", "{ set +x; } 2>/dev/null"]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("KOLO_") and k not in
           ("LD_LIBRARY_PATH", "LD_RUN_PATH", "PKG_CONFIG_PATH", "CMAKE_PREFIX_PATH")}
    env["HOME"] = home
    if args.cmake:
        env["PATH"] = os.path.dirname(os.path.abspath(args.cmake)) + os.pathsep + env["PATH"]
    print("running, in " + work + ": " + ", ".join(n for n, _ in scripts), flush=True)
    try:
        run = subprocess.run(["bash", "-c", "\n".join(driver)], cwd=work, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             timeout=args.timeout)
        out, rc = run.stdout, run.returncode
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout or ""
        rc = f"timeout after {args.timeout:.0f} s"
    print(out)

    sections, current = {}, None
    for line in out.splitlines():
        if line.startswith(SEPARATOR):
            current = line[len(SEPARATOR):]
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
    failures = []
    failed = None  # the script that stopped the shell: its output is not checked
    if rc != 0:
        failed = list(sections)[-1] if sections else scripts[0][0]
        failures.append(f"{failed} failed ({'exit ' + str(rc) if isinstance(rc, int) else rc})")
    for name, expects in scripts:
        out_name = expects or name[:-3] + ".out"
        if name not in sections or out_name not in texts or name == failed:
            continue
        want = sorted(line for line in texts[out_name].splitlines() if line.strip())
        got = sorted(line for line in sections[name] if RANK_LINE.match(line))
        if got != want:
            failures.append(f"{name} printed\n  " + "\n  ".join(got or ["(no rank lines)"]) +
                            f"\nbut {out_name} on the page says\n  " + "\n  ".join(want))
        else:
            print(f"{name}: the {len(want)} lines of {out_name}, as the page says")

    # The installed shared libraries find what sits next to them wherever the prefix is.
    libdir = os.path.join(home, "kolo", args.libdir)
    readelf = shutil.which("readelf")
    if rc == 0 and readelf:
        for lib in ("libkolo_c.so", "libkolo.so"):
            path = os.path.join(libdir, lib)
            if not os.path.exists(path):
                failures.append(f"{path} was not installed")
                continue
            dyn = subprocess.run([readelf, "-d", path], stdout=subprocess.PIPE, text=True).stdout
            if not re.search(r"\((RUNPATH|RPATH)\)\s+Library (runpath|rpath): \[\$ORIGIN\]", dyn):
                failures.append(f"{path} has no RUNPATH $ORIGIN:\n{dyn}")
            else:
                print(f"{lib}: RUNPATH $ORIGIN")

    print(f"c_api_docs: {time.monotonic() - start:.1f} s")
    if failures:
        print("c_api_docs: FAILED: " + "\n".join(failures), file=sys.stderr)
        return 1
    print("c_api_docs: every example of the page ran as written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
