"""A Spark standalone cluster on this machine: a master and two workers started from the
pyspark distribution, each worker with a fake GPU discovery script that gives it its own GPU
ids (worker 1: 0,1; worker 2: 2,3). Each worker runs one executor with 2 cores and 2 GPUs, so
4 barrier tasks get one GPU each.

Two "hosts" on one machine: both executors have the same hostname and network namespace, so
the test passes host_key="executor" (each executor's RPC address is its host key). The workers
do not get PYTHONPATH: the executors run the kolo_spark that run() ships with sc.addPyFile.
Everything started here is stopped at the end (process groups killed, checked by pid)."""

import os
import re
import threading
import signal
import subprocess
import sys
import time

import pytest

import kolo_spark
from conftest import DEMO_LINE, process_gone, spark_session, wait_gone

import pyspark  # noqa: E402  (a missing pyspark is an error, never a skip)

ENV = {"KOLO_TIMEOUT_SECONDS": "60"}


def _spark_home():
    return os.path.dirname(pyspark.__file__)


def _daemon_env():
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPARK_WORKER_OPTS")}
    env["SPARK_HOME"] = _spark_home()
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    env["PYSPARK_PYTHON"] = sys.executable
    return env


def _wait_for_line(path, pattern, proc, limit):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if proc.poll() is not None:
            break
        try:
            with open(path, errors="replace") as f:
                m = re.search(pattern, f.read())
            if m:
                return m
        except FileNotFoundError:
            pass
        time.sleep(0.2)
    with open(path, errors="replace") as f:
        log = f.read()[-3000:]
    raise RuntimeError(f"no /{pattern}/ in {path} within {limit}s (exit {proc.poll()}):\n{log}")


class Cluster:
    def __init__(self, workdir):
        self.workdir = workdir
        self.procs = []
        self.url = None

    def _start(self, name, args, extra_env=None):
        env = _daemon_env()
        env.update(extra_env or {})
        log = os.path.join(self.workdir, f"{name}.log")
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [os.path.join(_spark_home(), "bin", "spark-class"), *args], env=env,
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)  # its own group: executors and Python daemons included
        self.procs.append(proc)
        return proc, log

    def start(self, workers=2, cores=2, gpus_per_worker=2):
        master, log = self._start("master", ["org.apache.spark.deploy.master.Master",
                                             "--host", "127.0.0.1", "--port", "0",
                                             "--webui-port", "0"])
        m = _wait_for_line(log, r"Starting Spark master at (spark://[\d.]+:\d+)", master, 120)
        self.url = m.group(1)
        _wait_for_line(log, r"I have been elected leader", master, 60)
        for w in range(workers):
            ids = [str(w * gpus_per_worker + g) for g in range(gpus_per_worker)]
            script = os.path.join(self.workdir, f"gpus-worker{w}.sh")
            with open(script, "w") as f:
                f.write("#!/bin/sh\n# fake GPU discovery for a test worker\n"
                        f"echo '{{\"name\": \"gpu\", \"addresses\": [{', '.join(repr(i).replace(chr(39), chr(34)) for i in ids)}]}}'\n")
            os.chmod(script, 0o755)
            wdir = os.path.join(self.workdir, f"worker{w}")
            os.makedirs(wdir)
            opts = (f"-Dspark.worker.resource.gpu.amount={gpus_per_worker} "
                    f"-Dspark.worker.resource.gpu.discoveryScript={script}")
            self._start(f"worker{w}", ["org.apache.spark.deploy.worker.Worker",
                                       "--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
                                       "--cores", str(cores), "--memory", "1g",
                                       "--work-dir", wdir, self.url],
                        {"SPARK_WORKER_OPTS": opts})
        for w, proc in enumerate(self.procs[1:]):
            _wait_for_line(os.path.join(self.workdir, f"worker{w}.log"),
                           r"Successfully registered with master", proc, 120)

    def stop(self):
        for proc in reversed(self.procs):
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=10)
                    break
                except subprocess.TimeoutExpired:
                    continue
            # Executors and their Python workers live in the worker's group: none may stay.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()

    def group_members(self):
        members = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) in {p.pid for p in self.procs} and fields[0] not in "ZX":
                members.append(int(pid))
        return members


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(str(tmp_path_factory.mktemp("standalone")))
    try:
        c.start()
        yield c
    finally:
        c.stop()
        left = wait_gone(c.group_members(), 10)
        assert left == [], f"cluster processes left running: {left}"


@pytest.fixture(scope="module")
def spark(cluster):
    session = spark_session(
        cluster.url, "kolo_spark-standalone",
        spark__executor__cores="2", spark__cores__max="4", spark__executor__memory="512m",
        spark__executor__resource__gpu__amount="2", spark__task__resource__gpu__amount="1",
        spark__task__maxFailures="1")
    # Executors register a while after the application starts: let every test see all 4 slots.
    deadline = time.monotonic() + 180
    while kolo_spark.task_slots(session.sparkContext) < 4 and time.monotonic() < deadline:
        time.sleep(0.5)
    yield session
    session.stop()


