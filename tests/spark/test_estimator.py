"""kolo_spark.torch: TorchEstimator / TorchModel against real pyspark (local[4]) and real torch,
training with DDP over the kolo backend (kolo_torch must be installed: CTest runs this module as
spark/kolo_torch after torch/install).

Problems made here: regression y = Xw + b + N(0, 0.1^2) (documented: validation MSE <= 0.015,
weights within 0.05 of w) and two spirals (documented: validation accuracy >= 0.95), each at 1, 2
and 4 ranks with the same global batch of 64 rows (batch_size = 64 / num_proc: learning-rate and
batch scaling are the user's, as in Horovod). One SparkSession for the module; fits are cached
so that a test reusing a configuration does not train it twice.
"""

import json
import math
import os
import sys

# A missing dependency fails the module (never a skip).
import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import torch

import kolo_spark
import kolo_spark.torch as kt
from conftest import spark_session
from kolo_spark import torch_remote
from kolo_spark.torch import (Callback, EstimatorDataError, FilesystemStore, LocalStore, Store,
                              TorchEstimator, TorchModel)

pytestmark = pytest.mark.estimator

# Classes and functions of this module travel to the ranks by value: the executors cannot
# import a test module.
from pyspark import cloudpickle as _spark_cloudpickle  # noqa: E402

_spark_cloudpickle.register_pickle_by_value(sys.modules[__name__])

W_TRUE = np.array([1.0, -2.0, 0.5, 3.0])
B_TRUE = 0.25
ROWS = 2000
GLOBAL_BATCH = 64


@pytest.fixture(scope="module")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable  # the workers (and ranks) use this venv
    session = spark_session("local[4]", "kolo_spark-estimator")
    yield session
    session.stop()


def regression_rows(n=ROWS, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4))
    y = x @ W_TRUE + B_TRUE + rng.normal(0, 0.1, n)
    return x, y


def spiral_rows(n=ROWS, seed=0):
    """Two interleaved spirals (one turn each), labels 0 and 1."""
    rng = np.random.default_rng(seed)
    t = rng.uniform(0.25, 1.0, n)
    cls = rng.integers(0, 2, n)
    angle = t * 2 * np.pi + cls * np.pi
    xy = np.stack([t * np.cos(angle), t * np.sin(angle)], 1)
    xy += rng.normal(0, 0.05, (n, 2)) * t[:, None]
    return xy, cls


@pytest.fixture(scope="module")
def regression_df(spark):
    from pyspark.ml.linalg import Vectors

    x, y = regression_rows()
    return spark.createDataFrame([(Vectors.dense(a), float(b)) for a, b in zip(x, y)],
                                 ["features", "y"]).repartition(4).cache()


@pytest.fixture(scope="module")
def spiral_df(spark):
    xy, cls = spiral_rows()
    return spark.createDataFrame([([float(v) for v in a], int(c)) for a, c in zip(xy, cls)],
                                 "xy array<double>, label int").repartition(3).cache()


def regression_estimator(n, store, run_id, **kw):
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 1)
    opts = dict(num_proc=n, model=net,
                optimizer=torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9),
                loss=torch.nn.MSELoss(), metrics=["mae"], feature_cols=["features"],
                label_cols=["y"], batch_size=GLOBAL_BATCH // n, epochs=6, validation=0.2,
                store=store, run_id=run_id, verbose=0, random_seed=3,
                run_options={"env": {"KOLO_TIMEOUT_SECONDS": "120"}})
    opts.update(kw)
    return TorchEstimator(**opts)


def spiral_net():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(2, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32),
                               torch.nn.Tanh(), torch.nn.Linear(32, 2))


def spiral_estimator(n, store, run_id, **kw):
    net = spiral_net()
    opts = dict(num_proc=n, model=net,
                optimizer=lambda params: torch.optim.Adam(params, lr=0.02),
                loss=torch.nn.CrossEntropyLoss(), metrics=["accuracy"], feature_cols=["xy"],
                label_cols=["label"], batch_size=GLOBAL_BATCH // n, epochs=8, validation=0.2,
                store=store, run_id=run_id, verbose=0, random_seed=5,
                run_options={"env": {"KOLO_TIMEOUT_SECONDS": "120"}})
    opts.update(kw)
    return TorchEstimator(**opts)


_FITS = {}


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    return tmp_path_factory.mktemp("stores")


