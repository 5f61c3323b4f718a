"""Train a PyTorch model on a Spark DataFrame: ``TorchEstimator.fit(df)`` returns a ``TorchModel``
(see docs/estimator.md).

    from kolo_spark.torch import TorchEstimator, LocalStore

    est = TorchEstimator(num_proc=4, model=net, optimizer=torch.optim.SGD(net.parameters(), 0.1),
                         loss=torch.nn.MSELoss(), feature_cols=["features"], label_cols=["y"],
                         batch_size=64, epochs=10, validation=0.2, store=LocalStore("/shared/k"))
    model = est.fit(train_df)                # a Spark ML Model
    model.transform(test_df).show()          # adds "prediction"
    model.history["val_loss"]                # per epoch, averaged over the ranks

Absolute imports only: this module is ``kolo_spark.torch``, and ``import torch`` in it means
PyTorch.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import re
import time
import uuid
from datetime import datetime
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.util import (DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader,
                             MLWritable, MLWriter)
from pyspark.sql import functions as F
from pyspark.sql import types as T

import kolo_spark
from kolo_spark import torch_remote as remote
from kolo_spark.driver import ship_package
from kolo_spark.store import FilesystemStore, LocalStore, Store
from kolo_spark.torch_remote import MARK, VAL_COLUMN, Callback

__all__ = ["TorchEstimator", "TorchModel", "Callback", "Store", "LocalStore", "FilesystemStore",
           "EstimatorDataError"]

COMPRESSIONS = ("none", "fp16", "bf16")
# Row groups per rank that fit(df) aims at: enough for an even split, few enough to read fast.
GROUPS_PER_RANK = 4
MAX_GROUP_BYTES = 64 << 20


class EstimatorDataError(ValueError):
    """The DataFrame or Parquet dataset cannot be trained on (raised on the driver, before any
    rank starts): a missing or non-numeric column, nulls, arrays of different lengths, too few
    rows for the ranks."""


def _fail(msg: str):
    raise EstimatorDataError(MARK + msg)


# --- Params ---
def _p(name: str, doc: str, conv=None) -> Param:
    return Param(Params._dummy(), name, doc, typeConverter=conv)


def _to_validation(value):
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        raise TypeError("validation: a fraction in [0, 1) or a column name, not a bool")
    return TypeConverters.toFloat(value)


class _CommonParams(Params):
    feature_cols = _p("feature_cols", "feature columns: one model input each (numeric, Vector "
                      "or numeric array)", TypeConverters.toListString)
    label_cols = _p("label_cols", "label columns (numeric, Vector or numeric array)",
                    TypeConverters.toListString)
    batch_size = _p("batch_size", "rows per batch on each rank", TypeConverters.toInt)
    run_id = _p("run_id", "the run's name in the store (runs/<run_id>); the same run_id resumes "
                "from its last checkpoint", TypeConverters.toString)

    def getFeatureCols(self) -> List[str]:
        return self.getOrDefault(self.feature_cols)

    def getLabelCols(self) -> List[str]:
        return self.getOrDefault(self.label_cols)

    def getBatchSize(self) -> int:
        return self.getOrDefault(self.batch_size)

    def getRunId(self) -> Optional[str]:
        return self.getOrDefault(self.run_id)


class _EstimatorParams(_CommonParams):
    num_proc = _p("num_proc", "number of ranks (Spark barrier tasks)", TypeConverters.toInt)
    model = _p("model", "the torch.nn.Module to train (its initial weights are the start)")
    optimizer = _p("optimizer", "a torch.optim.Optimizer built on model.parameters(), or a "
                   "callable(parameters) -> Optimizer")
    loss = _p("loss", "callable(output, label) -> scalar tensor (mean over the batch)")
    metrics = _p("metrics", "names ('accuracy', 'mse', 'mae') or callables(output, label), or a "
                 "dict name -> either; averaged over rows and ranks per epoch")
    callbacks = _p("callbacks", "kolo_spark.torch.Callback objects, called on every rank")
    epochs = _p("epochs", "number of passes over the training data", TypeConverters.toInt)
    validation = _p("validation", "fraction of rows held out for validation, or the name of a "
                    "boolean/numeric column (true/non-zero: validation row)", _to_validation)
    shuffle = _p("shuffle", "shuffle each rank's rows every epoch", TypeConverters.toBoolean)
    store = _p("store", "a kolo_spark.torch Store (or a path/URL for Store.create)")
    backward_passes_per_step = _p("backward_passes_per_step", "batches whose gradients are "
                                  "accumulated before each optimizer step",
                                  TypeConverters.toInt)
    compression = _p("compression", "gradient compression on the wire: none, fp16 or bf16 (DDP "
                     "comm hooks)", TypeConverters.toString)
    use_gpu = _p("use_gpu", "train on each rank's GPU (Spark task GPU resources)",
                 TypeConverters.toBoolean)
    verbose = _p("verbose", "0: quiet, 1: a line per epoch, 2: a line per batch",
                 TypeConverters.toInt)
    random_seed = _p("random_seed", "seed of the validation split, shuffling and torch's RNG",
                     TypeConverters.toInt)
    backend = _p("backend", "torch.distributed backend: kolo (kolo_torch), gloo or nccl",
                 TypeConverters.toString)
    collective_timeout = _p("collective_timeout", "seconds a collective may wait for the other "
                            "ranks (init_process_group's timeout)", TypeConverters.toFloat)
    output_cols = _p("output_cols", "the TorchModel's output columns (default: prediction)",
                     TypeConverters.toListString)
    num_threads = _p("num_threads", "torch threads per rank (default: spark.task.cpus, the "
                     "cores Spark gives each task)", TypeConverters.toInt)
    run_options = _p("run_options", "extra keyword arguments of kolo_spark.run (timeout, env, "
                     "stream_logs, timeline, ...)")

    def __init__(self):
        super().__init__()
        self._setDefault(num_proc=None, model=None, optimizer=None, loss=None, metrics=None,
                         callbacks=None, feature_cols=None, label_cols=None, batch_size=32,
                         epochs=1, validation=None, shuffle=True, store=None, run_id=None,
                         backward_passes_per_step=1, compression="none", use_gpu=False,
                         verbose=1, random_seed=0, backend="kolo", collective_timeout=600.0,
                         output_cols=None, num_threads=None, run_options=None)


def _getter_setter(cls, name):
    camel = "".join(part.capitalize() for part in name.split("_"))
    param = getattr(cls, name)

    def getter(self):
        return self.getOrDefault(param.name)

    def setter(self, value):
        return self._set(**{param.name: value})

    getter.__doc__ = f"The value of ``{name}``: {param.doc}."
    setter.__doc__ = f"Sets ``{name}``: {param.doc}."
    if not hasattr(cls, "get" + camel):
        setattr(cls, "get" + camel, getter)
    if not hasattr(cls, "set" + camel):
        setattr(cls, "set" + camel, setter)


# --- columns ---
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


# --- datasets in the store ---
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


def _spark_error_message(e: BaseException) -> Optional[str]:
    """Our own message inside a Spark job's exception text (an executor's Python error)."""
    m = re.search(re.escape(MARK) + r"[^\n]*", str(e))
    return m.group(0) if m else None


def _default_run_id() -> str:
    return f"kolo_{datetime.now().strftime('%Y%m%d_%H%M%S')}_{uuid.uuid4().hex[:6]}"


class TorchEstimator(Estimator, _EstimatorParams):
    """A Spark ML Estimator that trains a torch model with DDP on ``num_proc`` kolo ranks
    (Spark barrier tasks started by :func:`kolo_spark.run`).

    ``fit(df)`` checks the DataFrame, writes the feature and label columns once to Parquet in
    the store (``intermediate_train_data``, ``intermediate_val_data``), trains, and returns a
    :class:`TorchModel`. ``fit_on_parquet()`` trains on a dataset already in the store. Every
    Param is a keyword argument of the constructor and has ``getX``/``setX`` accessors
    (``setNumProc``, ``getBatchSize``, ...). ``batch_size`` is per rank, and learning-rate
    scaling with the number of ranks is the user's (as in Horovod)."""

    def __init__(self, *, num_proc=None, model=None, optimizer=None, loss=None, metrics=None,
                 callbacks=None, feature_cols=None, label_cols=None, batch_size=None,
                 epochs=None, validation=None, shuffle=None, store=None, run_id=None,
                 backward_passes_per_step=None, compression=None, use_gpu=None, verbose=None,
                 random_seed=None, backend=None, collective_timeout=None, output_cols=None,
                 num_threads=None, run_options=None):
        super().__init__()
        kwargs = {k: v for k, v in dict(
            num_proc=num_proc, model=model, optimizer=optimizer, loss=loss, metrics=metrics,
            callbacks=callbacks, feature_cols=feature_cols, label_cols=label_cols,
            batch_size=batch_size, epochs=epochs, validation=validation, shuffle=shuffle,
            store=store, run_id=run_id, backward_passes_per_step=backward_passes_per_step,
            compression=compression, use_gpu=use_gpu, verbose=verbose, random_seed=random_seed,
            backend=backend, collective_timeout=collective_timeout, output_cols=output_cols,
            num_threads=num_threads, run_options=run_options).items() if v is not None}
        self._set(**kwargs)
        self.last_run: Dict[str, Any] = {}

    def setParams(self, **kwargs):
        """Sets any Params by name."""
        return self._set(**kwargs)

    # --- checks ---
    def _store(self) -> Store:
        store = self.getOrDefault(self.store)
        if store is None:
            raise ValueError(MARK + "store is not set: pass store=LocalStore('/shared/dir') (a "
                             "directory every executor sees) or a FilesystemStore")
        if isinstance(store, str):
            store = Store.create(store)
            self._set(store=store)
        if not isinstance(store, Store):
            raise TypeError(MARK + f"store must be a kolo_spark.torch Store, not "
                            f"{type(store).__name__}")
        return store

    def _check_params(self) -> None:
        g = self.getOrDefault
        n = g(self.num_proc)
        if not isinstance(n, int) or n < 1:
            raise ValueError(MARK + f"num_proc={n!r}: set it to the number of ranks (>= 1)")
        if not isinstance(g(self.model), torch.nn.Module):
            raise TypeError(MARK + f"model must be a torch.nn.Module, not "
                            f"{type(g(self.model)).__name__}")
        opt = g(self.optimizer)
        if opt is None or not (isinstance(opt, torch.optim.Optimizer) or callable(opt)):
            raise TypeError(MARK + "optimizer: a torch.optim.Optimizer built on "
                            "model.parameters(), or a callable(parameters) -> Optimizer")
        if not callable(g(self.loss)):
            raise TypeError(MARK + "loss: a callable(output, label) -> scalar tensor, e.g. "
                            "torch.nn.MSELoss()")
        if not g(self.feature_cols):
            raise ValueError(MARK + "feature_cols is empty")
        if not g(self.label_cols):
            raise ValueError(MARK + "label_cols is empty")
        for name in ("batch_size", "epochs", "backward_passes_per_step"):
            v = g(getattr(self, name))
            if not isinstance(v, int) or v < 1:
                raise ValueError(MARK + f"{name}={v!r} must be a positive integer")
        if g(self.compression) not in COMPRESSIONS:
            raise ValueError(MARK + f"compression={g(self.compression)!r}: one of "
                             f"{', '.join(COMPRESSIONS)}")
        v = g(self.validation)
        if isinstance(v, float) and not 0.0 <= v < 1.0:
            raise ValueError(MARK + f"validation={v!r}: a fraction in [0, 1) or a column name")
        remote.metric_functions(g(self.metrics))
        for cb in g(self.callbacks) or []:
            if not isinstance(cb, Callback):
                raise TypeError(MARK + f"callbacks: {cb!r} is not a kolo_spark.torch.Callback")
        if g(self.backend) not in ("kolo", "gloo", "nccl"):
            raise ValueError(MARK + f"backend={g(self.backend)!r}: kolo, gloo or nccl")

    # --- fit ---
    def _fit(self, df):
        self._check_params()
        store = self._store()
        run_id = self.getRunId() or _default_run_id()
        columns = _columns_of_schema(df.schema, self.getFeatureCols(), self.getLabelCols())
        done = self._finished_model(store, run_id, columns)
        if done is not None:
            return done
        t0 = time.monotonic()
        train, val = self._prepare(df, store, columns)
        prepare_seconds = time.monotonic() - t0
        return self._train(df.sparkSession, store, run_id, columns, train, val, prepare_seconds)

    def fit_on_parquet(self, train_path: Optional[str] = None, val_path: Optional[str] = None,
                       spark=None) -> "TorchModel":
        """Trains on a Parquet dataset already in the store, without writing anything: by
        default the one the last ``fit(df)`` prepared (``intermediate_train_data`` and, when
        it exists, ``intermediate_val_data``), else ``train_path``/``val_path`` (paths of the
        store's filesystem). Columns: numbers, or lists of numbers of one length."""
        self._check_params()
        store = self._store()
        run_id = self.getRunId() or _default_run_id()
        train_path = train_path or store.get_train_data_path()
        if val_path is None and store.list_files(store.get_val_data_path(), ".parquet"):
            val_path = store.get_val_data_path()
        if not store.list_files(train_path, ".parquet"):
            _fail(f"no Parquet files in {store.url(train_path)}")
        columns = _columns_of_parquet(_parquet_schema(store, train_path), self.getFeatureCols(),
                                      self.getLabelCols(), store.url(train_path))
        _vector_widths(store, train_path, columns)
        if spark is None:
            from pyspark.sql import SparkSession

            spark = SparkSession.getActiveSession()
        done = self._finished_model(store, run_id, columns)
        if done is not None:
            return done
        train = _read_dataset(store, train_path)
        val = _read_dataset(store, val_path) if val_path else None
        if val_path and val is None:
            _fail(f"no Parquet files in {store.url(val_path)}")
        return self._train(spark, store, run_id, columns, train, val, 0.0)

    def _prepare(self, df, store: Store, columns: List[Dict[str, Any]]
                 ) -> Tuple[_Dataset, Optional[_Dataset]]:
        """One Spark job: the feature and label columns, flattened, to Parquet in the store."""
        validation = self.getOrDefault(self.validation)
        exprs = _select_exprs(columns)
        has_val = False
        if isinstance(validation, str):
            if validation not in df.columns:
                _fail(f"validation column '{validation}' is not in the DataFrame")
            vt = df.schema[validation].dataType
            if not isinstance(vt, (T.BooleanType, T.NumericType)):
                _fail(f"validation column '{validation}' has type {vt.simpleString()}: boolean "
                      "or numeric (non-zero: a validation row)")
            exprs.append(F.col(f"`{validation}`").cast("boolean").alias(VAL_COLUMN))
            has_val = True
        elif validation:
            exprs.append((F.rand(self.getOrDefault(self.random_seed)) < float(validation))
                         .alias(VAL_COLUMN))
            has_val = True
        num_proc = self.getOrDefault(self.num_proc)
        selected = df.select(*exprs)
        partitions = max(1, selected.rdd.getNumPartitions())
        groups = max(1, math.ceil(GROUPS_PER_RANK * num_proc / partitions))
        train_dir, val_dir = store.get_train_data_path(), store.get_val_data_path()
        store.delete_dir(train_dir)
        store.delete_dir(val_dir)
        store.makedirs(train_dir)
        if has_val:
            store.makedirs(val_dir)
        plain = [dict(c) for c in columns]
        writer = functools.partial(remote.write_partition, store, train_dir, val_dir, plain,
                                   has_val, groups, MAX_GROUP_BYTES)
        ship_package(df.sparkSession.sparkContext)
        out_schema = "split string, path string, rows array<bigint>, widths string"
        try:
            written = selected.mapInArrow(writer, out_schema).collect()
        except Exception as e:
            msg = _spark_error_message(e)
            if msg is None:
                raise
            raise EstimatorDataError(msg) from None
        widths: Dict[str, Dict[int, str]] = {}
        for row in written:
            for name, w in json.loads(row["widths"]).items():
                if w is not None:
                    widths.setdefault(name, {}).setdefault(w, row["path"])
        for c in columns:
            if c["kind"] == "scalar":
                continue
            seen = widths.get(c["name"], {})
            if len(seen) > 1:
                (w1, p1), (w2, p2) = sorted(seen.items())[:2]
                _fail(f"column '{c['name']}' holds arrays of {w1} values in some partitions and "
                      f"{w2} in others; a feature or label must have one size")
            if seen:
                c["width"] = next(iter(seen))
            c["kind"] = "vector"
        if not written:
            _fail("the DataFrame has no rows")
        train = _Dataset(train_dir, [(r["path"], i, n) for r in written if r["split"] == "train"
                                     for i, n in enumerate(r["rows"])])
        val = _Dataset(val_dir, [(r["path"], i, n) for r in written if r["split"] == "val"
                                 for i, n in enumerate(r["rows"])]) if has_val else None
        if has_val and val.rows == 0:
            _fail(f"validation={validation!r} selected no rows of the DataFrame ({train.rows} "
                  "rows): nothing to validate on")
        return train, val

    def _finished_model(self, store: Store, run_id: str, columns) -> Optional["TorchModel"]:
        """The model of a run whose checkpoint already has every epoch (nothing to train)."""
        ckpt = remote.load_checkpoint(store, run_id)
        if ckpt is None or int(ckpt["epoch"]) < self.getOrDefault(self.epochs):
            return None
        columns = ckpt.get("columns") or columns  # with the widths the data had
        if any(c["kind"] != "scalar" and c["width"] is None for c in columns):
            return None
        self.last_run = {"run_id": run_id, "prepare_seconds": 0.0, "run_seconds": 0.0,
                         "ranks": [], "resumed_from": int(ckpt["epoch"])}
        return self._model_from(ckpt, run_id, columns)

    def _train(self, spark, store: Store, run_id: str, columns, train: _Dataset,
               val: Optional[_Dataset], prepare_seconds: float) -> "TorchModel":
        num_proc = self.getOrDefault(self.num_proc)
        batch_size = self.getBatchSize()
        if train.rows == 0:
            _fail("the training data has no rows")
        train_parts, train_rows = train.assign(num_proc)
        empty = [r for r, n in enumerate(train_rows) if n == 0]
        if empty:
            _fail(f"the training data has {train.rows} rows in {len(train.groups)} row groups "
                  f"for num_proc={num_proc}: rank {empty[0]} would get no rows (ranks without "
                  f"data: {', '.join(map(str, empty))}). Use fewer ranks or more data")
        steps = math.ceil(max(train_rows) / batch_size)
        if min(train_rows) < steps:
            r = train_rows.index(min(train_rows))
            _fail(f"rank {r} would get {train_rows[r]} training rows but every rank takes {steps} "
                  f"steps per epoch (the largest share, {max(train_rows)} rows, in batches of "
                  f"{batch_size}): the row groups are too uneven; rewrite the dataset with more, "
                  "smaller row groups")
        val_parts = val.assign(num_proc)[0] if val is not None else None
        opt = self.getOrDefault(self.optimizer)
        if isinstance(opt, torch.optim.Optimizer):
            opt_spec = ("instance", type(opt), opt.state_dict())
        else:
            opt_spec = ("factory", opt)
        use_gpu = bool(self.getOrDefault(self.use_gpu))
        verbose = self.getOrDefault(self.verbose)
        spec = {
            "store": store, "run_id": run_id, "columns": columns,
            "train_parts": train_parts, "val_parts": val_parts, "train_rows": train.rows,
            "steps_per_epoch": steps, "model": self.getOrDefault(self.model),
            "optimizer": opt_spec, "loss": self.getOrDefault(self.loss),
            "metrics": self.getOrDefault(self.metrics),
            "callbacks": self.getOrDefault(self.callbacks),
            "epochs": self.getOrDefault(self.epochs),
            "batch_size": batch_size, "shuffle": self.getOrDefault(self.shuffle),
            "backward_passes_per_step": self.getOrDefault(self.backward_passes_per_step),
            "compression": self.getOrDefault(self.compression), "use_gpu": use_gpu,
            "verbose": verbose, "seed": self.getOrDefault(self.random_seed),
            "backend": self.getOrDefault(self.backend),
            "collective_timeout": self.getOrDefault(self.collective_timeout),
            "threads": self.getOrDefault(self.num_threads) or _task_cpus(spark),
        }
        options = dict(self.getOrDefault(self.run_options) or {})
        options.setdefault("stream_logs", verbose > 0)
        if use_gpu:
            options.setdefault("use_gpu", True)
        t0 = time.monotonic()
        results = _run_ranks(spark, num_proc, spec, options)
        run_seconds = time.monotonic() - t0
        ckpt = remote.load_checkpoint(store, run_id)
        if ckpt is None:
            raise RuntimeError(MARK + f"the ranks finished but run {run_id} has no checkpoint "
                               f"in {store.url(store.get_checkpoint_path(run_id))}")
        self.last_run = {"run_id": run_id, "prepare_seconds": prepare_seconds,
                         "run_seconds": run_seconds, "train_rows": train.rows,
                         "val_rows": val.rows if val is not None else 0,
                         "rows_per_rank": train_rows, "steps_per_epoch": steps,
                         "resumed_from": results[0]["start_epoch"], "ranks": list(results)}
        return self._model_from(ckpt, run_id, columns)

    def _model_from(self, ckpt: Dict[str, Any], run_id: str, columns) -> "TorchModel":
        module = copy.deepcopy(self.getOrDefault(self.model)).cpu()
        module.load_state_dict(ckpt["model"])
        module.eval()
        labels = self.getLabelCols()
        outputs = self.getOrDefault(self.output_cols) or \
            (["prediction"] if len(labels) == 1 else [f"{c}__output" for c in labels])
        m = TorchModel(model=module, history={k: list(v) for k, v in ckpt["history"].items()},
                       columns=[dict(c) for c in columns], feature_cols=self.getFeatureCols(),
                       label_cols=labels, output_cols=outputs, batch_size=self.getBatchSize(),
                       run_id=run_id)
        m.training_stats = dict(self.last_run)
        return m


