"""What runs inside each barrier task (and, for ``local_mode``, the same pieces on the driver).

docs/spark.md: bind a listening socket and keep it, one ``allGather`` of
{rank, host key, ip, port, gpus}, local/cross ranks computed from it, then the native binary
with the environment contract, in its own process group, its output streamed and its tail kept.
A failure becomes an exception that fails the Spark stage and that the driver turns back into a
:class:`~kolo_spark.errors.RankFailedError` (the payload rides in the exception text).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import tempfile
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import data as data_mod
from .errors import (ConfigurationError, KoloSparkError, RankFailedError, SetupError,
                     StartTimeoutError)
from . import liveness
from .process import NativeProcess
from .topology import RankTopology, TaskInfo, peers_string, rendezvous

# Variables kolo_spark sets for every rank: env= may not set them.
CONTRACT_VARS = ("KOLO_RANK", "KOLO_SIZE", "KOLO_LOCAL_RANK", "KOLO_LOCAL_SIZE",
                 "KOLO_CROSS_RANK", "KOLO_CROSS_SIZE", "KOLO_PEERS", "KOLO_LISTEN_FD",
                 "KOLO_SECRET", "KOLO_HOST_KEY", "KOLO_DEVICES", "KOLO_DATA_FILE",
                 "KOLO_DATA_FORMAT", "KOLO_DATA_ROWS", "KOLO_DATA_COLUMNS")
# Inherited from the worker's environment they would belong to some other job: dropped
# (KOLO_STORE would take precedence over KOLO_PEERS; KOLO_ADDR over the address we gathered).
_DROPPED = CONTRACT_VARS + ("KOLO_STORE", "KOLO_ADDR")

HostKey = Union[str, Callable[..., str]]


def default_host_key() -> str:
    """The C++ default (Topology::default_host_key): hostname plus the network namespace."""
    key = socket.gethostname()
    try:
        key += f"/netns:{os.stat('/proc/self/ns/net').st_ino}"
    except OSError:
        pass
    return key


def build_env(base: Mapping[str, str], user_env: Optional[Mapping[str, str]],
              topo: RankTopology, peers: str, secret: str, listen_fd: int,
              data: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """The child's environment: ``base`` (the worker's, copied) without stale contract
    variables, then ``user_env``, then the contract. ``base`` is never modified."""
    env = {k: v for k, v in base.items() if k not in _DROPPED}
    for k, v in (user_env or {}).items():
        env[str(k)] = str(v)
    env.update({
        "KOLO_RANK": str(topo.rank),
        "KOLO_SIZE": str(topo.size),
        "KOLO_LOCAL_RANK": str(topo.local_rank),
        "KOLO_LOCAL_SIZE": str(topo.local_size),
        "KOLO_CROSS_RANK": str(topo.cross_rank),
        "KOLO_CROSS_SIZE": str(topo.cross_size),
        "KOLO_PEERS": peers,
        "KOLO_LISTEN_FD": str(listen_fd),
        "KOLO_SECRET": secret,
        "KOLO_HOST_KEY": topo.host,
    })
    if topo.gpus:
        env["KOLO_DEVICES"] = ",".join(topo.gpus)
    if data:
        env.update(data)
    return env


def listen_socket(bind_host: str = "0.0.0.0") -> socket.socket:
    """A listening TCP socket on an ephemeral port, kept open and handed to the rank."""
    s = socket.socket(socket.AF_INET6 if ":" in bind_host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((bind_host, 0))
        s.listen(128)
    except OSError:
        s.close()
        raise
    return s


def advertise_ip(driver_host: Optional[str]) -> str:
    """The address other ranks use to reach this task: SPARK_LOCAL_IP when the executor has
    one, else the interface that routes to the driver (no packet is sent), else the
    hostname's address."""
    ip = os.environ.get("SPARK_LOCAL_IP", "").strip()
    if ip:
        return ip
    if driver_host:
        try:
            family = socket.getaddrinfo(driver_host, 9, type=socket.SOCK_DGRAM)[0]
            with socket.socket(family[0], socket.SOCK_DGRAM) as s:
                s.connect(family[4])
                ip = s.getsockname()[0]
                if ip and ip not in ("0.0.0.0", "::"):
                    return ip
        except OSError:
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