@pytest.fixture(scope="module")
def fitted(spark, regression_df, spiral_df, stores):
    """fitted(problem, n) -> (estimator, model, store): one fit per configuration per module."""

    def get(problem, n):
        key = (problem, n)
        if key not in _FITS:
            store = LocalStore(str(stores / f"{problem}{n}"))
            make, df = (regression_estimator, regression_df) if problem == "regression" else \
                (spiral_estimator, spiral_df)
            est = make(n, store, f"{problem}{n}")
            _FITS[key] = (est, est.fit(df), store)
        return _FITS[key]

    yield get
    _FITS.clear()


def read_store_rows(store, path, columns):
    """Every row of a prepared dataset in the store, on the driver (for reference values)."""
    files = store.list_files(path, ".parquet")
    tables = []
    for f in files:
        with store.open_input_file(f) as fh:
            tables.append(pq.ParquetFile(fh).read(columns=columns))
    return pa.concat_tables(tables)


def assert_history(model, epochs, metric):
    h = model.history
    assert h["epoch"] == list(range(1, epochs + 1))
    for key in ("loss", metric, "val_loss", "val_" + metric, "train_time", "rows_per_second"):
        assert len(h[key]) == epochs, key
        assert all(math.isfinite(v) for v in h[key]), (key, h[key])


def assert_transform_matches_module(spark, model, df, column, width):
    """transform's outputs equal the torch module's own outputs on the same rows."""
    rows = model.transform(df).select(column, "prediction").collect()
    if width is None:  # a Vector column
        x = np.array([r[column].toArray() for r in rows], dtype=np.float32)
    else:
        x = np.array([r[column] for r in rows], dtype=np.float32)
    got = np.array([r["prediction"] for r in rows], dtype=np.float64)
    with torch.no_grad():
        want = model.getModel()(torch.from_numpy(x)).double().numpy()
    want = want.reshape(got.shape)
    assert got.shape[0] == df.count()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    return got


