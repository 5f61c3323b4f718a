"""One rank's life, the same for both runners: its set-up (:func:`prepare_rank`), launch
(:class:`RankLaunch`) and outcome; and the barrier task that runs them on an executor.

docs/spark.md: bind a listening socket and keep it (rank 0 also reserves torch's MASTER_PORT),
one ``allGather`` of {rank, host key, ip, port, gpus}, local/cross ranks computed from it, then
the rank under its supervisor with the environment contract: a native program, or a fresh
Python interpreter running the job's function (:mod:`kolo_spark.fnrank`). Its output is echoed
into the executor log, streamed to the driver's hub, and its tail kept. A failure becomes an
exception that fails the Spark stage and that the driver turns back into a
:class:`~kolo_spark.errors.RankFailedError` (the payload rides in the exception text).
``local_mode`` (:mod:`kolo_spark.local_job`) runs the same :func:`prepare_rank` and
:class:`RankLaunch` on the driver, without the ``allGather``.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from . import data as data_mod
from . import elastic as elastic_mod
from . import liveness
from . import timeline as tl
from .errors import (ConfigurationError, KoloSparkError, RankFailedError, RankFunctionError,
                     SetupError, StartTimeoutError, function_error)
from .process import NativeProcess, StartError
from .topology import RankTopology, TaskInfo, peers_string, rendezvous

# argv[0] of a command that is "the executor's Python" (scripts given to Distributor.run)
PYTHON = "<kolo_spark:python>"

# Variables kolo_spark sets for every rank: env= may not set them.
CONTRACT_VARS = ("KOLO_RANK", "KOLO_SIZE", "KOLO_LOCAL_RANK", "KOLO_LOCAL_SIZE",
                 "KOLO_CROSS_RANK", "KOLO_CROSS_SIZE", "KOLO_PEERS", "KOLO_LISTEN_FD",
                 "KOLO_SECRET", "KOLO_HOST_KEY", "KOLO_DEVICES", "KOLO_DATA_FILE",
                 "KOLO_DATA_FORMAT", "KOLO_DATA_ROWS", "KOLO_DATA_COLUMNS", "KOLO_DATA_TYPES")
# torchrun's contract, set for every rank too (init_process_group() needs no arguments).
TORCHRUN_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                 "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
                 "ROLE_WORLD_SIZE")
# Inherited from the worker's environment they would belong to some other job: dropped
# (KOLO_STORE would take precedence over KOLO_PEERS; KOLO_ADDR over the address we gathered).
_DROPPED = CONTRACT_VARS + TORCHRUN_VARS + ("KOLO_STORE", "KOLO_ADDR", "KOLO_TIMELINE")

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
              data: Optional[Mapping[str, str]] = None, *, master: Optional[Tuple[str, int]] = None
              ) -> Dict[str, str]:
    """The child's environment: ``base`` (the worker's, copied) without stale contract
    variables, then ``user_env``, then the contract: kolo's, and torchrun's when ``master``
    (rank 0's address and the port reserved for torch's store) is given. A rank with GPUs gets
    ``CUDA_VISIBLE_DEVICES`` (Spark's assignment) and ``KOLO_CUDA_DEVICE=0`` (the first of them,
    as numbered inside the process) unless ``user_env`` sets that. ``base`` is never modified."""
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
    if master is not None:
        env.update({
            "MASTER_ADDR": master[0],
            "MASTER_PORT": str(master[1]),
            "RANK": str(topo.rank),
            "WORLD_SIZE": str(topo.size),
            "LOCAL_RANK": str(topo.local_rank),
            "LOCAL_WORLD_SIZE": str(topo.local_size),
            "GROUP_RANK": str(topo.cross_rank),
            "GROUP_WORLD_SIZE": str(topo.cross_size),
            "ROLE_RANK": str(topo.rank),
            "ROLE_WORLD_SIZE": str(topo.size),
        })
    if topo.gpus:
        env["KOLO_DEVICES"] = ",".join(topo.gpus)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(topo.gpus)
        if "KOLO_CUDA_DEVICE" not in (user_env or {}):
            env["KOLO_CUDA_DEVICE"] = "0"
    if data:
        env.update(data)
    return env


def rank_job_id(spec: "TaskSpec") -> str:
    """The ranks' KOLO_JOB_ID in an elastic or retried run: the attempt's job id and the Spark
    attempt of the barrier stage, which the driver's store serves as a namespace of its own."""
    if stage_attempt := spec.stage_attempt:
        if stage_attempt >= elastic_mod.STAGE_ATTEMPTS:
            raise ConfigurationError(
                f"kolo_spark: Spark ran the barrier stage for the {stage_attempt + 1}th time; "
                f"the driver's store serves {elastic_mod.STAGE_ATTEMPTS} attempts of one stage")
    return f"{spec.job_id}-s{stage_attempt}"


