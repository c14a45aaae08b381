"""MLflow: the script's active run (or the one it ended while profiled), and logging into it.

Numbers are metrics, texts are tags, the JSON report an artifact under ``loadprof/``.
A script run under ``loadprof diagnose`` usually ends its run (``with
mlflow.start_run():``) before the profile ends; ``mlflow.last_active_run()`` gives it
back, taken only when it ended after the profile began, so that an older run of the
same process (a notebook's earlier cell) is never written to. Logging to an ended run
through the client is what MLflow allows.
"""

from __future__ import annotations

import sys
import time
from typing import Any

label = "MLflow"

#: MLflow refuses longer tag values (5,000 characters before 2.x's 8,000)
TAG_LIMIT = 5000


def active(since: float) -> list[Any]:
    mlflow = sys.modules.get("mlflow")
    if mlflow is None:
        return []
    run = mlflow.active_run()
    fluent = sys.modules.get("mlflow.tracking.fluent")
    # None: this process never ran one, and asking would open (create) the default store
    ran = getattr(fluent, "_last_active_run_id", True) is not None
    if run is None and ran and hasattr(mlflow, "last_active_run"):
        last = mlflow.last_active_run()
        if last is not None and (last.info.end_time or 0) / 1000.0 >= since:
            run = last
    return [run] if run is not None else []


def start(arg: str | None) -> Any:
    import mlflow

    if arg:
        mlflow.set_experiment(arg)
    return mlflow.start_run(run_name="loadprof")


def finish(run: Any) -> None:
    import mlflow

    mlflow.end_run()


def log(run: Any, numbers: dict[str, float], texts: dict[str, str], artifact: str, markdown: str,
        step: int) -> str:
    from mlflow.entities import Metric, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    run_id = run.info.run_id
    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric(k, v, now, step) for k, v in numbers.items()],
                     tags=[RunTag(k, v[:TAG_LIMIT]) for k, v in texts.items()])
    client.log_artifact(run_id, artifact, artifact_path="loadprof")
    return f"MLflow run {run_id}"