@pytest.mark.parametrize("n", [1, 2, 4])
def test_regression_reaches_noise_level(spark, fitted, regression_df, n):
    est, model, store = fitted("regression", n)
    assert isinstance(model, TorchModel)
    assert_history(model, 6, "mae")
    # documented: validation MSE <= 0.015 (the noise's variance is 0.01), weights within 0.05
    assert model.history["val_loss"][-1] <= 0.015, model.history["val_loss"]
    assert model.history["val_loss"][-1] < model.history["val_loss"][0] / 5
    w = model.getModel().weight.detach().numpy().ravel()
    b = model.getModel().bias.item()
    np.testing.assert_allclose(w, W_TRUE, atol=0.05)
    assert abs(b - B_TRUE) <= 0.05
    run = est.last_run
    assert len(run["ranks"]) == n and run["resumed_from"] == 0
    assert sum(r["train_rows"] for r in run["ranks"]) == run["train_rows"]
    assert run["train_rows"] + run["val_rows"] == ROWS
    assert max(run["rows_per_rank"]) - min(run["rows_per_rank"]) <= max(
        1, run["train_rows"] // (4 * n))  # whole row groups: at most one group apart
    # the epoch's validation loss is the mean over every validation row of every rank: the
    # final model on all of the store's validation rows gives the same number
    val = read_store_rows(store, store.get_val_data_path(), ["features", "y"])
    x = np.array(val.column("features").to_pylist(), dtype=np.float32)
    y = np.array(val.column("y").to_pylist(), dtype=np.float32)
    with torch.no_grad():
        pred = model.getModel()(torch.from_numpy(x)).numpy().ravel()
    assert len(y) == run["val_rows"]
    assert float(np.mean((pred - y) ** 2)) == pytest.approx(model.history["val_loss"][-1],
                                                            rel=1e-4)
    # the store's layout
    assert store.exists(store.get_checkpoint_file(f"regression{n}"))
    logged = json.loads(store.read_bytes(f"{store.get_logs_path(f'regression{n}')}/history.json"))
    assert logged["history"]["val_loss"] == model.history["val_loss"]
    assert_transform_matches_module(spark, model, regression_df, "features", None)


# One and two ranks are covered by the regression; the classifier runs on four (each fit is a
# Spark job that starts its own ranks, and this module is one of CI's longest).
@pytest.mark.parametrize("n", [4])
def test_spirals_reach_accuracy(spark, fitted, spiral_df, n):
    est, model, store = fitted("spirals", n)
    assert_history(model, 8, "accuracy")
    # documented: validation accuracy >= 0.95
    assert model.history["val_accuracy"][-1] >= 0.95, model.history["val_accuracy"]
    assert model.history["val_loss"][-1] < model.history["val_loss"][0]
    out = assert_transform_matches_module(spark, model, spiral_df, "xy", 2)
    assert out.shape == (ROWS, 2)  # two logits per row: an array column
    labels = np.array([r["label"] for r in spiral_df.select("label").collect()])
    assert (out.argmax(1) == labels).mean() >= 0.95


class StopAfter(Callback):
    """Stops the fit once epoch ``epoch`` (0-based) is done and checkpointed."""

    def __init__(self, epoch):
        self.epoch = epoch
        self.seen = []

    def on_epoch_end(self, epoch, logs):
        self.seen.append(epoch)
        if epoch == self.epoch:
            raise RuntimeError(f"stopping after epoch {epoch + 1}")


def test_resume_after_a_failing_callback_ends_with_the_same_weights(spark, fitted,
                                                                      regression_df, stores):
    _, reference, _ = fitted("regression", 2)  # uninterrupted: 6 epochs
    store = LocalStore(str(stores / "resume"))
    est = regression_estimator(2, store, "resumed", callbacks=[StopAfter(2)])
    with pytest.raises(kolo_spark.RankFunctionError) as caught:
        est.fit(regression_df)
    assert caught.value.exc_type == "RuntimeError"
    assert caught.value.exc_message == "stopping after epoch 3"
    ckpt = torch_remote.load_checkpoint(store, "resumed")
    assert ckpt["epoch"] == 3 and ckpt["history"]["epoch"] == [1, 2, 3]
    # the same run_id, without the failing callback: epochs 4..6 from checkpoint 3
    est2 = regression_estimator(2, store, "resumed")
    model = est2.fit(regression_df)
    assert est2.last_run["resumed_from"] == 3
    assert all(r["start_epoch"] == 3 for r in est2.last_run["ranks"])
    assert [len(r["epochs"]) for r in est2.last_run["ranks"]] == [3, 3]
    assert model.history["epoch"] == [1, 2, 3, 4, 5, 6]
    for got, want in zip(model.getModel().state_dict().values(),
                         reference.getModel().state_dict().values()):
        assert torch.equal(got, want), (got, want)
    assert model.history["val_loss"] == reference.history["val_loss"]
    # a third fit of a finished run trains nothing and returns the same model
    est3 = regression_estimator(2, store, "resumed")
    again = est3.fit(regression_df)
    assert est3.last_run["ranks"] == [] and est3.last_run["resumed_from"] == 6
    assert torch.equal(again.getModel().weight, model.getModel().weight)


class DyingLoss(torch.nn.MSELoss):
    """MSE; rank 1's process dies in its ``calls``-th training forward of the first attempt."""

    def __init__(self, calls):
        super().__init__()
        self.calls, self.seen = calls, 0

    def forward(self, out, y):
        import os

        from kolo_spark import elastic
        if torch.is_grad_enabled():
            self.seen += 1
            if self.seen == self.calls and elastic.attempt() == 0 and \
                    os.environ["KOLO_RANK"] == "1":
                os._exit(9)
        return super().forward(out, y)


def test_max_attempts_resumes_a_lost_rank_from_the_step_checkpoint(spark, fitted,
                                                                     regression_df, stores):
    _, reference, _ = fitted("regression", 2)  # uninterrupted: 6 epochs of 25 steps
    store = LocalStore(str(stores / "retried"))
    # rank 1 dies in batch 7 of epoch 3; a checkpoint every 4 steps has batches 1-4 of it
    est = regression_estimator(2, store, "retried", loss=DyingLoss(2 * 25 + 7),
                               checkpoint_every_steps=4,
                               run_options={"env": {"KOLO_TIMEOUT_SECONDS": "120"},
                                            "max_attempts": 2})
    model = est.fit(regression_df)
    assert est.last_run["steps_per_epoch"] == 25
    assert est.last_run["attempts"] == [(0, "RankFailedError"), (1, None)]
    assert est.last_run["resumed_from"] == 2 and est.last_run["resumed_from_batch"] == 4
    assert model.history["epoch"] == [1, 2, 3, 4, 5, 6]
    # the same run as an uninterrupted fit, bit for bit: weights, and every epoch's metrics
    # (the resumed epoch's training loss includes the batches before the loss)
    for got, want in zip(model.getModel().state_dict().values(),
                         reference.getModel().state_dict().values()):
        assert torch.equal(got, want), (got, want)
    for key in ("loss", "mae", "val_loss", "val_mae"):
        assert model.history[key] == reference.history[key], key


def test_fit_on_parquet_reuses_the_prepared_data(spark, fitted):
    _, model, store = fitted("regression", 1)
    files = store.list_files(store.get_train_data_path(), ".parquet") + \
        store.list_files(store.get_val_data_path(), ".parquet")
    before = {f: store.filesystem.get_file_info(f).mtime_ns for f in files}
    est = regression_estimator(1, store, "on_parquet", epochs=4)
    got = est.fit_on_parquet()
    after = {f: store.filesystem.get_file_info(f).mtime_ns for f in store.list_files(
        store.get_train_data_path(), ".parquet") + store.list_files(store.get_val_data_path(),
                                                                    ".parquet")}
    assert after == before  # nothing rewritten
    assert est.last_run["prepare_seconds"] == 0.0
    assert est.last_run["train_rows"] == fitted("regression", 1)[0].last_run["train_rows"]
    assert got.history["val_loss"][-1] <= 0.015
    np.testing.assert_allclose(got.getModel().weight.detach().numpy().ravel(), W_TRUE, atol=0.05)


class TwoInputs(torch.nn.Module):
    """A model of two scalar feature columns (each input is [batch, 1])."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)

    def forward(self, a, b):
        return self.linear(torch.cat([a, b], dim=1))


def test_fit_on_parquet_of_a_users_dataset_in_a_pyarrow_filesystem_store(spark, tmp_path):
    # A store on a pyarrow.fs filesystem that is not the local one by URL: a SubTreeFileSystem
    # (the same FileSystem interface as HadoopFileSystem and S3FileSystem, which cannot be
    # reached from here), addressed as hdfs://namenode/...
    root = tmp_path / "fs"
    root.mkdir()
    fs = pafs.SubTreeFileSystem(str(root), pafs.LocalFileSystem())
    store = FilesystemStore("hdfs://namenode:8020/user/kolo", filesystem=fs)
    assert store.prefix == "/user/kolo"
    assert store.url(store.get_train_data_path()) == \
        "hdfs://namenode:8020/user/kolo/intermediate_train_data"
    rng = np.random.default_rng(4)
    for d, n in (("train", 1024), ("val", 256)):  # a user's dataset: float64 columns
        a, b = rng.normal(size=n), rng.normal(size=n)
        y = 2.0 * a - 1.0 * b + 0.5 + rng.normal(0, 0.05, n)
        table = pa.table({"a": a, "b": b, "y": y, "unused": ["x"] * n})
        fs.create_dir(f"/user/kolo/mine/{d}")
        with fs.open_output_stream(f"/user/kolo/mine/{d}/part-0.parquet") as f:
            pq.write_table(table, f, row_group_size=128)
    assert (root / "user/kolo/mine/train/part-0.parquet").exists()

    def fit(run_id, **kw):
        torch.manual_seed(0)
        net = TwoInputs()
        opts = dict(num_proc=2, model=net,
                    optimizer=torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.5),
                    loss=torch.nn.MSELoss(), feature_cols=["a", "b"], label_cols=["y"],
                    batch_size=64, epochs=5, store=store, run_id=run_id, verbose=0,
                    run_options={"env": {"KOLO_TIMEOUT_SECONDS": "120"}})
        opts.update(kw)
        est = TorchEstimator(**opts)
        model = est.fit_on_parquet(train_path="/user/kolo/mine/train",
                                   val_path="/user/kolo/mine/val")
        return est, model

    est, model = fit("mine")
    assert est.last_run["rows_per_rank"] == [512, 512]  # 8 row groups of 128 rows
    assert est.last_run["steps_per_epoch"] == 8
    assert model.history["val_loss"][-1] <= 0.005, model.history["val_loss"]
    weights = model.getModel().linear.weight.detach().numpy().ravel()
    np.testing.assert_allclose(weights, [2.0, -1.0], atol=0.05)
    assert (root / "user/kolo/runs/mine/checkpoint/checkpoint.pt").exists()
    assert (root / "user/kolo/runs/mine/logs/history.json").exists()
    # transform with scalar feature columns
    df = spark.createDataFrame([(0.5, -1.0), (1.0, 2.0)], ["a", "b"])
    got = [r["prediction"] for r in model.transform(df).collect()]
    with torch.no_grad():
        want = model.getModel()(torch.tensor([[0.5], [1.0]]), torch.tensor([[-1.0], [2.0]]))
    np.testing.assert_allclose(got, want.numpy().ravel(), rtol=1e-6)

    # backward_passes_per_step=2 with half the batch: each step averages the gradients of two
    # halves of the same 64 rows, so the weights are those of the run above (up to rounding)
    est2, halves = fit("halves", batch_size=32, backward_passes_per_step=2)
    assert est2.last_run["steps_per_epoch"] == 16
    for got, want in zip(halves.getModel().parameters(), model.getModel().parameters()):
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-5,
                                   atol=1e-6)
    # fp16 gradients on the wire (DDP's fp16_compress_hook over kolo): the same fit to within
    # half precision, but not bit-equal
    _, fp16 = fit("fp16", compression="fp16")
    diff = max(float((a - b).detach().abs().max()) for a, b in zip(fp16.getModel().parameters(),
                                                           model.getModel().parameters()))
    assert 0 < diff < 1e-2, diff
    assert fp16.history["val_loss"][-1] <= 0.005


@pytest.fixture
def no_ranks(monkeypatch):
    """Fails the test if a fit gets as far as starting ranks."""

    def refuse(*args, **kwargs):
        raise AssertionError("ranks were started")

    import kolo_spark.torch_estimator  # where TorchEstimator calls it

    monkeypatch.setattr(kolo_spark.torch_estimator, "_run_ranks", refuse)


def test_bad_dataframes_fail_before_any_rank_starts(spark, regression_df, tmp_path, no_ranks):
    store = LocalStore(str(tmp_path / "bad"))

    def fit(df, **kw):
        with pytest.raises(EstimatorDataError) as caught:
            regression_estimator(kw.pop("n", 2), store, "bad", **kw).fit(df)
        return str(caught.value)

    msg = fit(regression_df.withColumnRenamed("y", "target"))
    assert msg.startswith("kolo_spark.torch: label column 'y' is not in the DataFrame")
    assert "features, target" in msg
    words = spark.createDataFrame([("a", 1.0), ("b", 2.0)], ["features", "y"])
    msg = fit(words)
    assert "feature column 'features' has type string, which is not numeric" in msg
    assert "StringIndexer" in msg
    # an empty partition: 3 rows over 4 partitions, for 4 ranks
    three = regression_df.limit(3).repartition(4)
    assert sorted(len(p) for p in three.rdd.glom().collect()) == [0, 1, 1, 1]
    msg = fit(three, n=4, validation=None)
    assert "the training data has 3 rows in 3 row groups for num_proc=4: rank 3 would get no " \
        "rows" in msg
    msg = fit(regression_df.limit(0), validation=None)
    assert msg == "kolo_spark.torch: the DataFrame has no rows"
    nulls = spark.createDataFrame([([1.0, 2.0, 3.0, 4.0], 1.0), ([1.0, 2.0, 3.0, 4.0], None)],
                                  "features array<double>, y double")
    msg = fit(nulls, validation=None)
    assert msg.startswith("kolo_spark.torch: column 'y' has 1 null values")
    ragged = spark.createDataFrame([([1.0, 2.0, 3.0, 4.0], 1.0), ([1.0, 2.0], 2.0)],
                                   "features array<double>, y double").coalesce(1)
    msg = fit(ragged, validation=None)
    assert msg.startswith("kolo_spark.torch: column 'features' holds arrays of different "
                          "lengths (2 to 4")
    msg = fit(regression_df, validation="missing")
    assert msg == "kolo_spark.torch: validation column 'missing' is not in the DataFrame"
    with pytest.raises(ValueError, match="compression='zip'"):
        regression_estimator(2, store, "bad", compression="zip").fit(regression_df)
    assert not store.exists(store.get_run_path("bad"))


def test_model_save_load_round_trip(spark, fitted, spiral_df, tmp_path):
    _, model, _ = fitted("spirals", 4)
    path = str(tmp_path / "spiral_model")
    model.setOutputCols(["logits"])
    try:
        model.save(path)
        loaded = TorchModel.load(path)
    finally:
        model.setOutputCols(["prediction"])
    assert isinstance(loaded, TorchModel) and loaded.uid == model.uid
    # The class path in Spark ML's metadata is the public one, as before the estimator was
    # split into modules: models saved by either layout load with the other.
    meta = json.loads(spark.sparkContext.textFile(f"{path}/metadata").first())
    assert meta["class"] == "kolo_spark.torch.TorchModel"
    assert loaded.getOutputCols() == ["logits"]
    assert loaded.getFeatureCols() == ["xy"] and loaded.getLabelCols() == ["label"]
    assert loaded.history == model.history
    assert loaded.getRunId() == "spirals4"
    for got, want in zip(loaded.getModel().state_dict().values(),
                         model.getModel().state_dict().values()):
        assert torch.equal(got, want)
    rows = spiral_df.limit(200).collect()  # a small DataFrame of one partition
    small = spark.createDataFrame(rows, spiral_df.schema).coalesce(1)
    a = [r["prediction"] for r in model.transform(small).collect()]
    b = [r["logits"] for r in loaded.transform(small).collect()]
    assert len(a) == 200 and a == b
    # inside a Spark ML pipeline too
    from pyspark.ml import PipelineModel

    pipeline = PipelineModel(stages=[loaded])
    pipeline.write().overwrite().save(str(tmp_path / "pipeline"))
    again = PipelineModel.load(str(tmp_path / "pipeline"))
    assert [r["logits"] for r in again.transform(small).collect()] == b


# --- pieces without Spark jobs ---
def test_row_groups_are_balanced_over_ranks():
    groups = [("f0", i, 100) for i in range(7)] + [("f1", 0, 30), ("f1", 1, 20)]
    parts, rows = kt._Dataset("d", groups).assign(3)
    # the largest groups first, each to the rank with the fewest rows so far
    assert rows == [300, 230, 220]
    assert parts[1] == [("f0", [1, 4]), ("f1", [0])]
    seen = sorted((f, i) for p in parts for f, ids in p for i in ids)
    assert seen == sorted((f, i) for f, i, _ in groups)  # every group once


def test_stores_layout_and_files(tmp_path):
    local = LocalStore(str(tmp_path / "local"))
    assert local.get_train_data_path() == str(tmp_path / "local/intermediate_train_data")
    assert local.get_val_data_path("2") == str(tmp_path / "local/intermediate_val_data.2")
    assert local.get_checkpoint_path("r1") == str(tmp_path / "local/runs/r1/checkpoint")
    assert local.get_logs_path("r1") == str(tmp_path / "local/runs/r1/logs")
    local.write_bytes(local.get_checkpoint_file("r1"), b"abc")
    assert local.read_bytes(local.get_checkpoint_file("r1")) == b"abc"
    assert os.listdir(tmp_path / "local/runs/r1/checkpoint") == ["checkpoint.pt"]  # no tmp left
    url = FilesystemStore(f"file://{tmp_path}/byurl")
    assert isinstance(url.filesystem, pafs.LocalFileSystem)
    assert url.prefix == f"{tmp_path}/byurl" and url.is_dir(url.prefix)
    assert isinstance(Store.create(str(tmp_path / "x")), LocalStore)
    assert isinstance(Store.create(f"file://{tmp_path}/y"), LocalStore)
    s3 = FilesystemStore("s3://bucket/some/prefix",
                         filesystem=pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem()))
    assert s3.prefix == "bucket/some/prefix"
    assert s3.url(s3.get_logs_path("r")) == "s3://bucket/some/prefix/runs/r/logs"
    assert (tmp_path / "bucket/some/prefix").is_dir()
    with pytest.raises(ValueError, match="not a local path"):
        LocalStore("s3://bucket/x")


def test_transform_model_is_loaded_once_per_process():
    import pickle

    from pyspark import cloudpickle

    blob = cloudpickle.dumps(torch.nn.Linear(2, 1))
    calls = []

    def source():
        calls.append(1)
        return blob

    before = torch_remote.LOADS["count"]
    a = torch_remote.cached_model("k1", source)
    b = torch_remote.cached_model("k1", source)
    assert a is b and len(calls) == 1 and torch_remote.LOADS["count"] == before + 1
    assert not a.training
    c = torch_remote.cached_model("k2", lambda: pickle.dumps(torch.nn.Linear(3, 1)))
    assert c is not a and c.in_features == 3
