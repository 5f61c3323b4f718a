"""Who is who: from one ``allGather`` of every task's facts to each rank's topology.

Pure functions, no Spark: the barrier task calls :func:`rendezvous` with
``BarrierTaskContext.allGather``; tests call it with a fake one.

The rules match kolo's C++ ``Bootstrap`` (include/kolo/topology/bootstrap.hpp), which checks
what the launcher exported against the host keys it sees through the store:

* hosts are the distinct host keys, numbered in the order of their lowest rank (cross rank);
* a rank's local rank is its index among the ranks with the same host key, in rank order;
* a GPU id may be given to at most one rank per host.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable, List, Sequence, Tuple

from .errors import ConfigurationError, SetupError


@dataclass(frozen=True)
class TaskInfo:
    """What one task tells all the others, exactly once."""

    rank: int
    host: str  # host key: tasks with equal keys share memory
    ip: str  # address the other ranks use to reach this task's listening socket
    port: int  # port of the listening socket the task keeps open for its native process
    gpus: Tuple[str, ...] = ()
    error: str = ""  # a failure before the rendezvous, so that every rank stops
    torch_port: int = 0  # rank 0: the port reserved for torch's TCPStore (MASTER_PORT)

    def to_message(self) -> str:
        return json.dumps({"rank": self.rank, "host": self.host, "ip": self.ip,
                           "port": self.port, "gpus": list(self.gpus), "error": self.error,
                           "torch_port": self.torch_port}, sort_keys=True)

    @staticmethod
    def from_message(message: str) -> "TaskInfo":
        try:
            d = json.loads(message)
            return TaskInfo(rank=int(d["rank"]), host=str(d["host"]), ip=str(d["ip"]),
                            port=int(d["port"]), gpus=tuple(str(g) for g in d.get("gpus", ())),
                            error=str(d.get("error", "")),
                            torch_port=int(d.get("torch_port", 0) or 0))
        except (ValueError, KeyError, TypeError) as e:
            raise ConfigurationError(f"kolo_spark: malformed rendezvous message {message!r}: {e}")


@dataclass(frozen=True)
class RankTopology:
    """One rank's place in the job: what becomes its KOLO_* environment."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    host: str
    ip: str
    port: int
    gpus: Tuple[str, ...] = field(default=())
    torch_port: int = 0  # what this task reserved for torch's TCPStore (rank 0 only)

    @property
    def address(self) -> str:
        return f"[{self.ip}]:{self.port}" if ":" in self.ip else f"{self.ip}:{self.port}"


def compute_topology(infos: Sequence[TaskInfo]) -> List[RankTopology]:
    """Every rank's topology, in rank order. Deterministic: the same infos in any order give
    the same answer on every task. Raises ConfigurationError for an inconsistent job (missing
    or repeated ranks, a GPU id on two ranks of one host, a bad address) and SetupError when
    a task reported a failure of its own."""
    if not infos:
        raise ConfigurationError("kolo_spark: no tasks took part in the rendezvous")
    by_rank = sorted(infos, key=lambda i: i.rank)
    size = len(by_rank)
    ranks = [i.rank for i in by_rank]
    if ranks != list(range(size)):
        repeated = sorted({r for r in ranks if ranks.count(r) > 1})
        missing = sorted(set(range(size)) - set(ranks))
        raise ConfigurationError(
            f"kolo_spark: the rendezvous saw ranks {ranks}: expected 0..{size - 1} once each"
            + (f"; repeated: {repeated}" if repeated else "")
            + (f"; missing: {missing}" if missing else ""))

    failed = [i for i in by_rank if i.error]
    if failed:
        raise SetupError("kolo_spark: " + "; ".join(
            f"rank {i.rank} (host '{i.host}') failed before launch: {i.error}" for i in failed))

    addresses = {}
    for i in by_rank:
        if not i.ip:
            raise ConfigurationError(f"kolo_spark: rank {i.rank} reported no IP address")
        if not 0 < i.port < 65536:
            raise ConfigurationError(f"kolo_spark: rank {i.rank} reported port {i.port}")
        key = (i.ip, i.port)
        if key in addresses:
            raise ConfigurationError(f"kolo_spark: ranks {addresses[key]} and {i.rank} both "
                                     f"listen at {i.ip}:{i.port}")
        addresses[key] = i.rank

    # GPU ids: device indices (KOLO_DEVICES is a list of integers), each on one rank per host.
    owner = {}  # (host, gpu) -> rank
    for i in by_rank:
        for g in i.gpus:
            if not g.isdigit():
                raise ConfigurationError(
                    f"kolo_spark: rank {i.rank} on host '{i.host}' got GPU address {g!r}, which "
                    "is not a device index (KOLO_DEVICES takes integers: make the GPU discovery "
                    "script report indices such as \"0\", \"1\")")
            if (i.host, g) in owner:
                other = owner[(i.host, g)]
                who = (f"both rank {other} and rank {i.rank}" if other != i.rank
                       else f"rank {i.rank} twice")
                raise ConfigurationError(
                    f"kolo_spark: GPU {g} on host '{i.host}' is assigned to {who}: check "
                    "spark.task.resource.gpu.amount and the GPU discovery script (every task "
                    "of a host must get its own GPUs)")
            owner[(i.host, g)] = i.rank

    host_order: List[str] = []  # cross rank = order of each host's lowest rank
    members = {}  # host -> ranks on it, in rank order
    for i in by_rank:
        if i.host not in members:
            host_order.append(i.host)
            members[i.host] = []
        members[i.host].append(i.rank)
    cross = {h: n for n, h in enumerate(host_order)}
    return [
        RankTopology(rank=i.rank, size=size, local_rank=members[i.host].index(i.rank),
                     local_size=len(members[i.host]), cross_rank=cross[i.host],
                     cross_size=len(host_order), host=i.host, ip=i.ip, port=i.port,
                     gpus=tuple(i.gpus), torch_port=i.torch_port)
        for i in by_rank
    ]


def peers_string(topology: Sequence[RankTopology]) -> str:
    """KOLO_PEERS: ``ip:port`` of every rank, in rank order (rank 0's hosts the store)."""
    return ",".join(t.address for t in topology)


def rendezvous(all_gather: Callable[[str], Sequence[str]], mine: TaskInfo) -> List[RankTopology]:
    """One ``allGather`` of this task's facts, then the whole job's topology."""
    messages = all_gather(mine.to_message())
    infos = [TaskInfo.from_message(m) for m in messages]
    if not any(i.rank == mine.rank for i in infos):
        raise ConfigurationError(f"kolo_spark: rank {mine.rank} is missing from the allGather")
    return compute_topology(infos)
