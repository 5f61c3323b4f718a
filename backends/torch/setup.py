"""Build of kolo_torch._C against the installed torch (see pyproject.toml)."""
import os

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

here = os.path.dirname(os.path.abspath(__file__))
# kolo's headers: the repository's include/ (pip builds this directory in place), or a copy
# named by KOLO_INCLUDE_DIR (an installed kolo: <prefix>/include).
kolo_include = os.environ.get("KOLO_INCLUDE_DIR") or os.path.join(here, "..", "..", "include")
if not os.path.exists(os.path.join(kolo_include, "kolo", "communicator.hpp")):
    raise RuntimeError(f"kolo-torch: kolo's headers are not at {kolo_include}: build from the "
                       "kolo repository (pip install backends/torch) or set KOLO_INCLUDE_DIR")

setup(
    ext_modules=[
        CppExtension(
            name="kolo_torch._C",
            sources=["csrc/kolo_backend.cpp"],
            include_dirs=[os.path.abspath(kolo_include), os.path.join(here, "csrc")],
            extra_compile_args=["-std=c++20", "-O2", "-Wall", "-Wno-unused-parameter"],
            libraries=["crypto"],
        )
    ],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=True)},
)
