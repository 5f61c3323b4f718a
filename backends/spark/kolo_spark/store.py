"""Stores: where an estimator keeps its prepared data, checkpoints and logs (see docs/estimator.md).

A store is a directory on a ``pyarrow.fs`` filesystem that the driver and every executor can
reach. Its layout::

    <prefix>/intermediate_train_data[.<idx>]/part-00000.parquet ...   training rows
    <prefix>/intermediate_val_data[.<idx>]/part-00000.parquet ...     validation rows
    <prefix>/runs/<run_id>/checkpoint/checkpoint.pt                    the last epoch's state
    <prefix>/runs/<run_id>/checkpoint/checkpoint-step.pt               inside an epoch (optional)
    <prefix>/runs/<run_id>/logs/history.json                           per-epoch metrics

    store = LocalStore("/shared/kolo")                     # a path every executor sees (NFS, ...)
    store = Store.create("hdfs://namenode:8020/user/me/kolo")
    store = FilesystemStore("s3://bucket/kolo", filesystem=pyarrow.fs.S3FileSystem(...))

The store object travels to the executors pickled, filesystem included (every ``pyarrow.fs``
filesystem pickles).
"""

from __future__ import annotations

import posixpath
import uuid
from typing import List, Optional
from urllib.parse import urlparse

TRAIN_DATA = "intermediate_train_data"
VAL_DATA = "intermediate_val_data"
RUNS = "runs"
CHECKPOINT_FILE = "checkpoint.pt"
STEP_CHECKPOINT_FILE = "checkpoint-step.pt"  # inside an epoch (checkpoint_every_steps)
HISTORY_FILE = "history.json"

# Schemes whose first URL component is a bucket that pyarrow keeps in the path ("bucket/key").
_BUCKET_SCHEMES = {"s3", "s3a", "s3n", "gs", "gcs"}


def _fs():
    try:
        import pyarrow.fs as pafs
    except ImportError:
        raise ImportError("kolo_spark stores need pyarrow (pip install pyarrow)") from None
    return pafs


class Store:
    """A directory on a ``pyarrow.fs.FileSystem``: ``filesystem`` and ``prefix`` (a path of that
    filesystem). Use :class:`LocalStore` or :class:`FilesystemStore`, or :meth:`Store.create`,
    which picks one from a path or URL."""

    def __init__(self, prefix: str, filesystem, url: Optional[str] = None):
        if not prefix:
            raise ValueError("kolo_spark store: the prefix path is empty")
        self.filesystem = filesystem
        self.prefix = prefix.rstrip("/") or "/"
        self._url = url

    @staticmethod
    def create(prefix_path: str, filesystem=None) -> "Store":
        """A :class:`LocalStore` for a local path or ``file://`` URL, else a
        :class:`FilesystemStore` (``hdfs://``, ``s3://``, ... through ``pyarrow.fs``)."""
        scheme = urlparse(prefix_path).scheme
        if filesystem is None and scheme in ("", "file"):
            return LocalStore(prefix_path)
        return FilesystemStore(prefix_path, filesystem=filesystem)

    # --- layout ---
    def join(self, *parts: str) -> str:
        return posixpath.join(self.prefix, *parts)

    def get_train_data_path(self, idx: Optional[str] = None) -> str:
        """The directory of the prepared training rows (``intermediate_train_data[.idx]``)."""
        return self.join(TRAIN_DATA + (f".{idx}" if idx is not None else ""))

    def get_val_data_path(self, idx: Optional[str] = None) -> str:
        """The directory of the prepared validation rows (``intermediate_val_data[.idx]``)."""
        return self.join(VAL_DATA + (f".{idx}" if idx is not None else ""))

    def get_run_path(self, run_id: str) -> str:
        return self.join(RUNS, run_id)

    def get_checkpoint_path(self, run_id: str) -> str:
        """The run's checkpoint directory (``runs/<run_id>/checkpoint``)."""
        return self.join(RUNS, run_id, "checkpoint")

    def get_checkpoint_file(self, run_id: str) -> str:
        return posixpath.join(self.get_checkpoint_path(run_id), CHECKPOINT_FILE)

    def get_step_checkpoint_file(self, run_id: str) -> str:
        """The checkpoint written inside an epoch (``checkpoint_every_steps``)."""
        return posixpath.join(self.get_checkpoint_path(run_id), STEP_CHECKPOINT_FILE)

    def get_logs_path(self, run_id: str) -> str:
        """The run's log directory (``runs/<run_id>/logs``)."""
        return self.join(RUNS, run_id, "logs")

    def url(self, path: Optional[str] = None) -> str:
        """``path`` (default: the prefix) as the user would write it, for messages."""
        path = self.prefix if path is None else path
        if self._url is None:
            return path
        rel = posixpath.relpath(path, self.prefix)
        return self._url.rstrip("/") + ("" if rel == "." else "/" + rel)

    # --- files ---
    def exists(self, path: str) -> bool:
        return self.filesystem.get_file_info(path).type != _fs().FileType.NotFound

    def is_dir(self, path: str) -> bool:
        return self.filesystem.get_file_info(path).type == _fs().FileType.Directory

    def makedirs(self, path: str) -> None:
        self.filesystem.create_dir(path, recursive=True)

    def read_bytes(self, path: str) -> bytes:
        with self.filesystem.open_input_stream(path) as f:
            return f.read()

    def write_bytes(self, path: str, data: bytes) -> None:
        """Writes ``data`` to ``path`` whole: into a temporary file next to it, then moved over
        it, so a reader never sees half a file (on object stores the move is a copy)."""
        parent = posixpath.dirname(path)
        self.makedirs(parent)
        tmp = posixpath.join(parent, f".{posixpath.basename(path)}.{uuid.uuid4().hex[:8]}.tmp")
        with self.filesystem.open_output_stream(tmp) as f:
            f.write(data)
        try:
            self.filesystem.move(tmp, path)
        except BaseException:
            self.filesystem.delete_file(tmp)
            raise

    def delete_dir(self, path: str) -> None:
        if self.exists(path):
            self.filesystem.delete_dir(path)

    def list_files(self, path: str, suffix: str = "") -> List[str]:
        """The files directly in ``path`` ending in ``suffix``, sorted; hidden files (``.``,
        ``_``: temporary files, ``_SUCCESS``) left out."""
        pafs = _fs()
        if not self.is_dir(path):
            return []
        infos = self.filesystem.get_file_info(pafs.FileSelector(path, recursive=False))
        return sorted(i.path for i in infos if i.type == pafs.FileType.File
                      and not i.base_name.startswith((".", "_")) and i.base_name.endswith(suffix))

    def open_input_file(self, path: str):
        return self.filesystem.open_input_file(path)

    def open_output_stream(self, path: str):
        return self.filesystem.open_output_stream(path)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url()!r})"


