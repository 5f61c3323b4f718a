"""kolo_spark.torch's schema: which DataFrame or Parquet columns a model can train on, as
column specs (name, role, kind, dtype, width), the Spark expressions that flatten them, and the
EstimatorDataError that names a column that cannot be used."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

from pyspark.sql import functions as F
from pyspark.sql import types as T

from kolo_spark.torch_remote import MARK


class EstimatorDataError(ValueError):
    """The DataFrame or Parquet dataset cannot be trained on (raised on the driver, before any
    rank starts): a missing or non-numeric column, nulls, arrays of different lengths, too few
    rows for the ranks."""


def _fail(msg: str):
    raise EstimatorDataError(MARK + msg)


def _kind(dtype, name: str, role: str) -> Tuple[str, str]:
    """(kind, dtype) of a DataFrame column, or an EstimatorDataError naming it."""
    from pyspark.ml.linalg import VectorUDT

    numeric = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType,
               T.DecimalType, T.BooleanType)
    integral = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.BooleanType)
    if isinstance(dtype, numeric):
        return "scalar", ("int64" if role == "label" and isinstance(dtype, integral)
                          else "float32")
    if isinstance(dtype, VectorUDT):
        return "vector", "float32"
    if isinstance(dtype, T.ArrayType) and isinstance(dtype.elementType, numeric):
        return "array", "float32"
    hint = (" (index strings first, e.g. pyspark.ml.feature.StringIndexer)"
            if isinstance(dtype, T.StringType) else "")
    _fail(f"{role} column '{name}' has type {dtype.simpleString()}, which is not numeric, a "
          f"Vector or an array of numbers{hint}")


def _columns_of_schema(schema, feature_cols: Sequence[str], label_cols: Sequence[str]
                       ) -> List[Dict[str, Any]]:
    fields = {f.name: f.dataType for f in schema.fields}
    cols = []
    for role, names in (("feature", feature_cols), ("label", label_cols)):
        for name in names:
            if name not in fields:
                _fail(f"{role} column '{name}' is not in the DataFrame (its columns: "
                      f"{', '.join(fields) or 'none'})")
            kind, dtype = _kind(fields[name], name, role)
            cols.append({"name": name, "role": role, "kind": kind, "dtype": dtype,
                         "width": None})
    names = [c["name"] for c in cols]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        _fail(f"column(s) {', '.join(dup)} given twice in feature_cols/label_cols")
    return cols


def _select_exprs(columns: List[Dict[str, Any]]):
    from pyspark.ml.functions import vector_to_array

    out = []
    for c in columns:
        col = F.col(f"`{c['name']}`")
        if c["kind"] == "vector":
            e = vector_to_array(col, "float32")
        elif c["kind"] == "array":
            e = col.cast(T.ArrayType(T.FloatType()))
        elif c["dtype"] == "int64":
            e = col.cast(T.LongType())
        else:
            e = col.cast(T.FloatType())
        out.append(e.alias(c["name"]))
    return out


def _columns_of_parquet(schema, feature_cols, label_cols, where: str) -> List[Dict[str, Any]]:
    """Column specs from a Parquet dataset's Arrow schema (fit_on_parquet)."""
    import pyarrow as pa

    cols = []
    for role, names in (("feature", feature_cols), ("label", label_cols)):
        for name in names:
            idx = schema.get_field_index(name)
            if idx < 0:
                _fail(f"{role} column '{name}' is not in the Parquet dataset {where} (its "
                      f"columns: {', '.join(schema.names)})")
            t = schema.field(idx).type
            if pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_floating(t) or \
                    pa.types.is_decimal(t):
                dtype = "int64" if role == "label" and not (pa.types.is_floating(t) or
                                                            pa.types.is_decimal(t)) else "float32"
                cols.append({"name": name, "role": role, "kind": "scalar", "dtype": dtype,
                             "width": None})
            elif (pa.types.is_list(t) or pa.types.is_large_list(t) or
                  pa.types.is_fixed_size_list(t)) and (pa.types.is_integer(t.value_type) or
                                                       pa.types.is_floating(t.value_type)):
                width = t.list_size if pa.types.is_fixed_size_list(t) else None
                cols.append({"name": name, "role": role, "kind": "vector", "dtype": "float32",
                             "width": width})
            else:
                _fail(f"{role} column '{name}' of {where} has type {t}, which is not a number "
                      "or a list of numbers")
    return cols


EstimatorDataError.__module__ = "kolo_spark.torch"  # its public path, as in tracebacks
