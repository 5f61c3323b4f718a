"""backends/spark is a pip-installable package: a wheel builds and holds the package."""

import os
import shutil
import subprocess
import sys
import zipfile

import kolo_skip  # tests/common (conftest.py puts it on the path)
from conftest import REPO


def _can_build_offline():
    try:
        import setuptools
        import wheel  # noqa: F401  (setuptools < 70 needs it for bdist_wheel)
    except ImportError:
        return False
    return int(setuptools.__version__.split(".")[0]) >= 61


def test_wheel_builds(tmp_path):
    # Build from a copy: setuptools writes build/ and *.egg-info next to the sources.
    src = tmp_path / "src"
    shutil.copytree(os.path.join(REPO, "backends", "spark"), src,
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    out = tmp_path / "dist"
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)]
    if _can_build_offline():
        cmd.insert(4, "--no-build-isolation")
    proc = subprocess.run(cmd, cwd=tmp_path, timeout=300, capture_output=True, text=True)
    if proc.returncode != 0 and "--no-build-isolation" not in cmd:
        kolo_skip.pytest_skip("no-offline-build", "cannot build (build isolation needs setuptools "
                              f"from PyPI): {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr
    [wheel] = [f for f in os.listdir(out) if f.endswith(".whl")]
    assert wheel.startswith("kolo_spark-0.2.0-")
    names = zipfile.ZipFile(out / wheel).namelist()
    for module in ("__init__", "driver", "api", "preflight", "results", "spark_job", "local_job",
                   "task", "topology", "process", "data", "liveness", "errors", "supervisor",
                   "fnrank", "timeline", "rank", "runners", "torch", "torch_params",
                   "torch_schema", "torch_dataset", "torch_estimator", "torch_model",
                   "torch_remote", "store"):
        assert f"kolo_spark/{module}.py" in names

    # ... and installs: the installed package imports without the source tree.
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--target", str(target), str(out / wheel)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)
    probe = subprocess.run([sys.executable, "-c",
                            "import kolo_spark; print(kolo_spark.__file__, kolo_spark.__version__)"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, check=True)
    assert probe.stdout.startswith(str(target)) and probe.stdout.split()[1] == "0.2.0"


def test_run_demo_refuses_what_is_not_a_program(tmp_path):
    # A fresh clone has no build: the demo must say what to build, not submit the repository
    # directory as the program (a directory passes os.access(X_OK)).
    demo = os.path.join(REPO, "examples", "spark", "run_demo.py")
    for flags, missing in ((["--demo", REPO], "allreduce_demo"),
                           (["--demo", sys.executable, "--data", "--shard-sum", str(tmp_path)],
                            "kolo_spark_shard_sum")):
        proc = subprocess.run([sys.executable, demo, "--local-mode", *flags], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1
        assert f"{missing} not found at" in proc.stderr and "not an executable file" in proc.stderr
        assert f"--target {missing}" in proc.stderr


def test_in_tree_pip_builds_leave_git_clean():
    # `pip install backends/spark` builds in the source tree (build/, kolo_spark.egg-info/):
    # git must ignore both, so a developer's install never shows up as changes.
    if not os.path.isdir(os.path.join(REPO, ".git")) and \
            not os.path.isfile(os.path.join(REPO, ".git")):
        kolo_skip.pytest_skip("not-a-git-checkout", "not a git checkout")
    paths = ["backends/spark/build/lib/kolo_spark/driver.py",
             "backends/spark/kolo_spark.egg-info/PKG-INFO"]
    proc = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.stdout.split() == paths