def _task_cpus(spark) -> int:
    """spark.task.cpus: the cores Spark gives each task, so each rank's torch threads (more
    threads than cores make torch's thread pool spin against the other ranks)."""
    try:
        return max(1, int(spark.sparkContext.getConf().get("spark.task.cpus", "1")))
    except Exception:  # no session (local mode): one thread
        return 1


def _run_ranks(spark, num_proc: int, spec: Dict[str, Any], options: Dict[str, Any]):
    """The ranks: ``kolo_spark.run`` of :func:`kolo_spark.torch_remote.train`."""
    return kolo_spark.run(spark, num_proc, remote.train, args=(spec,), **options)


for _name in [p for p in dir(_EstimatorParams) if isinstance(getattr(_EstimatorParams, p), Param)]:
    _getter_setter(TorchEstimator, _name)


# --- the model ---
class _ModelParams(_CommonParams):
    output_cols = _p("output_cols", "output columns that transform adds, one per model output",
                     TypeConverters.toListString)

    def __init__(self):
        super().__init__()
        self._setDefault(feature_cols=None, label_cols=None, output_cols=["prediction"],
                         batch_size=256, run_id=None)


class TorchModel(Model, _ModelParams, MLReadable, MLWritable):
    """The trained model as a Spark ML Model: ``transform(df)`` adds ``output_cols`` (a double
    for a one-value output, an array of doubles otherwise) computed by the torch module in a
    pandas UDF, which deserializes the module once per executor Python process.

    ``getModel()`` is the torch module, ``history`` the per-epoch metrics (``loss``,
    ``val_loss``, ...), ``training_stats`` the fit's timings (not saved). ``save(path)`` /
    ``TorchModel.load(path)`` go through Spark ML's persistence (any Hadoop filesystem path);
    the module is stored cloudpickled, so loading needs the same torch and the module's class."""

    def __init__(self, *, model=None, history=None, columns=None, feature_cols=None,
                 label_cols=None, output_cols=None, batch_size=None, run_id=None):
        super().__init__()
        self._model = model
        self.history: Dict[str, List[float]] = history or {}
        self._columns: List[Dict[str, Any]] = columns or []
        self.training_stats: Dict[str, Any] = {}
        kwargs = {k: v for k, v in dict(feature_cols=feature_cols, label_cols=label_cols,
                                        output_cols=output_cols, batch_size=batch_size,
                                        run_id=run_id).items() if v is not None}
        self._set(**kwargs)
        self._blob_key: Optional[Tuple[int, str]] = None

    def getModel(self) -> torch.nn.Module:
        """The trained torch module (on the CPU, in eval mode)."""
        return self._model

    def getOutputCols(self) -> List[str]:
        return self.getOrDefault(self.output_cols)

    def setOutputCols(self, value: List[str]) -> "TorchModel":
        return self._set(output_cols=value)

    def setBatchSize(self, value: int) -> "TorchModel":
        """Rows per forward pass in transform."""
        return self._set(batch_size=value)

    def _feature_columns(self) -> List[Dict[str, Any]]:
        return [c for c in self._columns if c["role"] == "feature"]

    def _output_widths(self) -> List[int]:
        """Each output's values per row, from one forward pass on a row of zeros."""
        xs = [torch.zeros(1, c["width"] or 1) for c in self._feature_columns()]
        with torch.no_grad():
            got = self._model(*xs)
        got = got if isinstance(got, (tuple, list)) else (got,)
        return [int(t[0].numel()) for t in got]

    def _transform(self, df):
        if self._model is None:
            raise ValueError(MARK + "this TorchModel has no torch module")
        feats = self._feature_columns()
        fields = {f.name: f.dataType for f in df.schema.fields}
        kinds = {}
        for c in feats:
            if c["name"] not in fields:
                _fail(f"feature column '{c['name']}' is not in the DataFrame (its columns: "
                      f"{', '.join(fields)})")
            kind, _ = _kind(fields[c["name"]], c["name"], "feature")
            kinds[c["name"]] = kind
            if (kind == "scalar") != (c["kind"] == "scalar"):
                _fail(f"feature column '{c['name']}' is a {kind} here but the model was "
                      f"trained on a {'number' if c['kind'] == 'scalar' else 'vector'}")
        outputs = self.getOutputCols()
        widths = self._output_widths()
        if len(widths) != len(outputs):
            _fail(f"the model returns {len(widths)} outputs but output_cols has {len(outputs)} "
                  f"({', '.join(outputs)})")
        clash = [o for o in outputs if o in fields]
        if clash:
            _fail(f"output column(s) {', '.join(clash)} already in the DataFrame")
        # Arrays as Arrow hands them back (elements nullable): Spark 3.4 compares a pandas_udf's
        # schema exactly and fails the task on containsNull=False.
        schema = T.StructType([T.StructField(o, T.DoubleType() if w == 1 else
                                             T.ArrayType(T.DoubleType(), True))
                               for o, w in zip(outputs, widths)])
        sc = df.sparkSession.sparkContext
        ship_package(sc)
        key = self._broadcast(sc)
        bc = self._bc
        batch_size = self.getBatchSize()
        plain = [dict(c) for c in feats]
        n_out = len(outputs)

        import pandas as pd
        from pyspark.sql.functions import pandas_udf

        def predict(batch):
            from pyspark import TaskContext

            ctx = TaskContext.get()  # torch threads: the task's share of cores (spark.task.cpus)
            model = remote.cached_model(key, lambda: bc.value)
            outs = remote.predict_batch(model, plain, [batch[c["name"]] for c in plain], n_out,
                                        batch_size,
                                        threads=ctx.cpus() if ctx is not None else None)
            return pd.DataFrame({o: (a[:, 0] if w == 1 else list(a))
                                 for o, w, a in zip(outputs, widths, outs)})

        # a scalar pandas UDF of one struct column (a pandas DataFrame per Arrow batch)
        predict.__annotations__ = {"batch": pd.DataFrame, "return": pd.DataFrame}
        udf = pandas_udf(predict, schema)
        tmp = f"__kolo_out_{uuid.uuid4().hex[:8]}"
        # the UDF's input: Vectors to float arrays in the JVM, numbers to float
        inputs = _select_exprs([{"name": c["name"], "kind": kinds[c["name"]], "dtype": "float32"}
                                for c in feats])
        return df.withColumn(tmp, udf(F.struct(*inputs))).select(
            *[F.col(f"`{c}`") for c in df.columns], *[F.col(tmp)[o].alias(o) for o in outputs])

    def _broadcast(self, sc) -> str:
        """The cloudpickled module as a broadcast variable, made once per SparkContext; its key
        names the module in the executors' cache."""
        from pyspark import cloudpickle

        if self._blob_key is None or self._blob_key[0] != id(sc):
            key = f"{self.uid}-{uuid.uuid4().hex[:8]}"
            self._bc = sc.broadcast(cloudpickle.dumps(self._model))
            self._blob_key = (id(sc), key)
        return self._blob_key[1]

    def copy(self, extra=None) -> "TorchModel":
        that = super().copy(extra)
        that._model = self._model
        that.history = dict(self.history)
        that._columns = [dict(c) for c in self._columns]
        that.training_stats = dict(self.training_stats)
        that._blob_key = None
        return that

    def write(self) -> MLWriter:
        return _TorchModelWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        return _TorchModelReader(cls)