class LocalStore(Store):
    """A store in a local directory. With executors on several hosts, the directory must be the
    same shared filesystem (NFS, ...) on every one of them and on the driver."""

    def __init__(self, prefix_path: str):
        import os

        pafs = _fs()
        parsed = urlparse(prefix_path)
        if parsed.scheme == "file":
            prefix_path = parsed.path
        elif parsed.scheme:
            raise ValueError(f"kolo_spark LocalStore: {prefix_path!r} is not a local path "
                             "(use FilesystemStore or Store.create for URLs)")
        super().__init__(os.path.abspath(prefix_path), pafs.LocalFileSystem())
        self.makedirs(self.prefix)


class FilesystemStore(Store):
    """A store at a ``pyarrow.fs`` URL: ``file:///path``, ``hdfs://host:port/path`` (needs
    libhdfs and a Hadoop client on every machine), ``s3://bucket/path`` (credentials from the
    usual AWS variables), ``gs://...``. Pass ``filesystem=`` to use a filesystem object
    configured by hand (an ``S3FileSystem`` with an endpoint, a ``HadoopFileSystem`` with a
    user, ...): the URL then only gives the path inside it."""

    def __init__(self, prefix_url: str, filesystem=None):
        pafs = _fs()
        parsed = urlparse(prefix_url)
        if filesystem is None:
            try:
                filesystem, path = pafs.FileSystem.from_uri(prefix_url)
            except Exception as e:
                raise ValueError(f"kolo_spark FilesystemStore: cannot open {prefix_url!r} with "
                                 f"pyarrow.fs: {type(e).__name__}: {e}") from None
        elif parsed.scheme in _BUCKET_SCHEMES:
            path = (parsed.netloc + parsed.path).rstrip("/")
        elif parsed.scheme:
            path = parsed.path
        else:
            path = prefix_url
        if not isinstance(filesystem, pafs.FileSystem):
            raise TypeError("kolo_spark FilesystemStore: filesystem must be a "
                            f"pyarrow.fs.FileSystem, not {type(filesystem).__name__}")
        super().__init__(path, filesystem, url=prefix_url if parsed.scheme else None)
        self.makedirs(self.prefix)
