"""In-tree PEP 517 backend of kolo-torch: setuptools, plus the installed torch on sys.path.

pip builds in an isolated environment that holds only the build requirements. Declaring torch
there would download a second torch (5 GB) of possibly another version, and an extension built
against it would not load in the user's. Instead, this asks the target interpreter (the one pip
runs, without pip's isolation variables) where its torch lives and puts that on sys.path, so
setup.py builds against exactly the torch that will import the extension.
"""
import os
import subprocess
import sys


def _find_target_torch():
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONNOUSERSITE", "PYTHONHOME", "PYTHONSAFEPATH")}
    probe = ("import os, torch; "
             "print(os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__))))")
    for exe in (os.environ.get("KOLO_TORCH_PYTHON"), sys.executable,
                getattr(sys, "_base_executable", None)):
        if not exe:
            continue
        try:
            out = subprocess.run([exe, "-I", "-c", probe], env=env, capture_output=True,
                                 text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[-1]
    return None


try:
    import torch  # noqa: F401  (already importable: --no-build-isolation)
except ImportError:
    _site = _find_target_torch()
    if _site is None:
        raise RuntimeError(
            "kolo-torch: torch is not installed in the environment this package is being "
            "installed into; install torch first (pip install torch), then kolo-torch")
    sys.path.append(_site)

from setuptools.build_meta import *  # noqa: E402,F401,F403
from setuptools.build_meta import __all__  # noqa: E402,F401
