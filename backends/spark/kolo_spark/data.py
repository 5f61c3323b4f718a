"""The data hand-off: each barrier task writes its DataFrame partition to a local file that its
rank reads (path in ``KOLO_DATA_FILE``).

Three layouts (``data_format=``):

``csv`` (default)
    UTF-8 text, ``\\n`` line ends, RFC 4180 quoting (a field holding a comma, quote or line
    break is quoted, quotes doubled). The first line is the header: the column names. Then one
    line per row. Values: integers in decimal (exact, any size), floats in Python's shortest
    round-trip form (``repr``: ``0.1``, ``1e+20``, ``nan``, ``inf``, ``-inf``), booleans
    ``true``/``false``, vectors and arrays as ``[v1,v2,...]`` (floats as above), null as an
    empty field, anything else (strings, dates, ...) as ``str(value)``.

``f64``
    Binary, little-endian, for numeric columns::

        offset 0   8 bytes   magic "KOLOF64\\0"
        offset 8   uint64    rows
        offset 16  uint64    cols
        offset 24  float64   rows * cols values, row-major

    Integers and decimals are converted to float64 (integers above 2^53 lose digits: use
    ``bin``), booleans to 1/0, null to NaN; any other type is an error naming the column.

``bin``
    Binary, little-endian, typed columns (exact int64) and vector/array columns flattened::

        offset 0   8 bytes   magic "KOLOBIN1"
        offset 8   uint64    rows
        offset 16  uint64    columns (the DataFrame's)
        offset 24  uint64    cells per row (the sum of the columns' widths)
        offset 32  per column: uint8 type (1 float64, 2 int64, 3 vector of float64),
                   3 zero bytes, uint32 width (cells; 1 for scalars), uint32 name length,
                   the name (UTF-8)
        then zero bytes up to a multiple of 8, then rows * cells 8-byte cells, row-major:
        float64 or int64 (two's complement) as the column's type says.

    int64: integer and boolean (1/0) columns, exact. float64: floating and decimal columns,
    null is NaN. vector: ``pyspark.ml.linalg`` vectors (dense or sparse) and numeric arrays,
    flattened; the width is the first row's length and every row of the shard must have it.
    A null in an int64 or vector column, and a string column, are errors naming the column.

The rank also gets ``KOLO_DATA_FORMAT`` (``csv``/``f64``/``bin``), ``KOLO_DATA_ROWS`` (rows in
this shard), ``KOLO_DATA_COLUMNS`` (the column names joined by commas; the file's own names are
authoritative if a name holds a comma) and ``KOLO_DATA_TYPES`` (one type per column, from the
DataFrame's schema: ``int64``, ``float64``, ``bool``, ``vector``, ``text``), with which the C++
reader (``kolo/spark/data_file.hpp``) keeps int64 columns exact and string columns as text in
CSV shards.
"""

from __future__ import annotations

import array
import csv
import decimal
import itertools
import math
import os
import struct
import sys
from typing import Iterable, Optional, Sequence, Tuple

FORMATS = ("csv", "f64", "bin")
F64_MAGIC = b"KOLOF64\0"
BIN_MAGIC = b"KOLOBIN1"
_F64_HEADER = struct.Struct("<8sQQ")
_BIN_HEADER = struct.Struct("<8sQQQ")
_BIN_COLUMN = struct.Struct("<B3xII")
_SUFFIX = {"csv": ".csv", "f64": ".f64", "bin": ".bin"}
TYPES = ("int64", "float64", "bool", "vector", "text")
_BIN_CODE = {"float64": 1, "int64": 2, "bool": 2, "vector": 3}
_INT64 = (-(1 << 63), (1 << 63) - 1)


def shard_file_name(rank: int, fmt: str) -> str:
    return f"shard-{rank:05d}{_SUFFIX[fmt]}"