def store_env(spec: "TaskSpec") -> Dict[str, str]:
    """A rank's variables of an elastic or retried run (none otherwise): ``KOLO_STORE`` and
    ``KOLO_JOB_ID`` (the driver's store: kolo's rendezvous then outlives every rank, so the
    survivors of a lost one can shrink), and kolo_spark.elastic's ``KOLO_SPARK_ELASTIC``,
    ``KOLO_SPARK_MIN_NP`` and ``KOLO_SPARK_ATTEMPT``."""
    if spec.store is None:
        return {}
    host, port = spec.store
    return {"KOLO_STORE": f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
            "KOLO_JOB_ID": rank_job_id(spec),
            elastic_mod.ELASTIC_VAR: "1" if spec.elastic else "0",
            elastic_mod.MIN_NP_VAR: str(spec.min_np if spec.elastic else 0),
            elastic_mod.ATTEMPT_VAR: str(spec.attempt)}


def reserve_port(bind_host: str = "0.0.0.0") -> socket.socket:
    """A port for torch's TCPStore on rank 0 (MASTER_PORT), held until the rank ends.

    The socket is bound with SO_REUSEADDR but never listens: while it exists the kernel gives
    the port to no other bind(port 0) and no outgoing connection, and nobody without
    SO_REUSEADDR can bind it; torch's store, which sets SO_REUSEADDR, can (Linux allows a
    second SO_REUSEADDR bind while no socket listens on the port)."""
    s = socket.socket(socket.AF_INET6 if ":" in bind_host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((bind_host, 0))
    except OSError:
        s.close()
        raise
    return s


def python_path() -> str:
    """PYTHONPATH for a function rank: this interpreter's sys.path minus what every interpreter
    has anyway (the standard library, site-packages), so the rank imports what the Python
    worker (or the driver) imports: pyspark, files added with sc.addPyFile, kolo_spark."""
    standard = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            standard.add(os.path.normpath(p))
    try:
        import site
        standard.update(os.path.normpath(p) for p in site.getsitepackages())
    except (AttributeError, ImportError):
        pass
    out = []
    for p in sys.path:
        p = os.path.normpath(os.path.abspath(p or os.getcwd()))
        if p in standard or p in out or p.endswith("lib-dynload") or \
                re.search(r"python\d+\.zip$", p):
            continue
        out.append(p)
    parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if parent not in out:
        out.insert(0, parent)
    return os.pathsep.join(out)


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


def failure_payload(error: KoloSparkError) -> dict:
    """What a task tells the driver about its failure (JSON-able): in the exception text that
    fails the Spark stage, and first through the driver's hub (see barrier_partition)."""
    if isinstance(error, RankFunctionError):
        return {"type": "fn", "rank": error.rank, "record": error.record,
                "tail": error.output_tail, "host": error.host, "exit_code": error.exit_code,
                "failed_at": error.failed_at}
    if isinstance(error, RankFailedError):
        return {"type": "rank", "rank": error.rank, "exit_code": error.exit_code,
                "tail": error.output_tail, "host": error.host, "reason": error.reason,
                "detail": error.detail, "failed_at": error.failed_at}
    kind = {ConfigurationError: "config", SetupError: "setup",
            StartTimeoutError: "start"}.get(type(error), "other")
    return {"type": kind, "message": str(error)}


def error_from_payload(p: dict) -> KoloSparkError:
    """The driver's exception for a failure_payload."""
    if p.get("type") == "fn":
        return function_error(p["rank"], p.get("record") or {}, p.get("tail", ""),
                              p.get("host", ""), p.get("exit_code", 1), p.get("failed_at"))
    if p.get("type") == "rank":
        return RankFailedError(p["rank"], p["exit_code"], p.get("tail", ""), p.get("host", ""),
                               p.get("reason", "exit"), p.get("detail", ""), p.get("failed_at"))
    cls = {"config": ConfigurationError, "setup": SetupError,
           "start": StartTimeoutError}.get(p.get("type"), KoloSparkError)
    return cls(p.get("message", "kolo_spark: a task failed"))


def raise_task_failure(error: KoloSparkError, payload: Optional[dict] = None) -> None:
    if payload is None:
        payload = failure_payload(error)
    blob = base64.b64encode(json.dumps(payload).encode()).decode()
    # The marker is the message's last line; one inside the text (a rank's output tail) is
    # defused, so only this one is ever read (error_from_text takes the last).
    text = str(error).replace(_MARK, "KOLO_SPARK_FAILURE(quoted)")
    raise TaskFailure(f"{text}\n{_MARK}<{blob}>")


def error_from_text(text: str) -> Optional[KoloSparkError]:
    """The kolo_spark error encoded in a failed job's message, if any: the last marker line
    (raise_task_failure writes it last; Spark may append only its own stack trace), so a marker
    a rank printed earlier in the text never wins."""
    m = None
    for m in _MARK_RE.finditer(text):
        pass
    if m is None:
        return None
    try:
        p = json.loads(base64.b64decode(m.group(1)))
    except ValueError:
        return None
    return error_from_payload(p)


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
    data_types: Tuple[str, ...] = ()  # per column: the layouts' type names (data.py)
    data_dir: Optional[str] = None
    liveness: Optional[Tuple[str, int]] = None  # the driver's hub
    fn_payload: Optional[bytes] = None  # cloudpickled (fn, args, kwargs): a function rank
    pickler: str = "pyspark"  # which cloudpickle made fn_payload: "pyspark" or "cloudpickle"
    max_result_bytes: int = 0
    timeline: bool = False
    stream_logs: bool = True
    log_lines_per_second: float = 100.0
    log_line_bytes: int = 2048
    # An elastic or retried run (kolo_spark.elastic): the store the driver hosts for this
    # attempt (the ranks' KOLO_STORE, with KOLO_JOB_ID job_id), the attempt's number, and
    # whether a rank's failure is a loss the others survive (elastic) while min_np remain.
    store: Optional[Tuple[str, int]] = None
    job_id: str = ""
    attempt: int = 0
    stage_attempt: int = 0  # set in each task: Spark's attempt of the barrier stage
    elastic: bool = False
    min_np: int = 0


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


def scratch_dir(parent: Optional[str], rank: int) -> str:
    """A private directory for one rank's files (shard, function, result, timeline)."""
    if not parent:
        local_dirs = os.environ.get("SPARK_LOCAL_DIRS", "")
        parent = local_dirs.split(",")[0] if local_dirs else None
    return tempfile.mkdtemp(prefix=f"kolo-spark-r{rank}-", dir=parent)


_MAX_ERROR_RECORD = 16 << 20


def read_bounded(path: str, limit: int, what: str) -> bytes:
    """The bytes of ``path``, its size checked against ``limit`` before anything is read (a
    SetupError naming the file otherwise)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise SetupError(f"kolo_spark: {path} holds {size:,} bytes, more than the "
                             f"{limit:,} a rank's {what} may have")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise SetupError(f"kolo_spark: {path} grew past the {limit:,} bytes a rank's {what} "
                         "may have while it was read")
    return data


@dataclass
class PreparedRank:
    """One rank's resources before its launch, made by :func:`prepare_rank`: its listening
    socket (the rank inherits it), rank 0's reserved torch port, where it runs, its scratch
    directory and its data shard's environment. Filled step by step: after a failure it holds
    what was made, for :meth:`release`."""

    rank: int
    listener: Optional[socket.socket] = None
    reserved: Optional[socket.socket] = None
    host: str = ""
    ip: str = ""
    gpus: Tuple[str, ...] = ()
    workdir: Optional[str] = None
    data: Optional[Dict[str, str]] = None

    @property
    def port(self) -> int:
        """The listening socket's port (0 before it exists)."""
        return self.listener.getsockname()[1] if self.listener is not None else 0

    def info(self, error: str = "") -> TaskInfo:
        """What this rank tells the others at the rendezvous (``error``: its set-up failed)."""
        torch_port = self.reserved.getsockname()[1] if self.reserved is not None else 0
        return TaskInfo(self.rank, self.host, self.ip, self.port, self.gpus, error, torch_port)

    def release(self) -> None:
        """Closes the sockets still held and removes the scratch directory. Idempotent."""
        for s in (self.listener, self.reserved):
            if s is not None:
                s.close()
        self.listener = self.reserved = None
        if self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None


def prepare_rank(spec: TaskSpec, out: PreparedRank,
                 where: Callable[[PreparedRank], None],
                 rows: Optional[Iterable], *, bind_host: str,
                 reserve_host: Optional[str] = None, scratch_parent: Optional[str] = None,
                 events: Optional[List[dict]] = None) -> PreparedRank:
    """Sets rank ``out.rank`` up for its launch, the one path of both runners (the barrier
    task and local mode), in this order: a listening socket on ``bind_host``; for rank 0 the
    port reserved for torch's store (on ``reserve_host``, default ``bind_host``);
    ``where(out)``, which sets ``out``'s host key, ip and gpus; a scratch directory under
    ``scratch_parent`` (:func:`scratch_dir`); and with ``spec.data_format`` the rank's rows
    written to its shard there (``data`` is then its KOLO_DATA_* environment; the span
    "write data shard" goes to ``events`` when given). Returns ``out``; when a step raises,
    ``out`` keeps what the earlier steps made (the caller releases it)."""
    rank = out.rank
    out.listener = listen_socket(bind_host)
    if rank == 0:
        out.reserved = reserve_port(bind_host if reserve_host is None else reserve_host)
    where(out)
    out.workdir = scratch_dir(scratch_parent, rank)
    if spec.data_format:
        t0 = tl.now_us()
        path = os.path.join(out.workdir, data_mod.shard_file_name(rank, spec.data_format))
        count = data_mod.write_rows(rows if rows is not None else (), path, spec.data_format,
                                    spec.data_columns, spec.data_types)
        out.data = data_mod.data_env(path, spec.data_format, count, spec.data_columns,
                                     spec.data_types)
        if events is not None:
            events.append(tl.complete("write data shard", t0, tl.now_us(), tl.KOLO_TID,
                                      rows=count))
    return out


@dataclass
class RankRun:
    """One rank's outcome: its result dict, and for a function the pickled return value."""

    result: dict
    value: Optional[bytes] = None
    events: List[dict] = field(default_factory=list)


class RankLaunch:
    """How one rank is started (argv, environment, its files in ``workdir``) and how its
    outcome is read back once its process has ended."""

    def __init__(self, spec: TaskSpec, topology: List[RankTopology], rank: int, listen_fd: int,
                 data: Optional[Mapping[str, str]], workdir: str,
                 base_env: Optional[Mapping[str, str]] = None,
                 python_path_value: Optional[str] = None):
        self.spec, self.rank, self.me, self.data = spec, rank, topology[rank], data
        self.proc: Optional[NativeProcess] = None  # set by start()
        master = (topology[0].ip, topology[0].torch_port) if topology[0].torch_port else None
        self.env = build_env(os.environ if base_env is None else base_env, spec.env, self.me,
                             peers_string(topology), spec.secret, listen_fd, data, master=master)
        self.engine_file = os.path.join(workdir, "engine-timeline.json")
        self.result_path = os.path.join(workdir, "result.pickle")
        self.trace_path = os.path.join(workdir, "fn-timeline.json")
        if spec.timeline:
            self.env["KOLO_TIMELINE"] = self.engine_file
        self.env.update(store_env(spec))
        self.argv = [(sys.executable or "python3") if a == PYTHON and i == 0 else a
                     for i, a in enumerate(spec.argv)]
        self.what = spec.argv[0]
        if spec.fn_payload is not None:
            fn_path = os.path.join(workdir, "function.pickle")
            with open(fn_path, "wb") as f:
                f.write(spec.fn_payload)
            self.env.update({"KOLO_SPARK_FN": fn_path, "KOLO_SPARK_RESULT": self.result_path,
                             "KOLO_SPARK_MAX_RESULT": str(spec.max_result_bytes),
                             "PYTHONPATH": python_path_value or python_path(),
                             "PYTHONUNBUFFERED": "1", "KOLO_SPARK_PICKLER": spec.pickler})
            if spec.timeline:
                self.env["KOLO_SPARK_TRACE"] = self.trace_path
            self.argv = [sys.executable or "python3", "-m", "kolo_spark.fnrank"]
            self.what = "python (function rank)"

    def process(self, pass_fds: Sequence[int], hold_fds: Sequence[int], label: str,
                on_line: Optional[Callable[[str], None]], echo: Optional[bool] = None
                ) -> NativeProcess:
        if self.spec.fn_payload is not None:
            self.env["KOLO_SPARK_LAUNCHED"] = repr(time.time())
        return NativeProcess(self.argv, self.env, pass_fds=pass_fds, hold_fds=hold_fds,
                             label=label, echo=self.spec.echo if echo is None else echo,
                             tail_lines=self.spec.tail_lines, on_line=on_line,
                             kill_grace=self.spec.kill_grace)

    def start(self, listener: socket.socket, hold_fds: Sequence[int], label: str,
              on_line: Optional[Callable[[str], None]], echo: Optional[bool] = None
              ) -> NativeProcess:
        """Starts the rank (:meth:`process`, passing it ``listener`` and ``hold_fds``) and closes
        ``listener``, which the rank holds now. A program that cannot start raises
        :meth:`start_error`'s RankFailedError (``proc`` is the process all the same, ended)."""
        proc = self.proc = self.process((listener.fileno(), *hold_fds), hold_fds, label, on_line,
                                        echo)
        try:
            proc.start()
        except StartError as e:
            raise self.start_error(e) from None
        finally:
            listener.close()
        return proc

    def start_error(self, e: OSError) -> RankFailedError:
        return RankFailedError(self.rank, None, "", self.me.host, "start",
                               f"{self.what}: {e.strerror or e}", failed_at=time.time())

    def timeout_error(self, proc: NativeProcess, at: Optional[float] = None) -> RankFailedError:
        """``at``: when the timeout struck (``time.time()``; now, when not given)."""
        return RankFailedError(self.rank, proc.returncode, proc.output_tail(), self.me.host,
                               "timeout", f"timeout={self.spec.timeout:g}s",
                               failed_at=time.time() if at is None else at)

    def stop_for_timeout(self, proc: NativeProcess) -> RankFailedError:
        """Ends ``proc``, whose ``spec.timeout`` has just struck (:meth:`NativeProcess.terminate`:
        the supervisor's SIGTERM, then SIGKILL after ``kill_grace``), and returns the timeout's
        RankFailedError, dated when it struck."""
        at = time.time()
        proc.terminate()
        return self.timeout_error(proc, at)

    def events(self, proc: NativeProcess) -> List[dict]:
        """This rank's timeline events from its process (and, with a timeline, its files)."""
        if not proc.started_at:
            return []
        out = [tl.complete("rank process", proc.started_at * 1e6,
                           (proc.ended_at or time.time()) * 1e6, tl.KOLO_TID,
                           pid=proc.rank_pid, exit=proc.returncode)]
        if self.spec.timeline:
            out.extend(tl.read_events(self.trace_path))
            out.extend(tl.engine_events(self.engine_file, proc.started_at * 1e6))
        return out

    def outcome(self, proc: NativeProcess) -> "RankRun":
        """The ended process's RankRun; raises RankFailedError (RankFunctionError) for a
        failure."""
        if proc.returncode != 0:
            err_path = self.result_path + ".error"
            if self.spec.fn_payload is not None and os.path.exists(err_path):
                record = json.loads(read_bounded(err_path, _MAX_ERROR_RECORD, "error record"))
                raise function_error(self.rank, record, proc.output_tail(), self.me.host,
                                     proc.returncode, proc.exited_at)
            detail = ""
            if self.spec.fn_payload is not None and os.path.exists(self.result_path):
                detail = ("after its function had returned and its result was written "
                          "(the process failed while it ended)")
            raise RankFailedError(self.rank, proc.returncode, proc.output_tail(), self.me.host,
                                  detail=detail, failed_at=proc.exited_at)
        value = None
        if self.spec.fn_payload is not None and not os.path.exists(self.result_path):
            raise RankFailedError(self.rank, proc.returncode, proc.output_tail(), self.me.host,
                                  detail="before its function returned (nothing was returned: "
                                  "did the function call os._exit(0)?)",
                                  failed_at=proc.exited_at)
        if self.spec.fn_payload is not None:  # fnrank enforced the limit; the file must agree
            value = read_bounded(self.result_path, self.spec.max_result_bytes or (1 << 62),
                                 "result (max_result_bytes)")
        return RankRun(result_of(self.spec, self.me, proc.returncode, proc.output_tail(),
                                 self.data, leftovers=proc.leftovers), value)


def run_rank(spec: TaskSpec, topology: List[RankTopology], rank: int, listener: socket.socket,
             data: Optional[Mapping[str, str]], workdir: str, *,
             hub: Optional["liveness.HubClient"] = None, events: Optional[List[dict]] = None
             ) -> RankRun:
    """Launches rank ``rank`` (a native program or ``spec``'s function) under its supervisor,
    waits for it and returns its RankRun; raises RankFailedError for a failure. Every process
    of the rank is gone when this returns. ``listener`` is closed here (the rank holds it)."""
    launch = RankLaunch(spec, topology, rank, listener.fileno(), data, workdir)
    on_line = hub.line if hub is not None and spec.stream_logs else None
    hold = (hub.fileno(),) if hub is not None else ()
    try:
        proc = launch.start(listener, hold, f"kolo rank {rank}", on_line)
        code = proc.wait(timeout=spec.timeout)
        if code is None and proc.timed_out:
            raise launch.stop_for_timeout(proc)
    finally:
        if launch.proc is not None:
            launch.proc.terminate()
            if events is not None:
                events.extend(launch.events(launch.proc))
    return launch.outcome(proc)


def lost_run(spec: TaskSpec, me: RankTopology, data: Optional[Mapping[str, str]],
             error: RankFailedError) -> RankRun:
    """In an elastic run, the outcome of a rank whose process failed: recorded lost in the
    driver's store (the survivors read it through kolo_spark.elastic.lost_ranks), and returned
    as a result with ``lost`` set instead of failing the stage. Raises ``error`` itself when the
    store cannot be reached (the run cannot go on without it)."""
    payload = failure_payload(error)
    payload["attempt"] = spec.attempt
    try:
        elastic_mod.record_lost(spec.store, spec.secret, rank_job_id(spec), spec.attempt,
                                me.rank, payload)
    except Exception:  # noqa: B902 (the driver's store is gone: fail as without elastic)
        raise error from None
    code = error.exit_code if error.exit_code is not None else -1
    result = result_of(spec, me, code, error.output_tail, data)
    result["lost"] = payload
    return RankRun(result)


def result_of(spec: TaskSpec, me: RankTopology, exit_code: int, tail: str,
              data: Optional[Mapping[str, str]], leftovers: Sequence[dict] = ()) -> dict:
    keep = spec.collect_output == "all" or me.rank == 0
    return {"rank": me.rank, "exit_code": exit_code, "host": me.host, "ip": me.ip,
            "port": me.port, "local_rank": me.local_rank, "local_size": me.local_size,
            "cross_rank": me.cross_rank, "cross_size": me.cross_size, "devices": list(me.gpus),
            "data_rows": int(data["KOLO_DATA_ROWS"]) if data else None,
            "output": tail if keep else "", "leftovers": list(leftovers)}


def barrier_partition(spec: TaskSpec, iterator):
    """The function each barrier task runs (``rdd.barrier().mapPartitions``). Yields one
    ``(result JSON, pickled return value or None)``."""
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    rank = ctx.partitionId()
    try:
        spec.stage_attempt = int(ctx.stageAttemptNumber())
    except Exception:  # noqa: B902 (an older PySpark)
        spec.stage_attempt = 0
    task_start = tl.now_us()
    events: List[dict] = []
    me = PreparedRank(rank)
    hub = None
    error = ""

    def where(out: PreparedRank) -> None:
        out.host = _host_key_of(spec, ctx, rank)
        out.ip = advertise_ip(spec.driver_host)
        out.gpus = _task_gpus(ctx)

    try:
        try:
            prepare_rank(spec, me, where, iterator, bind_host=spec.bind_host,
                         scratch_parent=spec.data_dir, events=events)
        except Exception as e:  # reported through the allGather so that every rank stops
            error = f"{type(e).__name__}: {e}"
        try:
            t0 = tl.now_us()
            topology = rendezvous(ctx.allGather, me.info(error))
            events.append(tl.complete("rendezvous", t0, tl.now_us(), tl.KOLO_TID))
            if len(topology) != spec.num_proc:
                raise ConfigurationError(f"kolo_spark: {len(topology)} tasks met in the barrier "
                                         f"but num_proc={spec.num_proc}")
            hub = liveness.connect(spec.liveness, spec.secret, rank,
                                   lines_per_second=spec.log_lines_per_second,
                                   line_bytes=spec.log_line_bytes)
            try:
                try:
                    run = run_rank(spec, topology, rank, me.listener, me.data, me.workdir,
                                   hub=hub, events=events)
                except RankFailedError as e:
                    if not spec.elastic or e.reason == "timeout":
                        raise
                    run = lost_run(spec, topology[rank], me.data, e)
            finally:
                me.listener = None  # closed by run_rank
                if hub is not None and spec.timeline:
                    events.append(tl.complete("barrier task", task_start, tl.now_us(),
                                              tl.KOLO_TID))
                    hub.trace(events)
        except KoloSparkError as e:
            payload = failure_payload(e)
            try:
                payload["attempt"] = int(ctx.stageAttemptNumber())
            except Exception:  # noqa: B902 (an older PySpark)
                payload["attempt"] = 0
            if hub is not None:
                # First to the driver's hub: the task that fails the stage first is not always
                # the rank that failed first, and Spark kills the other tasks once the stage
                # fails; the driver names the first failure from every rank's report.
                hub.failure(payload)
            raise_task_failure(e, payload)
        yield (json.dumps(run.result), run.value)
    finally:
        workdir, me.workdir = me.workdir, None
        me.release()  # the sockets
        if hub is not None:
            hub.close()
        if workdir:
            shutil.rmtree(workdir, ignore_errors=True)