def test_two_hosts_distinct_gpus_and_right_ranks(spark, demo_bin):
    # The program prints what it got, then execs the demo (which keeps the inherited fds).
    script = ('echo "devices=$KOLO_DEVICES host=$KOLO_HOST_KEY"; '
              'echo "cuda=$CUDA_VISIBLE_DEVICES/$KOLO_CUDA_DEVICE"; exec "$0" "$@"')
    result = kolo_spark.run(spark, 4, ["sh", "-c", script, demo_bin], ["65537"], env=ENV,
                            host_key="executor", collect_output="all", echo=False,
                            start_timeout=120, stream_logs=False)
    assert result.exit_codes == [0, 0, 0, 0]
    devices = [r.devices for r in result.ranks]
    assert all(len(d) == 1 for d in devices), devices
    assert sorted(d[0] for d in devices) == ["0", "1", "2", "3"]  # every rank its own GPU
    hosts = [r.host for r in result.ranks]
    assert len(set(hosts)) == 2, hosts
    by_host = {}
    for r in result.ranks:
        by_host.setdefault(r.host, []).append(r)
        # what the native process saw
        m = re.search(r"devices=(\S*) host=(\S+)", r.output)
        assert m and m.group(1) == ",".join(r.devices) and m.group(2) == r.host, r.output
        # native programs get CUDA_VISIBLE_DEVICES from Spark's assignment too
        assert f"cuda={r.devices[0]}/0" in r.output.splitlines()
    # worker 1 owns GPUs 0,1 and worker 2 GPUs 2,3: a host's ranks hold one worker's ids
    for ranks in by_host.values():
        assert {int(x.devices[0]) // 2 for x in ranks} in ({0}, {1})
    # local/cross ranks: from the host keys, in rank order; the C++ side agrees
    host_order = sorted(by_host, key=lambda h: min(x.rank for x in by_host[h]))
    for r in result.ranks:
        peers = by_host[r.host]
        want = (peers.index(r), len(peers), host_order.index(r.host), 2)
        assert (r.local_rank, r.local_size, r.cross_rank, r.cross_size) == want
        m = re.search(DEMO_LINE, r.output)
        assert m, r.output
        assert tuple(int(x) for x in m.groups()[:6]) == (r.rank, 4) + want
        assert "correct" in m.group(7) and "expected 10" in m.group(7)


def test_too_few_slots_on_a_cluster(spark):
    t0 = time.monotonic()
    with pytest.raises(kolo_spark.ConfigurationError,
                       match=r"num_proc=5 but the Spark application has only 4 task slots "
                             r"after waiting \d+s"):
        kolo_spark.run(spark, 5, "true", start_timeout=3)
    assert time.monotonic() - t0 < 15


def test_rank_failure_on_a_cluster(spark, demo_bin, tmp_path):
    script = (f'echo $$ > {tmp_path}/pid.$KOLO_RANK; '
              'if [ "$KOLO_RANK" = 3 ]; then echo "no GPU for rank 3" >&2; exit 3; fi; '
              'exec "$0" "$@"')
    with pytest.raises(kolo_spark.RankFailedError, match="rank 3 exited with code 3") as caught:
        kolo_spark.run(spark, 4, ["sh", "-c", script, demo_bin], ["1000"], env=ENV,
                       host_key="executor", echo=False)
    assert "no GPU for rank 3" in caught.value.output_tail
    pids = []
    for r in range(4):
        with open(tmp_path / f"pid.{r}") as f:
            pids.append(int(f.read()))
    assert [p for p in pids if not process_gone(p)] == []


# --- Python functions on the cluster ---
from pyspark import cloudpickle  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _gpu_view(x):
    import os

    import kolo_spark

    env = os.environ
    return {"rank": int(env["RANK"]), "x": x, "devices": kolo_spark.get_available_devices(),
            "cuda": env.get("CUDA_VISIBLE_DEVICES"), "cuda_device": env.get("KOLO_CUDA_DEVICE"),
            "local": (int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"])),
            "group": int(env["GROUP_RANK"]), "context": kolo_spark.rank_context().devices}


def test_functions_on_a_cluster_see_their_gpus(spark):
    values = kolo_spark.run(spark, 4, _gpu_view, args=("x",), host_key="executor",
                            stream_logs=False)
    assert [v["rank"] for v in values] == [0, 1, 2, 3] and {v["x"] for v in values} == {"x"}
    assert sorted(d for v in values for d in v["devices"]) == ["0", "1", "2", "3"]
    for v, r in zip(values, values.ranks):
        assert v["devices"] == list(r.devices) and v["context"] == r.devices
        assert v["cuda"] == ",".join(r.devices) and v["cuda_device"] == "0"
        assert v["local"] == (r.local_rank, r.local_size) and v["group"] == r.cross_rank


def _sleep_on_the_cluster(directory):
    import os
    import subprocess
    import time

    rank = os.environ["RANK"]
    subprocess.Popen(["setsid", "sleep", f"3600.{7300 + int(rank)}"])
    time.sleep(0.2)
    with open(os.path.join(directory, f"pid.{rank}"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)


def test_ctrl_c_cancels_a_cluster_job_and_every_rank(spark, tmp_path):
    def interrupt():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(os.listdir(tmp_path)) < 4:
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGINT)

    t = threading.Thread(target=interrupt, daemon=True)
    t.start()
    with pytest.raises(KeyboardInterrupt):
        kolo_spark.run(spark, 4, _sleep_on_the_cluster, args=(str(tmp_path),),
                       host_key="executor", stream_logs=False)
    t.join(5)
    pids = []
    for r in range(4):
        with open(tmp_path / f"pid.{r}") as f:
            pids.append(int(f.read()))
    daemons = subprocess.run(["pgrep", "-f", "sleep 3600.73"], capture_output=True, text=True)
    left = [p for p in pids if not process_gone(p)] + [int(p) for p in daemons.stdout.split()]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert left == []
    sc = spark.sparkContext
    deadline = time.monotonic() + 10
    while sc.statusTracker().getActiveJobsIds() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sc.statusTracker().getActiveJobsIds() == []


def _count_and_commit(directory):
    import os
    import time

    from kolo_spark import elastic

    rank = int(os.environ["KOLO_RANK"])
    state = elastic.restore({"step": 0})
    stage_attempt = os.environ["KOLO_JOB_ID"].rsplit("-s", 1)[1]
    tag = f"{elastic.attempt()}.{stage_attempt}"
    with open(os.path.join(directory, f"pid.{tag}.{rank}"), "w") as f:
        f.write(str(os.getpid()))
    # every rank has restored before rank 0 commits again (a barrier through the directory)
    deadline = time.monotonic() + 60
    while len([f for f in os.listdir(directory) if f.startswith(f"pid.{tag}.")]) < 4 and \
            time.monotonic() < deadline:
        time.sleep(0.02)
    for step in range(state["step"], 12):
        if rank == 0:
            elastic.commit({"step": step + 1})
            with open(os.path.join(directory, "committed.tmp"), "w") as f:
                f.write(str(step + 1))
            os.replace(os.path.join(directory, "committed.tmp"),
                       os.path.join(directory, "committed"))
        time.sleep(0.25)
    return state["step"]


def _executor_pids(app_id):
    out = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        if b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in cmd and \
                app_id.encode() in cmd:
            out.append(int(pid))
    return out


def test_a_lost_executor_retries_and_resumes_from_the_last_commit(spark, tmp_path):
    # Last in the module: it kills one of the application's two executors (the worker starts
    # another) and waits for all 4 slots to be back before it ends.
    sc = spark.sparkContext
    killed = []

    def kill_an_executor():
        deadline = time.monotonic() + 120
        path = tmp_path / "committed"
        while time.monotonic() < deadline:
            if path.exists() and int(path.read_text() or 0) >= 4:
                pids = _executor_pids(sc.applicationId)
                os.kill(pids[0], signal.SIGKILL)
                killed.append(pids[0])
                return
            time.sleep(0.05)

    t = threading.Thread(target=kill_an_executor, daemon=True)
    t.start()
    result = kolo_spark.run(spark, 4, _count_and_commit, args=(str(tmp_path),),
                            host_key="executor", max_attempts=3, stream_logs=False, timeout=300)
    t.join(5)
    assert killed, "the executor was never killed"
    # the attempt that finished resumed where rank 0's last commit before the loss left off
    resumed = result[0]
    assert resumed >= 4 and list(result) == [resumed] * 4, list(result)
    assert result.committed[1] == {"step": 12}
    # a second run of the ranks: kolo's retry (an attempt) or Spark's (a stage attempt)
    runs = {p.name.rsplit(".", 1)[0] for p in tmp_path.glob("pid.*")}
    assert len(runs) >= 2, runs
    print(f"lost executor: runs (attempt.stage_attempt) {sorted(runs)}, resumed from step "
          f"{resumed}, attempts {[(a.number, a.error_type) for a in result.attempts]}")
    assert len(result.attempts) >= 1 and result.attempts[-1].error is None
    pids = [int(p.read_text()) for p in tmp_path.glob("pid.*")]
    assert wait_gone(pids, 30) == []
    deadline = time.monotonic() + 120
    while kolo_spark.task_slots(sc) < 4 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert kolo_spark.task_slots(sc) >= 4
