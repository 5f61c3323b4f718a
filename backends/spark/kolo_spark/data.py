"""The data hand-off: each barrier task writes its DataFrame partition to a local file that its
native rank reads (path in ``KOLO_DATA_FILE``).

Two layouts (``data_format=``):

``csv`` (default)
    UTF-8 text, ``\\n`` line ends, RFC 4180 quoting (a field holding a comma, quote or line
    break is quoted, quotes doubled). The first line is the header: the column names. Then one
    line per row. Values: integers in decimal, floats in Python's shortest round-trip form
    (``repr``: ``0.1``, ``1e+20``, ``nan``, ``inf``, ``-inf``), booleans ``true``/``false``,
    null as an empty field, anything else as ``str(value)``.

``f64``
    Binary, little-endian, for numeric columns::

        offset 0   8 bytes   magic "KOLOF64\\0"
        offset 8   uint64    rows
        offset 16  uint64    cols
        offset 24  float64   rows * cols values, row-major

    Integers and decimals are converted to float64, booleans to 1/0, null to NaN; any other
    type is an error naming the column (use ``csv`` for it).

The native side also gets ``KOLO_DATA_FORMAT`` (``csv``/``f64``), ``KOLO_DATA_ROWS`` (rows in
this shard) and ``KOLO_DATA_COLUMNS`` (the column names joined by commas; the CSV header is
authoritative if a name holds a comma). ``backends/spark/include/kolo/spark/data_file.hpp``
reads both layouts.
"""

from __future__ import annotations

import array
import csv
import decimal
import math
import os
import struct
import sys
from typing import Iterable, Sequence

FORMATS = ("csv", "f64")
F64_MAGIC = b"KOLOF64\0"
_F64_HEADER = struct.Struct("<8sQQ")
_SUFFIX = {"csv": ".csv", "f64": ".f64"}


def shard_file_name(rank: int, fmt: str) -> str:
    return f"shard-{rank:05d}{_SUFFIX[fmt]}"


def _csv_field(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _f64_value(v, column: str) -> float:
    if v is None:
        return math.nan
    if isinstance(v, (bool, int, float, decimal.Decimal)):
        return float(v)
    raise TypeError(f"column '{column}' holds a {type(v).__name__} value ({v!r:.40}): the f64 "
                    "data format takes numeric columns only (use data_format='csv')")


def write_rows(rows: Iterable[Sequence], path: str, fmt: str, columns: Sequence[str]) -> int:
    """Writes ``rows`` (tuples, e.g. pyspark Rows) to ``path``; returns the number of rows."""
    if fmt not in FORMATS:
        raise ValueError(f"data_format={fmt!r}: expected one of {', '.join(FORMATS)}")
    ncols = len(columns)
    count = 0
    if fmt == "csv":
        with open(path, "w", encoding="utf-8", newline="") as f:
            w = csv.writer(f, lineterminator="\n")
            w.writerow(list(columns))
            for row in rows:
                if len(row) != ncols:
                    raise ValueError(f"row {count} has {len(row)} values but there are "
                                     f"{ncols} columns")
                w.writerow([_csv_field(v) for v in row])
                count += 1
        return count

    with open(path, "wb") as f:
        f.write(_F64_HEADER.pack(F64_MAGIC, 0, ncols))
        buf = array.array("d")
        for row in rows:
            if len(row) != ncols:
                raise ValueError(f"row {count} has {len(row)} values but there are {ncols} columns")
            buf.extend(_f64_value(v, columns[i]) for i, v in enumerate(row))
            count += 1
            if len(buf) >= 65536:
                _write_le(f, buf)
                buf = array.array("d")
        _write_le(f, buf)
        f.seek(0)
        f.write(_F64_HEADER.pack(F64_MAGIC, count, ncols))
    return count


def _write_le(f, buf: "array.array") -> None:
    if sys.byteorder != "little":
        buf.byteswap()
    f.write(buf.tobytes())


def read_f64(path: str):
    """(rows, cols, values) of an f64 file; for tests and Python-side checks."""
    with open(path, "rb") as f:
        magic, rows, cols = _F64_HEADER.unpack(f.read(_F64_HEADER.size))
        if magic != F64_MAGIC:
            raise ValueError(f"{path} is not a kolo f64 file")
        values = array.array("d")
        values.frombytes(f.read())
    if sys.byteorder != "little":
        values.byteswap()
    return rows, cols, list(values)


def data_env(path: str, fmt: str, rows: int, columns: Sequence[str]) -> dict:
    return {"KOLO_DATA_FILE": os.path.abspath(path), "KOLO_DATA_FORMAT": fmt,
            "KOLO_DATA_ROWS": str(rows), "KOLO_DATA_COLUMNS": ",".join(columns)}
