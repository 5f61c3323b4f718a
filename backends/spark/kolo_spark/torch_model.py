"""kolo_spark.torch's model: ``TorchModel``, the trained module as a Spark ML Model
(``transform`` through a pandas UDF) and its Spark ML persistence (save/load).

Its ``__module__`` stays ``kolo_spark.torch``: Spark ML's metadata records the class path, so
models saved before and after the split into modules name the same class."""

from __future__ import annotations

import uuid
from typing import Any, Dict, List, Optional, Tuple

import torch
from pyspark.ml import Model
from pyspark.ml.util import (DefaultParamsReader, DefaultParamsWriter, MLReadable, MLReader,
                             MLWritable, MLWriter)
from pyspark.sql import functions as F
from pyspark.sql import types as T

from kolo_spark import torch_remote as remote
from kolo_spark.spark_job import ship_package
from kolo_spark.torch_params import _ModelParams
from kolo_spark.torch_remote import MARK
from kolo_spark.torch_schema import _fail, _kind, _select_exprs


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


TorchModel.__module__ = "kolo_spark.torch"  # the class path Spark ML's metadata records
