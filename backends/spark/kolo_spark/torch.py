"""Train a PyTorch model on a Spark DataFrame: ``TorchEstimator.fit(df)`` returns a ``TorchModel``
(see docs/estimator.md).

    from kolo_spark.torch import TorchEstimator, LocalStore

    est = TorchEstimator(num_proc=4, model=net, optimizer=torch.optim.SGD(net.parameters(), 0.1),
                         loss=torch.nn.MSELoss(), feature_cols=["features"], label_cols=["y"],
                         batch_size=64, epochs=10, validation=0.2, store=LocalStore("/shared/k"))
    model = est.fit(train_df)                # a Spark ML Model
    model.transform(test_df).show()          # adds "prediction"
    model.history["val_loss"]                # per epoch, averaged over the ranks

This module is the public face; each job has a module of its own: the Params
(:mod:`~kolo_spark.torch_params`), which columns can be trained on
(:mod:`~kolo_spark.torch_schema`), the store's Parquet datasets and their assignment to ranks
(:mod:`~kolo_spark.torch_dataset`), the estimator (:mod:`~kolo_spark.torch_estimator`), the
model and its persistence (:mod:`~kolo_spark.torch_model`); the ranks' side is
:mod:`~kolo_spark.torch_remote`. ``TorchEstimator`` and ``TorchModel`` keep ``kolo_spark.torch``
as their class path (Spark ML's saved metadata names it).

Absolute imports only: this module is ``kolo_spark.torch``, and ``import torch`` in it means
PyTorch.
"""

from kolo_spark.store import FilesystemStore, LocalStore, Store
from kolo_spark.torch_dataset import GROUPS_PER_RANK, MAX_GROUP_BYTES, _Dataset  # noqa: F401
from kolo_spark.torch_estimator import TorchEstimator, _run_ranks  # noqa: F401
from kolo_spark.torch_model import TorchModel
from kolo_spark.torch_params import COMPRESSIONS  # noqa: F401
from kolo_spark.torch_remote import Callback
from kolo_spark.torch_schema import EstimatorDataError

__all__ = ["TorchEstimator", "TorchModel", "Callback", "Store", "LocalStore", "FilesystemStore",
           "EstimatorDataError"]
