"""kolo_spark.torch's estimator: ``TorchEstimator.fit(df)`` (and ``fit_on_parquet``) — its
checks, the one Spark job that writes the training data to the store, the ranks' run through
:func:`kolo_spark.run` and the :class:`~kolo_spark.torch_model.TorchModel` it returns."""

from __future__ import annotations

import copy
import functools
import json
import math
import re
import time
import uuid
from datetime import datetime
from typing import Any, Dict, List, Optional, Tuple

import torch
from pyspark.ml import Estimator
from pyspark.ml.param import Param
from pyspark.sql import functions as F
from pyspark.sql import types as T

import kolo_spark
from kolo_spark import torch_remote as remote
from kolo_spark.spark_job import ship_package
from kolo_spark.store import Store
from kolo_spark.torch_dataset import (GROUPS_PER_RANK, MAX_GROUP_BYTES, _Dataset, _parquet_schema,
                                      _read_dataset, _vector_widths)
from kolo_spark.torch_model import TorchModel
from kolo_spark.torch_params import COMPRESSIONS, _EstimatorParams, _getter_setter
from kolo_spark.torch_remote import MARK, VAL_COLUMN, Callback
from kolo_spark.torch_schema import (EstimatorDataError, _columns_of_parquet, _columns_of_schema,
                                     _fail, _select_exprs)


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
                 num_threads=None, run_options=None, checkpoint_every_steps=None):
        super().__init__()
        kwargs = {k: v for k, v in dict(
            num_proc=num_proc, model=model, optimizer=optimizer, loss=loss, metrics=metrics,
            callbacks=callbacks, feature_cols=feature_cols, label_cols=label_cols,
            batch_size=batch_size, epochs=epochs, validation=validation, shuffle=shuffle,
            store=store, run_id=run_id, backward_passes_per_step=backward_passes_per_step,
            compression=compression, use_gpu=use_gpu, verbose=verbose, random_seed=random_seed,
            backend=backend, collective_timeout=collective_timeout, output_cols=output_cols,
            num_threads=num_threads, run_options=run_options,
            checkpoint_every_steps=checkpoint_every_steps).items() if v is not None}
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
            "checkpoint_every_steps": int(self.getOrDefault(self.checkpoint_every_steps) or 0),
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
                         "resumed_from": results[0]["start_epoch"],
                         "resumed_from_batch": results[0].get("start_batch", 0),
                         "ranks": list(results),
                         # run_options={"max_attempts": N}: each attempt (a retried one resumes
                         # from the last epoch's checkpoint)
                         "attempts": [(a.number, a.error_type) for a in results.attempts]}
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

TorchEstimator.__module__ = "kolo_spark.torch"  # the public path (pickles, Spark ML metadata)