# --- failures travel to the driver inside the exception text ---
_MARK = "KOLO_SPARK_FAILURE"
_MARK_RE = re.compile(_MARK + r"<([A-Za-z0-9+/=]+)>")


class TaskFailure(Exception):
    """Raised in a task to fail the Spark stage; carries a payload for the driver."""


def raise_task_failure(error: KoloSparkError) -> None:
    if isinstance(error, RankFailedError):
        payload = {"type": "rank", "rank": error.rank, "exit_code": error.exit_code,
                   "tail": error.output_tail, "host": error.host, "reason": error.reason,
                   "detail": error.detail}
    else:
        kind = {ConfigurationError: "config", SetupError: "setup",
                StartTimeoutError: "start"}.get(type(error), "other")
        payload = {"type": kind, "message": str(error)}
    blob = base64.b64encode(json.dumps(payload).encode()).decode()
    raise TaskFailure(f"{error}\n{_MARK}<{blob}>")


def error_from_text(text: str) -> Optional[KoloSparkError]:
    """The kolo_spark error encoded in a failed job's message, if any."""
    m = _MARK_RE.search(text)
    if not m:
        return None
    try:
        p = json.loads(base64.b64decode(m.group(1)))
    except ValueError:
        return None
    if p.get("type") == "rank":
        return RankFailedError(p["rank"], p["exit_code"], p.get("tail", ""), p.get("host", ""),
                               p.get("reason", "exit"), p.get("detail", ""))
    cls = {"config": ConfigurationError, "setup": SetupError,
           "start": StartTimeoutError}.get(p.get("type"), KoloSparkError)
    return cls(p.get("message", "kolo_spark: a task failed"))


@dataclass
class TaskSpec:
    """Everything a barrier task needs; pickled with the task closure."""

    num_proc: int
    argv: List[str]
    secret: str
    env: Dict[str, str] = field(default_factory=dict)
    timeout: Optional[float] = None
    tail_lines: int = 100
    echo: bool = True
    collect_output: str = "rank0"  # or "all"
    kill_grace: float = 2.0
    host_key: HostKey = "host"
    driver_host: Optional[str] = None
    bind_host: str = "0.0.0.0"
    data_format: Optional[str] = None  # None: no DataFrame
    data_columns: Tuple[str, ...] = ()
    data_dir: Optional[str] = None
    liveness: Optional[Tuple[str, int]] = None  # the driver's LivenessServer


def _host_key_of(spec: TaskSpec, ctx, rank: int) -> str:
    if callable(spec.host_key):
        return str(spec.host_key(ctx))
    if spec.host_key == "host":
        return default_host_key()
    if spec.host_key == "executor":
        # Each executor as its own "host" (tests: two workers on one machine). The barrier
        # task infos carry every task's executor address.
        return f"{socket.gethostname()}/executor:{ctx.getTaskInfos()[rank].address}"
    return str(spec.host_key)


def _task_gpus(ctx) -> Tuple[str, ...]:
    res = ctx.resources().get("gpu")
    return tuple(str(a) for a in res.addresses) if res is not None else ()


def _data_dir(spec: TaskSpec, rank: int) -> str:
    parent = spec.data_dir
    if not parent:
        local_dirs = os.environ.get("SPARK_LOCAL_DIRS", "")
        parent = local_dirs.split(",")[0] if local_dirs else None
    return tempfile.mkdtemp(prefix=f"kolo-spark-r{rank}-", dir=parent)