def column_types(schema) -> Tuple[str, ...]:
    """The layouts' type of every column of a Spark schema (a StructType)."""
    from pyspark.sql import types as T

    out = []
    for f in schema.fields:
        t = f.dataType
        if isinstance(t, T.BooleanType):
            out.append("bool")
        elif isinstance(t, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
            out.append("int64")
        elif isinstance(t, (T.FloatType, T.DoubleType, T.DecimalType)):
            out.append("float64")
        elif isinstance(t, T.ArrayType) and isinstance(t.elementType, T.NumericType):
            out.append("vector")
        elif type(t).__name__ == "VectorUDT":
            out.append("vector")
        else:
            out.append("text")
    return tuple(out)


def _vector_values(v) -> Optional[list]:
    """A vector's or array's values as a list of floats (None: not a vector)."""
    if isinstance(v, (list, tuple)):
        return [float(x) for x in v]
    to_array = getattr(v, "toArray", None)  # pyspark.ml.linalg / mllib vectors, numpy arrays
    if to_array is not None and hasattr(v, "size"):
        return [float(x) for x in to_array()]
    return None


def _csv_field(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if not isinstance(v, (str, int, decimal.Decimal)):
        values = _vector_values(v)
        if values is not None:
            return "[" + ",".join(repr(x) for x in values) + "]"
    return str(v)


def _f64_value(v, column: str) -> float:
    if v is None:
        return math.nan
    if isinstance(v, (bool, int, float, decimal.Decimal)):
        return float(v)
    hint = ("data_format='bin' flattens vector and array columns"
            if _vector_values(v) is not None else "use data_format='csv' for it")
    raise TypeError(f"column '{column}' holds a {type(v).__name__} value ({v!r:.40}): the f64 "
                    f"data format takes numeric columns only ({hint})")


def write_rows(rows: Iterable[Sequence], path: str, fmt: str, columns: Sequence[str],
               types: Sequence[str] = ()) -> int:
    """Writes ``rows`` (tuples, e.g. pyspark Rows) to ``path``; returns the number of rows.
    ``types``: per column (column_types); ``bin`` infers them from the first row without."""
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
    if fmt == "bin":
        return _write_bin(rows, path, columns, types)

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


def _infer_type(v) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int64"
    if v is None or isinstance(v, (float, decimal.Decimal)):
        return "float64"
    return "vector" if _vector_values(v) is not None else "text"


def _write_bin(rows: Iterable[Sequence], path: str, columns: Sequence[str],
               types: Sequence[str]) -> int:
    ncols = len(columns)
    it = iter(rows)
    first = next(it, None)
    if not types:
        types = tuple(_infer_type(v) for v in first) if first is not None else ("float64",) * ncols
    if len(types) != ncols:
        raise ValueError(f"{len(types)} column types for {ncols} columns")
    for name, t in zip(columns, types):
        if t not in _BIN_CODE:
            raise TypeError(f"column '{name}' is of type {t}: the bin data format takes numeric, "
                            "boolean, vector and array columns (use data_format='csv' for it)")
    widths = []
    for i, t in enumerate(types):
        if t != "vector":
            widths.append(1)
        elif first is None:
            widths.append(0)
        elif first[i] is None:
            raise ValueError(f"column '{columns[i]}' is null in row 0: the bin data format needs "
                             "a vector in every row (its width comes from the first row)")
        else:
            widths.append(len(_vector_values(first[i])))
    cells = sum(widths)
    header = bytearray(_BIN_HEADER.pack(BIN_MAGIC, 0, ncols, cells))
    for name, t, w in zip(columns, types, widths):
        raw = str(name).encode("utf-8")
        header += _BIN_COLUMN.pack(_BIN_CODE[t], w, len(raw)) + raw
    header += b"\0" * (-len(header) % 8)
    count = 0
    with open(path, "wb") as f:
        f.write(header)
        buf = bytearray()
        rows_iter = itertools.chain([first] if first is not None else [], it)
        for row in rows_iter:
            if len(row) != ncols:
                raise ValueError(f"row {count} has {len(row)} values but there are {ncols} columns")
            for v, t, w, name in zip(row, types, widths, columns):
                buf += _bin_cells(v, t, w, name, count)
            count += 1
            if len(buf) >= 1 << 19:
                f.write(buf)
                buf = bytearray()
        f.write(buf)
        f.seek(0)
        f.write(_BIN_HEADER.pack(BIN_MAGIC, count, ncols, cells))
    return count


def _bin_cells(v, t: str, width: int, column: str, row: int) -> bytes:
    if t == "float64":
        if v is None:
            return struct.pack("<d", math.nan)
        if isinstance(v, (bool, int, float, decimal.Decimal)):
            return struct.pack("<d", float(v))
        raise TypeError(f"column '{column}' holds a {type(v).__name__} value in row {row}, not "
                        "a number")
    if t in ("int64", "bool"):
        if v is None:
            raise ValueError(f"column '{column}' is null in row {row}: int64 cells of the bin "
                             "data format have no null (fill it, or cast the column to double)")
        if not isinstance(v, int):
            raise TypeError(f"column '{column}' holds a {type(v).__name__} value in row {row}, "
                            "not an integer")
        if not _INT64[0] <= v <= _INT64[1]:
            raise ValueError(f"column '{column}' holds {v} in row {row}, outside int64")
        return struct.pack("<q", int(v))
    values = _vector_values(v) if v is not None else None
    if values is None:
        what = "null" if v is None else f"a {type(v).__name__}, not a vector"
        raise ValueError(f"column '{column}' is {what} in row {row}: the bin data format needs "
                         "a vector or array in every row")
    if len(values) != width:
        raise ValueError(f"column '{column}' has {len(values)} values in row {row} but {width} "
                         "in the shard's first row: the bin data format needs one width per "
                         "column (pad or truncate the vectors)")
    return struct.pack(f"<{width}d", *values)


def _write_le(f, buf: "array.array") -> None:
    if sys.byteorder != "little":
        buf.byteswap()
    f.write(buf.tobytes())


MAX_CELLS_WITHOUT_ROWS = 1 << 16  # as the C++ reader (kolo/spark/data_file.hpp)


def _check_shape(path: str, rows: int, cells: int, body: int) -> None:
    """A header's ``rows`` x ``cells`` against the ``body`` bytes behind it, before anything is
    allocated (ValueError naming the file)."""
    if body < 0 or (cells and (rows > body // 8 // cells or rows * cells * 8 != body)) or (
            not cells and body):
        raise ValueError(f"{path}: says {rows} rows x {cells} cells but holds {max(body, 0)} "
                         "bytes of cells")
    if rows and not cells:
        raise ValueError(f"{path}: says {rows} rows x 0 cells: rows without a single column "
                         "cannot be read back")
    if not rows and cells > MAX_CELLS_WITHOUT_ROWS:
        raise ValueError(f"{path}: says 0 rows x {cells} cells: more than "
                         f"{MAX_CELLS_WITHOUT_ROWS} cells per row in a shard of no rows (a "
                         "lying header)")


def read_f64(path: str):
    """(rows, cols, values) of an f64 file; for tests and Python-side checks."""
    with open(path, "rb") as f:
        head = f.read(_F64_HEADER.size)
        if len(head) < _F64_HEADER.size:
            raise ValueError(f"{path} is not a kolo f64 file")
        magic, rows, cols = _F64_HEADER.unpack(head)
        if magic != F64_MAGIC:
            raise ValueError(f"{path} is not a kolo f64 file")
        _check_shape(path, rows, cols, os.fstat(f.fileno()).st_size - _F64_HEADER.size)
        values = array.array("d")
        values.frombytes(f.read())
    if sys.byteorder != "little":
        values.byteswap()
    return rows, cols, list(values)


def read_bin(path: str):
    """(columns, types, widths, rows as lists of cells) of a bin file; for tests and
    Python-side checks."""
    codes = {v: k for k, v in _BIN_CODE.items() if k != "bool"}
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < _BIN_HEADER.size or data[:8] != BIN_MAGIC:
        raise ValueError(f"{path} is not a kolo bin file")
    magic, rows, ncols, cells = _BIN_HEADER.unpack_from(data)
    if ncols > (len(data) - _BIN_HEADER.size) // _BIN_COLUMN.size:
        raise ValueError(f"{path}: says {ncols} columns, more than its header can hold")
    pos = _BIN_HEADER.size
    columns, types, widths = [], [], []
    for _ in range(ncols):
        if pos + _BIN_COLUMN.size > len(data):
            raise ValueError(f"{path}: the header ends inside column {len(columns)}")
        code, width, n = _BIN_COLUMN.unpack_from(data, pos)
        pos += _BIN_COLUMN.size
        columns.append(data[pos:pos + n].decode("utf-8"))
        pos += n
        if code not in codes:
            raise ValueError(f"{path}: column {columns[-1]!r} has type code {code}")
        types.append(codes[code])
        widths.append(width)
    pos += -pos % 8
    if sum(widths) != cells:
        raise ValueError(f"{path}: the columns' widths add up to {sum(widths)} cells but the "
                         f"header says {cells} per row")
    _check_shape(path, rows, cells, len(data) - pos)
    fmt = "<" + "".join(("q" if t == "int64" else "d") * w for t, w in zip(types, widths))
    out = [list(struct.unpack_from(fmt, data, pos + r * cells * 8)) for r in range(rows)]
    return columns, types, widths, out


def data_env(path: str, fmt: str, rows: int, columns: Sequence[str],
             types: Sequence[str] = ()) -> dict:
    env = {"KOLO_DATA_FILE": os.path.abspath(path), "KOLO_DATA_FORMAT": fmt,
           "KOLO_DATA_ROWS": str(rows), "KOLO_DATA_COLUMNS": ",".join(columns)}
    if types:
        env["KOLO_DATA_TYPES"] = ",".join(types)
    return env
