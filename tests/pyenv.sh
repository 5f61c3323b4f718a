#!/usr/bin/env bash
# tests/pyenv.sh — the Python environment of the Python test suites (Spark, PyTorch): a virtual
# environment in a cache directory, created once and reused, holding tests/requirements-py.txt
# (torch from PyPI is about 5 GB with its CUDA wheels and takes 2-3 min to install: never per
# test). Prints the environment's python on stdout; everything else goes to stderr.
#
#   py=$(bash tests/pyenv.sh) || exit 1
#
# The environment is rebuilt when the requirements file changes (a stamp holds its hash).
# Knobs: KOLO_PYENV (the directory; default ${XDG_CACHE_HOME:-~/.cache}/kolo/pyenv),
# PYTHON (the interpreter that creates it; default python3), KOLO_TEST_PYTHON (an interpreter
# to use as it is instead, e.g. a venv with another torch or pyspark: nothing is installed).
# Exit 1 with the reason when it cannot be had: a test suite that needs it fails loudly.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
reqs="$here/requirements-py.txt"
env_dir=${KOLO_PYENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kolo/pyenv}
base_py=${PYTHON:-python3}

if [[ -n ${KOLO_TEST_PYTHON:-} ]]; then
  [[ -x $KOLO_TEST_PYTHON ]] || {
    echo "pyenv.sh: KOLO_TEST_PYTHON=$KOLO_TEST_PYTHON is not an executable" >&2
    exit 1
  }
  echo "$KOLO_TEST_PYTHON"
  exit 0
fi

want=$(sha256sum "$reqs" | cut -c1-16)
stamp="$env_dir/.kolo-requirements"
if [[ -x $env_dir/bin/python && -f $stamp && $(cat "$stamp") == "$want" ]]; then
  echo "$env_dir/bin/python"
  exit 0
fi

command -v "$base_py" >/dev/null || {
  echo "pyenv.sh: $base_py not found" >&2
  exit 1
}
# Debian's python3 needs python3-venv for "-m venv"; install it when we can.
if ! "$base_py" -m venv --help >/dev/null 2>&1 || ! "$base_py" -c 'import ensurepip' 2>/dev/null; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q python3-venv >&2 || { apt-get update -q >&2 && apt-get install -y -q python3-venv >&2; }
  fi
fi

# One installer at a time (CTest runs the Python suites in parallel).
mkdir -p "$(dirname "$env_dir")"
exec 9>"$env_dir.lock"
flock 9
if [[ -x $env_dir/bin/python && -f $stamp && $(cat "$stamp") == "$want" ]]; then
  echo "$env_dir/bin/python"
  exit 0
fi
echo "pyenv.sh: installing $(grep -cv '^\s*\(#\|$\)' "$reqs") packages into $env_dir (once; torch takes minutes)" >&2
started=$SECONDS
[[ -x $env_dir/bin/python ]] || "$base_py" -m venv "$env_dir" >&2
"$env_dir/bin/python" -m pip install -q --disable-pip-version-check -r "$reqs" >&2 || {
  echo "pyenv.sh: pip install -r $reqs failed (see above)" >&2
  exit 1
}
echo "$want" >"$stamp"
echo "pyenv.sh: ready after $((SECONDS - started)) s" >&2
echo "$env_dir/bin/python"
