"""Pre-flight checks: refusing, on the driver and before anything is submitted, a barrier job
that Spark could not run (dynamic allocation, missing GPU settings, too few task slots, a
pyspark that cannot pickle this Python's functions), with a message saying what to change.

The checks are pure functions of the configuration (unit-tested without Spark), plus
:func:`check_spark`, the sequence :func:`kolo_spark.run` applies to a live SparkContext.
"""

from __future__ import annotations

import os
import re
import sys
import time
from typing import List, Mapping, Optional, Tuple

from .errors import ConfigurationError

_LOCAL_MASTER = re.compile(r"^local(?:\[(\*|\d+)(?:\s*,\s*\d+)?\])?$")


def local_master_slots(master: str, cpus_per_task: int = 1) -> Optional[int]:
    """Task slots of a ``local``/``local[N]``/``local[*]``/``local[N,F]`` master; None for
    anything else (standalone, YARN, k8s, local-cluster: executors come and go)."""
    m = _LOCAL_MASTER.match(master.strip())
    if not m:
        return None
    n = m.group(1)
    cores = 1 if n is None else (os.cpu_count() or 1) if n == "*" else int(n)
    return cores // max(1, cpus_per_task)


def _truthy(v: Optional[str]) -> bool:
    return v is not None and v.strip().lower() == "true"


def python_problem(pyspark_version: str, python: Tuple[int, int] = sys.version_info[:2]
                   ) -> Optional[str]:
    """The message for a pyspark that cannot run Python jobs on this interpreter, else None.
    pyspark before 3.4 supports Python up to 3.10: its bundled cloudpickle fails on 3.11's code
    objects ("IndexError: tuple index out of range"), in kolo_spark's pickling and in Spark's own
    task serialization alike, so every job would fail with that obscure error."""
    m = re.match(r"(\d+)\.(\d+)", pyspark_version or "")
    if m and (int(m.group(1)), int(m.group(2))) < (3, 4) and tuple(python) >= (3, 11):
        return (f"pyspark {pyspark_version} does not support Python {python[0]}.{python[1]} "
                "(pyspark before 3.4 supports Python up to 3.10: its cloudpickle cannot pickle "
                "3.11's functions, and every Python job would fail). Use Python 3.10 or older "
                "with this Spark, or pyspark 3.4 or later.")
    return None


def pyspark_problem() -> Optional[str]:
    """python_problem for the pyspark this process uses (imported already, or importable);
    None without pyspark."""
    mod = sys.modules.get("pyspark")
    if mod is None:
        try:
            import pyspark as mod
        except ImportError:
            return None
    return python_problem(getattr(mod, "__version__", ""))


_pyspark_problem = pyspark_problem  # the name kolo_spark.driver had


def check_conf(conf: Mapping[str, str], use_gpu: Optional[bool],
               master: Optional[str] = None) -> List[str]:
    """Problems of the Spark configuration for a barrier job, as messages (empty: fine).
    ``master``: the application's master (a local master ignores dynamic allocation, and so
    does Spark's barrier check)."""
    problems = []
    local = master is not None and local_master_slots(master) is not None
    if _truthy(conf.get("spark.dynamicAllocation.enabled")) and not local:
        problems.append(
            "spark.dynamicAllocation.enabled=true: a barrier stage needs all of its tasks "
            "running at once on executors that stay; Spark refuses barrier stages under dynamic "
            "allocation. Start the session with spark.dynamicAllocation.enabled=false and a "
            "fixed number of executors (spark.executor.instances or spark.cores.max).")
    task_gpu = conf.get("spark.task.resource.gpu.amount")
    exec_gpu = conf.get("spark.executor.resource.gpu.amount")
    if not task_gpu:
        if use_gpu:
            problems.append(
                "GPUs were requested (use_gpu=True) but spark.task.resource.gpu.amount is not "
                "set, so tasks would get no GPU and KOLO_DEVICES would be empty. Set "
                "spark.task.resource.gpu.amount (e.g. 1) together with "
                "spark.executor.resource.gpu.amount and a discovery script.")
        elif use_gpu is None and exec_gpu:
            problems.append(
                f"executors have GPUs (spark.executor.resource.gpu.amount={exec_gpu}) but "
                "spark.task.resource.gpu.amount is not set, so tasks would get no GPU and "
                "KOLO_DEVICES would be empty. Set spark.task.resource.gpu.amount (e.g. 1), or "
                "pass use_gpu=False to run without GPUs.")
    return problems


