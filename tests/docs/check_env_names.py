#!/usr/bin/env python3
"""Every KOLO_* variable that code names is declared in the configuration table.

Each layer declares its variables next to its code (include/kolo/core/config.hpp names the
files; tests/common/config_table.hpp is the one list of them): a variable's range, default and
doc line live there, and docs/environment.md is generated from them. This check scans
the library, the compiled C ABI (src/), the backends, the examples and the benchmarks for quoted names ("KOLO_X" or
'KOLO_X': the way code reads or exports a variable) and fails, naming file and line, for any name
the table does not declare (`kolo_env_doc --names` lists the declared ones).

    check_env_names.py KOLO_ENV_DOC_BINARY REPO_ROOT
"""
import pathlib
import re
import subprocess
import sys

# Quoted KOLO_ strings that are not environment variables.
NOT_VARIABLES = {
    "KOLO_SPARK_FAILURE",  # a marker line in a failed rank's output (kolo_spark/task.py)
}
SCANNED = ("include", "src", "backends", "examples", "benchmarks")
SUFFIXES = {".hpp", ".cpp", ".h", ".c", ".cu", ".cuh", ".py"}
PATTERN = re.compile(r"""["'](KOLO_[A-Z0-9_]+)["']""")


def main() -> int:
    doc_binary, root = sys.argv[1], pathlib.Path(sys.argv[2])
    declared = set(subprocess.run([doc_binary, "--names"], check=True, capture_output=True,
                                  text=True).stdout.split())
    undeclared = []
    scanned = 0
    for top in SCANNED:
        for path in sorted((root / top).rglob("*")):
            if path.suffix not in SUFFIXES or not path.is_file():
                continue
            if any(part.startswith(("build", "_build", ".")) for part in path.relative_to(root).parts):
                continue
            scanned += 1
            for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                for name in PATTERN.findall(line):
                    if name not in declared and name not in NOT_VARIABLES:
                        undeclared.append(f"{path.relative_to(root)}:{lineno}: {name}")
    if undeclared:
        print("KOLO_* names used in code but not declared by any layer (add a Var to the "
              "layer's *_config.hpp, see include/kolo/core/config.hpp, then regenerate "
              "docs/environment.md):")
        print("\n".join("  " + u for u in undeclared))
        return 1
    print(f"{scanned} files scanned: every quoted KOLO_* name is declared ({len(declared)} names "
          "with aliases)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
