#!/usr/bin/env bash
# tests/torch/compat.sh — kolo_torch's C++ source against the headers of another torch release:
# compiles backends/torch/csrc/kolo_backend.cpp (-fsyntax-only, the CPU build or, where the CUDA
# toolkit and NCCL's header are, the CUDA build) with the include paths and flags torch's
# extension builder uses. The other suites build and run the plugin on the pinned torch
# (tests/requirements-py.txt); this checks the oldest supported one (docs/torch.md) without
# installing it: its wheel (no dependencies, about 0.5 GB) is downloaded once and only its
# torch/include is kept, in ${XDG_CACHE_HOME:-~/.cache}/kolo/torch-headers/VERSION.
#
#   bash tests/torch/compat.sh 2.9.0 [2.13.0 ...]
#
# A failed download or compile fails the test (no skip).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
py=$(bash "$repo/tests/pyenv.sh") || {
  echo "tests/torch/compat.sh: the Python test environment could not be installed" >&2
  exit 1
}
[[ $# -gt 0 ]] || { echo "usage: compat.sh TORCH_VERSION..." >&2; exit 2; }
cache=${XDG_CACHE_HOME:-$HOME/.cache}/kolo/torch-headers
pyinc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
cxx=${CXX:-c++}
cuda=${CUDA_HOME:-/usr/local/cuda}
nccl_inc=""
for d in "$("$py" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)/include" \
  "$cuda/include"; do
  if [[ -f $d/nccl.h ]]; then nccl_inc=$d; break; fi
done

status=0
for v in "$@"; do
  inc=$cache/$v/torch/include
  if [[ ! -f $inc/torch/csrc/api/include/torch/version.h ]]; then
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/kolo-torch-wheel.XXXXXX")
    echo "downloading torch $v's wheel (headers only are kept)"
    "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      "torch==$v" -d "$tmp"
    rm -rf "${cache:?}/$v"
    mkdir -p "$cache/$v"
    "$py" -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("torch/include/")])' \
      "$tmp"/torch-*.whl "$cache/$v"
    rm -rf "$tmp"
  fi
  # The CUDA build's text is the CPU build's plus the CUDA paths (the CPU build's own branches
  # are stubs that use nothing of torch: `class CudaPath {}`, `return false`), so where the
  # toolkit and NCCL's header are, the CUDA build alone is checked (KOLO_TORCH_COMPAT_BOTH=1
  # checks both); elsewhere the CPU build.
  variants=(cpu)
  if [[ -f $cuda/include/cuda_runtime_api.h && -n $nccl_inc ]]; then
    variants=(cuda)
    [[ ${KOLO_TORCH_COMPAT_BOTH:-0} == 1 ]] && variants=(cpu cuda)
  fi
  for variant in "${variants[@]}"; do
    extra=()
    [[ $variant == cuda ]] && extra=(-DKOLO_TORCH_CUDA=1 -isystem "$nccl_inc" -isystem "$cuda/include")
    started=$SECONDS
    if "$cxx" -fsyntax-only -std=c++20 -O2 -Wall -Wno-unused-parameter -Werror -fPIC \
      -DTORCH_API_INCLUDE_EXTENSION_H -DTORCH_EXTENSION_NAME=_C "${extra[@]}" \
      "-I$repo/include" "-I$repo/backends/torch/csrc" -isystem "$inc" -isystem "$inc/torch/csrc/api/include" \
      -isystem "$pyinc" "$repo/backends/torch/csrc/kolo_backend.cpp"; then
      echo "PASS torch $v, $variant build: kolo_backend.cpp compiles ($((SECONDS - started)) s)"
    else
      echo "FAIL torch $v, $variant build: kolo_backend.cpp does not compile"
      status=1
    fi
  done
done
exit $status
