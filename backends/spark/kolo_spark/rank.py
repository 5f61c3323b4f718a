"""Inside a rank: what kolo_spark told it (for Python functions; native programs read the same
variables)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Mapping, Optional, Tuple


def get_available_devices(env: Optional[Mapping[str, str]] = None) -> List[str]:
    """The GPU addresses Spark assigned to this rank (``KOLO_DEVICES``), as strings; empty when
    it has none. Like Horovod's ``get_available_devices()``. They are the devices' ids on the
    host; inside the rank ``CUDA_VISIBLE_DEVICES`` holds exactly these, so torch numbers them
    0, 1, ... (``torch.device("cuda", 0)`` is the first)."""
    text = (os.environ if env is None else env).get("KOLO_DEVICES", "")
    return [d.strip() for d in text.split(",") if d.strip()]


@dataclass(frozen=True)
class RankContext:
    """This rank's place in the job (from the environment contract)."""

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    host_key: str
    devices: Tuple[str, ...]
    data_file: Optional[str]


def rank_context(env: Optional[Mapping[str, str]] = None) -> RankContext:
    """The rank's RankContext; raises RuntimeError outside a kolo_spark rank."""
    e = os.environ if env is None else env
    if "KOLO_RANK" not in e or "KOLO_SIZE" not in e:
        raise RuntimeError("kolo_spark.rank_context(): not inside a kolo_spark rank (KOLO_RANK "
                           "and KOLO_SIZE are not set)")
    return RankContext(rank=int(e["KOLO_RANK"]), size=int(e["KOLO_SIZE"]),
                       local_rank=int(e.get("KOLO_LOCAL_RANK", 0)),
                       local_size=int(e.get("KOLO_LOCAL_SIZE", 1)),
                       cross_rank=int(e.get("KOLO_CROSS_RANK", 0)),
                       cross_size=int(e.get("KOLO_CROSS_SIZE", 1)),
                       host_key=e.get("KOLO_HOST_KEY", ""),
                       devices=tuple(get_available_devices(e)),
                       data_file=e.get("KOLO_DATA_FILE") or None)
