#!/usr/bin/env bash
# tests/torch/run.sh — runs one of the kolo_torch test scripts with the cached test venv's python
# (tests/pyenv.sh: torch from PyPI). `run.sh install` installs the plugin into that venv the way
# a user does (pip install backends/torch, which compiles the extension against that torch);
# CTest runs it first (fixture torch_plugin); `run.sh install-cuda DIR` builds the CUDA variant
# into DIR (fixture torch_cuda_plugin). No skip: a missing torch or a failed build is a
# failure, in CI and elsewhere. KOLO_TEST_PYTHON (tests/pyenv.sh) runs them with another
# interpreter (another torch version).
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
if [[ ${1:-} == install-cuda ]]; then
  # The CUDA build (KOLO_TORCH_CUDA=1) into a directory of its own (the venv keeps the CPU
  # build): the tests that use it put that directory on PYTHONPATH.
  target=${2:?install-cuda needs a target directory}
  started=$SECONDS
  rm -rf "$target"
  KOLO_TORCH_CUDA=1 "$py" -m pip install -q --disable-pip-version-check --no-deps \
    --target "$target" "$repo/backends/torch"
  PYTHONPATH=$target "$py" -c 'import kolo_torch, torch
assert kolo_torch._C.built_with_cuda(), kolo_torch.__file__
print("kolo_torch (CUDA build)", kolo_torch.__file__, "for torch", torch.__version__,
      "CUDA", torch.version.cuda, "GPUs", torch.cuda.device_count())'
  echo "built in $((SECONDS - started)) s"
  exit 0
fi
script=$1
shift
work=$(mktemp -d "${TMPDIR:-/tmp}/kolo-torch-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$work"
export TORCHINDUCTOR_CACHE_DIR="$work/torchinductor"  # not /tmp/torchinductor_$USER, kept after
"$py" "$here/$script" "$@"
