"""Python functions as ranks on real Spark (master local[4], barrier tasks): return values in
rank order, torchrun's environment (DDP with init_process_group() and no arguments), failures
(a rank raising, a function the executors cannot unpickle, a hang past the timeout, a return
value over the limit, Ctrl-C on the driver), logs streamed while the job runs, the merged
timeline, and the HorovodRunner/TorchDistributor shapes. One SparkSession for the module."""

import json
import os
import signal
import sys
import threading
import time

import pytest

import kolo_spark
from conftest import kill_leftovers, process_gone, spark_session, wait_gone

import pyspark  # noqa: E402  (a missing pyspark is an error, never a skip)

# The executors cannot import this test module: its functions travel by value.
from pyspark import cloudpickle  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def spark():
    session = spark_session("local[4]", "kolo_spark-functions")
    yield session
    session.stop()


def _procs_with(token):
    """pids of live processes whose command line holds ``token`` (the process table)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if token in cmd and not process_gone(int(pid)):
            found.append(int(pid))
    return found


def _pids(directory, n):
    out = {}
    for r in range(n):
        path = os.path.join(directory, f"pid.{r}")
        if os.path.exists(path):
            with open(path) as f:
                out[r] = int(f.read())
    return out


def _whoami(base, scale=1):
    import os
    import sys

    env = os.environ
    return {
        "value": base * scale + int(env["RANK"]),
        "env": [env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                 "GROUP_RANK", "KOLO_RANK", "KOLO_SIZE")],
        "master": (env["MASTER_ADDR"], int(env["MASTER_PORT"])),
        "pid": os.getpid(),
        "main": sys.modules["__main__"].__spec__.name,
        "in_spark_worker": "pyspark.worker" in sys.modules,
    }


def test_return_values_in_rank_order(spark):
    offset = 1000  # a captured closure variable

    def fn(base, scale=1):
        return offset + _whoami(base, scale)["value"], _whoami(base, scale)

    # 2 and 3 ranks: the other tests of this module (and local mode: test_local_mode.py)
    for n in (1, 4):
        results = kolo_spark.run(spark, n, fn, args=(10 * n,), kwargs={"scale": 3},
                                 stream_logs=False)
        assert isinstance(results, list) and len(results) == n
        assert [v for v, _ in results] == [offset + 30 * n + r for r in range(n)]
        infos = [info for _, info in results]
        assert [i["env"] for i in infos] == [[str(r), str(n), str(r), str(n), "0", str(r), str(n)]
                                             for r in range(n)]
        # torchrun's rendezvous: one address, rank 0's task's, a port of its own
        assert len({tuple(i["master"]) for i in infos}) == 1
        assert infos[0]["master"][0] == results.ranks[0].ip
        assert infos[0]["master"][1] not in {r.port for r in results.ranks}
        # a fresh interpreter per rank, not Spark's Python worker
        assert all(i["main"] == "kolo_spark.fnrank" and not i["in_spark_worker"] for i in infos)
        assert len({i["pid"] for i in infos}) == n
        assert [r.rank for r in results.ranks] == list(range(n))


def _ddp_train(backend, steps, lr):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if backend == "kolo":
        import kolo_torch  # noqa: F401  (registers the backend)
    dist.init_process_group(backend)  # everything else from the environment kolo_spark set
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).double()
    reference = torch.nn.Linear(4, 1).double()
    reference.load_state_dict(model.state_dict())
    g = torch.Generator().manual_seed(7)
    x = torch.randn(64, 4, generator=g, dtype=torch.float64)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]], dtype=torch.float64) + 0.25
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x[rank::world]), y[rank::world])
        loss.backward()  # DDP averages the gradients of the ranks' shards
        opt.step()
        losses.append(loss.item())
        ref_opt.zero_grad()  # the same steps on the whole batch, in this process alone
        torch.nn.functional.mse_loss(reference(x), y).backward()
        ref_opt.step()
    weights = [p.detach().flatten().tolist() for p in model.parameters()]
    ref = [p.detach().flatten().tolist() for p in reference.parameters()]
    dist.destroy_process_group()
    return {"rank": rank, "world": world, "weights": weights, "reference": ref,
            "first_loss": losses[0], "last_loss": losses[-1]}


@pytest.mark.parametrize("backend", ["gloo", pytest.param("kolo", marks=pytest.mark.kolo_torch)])
def test_ddp_with_no_arguments_to_init_process_group(spark, backend):
    results = kolo_spark.run(spark, 2, _ddp_train, args=(backend, 20, 0.1), stream_logs=False,
                             env={"KOLO_TIMEOUT_SECONDS": "60"}, timeout=300)
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["world"] == 2 for r in results)
    # identical final weights on every rank ...
    assert results[0]["weights"] == results[1]["weights"]
    # ... equal to full-batch SGD in one process (equal shards: the averaged gradient is the
    # whole batch's), up to the order of floating-point sums
    for got, want in zip(results[0]["weights"], results[0]["reference"]):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert results[0]["last_loss"] < results[0]["first_loss"] / 10


def _leave_work_for_the_exit(directory):
    import atexit
    import ctypes
    import os
    import threading
    import time

    rank = os.environ["RANK"]
    # a native library whose teardown crashes (as torch's Gloo threads can at finalisation):
    # abort() registered with the C runtime's exit handlers
    libc = ctypes.CDLL("libc.so.6")
    assert libc.__cxa_atexit(libc.abort, None, None) == 0

    def late():
        time.sleep(1.0)
        with open(os.path.join(directory, f"thread.{rank}"), "w") as f:
            f.write("done")

    threading.Thread(target=late).start()  # non-daemon: the rank waits for it
    atexit.register(lambda: open(os.path.join(directory, f"atexit.{rank}"), "w").close())
    return int(rank) * 10


def test_a_rank_ends_without_the_native_teardown(spark, tmp_path):
    # the function's outcome decides: threads it left are joined and its atexit handlers run,
    # but a crash in a native library's exit handlers cannot fail a rank whose result is written
    results = kolo_spark.run(spark, 2, _leave_work_for_the_exit, args=(str(tmp_path),),
                             stream_logs=False, timeout=120)
    assert results == [0, 10]
    for rank in (0, 1):
        assert (tmp_path / f"thread.{rank}").read_text() == "done"
        assert (tmp_path / f"atexit.{rank}").exists()


def _raise_on_rank_1(directory):
    import os
    import subprocess
    import time

    rank = os.environ["RANK"]
    # a daemon detached from the rank's session: the supervisor must find it all the same
    subprocess.Popen(["setsid", "sleep", f"3600.{4711 + int(rank)}"])
    with open(os.path.join(directory, f"pid.{rank}"), "w") as f:
        f.write(str(os.getpid()))
    if rank == "1":
        time.sleep(1)
        raise ValueError("rank 1 refuses: bad shard")
    time.sleep(120)


def test_a_rank_raising_names_it_and_leaves_no_process(spark, tmp_path):
    with pytest.raises(kolo_spark.RankFunctionError) as caught:
        kolo_spark.run(spark, 4, _raise_on_rank_1, args=(str(tmp_path),), stream_logs=False,
                       kill_grace=1.0)
    err = caught.value
    assert (err.rank, err.reason, err.exc_type) == (1, "raise", "ValueError")
    assert err.exc_message == "rank 1 refuses: bad shard"
    assert "in _raise_on_rank_1" in err.remote_traceback
    assert "ValueError: rank 1 refuses: bad shard" in err.remote_traceback
    assert str(err).startswith("kolo_spark: rank 1 raised ValueError: rank 1 refuses: bad shard")
    assert isinstance(err, kolo_spark.RankFailedError)
    # run() returned after every rank's processes were gone: the process table agrees
    pids = _pids(tmp_path, 4)
    assert 1 in pids
    left = wait_gone(pids.values(), 1.0) + _procs_with("sleep 3600.47")
    kill_leftovers(left)
    assert left == []


def test_a_function_the_executors_cannot_unpickle(spark, tmp_path):
    # A module only the driver can import (its directory is on the driver's sys.path alone).
    (tmp_path / "kolo_only_on_the_driver.py").write_text("def f(x):\n    return x + 1\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import kolo_only_on_the_driver as mod

        with pytest.raises(kolo_spark.RankFunctionError) as caught:
            kolo_spark.run(spark, 2, mod.f, args=(1,), stream_logs=False)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("kolo_only_on_the_driver", None)
    err = caught.value
    assert err.reason == "unpickle" and err.module == "kolo_only_on_the_driver"
    assert err.exc_type == "ModuleNotFoundError"
    msg = str(err)
    assert "could not load the function" in msg
    assert "module 'kolo_only_on_the_driver'" in msg and "addPyFile" in msg


def _sleep_forever(directory):
    import os
    import time

    with open(os.path.join(directory, f"pid.{os.environ['RANK']}"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)


def test_a_rank_hanging_past_the_timeout(spark, tmp_path):
    with pytest.raises(kolo_spark.RankFailedError, match=r"timed out \(timeout=3s\)") as caught:
        kolo_spark.run(spark, 2, _sleep_forever, args=(str(tmp_path),), timeout=3,
                       kill_grace=0.5, stream_logs=False)
    assert caught.value.reason == "timeout"
    left = wait_gone(_pids(tmp_path, 2).values(), 1.0)
    kill_leftovers(left)
    assert left == []


def _big_on_rank_1(n):
    import os

    return b"x" * n if os.environ["RANK"] == "1" else b""


def test_a_return_value_over_the_limit(spark):
    with pytest.raises(kolo_spark.ResultTooLargeError) as caught:
        kolo_spark.run(spark, 2, _big_on_rank_1, args=(200_000,), max_result_bytes=100_000,
                       stream_logs=False)
    err = caught.value
    assert err.rank == 1 and err.limit == 100_000 and err.size > 200_000
    assert "over the limit of 100,000 bytes (max_result_bytes)" in str(err)


def test_keyboard_interrupt_cancels_the_job_and_every_rank(spark, tmp_path):
    sc = spark.sparkContext

    def interrupt_when_all_started():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(_pids(tmp_path, 4)) < 4:
            time.sleep(0.1)
        time.sleep(0.5)  # the daemons too
        os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C (a notebook's interrupt) sends

    t = threading.Thread(target=interrupt_when_all_started, daemon=True)
    t.start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        kolo_spark.run(spark, 4, _sleep_and_detach, args=(str(tmp_path),), stream_logs=False)
    t.join(5)
    assert time.monotonic() - t0 < 120
    pids = _pids(tmp_path, 4)
    assert sorted(pids) == [0, 1, 2, 3]
    # run() raised only after every rank process (and its detached daemon) was gone
    left = [p for p in pids.values() if not process_gone(p)] + _procs_with("sleep 3600.91")
    kill_leftovers(left)
    assert left == []
    deadline = time.monotonic() + 10  # the job ends in the scheduler moments later
    while sc.statusTracker().getActiveJobsIds() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sc.statusTracker().getActiveJobsIds() == []


def _sleep_and_detach(directory):
    import os
    import subprocess
    import time

    rank = os.environ["RANK"]
    subprocess.Popen(["setsid", "sleep", f"3600.{9100 + int(rank)}"])
    time.sleep(0.2)
    with open(os.path.join(directory, f"pid.{rank}"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)


def _traced(n):
    import kolo_spark

    with kolo_spark.timeline.span("work", n=n):
        total = sum(range(n))
    kolo_spark.timeline.instant("done")
    return total


def test_merged_timeline(spark, tmp_path):
    path = tmp_path / "job.json"
    values = kolo_spark.run(spark, 3, _traced, args=(1000,), timeline=str(path), stream_logs=False)
    assert values == [499500] * 3 and values.timeline == str(path)
    trace = json.loads(path.read_text())  # one JSON document (Perfetto, chrome://tracing)
    events = trace["traceEvents"]
    names = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert {"rank 0", "rank 1", "rank 2", "driver"} <= {n.split(" (")[0] for n in names}
    for r in range(3):
        mine = {e["name"] for e in events if e.get("pid") == r and e["ph"] != "M"}
        assert {"rendezvous", "rank process", "start interpreter", "load function", "function",
                "work", "done", "barrier task"} <= mine, (r, mine)
    driver = {e["name"] for e in events if e.get("pid") == 3 and e["ph"] == "X"}
    assert {"run", "barrier job (submit to results)"} <= driver
    work = [e for e in events if e["name"] == "work"]
    assert len(work) == 3 and all(e["args"] == {"n": 1000} and e["dur"] >= 0 for e in work)


def _chatty(directory, flood):
    import os
    import time

    rank = int(os.environ["RANK"])
    print(f"ready {rank}", flush=True)
    go = os.path.join(directory, "go")
    end = time.monotonic() + 60
    while not os.path.exists(go) and time.monotonic() < end:
        time.sleep(0.05)
    if rank == 0:
        print("y" * 500, flush=True)  # one long line: cut on its way to the driver
        for i in range(flood):
            print(f"line {i}", flush=True)
    return os.path.exists(go)


def test_logs_stream_to_the_driver_while_the_job_runs(spark, tmp_path):
    got = []
    lock = threading.Lock()

    def sink(rank, line):
        with lock:
            got.append((rank, line))
        if sum(1 for _, text in got if text.startswith("ready")) == 4:
            (tmp_path / "go").touch()  # every rank is waiting for this: only a live stream works

    flood = 300
    values = kolo_spark.run(spark, 4, _chatty, args=(str(tmp_path), flood), stream_logs=sink,
                            log_lines_per_second=20, log_line_bytes=100, tail_lines=1000,
                            collect_output="all")
    assert values == [True] * 4
    assert sorted(text for _, text in got if text.startswith("ready")) == \
        [f"ready {r}" for r in range(4)]
    assert {rank for rank, text in got if text.startswith("ready")} == {0, 1, 2, 3}
    mine = [text for rank, text in got if rank == 0]
    long = [t for t in mine if t.startswith("yyy")]
    assert long == ["y" * 100 + " [... line cut at 100 of 500 bytes]"]
    shown = [t for t in mine if t.startswith("line ")]
    notices = [t for t in mine if "not streamed to the driver (over 20 lines/s)" in t]
    dropped = sum(int(t.split("kolo_spark: ")[1].split(" ")[0]) for t in notices)
    assert notices and shown and len(shown) < flood
    assert len(shown) + dropped == flood  # every line either shown or counted
    # the rank side kept every line (the executor log has them all)
    assert values.ranks[0].output.splitlines().count("line 0") == 1
    assert f"line {flood - 1}" in values.ranks[0].output.splitlines()


def _describe(a, b=0):
    import os

    return {"rank": int(os.environ["RANK"]), "world": int(os.environ["WORLD_SIZE"]), "sum": a + b}


def test_runner_and_distributor_shapes(spark, tmp_path, monkeypatch):
    runner = kolo_spark.Runner(np=2, spark=spark, stream_logs=False)
    assert runner.run(_describe, a=1, b=2) == {"rank": 0, "world": 2, "sum": 3}  # rank 0's
    assert [r["rank"] for r in runner.results] == [0, 1]
    local = kolo_spark.Runner(np=-3, stream_logs=False)  # processes on the driver
    assert local.run(_describe, a=5) == {"rank": 0, "world": 3, "sum": 5}
    assert [r["rank"] for r in local.results] == [0, 1, 2]
    with pytest.raises(kolo_spark.ConfigurationError, match="np=0"):
        kolo_spark.Runner(np=0)

    dist = kolo_spark.Distributor(num_processes=2, local_mode=False, use_gpu=False, spark=spark,
                                  stream_logs=False)
    assert dist.run(_describe, 4, 6) == {"rank": 0, "world": 2, "sum": 10}
    script = tmp_path / "train.py"
    script.write_text("import os, sys\n"
                      f"path = {str(tmp_path)!r} + '/out.' + os.environ['RANK']\n"
                      "open(path, 'w').write(' '.join([os.environ['WORLD_SIZE'],"
                      " os.environ['LOCAL_RANK'], os.environ['MASTER_PORT']] + sys.argv[1:]))\n")
    local_dist = kolo_spark.Distributor(num_processes=2, use_gpu=False, stream_logs=False)
    assert local_dist.run(str(script), "--lr", "0.5") is None
    assert local_dist.result.exit_codes == [0, 0]
    outs = [(tmp_path / f"out.{r}").read_text().split() for r in range(2)]
    assert [o[:2] + o[3:] for o in outs] == [["2", "0", "--lr", "0.5"], ["2", "1", "--lr", "0.5"]]
    assert outs[0][2] == outs[1][2]  # one MASTER_PORT
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(kolo_spark.ConfigurationError, match="use_gpu=True in local mode"):
        kolo_spark.Distributor(num_processes=2).run(_describe, 1)  # TorchDistributor's defaults
