#!/usr/bin/env bash
# tests/torch/run.sh — runs one of the kolo_torch test scripts with the cached test venv's python
# (tests/pyenv.sh: torch from PyPI). `run.sh install` installs the plugin into that venv the way
# a user does (pip install backends/torch, which compiles the extension against that torch);
# CTest runs it first (fixture torch_plugin). No skip: a missing torch or a failed build is a
# failure, in CI and elsewhere.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
py=$(bash "$repo/tests/pyenv.sh") || {
  echo "tests/torch: the Python test environment (torch) could not be installed" >&2
  exit 1
}
export PYTHONDONTWRITEBYTECODE=1
if [[ ${1:-} == install ]]; then
  started=$SECONDS
  "$py" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$repo/backends/torch"
  "$py" -c 'import kolo_torch, torch; print("kolo_torch", kolo_torch.__file__, "for torch", torch.__version__)'
  echo "installed in $((SECONDS - started)) s"
  exit 0
fi
script=$1
shift
work=$(mktemp -d "${TMPDIR:-/tmp}/kolo-torch-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
"$py" "$here/$script" "$@"
