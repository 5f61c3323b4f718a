"""kolo_spark: run native kolo ranks as Spark barrier tasks (see docs/spark.md).

    import kolo_spark
    result = kolo_spark.run(spark, 4, "/opt/app/train", ["--epochs", "3"])
    print(result.exit_codes, result.output)
"""

from .driver import RankResult, RunResult, check_conf, local_master_slots, run, task_slots
from .errors import (ConfigurationError, KoloSparkError, RankFailedError, SetupError,
                     StartTimeoutError)
from .topology import RankTopology, TaskInfo, compute_topology, peers_string, rendezvous

__version__ = "0.1.0"

__all__ = [
    "run", "RunResult", "RankResult", "KoloSparkError", "ConfigurationError", "RankFailedError",
    "SetupError", "StartTimeoutError", "TaskInfo", "RankTopology", "compute_topology",
    "peers_string", "rendezvous", "check_conf", "local_master_slots", "task_slots",
]