def run_rank(spec: TaskSpec, topology: List[RankTopology], rank: int, listener: socket.socket,
             data: Optional[Mapping[str, str]], *, base_env: Optional[Mapping[str, str]] = None,
             label: Optional[str] = None, extra_fds: Sequence[int] = ()) -> dict:
    """Launches rank ``rank``'s native process, waits for it and returns its result dict;
    raises RankFailedError for a failure. The process group is gone when this returns."""
    me = topology[rank]
    env = build_env(os.environ if base_env is None else base_env, spec.env, me,
                    peers_string(topology), spec.secret, listener.fileno(), data)
    proc = NativeProcess(spec.argv, env, pass_fds=(listener.fileno(), *extra_fds),
                         label=label or f"kolo rank {rank}", echo=spec.echo,
                         tail_lines=spec.tail_lines)
    try:
        try:
            proc.start()
        except OSError as e:
            raise RankFailedError(rank, None, "", me.host, "start",
                                  f"{spec.argv[0]}: {e.strerror or e}") from None
        listener.close()  # the child holds it now
        code = proc.wait(timeout=spec.timeout)
        if code is None and proc.timed_out:
            proc.terminate(spec.kill_grace)
            raise RankFailedError(rank, proc.returncode, proc.output_tail(), me.host, "timeout",
                                  f"timeout={spec.timeout:g}s")
    finally:
        proc.terminate(spec.kill_grace)
    if proc.returncode != 0:
        raise RankFailedError(rank, proc.returncode, proc.output_tail(), me.host)
    return result_of(spec, me, proc.returncode, proc.output_tail(), data)


def result_of(spec: TaskSpec, me: RankTopology, exit_code: int, tail: str,
              data: Optional[Mapping[str, str]]) -> dict:
    keep = spec.collect_output == "all" or me.rank == 0
    return {"rank": me.rank, "exit_code": exit_code, "host": me.host, "ip": me.ip,
            "port": me.port, "local_rank": me.local_rank, "local_size": me.local_size,
            "cross_rank": me.cross_rank, "cross_size": me.cross_size, "devices": list(me.gpus),
            "data_rows": int(data["KOLO_DATA_ROWS"]) if data else None,
            "output": tail if keep else ""}


def barrier_partition(spec: TaskSpec, iterator):
    """The function each barrier task runs (``rdd.barrier().mapPartitions``)."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    rank = ctx.partitionId()
    listener = None
    alive = None
    shard_dir = None
    data = None
    host, ip, port, gpus, error = "", "", 0, (), ""
    try:
        try:
            listener = listen_socket(spec.bind_host)
            port = listener.getsockname()[1]
            host = _host_key_of(spec, ctx, rank)
            ip = advertise_ip(spec.driver_host)
            gpus = _task_gpus(ctx)
            if spec.data_format:
                shard_dir = _data_dir(spec, rank)
                path = os.path.join(shard_dir, data_mod.shard_file_name(rank, spec.data_format))
                rows = data_mod.write_rows(iterator, path, spec.data_format, spec.data_columns)
                data = data_mod.data_env(path, spec.data_format, rows, spec.data_columns)
        except Exception as e:  # reported through the allGather so that every rank stops
            error = f"{type(e).__name__}: {e}"
        try:
            topology = rendezvous(ctx.allGather, TaskInfo(rank, host, ip, port, gpus, error))
            if len(topology) != spec.num_proc:
                raise ConfigurationError(f"kolo_spark: {len(topology)} tasks met in the barrier "
                                         f"but num_proc={spec.num_proc}")
            alive = liveness.connect(spec.liveness, spec.secret, rank)
            result = run_rank(spec, topology, rank, listener, data,
                              extra_fds=(alive.fileno(),) if alive else ())
        except KoloSparkError as e:
            raise_task_failure(e)
        yield json.dumps(result)
    finally:
        if listener is not None:
            listener.close()
        if alive is not None:
            alive.close()
        if shard_dir:
            shutil.rmtree(shard_dir, ignore_errors=True)
