"""The executor side of :mod:`kolo_spark.torch`: writing a partition to Parquet, reading a rank's
row groups, the training loop every rank runs, and the model cache of ``TorchModel.transform``.

Nothing here imports pyspark at module level: a rank is a fresh interpreter that needs torch,
numpy and pyarrow only.
"""

from __future__ import annotations

import io
import json
import math
import os
import time
from contextlib import nullcontext
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

# The marker of every error this module raises for bad data: the driver finds it in Spark's
# wrapped exception text and raises the line as it is.
MARK = "kolo_spark.torch: "
VAL_COLUMN = "__kolo_val"


class Callback:
    """Hooks the training loop calls on every rank (subclass it and override what you need).

    ``logs`` holds the epoch's metrics, already averaged over the ranks (``loss``, ``val_loss``,
    each metric and ``val_`` metric, ``train_time``, ``val_time``, ``rows_per_second``) and
    ``epoch``, the epoch's number counted from 1 (as in the log line ``epoch 2/4``), while the
    ``epoch`` argument of ``on_epoch_begin``/``on_epoch_end`` is 0-based. Raising an exception
    stops the fit: ``fit`` raises it on the driver (``kolo_spark.RankFunctionError``); the
    checkpoint of every completed epoch is in the store, and a fit with the same ``run_id``
    resumes there."""

    def on_train_begin(self, logs: Dict[str, Any]) -> None:
        """Before the first epoch of this fit; ``logs``: ``start_epoch`` (epochs the checkpoint
        had finished already: the 0-based index of this fit's first epoch), ``epochs``,
        ``rank``, ``size``."""

    def on_epoch_begin(self, epoch: int) -> None:
        """Before epoch ``epoch`` (0-based)."""

    def on_epoch_end(self, epoch: int, logs: Dict[str, Any]) -> None:
        """After epoch ``epoch`` (0-based) is validated and its checkpoint is written."""

    def on_train_end(self, logs: Dict[str, Any]) -> None:
        """After the last epoch; ``logs`` is the whole history."""


# --- columns ---
def column_arrow_type(col: Dict[str, Any]):
    import pyarrow as pa

    item = pa.int64() if col["dtype"] == "int64" else pa.float32()
    return item if col["kind"] == "scalar" else pa.list_(item, col["width"])