_CHUNK = 16 << 20


class _TorchModelWriter(MLWriter):
    """Spark ML persistence: ``<path>/metadata`` (Params, history, columns, torch version, as
    Spark's DefaultParamsWriter writes them) and ``<path>/model`` (the cloudpickled module, a
    pickle file of 16 MiB chunks)."""

    def __init__(self, instance: TorchModel):
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        from pyspark import cloudpickle

        m = self.instance
        DefaultParamsWriter.saveMetadata(m, path, self.sc, extraMetadata={
            "history": m.history, "columns": m._columns, "torch_version": torch.__version__})
        blob = cloudpickle.dumps(m.getModel())
        chunks = [blob[i:i + _CHUNK] for i in range(0, len(blob), _CHUNK)] or [b""]
        self.sc.parallelize(list(enumerate(chunks)), 1).saveAsPickleFile(f"{path}/model")


class _TorchModelReader(MLReader):
    def __init__(self, cls):
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> TorchModel:
        from pyspark import cloudpickle

        metadata = DefaultParamsReader.loadMetadata(path, self.sc)
        chunks = sorted(self.sc.pickleFile(f"{path}/model").collect())
        module = cloudpickle.loads(b"".join(c for _, c in chunks))
        module.eval()
        m = self.cls(model=module, history=metadata.get("history") or {},
                     columns=metadata.get("columns") or [])
        DefaultParamsReader.getAndSetParams(m, metadata)
        m._resetUid(metadata["uid"])
        return m
