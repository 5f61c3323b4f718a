"""kolo_spark.torch's datasets: a Parquet directory of the store as its row groups, read from
the store's metadata, and their assignment to ranks (whole row groups, balanced by rows)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from kolo_spark.store import Store
from kolo_spark.torch_schema import _fail

# Row groups per rank that fit(df) aims at: enough for an even split, few enough to read fast.
GROUPS_PER_RANK = 4
MAX_GROUP_BYTES = 64 << 20


class _Dataset:
    """A Parquet directory of the store: its files and their row groups' sizes."""

    def __init__(self, path: str, groups: List[Tuple[str, int, int]]):
        self.path = path
        self.groups = groups  # (file, row group index, rows)

    @property
    def rows(self) -> int:
        return sum(g[2] for g in self.groups)

    def assign(self, num_proc: int) -> Tuple[List[List[Tuple[str, List[int]]]], List[int]]:
        """Whole row groups to ranks, the largest first to the rank with the fewest rows (ties
        to the lower rank): ([(file, [row groups])] per rank, rows per rank)."""
        rows = [0] * num_proc
        picked: List[Dict[str, List[int]]] = [{} for _ in range(num_proc)]
        for path, idx, n in sorted(self.groups, key=lambda g: (-g[2], g[0], g[1])):
            r = min(range(num_proc), key=lambda i: (rows[i], i))
            rows[r] += n
            picked[r].setdefault(path, []).append(idx)
        parts = [[(p, sorted(ids)) for p, ids in sorted(d.items())] for d in picked]
        return parts, rows


def _read_dataset(store: Store, path: str) -> Optional[_Dataset]:
    import pyarrow.parquet as pq

    files = store.list_files(path, ".parquet")
    if not files:
        return None
    groups = []
    for f in files:
        with store.open_input_file(f) as fh:
            meta = pq.ParquetFile(fh).metadata
        groups += [(f, i, meta.row_group(i).num_rows) for i in range(meta.num_row_groups)
                   if meta.row_group(i).num_rows]
    return _Dataset(path, groups)


def _parquet_schema(store: Store, path: str):
    import pyarrow.parquet as pq

    files = store.list_files(path, ".parquet")
    with store.open_input_file(files[0]) as fh:
        return pq.ParquetFile(fh).schema_arrow


def _vector_widths(store: Store, path: str, columns: List[Dict[str, Any]]) -> None:
    """Fills the width of list columns of unknown size from the dataset's first row group."""
    import pyarrow.parquet as pq

    unknown = [c for c in columns if c["kind"] != "scalar" and c["width"] is None]
    if not unknown:
        return
    f = store.list_files(path, ".parquet")[0]
    with store.open_input_file(f) as fh:
        t = pq.ParquetFile(fh).read_row_group(0, columns=[c["name"] for c in unknown])
    for c in unknown:
        first = t.column(c["name"]).slice(0, 1).to_pylist()
        if not first or first[0] is None:
            _fail(f"column '{c['name']}' of {store.url(f)}: cannot tell its array size from the "
                  "first row")
        c["width"] = len(first[0])