def numpy_column(chunked, col: Dict[str, Any], where: str):
    """A Parquet/Arrow column as a numpy array: scalars 1-D, vectors 2-D (rows x width), in the
    column's dtype. Nulls and ragged arrays are errors naming the column."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    name = col["name"]
    arr = chunked.combine_chunks() if isinstance(chunked, pa.ChunkedArray) else chunked
    if arr.null_count:
        raise ValueError(f"{MARK}column '{name}' has {arr.null_count} null values ({where}); drop "
                         "or fill them first (df.na.drop(), df.na.fill())")
    if col["kind"] == "scalar":
        return _writable(arr.to_numpy(zero_copy_only=False).astype(col["dtype"], copy=False))
    width = col["width"]
    if pa.types.is_fixed_size_list(arr.type):
        got = arr.type.list_size
        values = arr.flatten()
    else:
        lengths = pc.list_value_length(arr)
        lo, hi = pc.min(lengths).as_py(), pc.max(lengths).as_py()
        if lo != hi:
            raise ValueError(f"{MARK}column '{name}' holds arrays of different lengths ({lo} to "
                             f"{hi}, {where}); a feature or label must have one size")
        got = lo if lo is not None else width
        values = arr.flatten()
    if width is not None and got != width:
        raise ValueError(f"{MARK}column '{name}' holds arrays of {got} values ({where}) but "
                         f"{width} elsewhere; a feature or label must have one size")
    if values.null_count:
        raise ValueError(f"{MARK}column '{name}' has null elements inside its arrays ({where})")
    out = values.to_numpy(zero_copy_only=False).astype(col["dtype"], copy=False)
    return _writable(out.reshape(len(arr), got))


def _writable(a):
    """torch.from_numpy wants a writable array (Arrow's buffers are read-only)."""
    return a if a.flags.writeable else a.copy()


# --- writing (a Spark task of fit(df), in mapInArrow) ---
def write_partition(store, train_dir: str, val_dir: str, columns: List[Dict[str, Any]],
                    has_val: bool, groups: int, max_group_bytes: int, batches):
    """Writes one DataFrame partition's rows to ``<train_dir>/part-<p>.parquet`` (and the
    validation rows to ``<val_dir>``), in ``groups`` row groups of equal size (smaller ones when
    a group would hold more than ``max_group_bytes`` of values). Yields one record per file:
    split, path, row group sizes, the array widths found."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark import TaskContext

    part = TaskContext.get().partitionId()
    batches = [b for b in batches if b.num_rows]
    if not batches:
        return
    table = pa.Table.from_batches(batches)
    where = f"DataFrame partition {part}"
    arrays, fields = [], []
    for col in columns:
        data = numpy_column(table.column(col["name"]), dict(col, width=None), where)
        fixed = dict(col, width=data.shape[1] if data.ndim == 2 else None)
        t = column_arrow_type(fixed)
        if data.ndim == 2:
            arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(data.reshape(-1)),
                                                            data.shape[1]))
        else:
            arrays.append(pa.array(data, type=t))
        fields.append(pa.field(col["name"], t, nullable=False))
    out = pa.Table.from_arrays(arrays, schema=pa.schema(fields))
    widths = {c["name"]: (arrays[i].type.list_size if c["kind"] != "scalar" else None)
              for i, c in enumerate(columns)}
    row_bytes = sum(8 if w is None else 4 * w for w in widths.values()) or 1
    max_group_rows = max(1, max_group_bytes // row_bytes)
    if has_val:
        mask = table.column(VAL_COLUMN).combine_chunks()
        if mask.null_count:
            raise ValueError(f"{MARK}the validation column has {mask.null_count} null values "
                             f"({where})")
        import pyarrow.compute as pc
        splits = (("train", train_dir, out.filter(pc.invert(mask))), ("val", val_dir,
                                                                       out.filter(mask)))
    else:
        splits = (("train", train_dir, out),)
    for split, directory, tbl in splits:
        n = tbl.num_rows
        if n == 0:
            continue
        per_group = max(1, min(max_group_rows, math.ceil(n / max(1, groups))))
        path = f"{directory}/part-{part:05d}.parquet"
        with store.open_output_stream(path) as sink:
            pq.write_table(tbl, sink, row_group_size=per_group)
        sizes = [min(per_group, n - i) for i in range(0, n, per_group)]
        yield pa.RecordBatch.from_pydict({"split": [split], "path": [path], "rows": [sizes],
                                          "widths": [json.dumps(widths)]})


# --- reading (a rank) ---
def read_rows(store, parts: Sequence[Tuple[str, Sequence[int]]], columns: List[Dict[str, Any]]
              ) -> Dict[str, Any]:
    """Reads the given row groups of the given files (only those) and returns one numpy array
    per column, rows in file and row-group order."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = [c["name"] for c in columns]
    tables = []
    for path, groups in parts:
        if not groups:
            continue
        with store.open_input_file(path) as f:
            tables.append(pq.ParquetFile(f).read_row_groups(list(groups), columns=names))
    out = {}
    for col in columns:
        if not tables:
            shape = (0,) if col["kind"] == "scalar" else (0, col["width"])
            out[col["name"]] = np.zeros(shape, dtype=col["dtype"])
            continue
        chunks = pa.chunked_array([c for t in tables for c in t.column(col["name"]).chunks],
                                  type=tables[0].schema.field(col["name"]).type)
        out[col["name"]] = numpy_column(chunks, col, f"{len(parts)} files of the store")
    return out


# --- metrics ---
def _accuracy(output, label):
    import torch

    if output.dim() > 1 and output.shape[-1] > 1:
        pred = output.argmax(dim=-1)
        return (pred == label.reshape(pred.shape)).float().mean()
    return (torch.round(output.reshape(-1)) == label.reshape(-1).to(output.dtype)).float().mean()


def _mse(output, label):
    return ((output - label.reshape(output.shape).to(output.dtype)) ** 2).mean()


def _mae(output, label):
    return (output - label.reshape(output.shape).to(output.dtype)).abs().mean()


BUILTIN_METRICS: Dict[str, Callable] = {"accuracy": _accuracy, "mse": _mse, "mae": _mae}


def metric_functions(metrics) -> List[Tuple[str, Callable]]:
    """[(name, fn)] from a list of names/callables or a dict name -> name/callable."""
    if not metrics:
        return []
    items = metrics.items() if isinstance(metrics, dict) else \
        [(m if isinstance(m, str) else getattr(m, "__name__", f"metric{i}"), m)
         for i, m in enumerate(metrics)]
    out = []
    for name, m in items:
        fn = BUILTIN_METRICS.get(m) if isinstance(m, str) else m
        if fn is None or not callable(fn):
            raise ValueError(f"{MARK}metric {name!r}: a callable(output, label) or one of "
                             f"{', '.join(sorted(BUILTIN_METRICS))}")
        out.append((str(name), fn))
    return out


# --- checkpoints ---
def load_checkpoint(store, run_id: str, step: bool = False) -> Optional[Dict[str, Any]]:
    """The run's last epoch checkpoint (``step``: the one written inside an epoch by
    ``checkpoint_every_steps``), or None."""
    import torch

    path = store.get_step_checkpoint_file(run_id) if step else store.get_checkpoint_file(run_id)
    if not store.exists(path):
        return None
    return torch.load(io.BytesIO(store.read_bytes(path)), map_location="cpu", weights_only=True)


def _tensorize(arrays: Dict[str, Any], columns: List[Dict[str, Any]]):
    import torch

    out = []
    for col in columns:
        t = torch.from_numpy(arrays[col["name"]])
        if col["kind"] == "scalar" and not (col["role"] == "label" and col["dtype"] == "int64"):
            t = t.reshape(-1, 1)  # [B, 1]: a float label matches a [B, 1] output
        out.append(t)
    return out


def _pick(tensors, idx, device):
    return [t[idx].to(device, non_blocking=True) for t in tensors]


def _label_arg(labels):
    return labels[0] if len(labels) == 1 else labels


def _log(msg: str) -> None:
    print(msg, flush=True)


def _step_checkpoint(store, run_id, spec, model, optimizer, history, epoch, batch, sums, rank,
                     size, torch, dist) -> None:
    """Every rank: the checkpoint after ``batch`` batches of epoch ``epoch`` (0-based): rank 0
    writes the model, the optimizer and every rank's RNG state and partial sums of the epoch
    (gathered here), then every rank waits for it."""
    states = [None] * size
    dist.all_gather_object(states, (torch.get_rng_state(), sums.clone()))
    if rank == 0:
        buf = io.BytesIO()
        torch.save({"epoch": epoch, "batch": batch, "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(), "history": history,
                    "rng": [s[0] for s in states], "sums": [s[1] for s in states],
                    "num_proc": size, "seed": spec["seed"]}, buf)
        store.write_bytes(store.get_step_checkpoint_file(run_id), buf.getvalue())
    dist.barrier()


# --- training (every rank) ---
def train(spec: Dict[str, Any]) -> Dict[str, Any]:
    """One rank of a fit: DDP over ``spec['backend']``, the rank's row groups, per-epoch
    validation, metrics averaged over the ranks, rank 0 checkpoints every epoch."""
    t_start = time.time()
    import numpy as np
    import torch
    import torch.distributed as dist
    from datetime import timedelta
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = int(os.environ["RANK"])
    size = int(os.environ["WORLD_SIZE"])
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("KOLO_LOCAL_SIZE", "1")))
    threads = spec.get("threads") or max(1, (os.cpu_count() or 1) // max(1, local_size))
    os.environ["OMP_NUM_THREADS"] = str(threads)  # for anything the rank starts
    torch.set_num_threads(threads)
    store, run_id = spec["store"], spec["run_id"]
    verbose = spec["verbose"]

    if spec["backend"] == "kolo":
        import kolo_torch  # noqa: F401  (registers the "kolo" backend)
    dist.init_process_group(spec["backend"], timeout=timedelta(seconds=spec["collective_timeout"]))
    try:
        return _train(spec, rank, size, threads, store, run_id, verbose, t_start, np, torch,
                      dist, DDP)
    finally:
        dist.destroy_process_group()


def _train(spec, rank, size, threads, store, run_id, verbose, t_start, np, torch, dist, DDP):
    use_gpu = spec["use_gpu"]
    device = torch.device("cuda", 0) if use_gpu else torch.device("cpu")
    if use_gpu:
        torch.cuda.set_device(0)
    features = [c for c in spec["columns"] if c["role"] == "feature"]
    labels = [c for c in spec["columns"] if c["role"] == "label"]

    t0 = time.time()
    train_np = read_rows(store, spec["train_parts"][rank], spec["columns"])
    val_np = read_rows(store, spec["val_parts"][rank], spec["columns"]) \
        if spec["val_parts"] else None
    read_seconds = time.time() - t0
    x_train, y_train = _tensorize(train_np, features), _tensorize(train_np, labels)
    n_train = len(x_train[0])
    if val_np is not None:
        x_val, y_val = _tensorize(val_np, features), _tensorize(val_np, labels)
        n_val = len(x_val[0])
    else:
        n_val = 0

    model = spec["model"].to(device)
    opt_spec = spec["optimizer"]
    if opt_spec[0] == "factory":
        optimizer = opt_spec[1](model.parameters())
    else:  # ("instance", class, state_dict): rebuilt on this rank's parameters
        optimizer = opt_spec[1](model.parameters(), lr=1.0)
        optimizer.load_state_dict(opt_spec[2])
    loss_fn = spec["loss"]
    metrics = metric_functions(spec["metrics"])
    callbacks = list(spec["callbacks"] or [])

    start_epoch, history = 0, {}
    ckpt = load_checkpoint(store, run_id)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        start_epoch, history = int(ckpt["epoch"]), dict(ckpt["history"])
        if rank == 0 and verbose:
            _log(f"kolo_spark.torch: run {run_id}: resuming after epoch {start_epoch} from "
                 f"{store.url(store.get_checkpoint_file(run_id))}")
    # A checkpoint inside the epoch after that one (checkpoint_every_steps): the model and
    # optimizer after its batch, and every rank's RNG state and partial sums of the epoch, so
    # that the rest of the epoch is what the uninterrupted run computed.
    every = int(spec.get("checkpoint_every_steps") or 0)
    mid = load_checkpoint(store, run_id, step=True) if every > 0 else None
    if mid is not None and (int(mid["epoch"]) != start_epoch or int(mid["num_proc"]) != size):
        mid = None  # stale: an epoch checkpoint came after it, or another world size
    start_batch = 0
    if mid is not None:
        model.load_state_dict(mid["model"])
        optimizer.load_state_dict(mid["optimizer"])
        start_batch = int(mid["batch"])
        if rank == 0 and verbose:
            _log(f"kolo_spark.torch: run {run_id}: resuming epoch {start_epoch + 1} after batch "
                 f"{start_batch} from {store.url(store.get_step_checkpoint_file(run_id))}")

    ddp = DDP(model, device_ids=[0] if use_gpu else None)
    if spec["compression"] != "none":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        hook = {"fp16": default_hooks.fp16_compress_hook,
                "bf16": default_hooks.bf16_compress_hook}[spec["compression"]]
        ddp.register_comm_hook(state=None, hook=hook)

    epochs, batch_size, k = spec["epochs"], spec["batch_size"], spec["backward_passes_per_step"]
    steps = spec["steps_per_epoch"]
    seed = spec["seed"]
    train_rows_total = spec["train_rows"]
    for cb in callbacks:
        cb.on_train_begin({"start_epoch": start_epoch, "epochs": epochs, "rank": rank,
                           "size": size})
    setup_seconds = time.time() - t_start
    epoch_stats = []
    for epoch in range(start_epoch, epochs):
        for cb in callbacks:
            cb.on_epoch_begin(epoch)
        t_epoch = time.time()
        # Every source of randomness is a function of (seed, epoch, rank): a resumed run draws
        # what the uninterrupted one drew.
        torch.manual_seed(seed * 1_000_003 + epoch * 1009 + rank)
        if spec["shuffle"]:
            order = np.random.default_rng([seed, epoch, rank]).permutation(n_train)
        else:
            order = np.arange(n_train)
        batches = np.array_split(order, steps)
        model.train()
        sums = torch.zeros(2 + len(metrics), dtype=torch.float64)
        first = 0
        if mid is not None and epoch == start_epoch:
            torch.set_rng_state(mid["rng"][rank])
            sums = mid["sums"][rank].clone()
            first = start_batch
        optimizer.zero_grad(set_to_none=True)
        for i, idx in enumerate(batches):
            if i < first:
                continue
            group_start = (i // k) * k
            in_group = min(k, steps - group_start)  # the last group of an epoch may be short
            step_now = i - group_start == in_group - 1
            idx_t = torch.from_numpy(idx)
            xb, yb = _pick(x_train, idx_t, device), _label_arg(_pick(y_train, idx_t, device))
            with nullcontext() if step_now else ddp.no_sync():
                out = ddp(*xb)
                loss = loss_fn(out, yb)
                (loss / in_group if in_group > 1 else loss).backward()
            if step_now:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            with torch.no_grad():
                n = len(idx)
                sums[0] += loss.detach().double().cpu() * n
                sums[1] += n
                for j, (_, fn) in enumerate(metrics):
                    sums[2 + j] += float(fn(out.detach(), yb)) * n
            if verbose >= 2 and rank == 0:
                _log(f"epoch {epoch + 1} step {i + 1}/{steps} loss {loss.item():.6g}")
            if every > 0 and step_now and (i // k + 1) % every == 0 and i + 1 < steps:
                _step_checkpoint(store, run_id, spec, model, optimizer, history, epoch, i + 1,
                                 sums, rank, size, torch, dist)
        train_seconds = time.time() - t_epoch

        t_val = time.time()
        vsums = torch.zeros(2 + len(metrics), dtype=torch.float64)
        if val_np is not None:
            model.eval()
            with torch.no_grad():
                for lo in range(0, n_val, batch_size):
                    idx_t = torch.arange(lo, min(n_val, lo + batch_size))
                    xb = _pick(x_val, idx_t, device)
                    yb = _label_arg(_pick(y_val, idx_t, device))
                    out = model(*xb)
                    n = len(idx_t)
                    vsums[0] += float(loss_fn(out, yb)) * n
                    vsums[1] += n
                    for j, (_, fn) in enumerate(metrics):
                        vsums[2 + j] += float(fn(out, yb)) * n
        val_seconds = time.time() - t_val
        # The epoch's metrics: row-weighted sums over every rank (one kolo allreduce), and the
        # slowest rank's times.
        both = torch.cat([sums, vsums]).to(device)
        dist.all_reduce(both)
        times = torch.tensor([train_seconds, val_seconds], dtype=torch.float64).to(device)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        both, times = both.cpu(), times.cpu()
        sums, vsums = both[:len(sums)], both[len(sums):]
        logs = {"epoch": epoch + 1, "loss": float(sums[0] / sums[1])}
        for j, (name, _) in enumerate(metrics):
            logs[name] = float(sums[2 + j] / sums[1])
        if val_np is not None and vsums[1] > 0:
            logs["val_loss"] = float(vsums[0] / vsums[1])
            for j, (name, _) in enumerate(metrics):
                logs["val_" + name] = float(vsums[2 + j] / vsums[1])
        logs["train_time"] = float(times[0])
        logs["val_time"] = float(times[1])
        logs["rows_per_second"] = train_rows_total / float(times[0]) if times[0] > 0 else 0.0
        for key, value in logs.items():
            history.setdefault(key, []).append(value)

        t_ckpt = time.time()
        if rank == 0:
            buf = io.BytesIO()
            torch.save({"epoch": epoch + 1, "model": model.state_dict(),
                        "optimizer": optimizer.state_dict(), "history": history,
                        "columns": spec["columns"], "num_proc": size, "seed": seed}, buf)
            store.write_bytes(store.get_checkpoint_file(run_id), buf.getvalue())
            store.write_bytes(f"{store.get_logs_path(run_id)}/history.json",
                              json.dumps({"run_id": run_id, "history": history},
                                         indent=1).encode())
        # Every rank waits for the checkpoint: a callback that stops the fit after this point
        # leaves epoch `epoch` saved.
        dist.barrier()
        checkpoint_seconds = time.time() - t_ckpt
        epoch_stats.append({"epoch": epoch + 1, "train_seconds": train_seconds,
                            "val_seconds": val_seconds, "checkpoint_seconds": checkpoint_seconds})
        if verbose and rank == 0:
            shown = ", ".join(f"{k2} {v:.4g}" for k2, v in logs.items()
                              if k2 not in ("epoch", "rows_per_second"))
            _log(f"kolo_spark.torch: epoch {epoch + 1}/{epochs}: {shown}")
        for cb in callbacks:
            cb.on_epoch_end(epoch, dict(logs))
    for cb in callbacks:
        cb.on_train_end(dict(history))
    if use_gpu:
        torch.cuda.synchronize()
    return {"rank": rank, "train_rows": n_train, "val_rows": n_val, "start_epoch": start_epoch,
            "start_batch": start_batch,
            "threads": threads, "read_seconds": read_seconds, "setup_seconds": setup_seconds,
            "epochs": epoch_stats, "steps_per_epoch": steps}


# --- inference (TorchModel.transform, in a pandas UDF) ---
_MODELS: Dict[str, Any] = {}
LOADS = {"count": 0}  # how many models this process has deserialized


def cached_model(key: str, blob_source: Callable[[], bytes]):
    """The model of ``key`` in this process: deserialized once (``blob_source()`` called once),
    then reused by every later batch and task of the same Python worker."""
    model = _MODELS.get(key)
    if model is None:
        from pyspark import cloudpickle

        model = cloudpickle.loads(blob_source())
        model.eval()
        while len(_MODELS) >= 4:  # a few models at a time (a pipeline may hold several)
            _MODELS.pop(next(iter(_MODELS)))
        _MODELS[key] = model
        LOADS["count"] += 1
    return model


def predict_batch(model, columns: List[Dict[str, Any]], series: Sequence, n_outputs: int,
                  batch_size: int, threads: Optional[int] = None):
    """The model's outputs for one Arrow batch of a pandas UDF: a list of numpy arrays, one per
    output (rows first)."""
    import numpy as np
    import torch

    if threads:
        torch.set_num_threads(threads)
    inputs = []
    for col, s in zip(columns, series):
        if col["kind"] == "scalar":
            a = s.to_numpy(dtype=np.float32).reshape(-1, 1)
        else:
            a = np.stack(s.to_numpy()).astype(np.float32, copy=False) if len(s) else \
                np.zeros((0, col["width"]), np.float32)
            if a.ndim != 2 or a.shape[1] != col["width"]:
                raise ValueError(f"{MARK}column '{col['name']}' holds arrays of "
                                 f"{a.shape[1] if a.ndim == 2 else '?'} values; the model was "
                                 f"trained on {col['width']}")
        inputs.append(torch.from_numpy(a))
    n = len(inputs[0]) if inputs else 0
    outs: List[List[Any]] = [[] for _ in range(n_outputs)]
    with torch.no_grad():
        for lo in range(0, n, batch_size):
            got = model(*[t[lo:lo + batch_size] for t in inputs])
            got = got if isinstance(got, (tuple, list)) else (got,)
            if len(got) != n_outputs:
                raise ValueError(f"{MARK}the model returned {len(got)} outputs for "
                                 f"{n_outputs} output columns")
            for j, t in enumerate(got):
                outs[j].append(t.detach().cpu().double().numpy().reshape(len(t), -1))
    return [np.concatenate(o) if o else np.zeros((0, 1)) for o in outs]

