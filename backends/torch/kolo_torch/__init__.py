"""kolo as a torch.distributed backend.

    import torch.distributed as dist
    dist.init_process_group("kolo")          # torch >= 2.14 loads kolo_torch (its entry point)
    dist.all_reduce(tensor)

`import kolo_torch` registers the backend too: needed before init_process_group with torch 2.9
to 2.13, which do not load backend entry points. Rank, world size and rendezvous are torch's own (env://, tcp://, file://, a
TCPStore you pass); kolo's KOLO_* variables tune it (KOLO_TRANSPORT, KOLO_TIMEOUT_SECONDS,
KOLO_ALLREDUCE, ...). See docs/torch.md.
"""
import torch  # noqa: F401  (loads libtorch before the extension)
import torch.distributed as dist

from . import _C
from ._secret import load_secret, warn_if_published

__all__ = ["register", "BACKEND_NAME", "create_backend", "load_secret", "lost_ranks"]

BACKEND_NAME = "kolo"


def create_backend(store, rank, size, timeout):
    """Creates the kolo backend of one process group: (store, rank, world size, timeout).
    Rank 0 warns (one line) when, without KOLO_SECRET, the drawn secret is about to go into a
    TCPStore on a non-loopback address (kolo_torch._secret)."""
    warn_if_published(store, rank)
    return _C.create_backend(store, rank, size, timeout)


def lost_ranks(group=None):
    """The ranks of ``group`` (default: the default group) that this rank's kolo failure
    detector holds for gone now: their process exited or their connection closed. After a
    collective failed with a lost peer, it is what to pass to ``dist.shrink_group`` (the
    survivors agree on the same set when none of them missed a death; shrink_group says so
    when they do not). Empty while no peer is lost."""
    import torch as _torch
    pg = group if group is not None else dist.group.WORLD
    return list(_C.lost_ranks(pg._get_backend(_torch.device("cpu"))))


def register():
    """Registers the "kolo" backend with torch.distributed (idempotent)."""
    if BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(BACKEND_NAME, create_backend, devices=["cpu", "cuda"])


register()
