"""kolo as torchft's replica-group backend: ``ProcessGroupKolo``.

    from torchft import Manager
    from kolo_torch.torchft import ProcessGroupKolo
    manager = Manager(pg=ProcessGroupKolo(timeout=timedelta(seconds=10)), ...)

torchft (``pip install torchft``) reconfigures its process group at every quorum change by
calling ``configure(store_addr, replica_id, rank, world_size, ...)``: ProcessGroupKolo (a
``torchft.process_group.ProcessGroupWrapper``) then aborts the previous kolo group and creates
a new one, rank ``rank`` of ``world_size``, through the quorum's store. See docs/torch.md.
"""
from __future__ import annotations

from datetime import timedelta

import torch
from torch.distributed import ProcessGroup as BaseProcessGroup
from torchft.process_group import ProcessGroupWrapper

from . import create_backend

__all__ = ["ProcessGroupKolo"]


class ProcessGroupKolo(ProcessGroupWrapper):
    """A reconfigurable torchft process group over kolo's backend (CPU tensors, and CUDA tensors
    as the kolo backend takes them). ``timeout`` bounds each configure's rendezvous and every
    collective of the group."""

    def __init__(self, timeout: timedelta = timedelta(seconds=60)) -> None:
        super().__init__(timeout=timeout)

    def _create_pg(self, store, rank: int, world_size: int) -> BaseProcessGroup:
        pg = BaseProcessGroup(store, rank, world_size)
        pg._set_default_backend(BaseProcessGroup.BackendType.CUSTOM)
        backend = create_backend(store, rank, world_size, self._timeout)
        pg._register_backend(torch.device("cpu"), BaseProcessGroup.BackendType.CUSTOM, backend)
        if torch.cuda.is_available():
            pg._register_backend(torch.device("cuda"), BaseProcessGroup.BackendType.CUSTOM,
                                 backend)
        return pg

    def getBackendName(self) -> str:
        return "torchft-kolo"