def slots_problem(num_proc: int, slots: int, master: str, conf: Mapping[str, str],
                  waited: float = 0.0) -> Optional[str]:
    """The message for too few task slots, or None."""
    if slots >= num_proc:
        return None
    how = [f"master {master}"]
    if conf.get("spark.task.cpus", "1") not in ("1", ""):
        how.append(f"spark.task.cpus={conf.get('spark.task.cpus')}")
    if conf.get("spark.task.resource.gpu.amount"):
        how.append(f"spark.task.resource.gpu.amount={conf.get('spark.task.resource.gpu.amount')}")
    after = f" after waiting {waited:.0f}s for executors" if waited >= 1 else ""
    if local_master_slots(master) is not None:
        cpus = int(conf.get("spark.task.cpus", "1") or 1)
        more = (f"cores (master local[{num_proc * cpus}]"
                + (f", or spark.task.cpus=1 with local[{num_proc}]" if cpus > 1 else "") + ").")
    else:
        more = ("executors or cores (spark.executor.instances, spark.executor.cores, "
                "spark.cores.max; for GPUs, more GPUs per executor).")
    return (f"num_proc={num_proc} but the Spark application has only {slots} task slot"
            f"{'s' if slots != 1 else ''}{after} ({', '.join(how)}). A barrier stage starts "
            f"all {num_proc} tasks at once, so Spark would wait for slots that never come and "
            "fail only after spark.scheduler.barrier.maxConcurrentTasksCheck.* (about 10 "
            f"minutes). Use num_proc <= {slots}, or give the application more " + more)


def task_slots(sc) -> int:
    """How many tasks the application can run at once now (honours spark.task.cpus and task
    resources such as GPUs)."""
    try:
        jsc = sc._jsc.sc()
        rp = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(rp))
    except Exception:  # older/newer Spark without this internal method
        cpus = int(sc.getConf().get("spark.task.cpus", "1"))
        local = local_master_slots(sc.master, cpus)
        return local if local is not None else int(sc.defaultParallelism) // max(1, cpus)


def spark_size(text: Optional[str]) -> int:
    """Bytes of a Spark size ("1g", "512m", "0"); 0 for none/unlimited/unparsable."""
    m = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)b?\s*", (text or "").lower())
    if not m:
        return 0
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[m.group(2)]


def check_spark(sc, conf: Mapping[str, str], num_proc: int, use_gpu: Optional[bool],
                start_timeout: float) -> None:
    """Raises ConfigurationError when ``sc`` cannot run a barrier job of ``num_proc`` tasks:
    its configuration (:func:`check_conf`, :func:`pyspark_problem`), then its task slots (a
    cluster's executors may still be registering: waited for up to ``start_timeout``)."""
    problems = check_conf(conf, use_gpu, sc.master)
    bad_python = pyspark_problem()
    if bad_python:
        problems.insert(0, bad_python)
    if problems:
        raise ConfigurationError("kolo_spark: cannot run a barrier job:\n  - " +
                                 "\n  - ".join(problems))
    # Slots: a local master has them all now; a cluster's executors may still be registering.
    slots = task_slots(sc)
    waited = 0.0
    if slots < num_proc and local_master_slots(sc.master) is None:
        t0 = time.monotonic()
        while slots < num_proc and time.monotonic() - t0 < start_timeout:
            time.sleep(0.5)
            slots = task_slots(sc)
        waited = time.monotonic() - t0
    problem = slots_problem(num_proc, slots, sc.master, conf, waited)
    if problem:
        raise ConfigurationError("kolo_spark: " + problem)
