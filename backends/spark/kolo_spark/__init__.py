"""kolo_spark: run kolo ranks as Spark barrier tasks — native programs or Python functions
(see docs/spark.md).

    import kolo_spark
    result = kolo_spark.run(spark, 4, "/opt/app/train", ["--epochs", "3"])
    print(result.exit_codes, result.output)

    def train(lr):
        import torch.distributed as dist
        dist.init_process_group("gloo")        # MASTER_ADDR, RANK, ... are set
        ...
        return dist.get_rank()
    print(kolo_spark.run(spark, 4, train, args=(0.1,)))   # [0, 1, 2, 3]
"""

import importlib

__version__ = "0.2.0"

# Attributes load on first use (PEP 562): a rank's supervisor and a function rank's interpreter
# import this package too, and should not pay for the driver's modules.
_WHERE = {
    "run": "api", "RunResult": "results", "RankResult": "results", "FunctionResults": "results",
    "Attempt": "results",
    "check_conf": "preflight", "local_master_slots": "preflight", "task_slots": "preflight",
    "KoloSparkError": "errors", "ConfigurationError": "errors", "RankFailedError": "errors",
    "RankFunctionError": "errors", "ResultTooLargeError": "errors", "SetupError": "errors",
    "StartTimeoutError": "errors",
    "get_available_devices": "rank", "rank_context": "rank", "RankContext": "rank",
    "Runner": "runners", "Distributor": "runners",
    "TaskInfo": "topology", "RankTopology": "topology", "compute_topology": "topology",
    "peers_string": "topology", "rendezvous": "topology",
}

__all__ = sorted(_WHERE) + ["timeline", "data", "elastic"]


def __getattr__(name):
    if name in ("timeline", "data", "elastic"):
        return importlib.import_module(f".{name}", __name__)
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'kolo_spark' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
