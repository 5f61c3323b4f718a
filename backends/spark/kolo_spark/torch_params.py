"""kolo_spark.torch's Params: the estimator's and the model's Spark ML Params (names, docs,
type converters, defaults) and their generated ``getX``/``setX`` accessors."""

from __future__ import annotations

from typing import List, Optional

from pyspark.ml.param import Param, Params, TypeConverters

COMPRESSIONS = ("none", "fp16", "bf16")


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
                     "stream_logs, timeline, max_attempts, ...)")
    checkpoint_every_steps = _p("checkpoint_every_steps", "also checkpoint every this many "
                                "optimizer steps inside an epoch, for a retried attempt to "
                                "resume from (0: at the end of each epoch only)",
                                TypeConverters.toInt)

    def __init__(self):
        super().__init__()
        self._setDefault(num_proc=None, model=None, optimizer=None, loss=None, metrics=None,
                         callbacks=None, feature_cols=None, label_cols=None, batch_size=32,
                         epochs=1, validation=None, shuffle=True, store=None, run_id=None,
                         backward_passes_per_step=1, compression="none", use_gpu=False,
                         verbose=1, random_seed=0, backend="kolo", collective_timeout=600.0,
                         output_cols=None, num_threads=None, run_options=None,
                         checkpoint_every_steps=0)


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


class _ModelParams(_CommonParams):
    output_cols = _p("output_cols", "output columns that transform adds, one per model output",
                     TypeConverters.toListString)

    def __init__(self):
        super().__init__()
        self._setDefault(feature_cols=None, label_cols=None, output_cols=["prediction"],
                         batch_size=256, run_id=None)
