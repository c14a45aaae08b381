"""MLflow: the script's run, and logging into it.

Numbers are metrics, texts are tags, the JSON report an artifact under ``loadprof/``.
The script's run is, first, MLflow's active run. A script run under ``loadprof
diagnose`` usually ends its run (``with mlflow.start_run():``) before the profile ends;
``mlflow.last_active_run()`` gives it back, taken only when it ended after the profile
began, so that an older run of the same process (a notebook's earlier cell) is never
written to. Failing both, the newest run the script created through an ``MlflowClient``
while profiled: Lightning's ``MLFlowLogger`` makes its run so, never as the active run,
in the store of its own ``tracking_uri``; ``watch()`` notes each such run with the
client that made it, and the summary goes through that client, to that store.
Logging to an ended run through the client is what MLflow allows.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from .watch import MethodWatch

label = "MLflow"

#: MLflow refuses longer tag values (5,000 characters before 2.x's 8,000)
TAG_LIMIT = 5000
#: where ``MlflowClient`` lives: watched once the script imports it
MODULE = "mlflow.tracking.client"


@dataclass
class Target:
    """A run to log into, and the client of its store (None: MLflow's default, the fluent API's)."""

    run_id: str
    client: Any = None


#: (unix time, run id, client) of the runs made through a client while a watch was on
_created: collections.deque[tuple[float, str, Any]] = collections.deque(maxlen=32)
_created_lock = threading.Lock()


def _noted(client: Any, run: Any) -> None:
    run_id = getattr(getattr(run, "info", None), "run_id", None)
    if isinstance(run_id, str):
        with _created_lock:
            _created.append((time.time(), run_id, client))


def watch() -> MethodWatch:
    """Notes every run ``MlflowClient.create_run`` makes while it runs."""
    return MethodWatch("mlflow watch", [MODULE], "MlflowClient", "create_run", _noted)


def active(since: float) -> list[Target]:
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
    if run is not None:
        return [Target(run.info.run_id)]
    with _created_lock:
        made = [(run_id, client) for t, run_id, client in _created if t >= since]
    return [Target(*made[-1])] if made else []


def start(arg: str | None) -> Target:
    import mlflow

    if arg:
        mlflow.set_experiment(arg)
    return Target(mlflow.start_run(run_name="loadprof").info.run_id)


def finish(target: Target) -> None:
    import mlflow

    mlflow.end_run()


def log(target: Target, numbers: dict[str, float], texts: dict[str, str], artifact: str, markdown: str,
        step: int) -> str:
    from mlflow.entities import Metric, RunTag
    from mlflow.tracking import MlflowClient

    client = target.client if target.client is not None else MlflowClient()
    now = int(time.time() * 1000)
    client.log_batch(target.run_id, metrics=[Metric(k, v, now, step) for k, v in numbers.items()],
                     tags=[RunTag(k, v[:TAG_LIMIT]) for k, v in texts.items()])
    client.log_artifact(target.run_id, artifact, artifact_path="loadprof")
    return f"MLflow run {target.run_id}"
