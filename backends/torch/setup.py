"""Build of kolo_torch._C against the installed torch (see pyproject.toml).

KOLO_TORCH_CUDA=1 builds the CUDA variant: contiguous CUDA tensors then go through kolo's NCCL
transport (docs/torch.md). It needs a torch with CUDA, the CUDA toolkit's headers (CUDA_HOME,
else /usr/local/cuda) and NCCL (NCCL_HOME, else the nvidia-nccl wheel torch depends on, else
the toolkit's). Compiled by the host compiler: no nvcc. Unset or 0: the CPU build (CUDA
tensors are staged through host memory), which needs nothing of CUDA.
"""
import glob
import os

import torch
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

here = os.path.dirname(os.path.abspath(__file__))
# kolo's headers: the repository's include/ (pip builds this directory in place), or a copy
# named by KOLO_INCLUDE_DIR (an installed kolo: <prefix>/include).
kolo_include = os.environ.get("KOLO_INCLUDE_DIR") or os.path.join(here, "..", "..", "include")
if not os.path.exists(os.path.join(kolo_include, "kolo", "communicator.hpp")):
    raise RuntimeError(f"kolo-torch: kolo's headers are not at {kolo_include}: build from the "
                       "kolo repository (pip install backends/torch) or set KOLO_INCLUDE_DIR")

# c10d::Backend's interface as kolo_backend.hpp uses it (split, getBackendOptions) is torch 2.9's.
_torch_version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
if _torch_version < (2, 9):
    raise RuntimeError(f"kolo-torch: torch {torch.__version__} is installed; kolo-torch needs "
                       "torch 2.9 or later")

want_cuda = os.environ.get("KOLO_TORCH_CUDA", "0")
if want_cuda not in ("0", "1", ""):
    raise RuntimeError(f"kolo-torch: KOLO_TORCH_CUDA={want_cuda!r}: use 1 (the CUDA build) or 0")

# No debug information unless CFLAGS asks for it (-g): Python's own build flags carry -g, which
# for a file that includes torch's headers cost 1.6 times the compile time (97 s of CPU against
# 62 s on a 2-core machine) and made the module 15 times larger (19 MB against 1.3 MB).
compile_args = ["-std=c++20", "-O2", "-Wall", "-Wno-unused-parameter"]
if not any(f.startswith("-g") for f in os.environ.get("CFLAGS", "").split()):
    compile_args.append("-g0")

kwargs = dict(
    name="kolo_torch._C",
    sources=["csrc/kolo_backend.cpp"],
    include_dirs=[os.path.abspath(kolo_include), os.path.join(here, "csrc")],
    extra_compile_args=compile_args,
    libraries=["crypto"],
)


def find_nccl():
    """(include dir, lib dir, library file) of NCCL, the one torch loads first."""
    roots = []
    if os.environ.get("NCCL_HOME"):
        roots.append(os.environ["NCCL_HOME"])
    # the nvidia-nccl wheel next to torch: the libnccl.so.2 that torch itself loads
    roots.append(os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "nvidia", "nccl"))
    roots.append(cuda_home)
    for root in roots:
        inc = os.path.join(root, "include")
        if not os.path.exists(os.path.join(inc, "nccl.h")):
            continue
        for libdir in (os.path.join(root, "lib"), os.path.join(root, "lib64")):
            libs = sorted(glob.glob(os.path.join(libdir, "libnccl.so*")), key=len)
            if libs:
                return inc, libdir, os.path.basename(libs[0])
    raise RuntimeError("kolo-torch: KOLO_TORCH_CUDA=1 but NCCL (nccl.h and libnccl.so) was found "
                       f"in none of {roots}: set NCCL_HOME")


if want_cuda == "1":
    from torch.utils.cpp_extension import CUDA_HOME, CUDAExtension

    if torch.version.cuda is None:
        raise RuntimeError(f"kolo-torch: KOLO_TORCH_CUDA=1 but torch {torch.__version__} was "
                           "built without CUDA")
    cuda_home = os.environ.get("CUDA_HOME") or CUDA_HOME or "/usr/local/cuda"
    if not os.path.exists(os.path.join(cuda_home, "include", "cuda_runtime_api.h")):
        raise RuntimeError("kolo-torch: KOLO_TORCH_CUDA=1 but the CUDA toolkit's headers are not "
                           f"at {cuda_home}/include: set CUDA_HOME")
    nccl_inc, nccl_lib, nccl_file = find_nccl()
    kwargs["include_dirs"].append(nccl_inc)
    kwargs["define_macros"] = [("KOLO_TORCH_CUDA", "1")]
    kwargs["library_dirs"] = [nccl_lib]
    kwargs["extra_link_args"] = [f"-l:{nccl_file}", f"-Wl,-rpath,{nccl_lib}"]
    print(f"kolo-torch: CUDA build (torch CUDA {torch.version.cuda}, toolkit {cuda_home}, "
          f"NCCL {nccl_lib}/{nccl_file})")
    ext = CUDAExtension(**kwargs)
else:
    ext = CppExtension(**kwargs)

setup(
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
    # one build tree per variant: switching between them rebuilds nothing twice, and the two
    # never share object files
    options={"build": {"build_base": os.path.join("build", "cuda" if want_cuda == "1" else "cpu")}},
)
