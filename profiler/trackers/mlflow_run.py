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

A run loadprof starts (``--log-to mlflow``) is made through a client of its own: never
``mlflow.start_run``, which resumes the run ``MLFLOW_RUN_ID`` names (an orchestrator's)
and changes the script's active run, nor ``mlflow.set_experiment``, which would move the
script's later runs. MLflow's fluent state (active runs, experiment, tracking URI) is
left as it was.

loadprof's own calls to a tracking server are bounded (``calls()``): MLflow retries a
server that does not answer for about four minutes by default, after training.
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .watch import MethodWatch

label = "MLflow"

#: MLflow refuses longer tag values (5,000 characters before 2.x's 8,000)
TAG_LIMIT = 5000
#: where ``MlflowClient`` lives: watched once the script imports it
MODULE = "mlflow.tracking.client"
#: MLflow's HTTP settings for loadprof's own calls (a lower value of the script's kept):
#: 3 tries, at most 2.5 s apart, 5 s without an answer each: seconds in all where the
#: server is down (MLflow's defaults: 8 tries with backoff up to 2 minutes, 120 s each)
BOUNDS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": 2, "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": 1,
          "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": 0.5, "MLFLOW_HTTP_REQUEST_TIMEOUT": 5}


@dataclass
class Target:
    """A run to log into, and the client of its store (None: MLflow's default, the fluent API's)."""

    run_id: str
    client: Any = None


@contextlib.contextmanager
def calls() -> Iterator[None]:
    """loadprof's own MLflow calls, with HTTP retries and timeout bounded (BOUNDS);
    the environment as it was afterwards. MLflow reads these for each request."""
    saved = {name: os.environ.get(name) for name in BOUNDS}
    for name, bound in BOUNDS.items():
        value = saved[name]
        try:
            theirs = type(bound)(value) if value is not None else bound
        except ValueError:
            theirs = bound
        os.environ[name] = str(min(bound, theirs) if theirs >= 0 else bound)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


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
    last_id: Any = getattr(fluent, "_last_active_run_id", True)
    ran = (last_id.get() if callable(getattr(last_id, "get", None)) else last_id) is not None  # 3.x: per thread
    if run is None and ran and hasattr(mlflow, "last_active_run"):
        try:
            last = mlflow.last_active_run()
        except mlflow.exceptions.MlflowException as err:
            if err.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            last = None  # a run of another store (the tracking URI changed since): not the script's now
        if last is not None and (last.info.end_time or 0) / 1000.0 >= since:
            run = last
    if run is not None:
        return [Target(run.info.run_id)]
    with _created_lock:
        made = [(run_id, client) for t, run_id, client in _created if t >= since]
    return [Target(*made[-1])] if made else []


def start(arg: str | None) -> Target:
    """A new run named loadprof, in experiment ``arg`` (made where missing) or the script's current one."""
    from mlflow.tracking import MlflowClient, fluent

    client = MlflowClient()
    if arg:
        found = client.get_experiment_by_name(arg)
        experiment = found.experiment_id if found is not None else client.create_experiment(arg)
    else:  # the script's set_experiment, MLFLOW_EXPERIMENT_NAME/_ID, else the default
        current = getattr(fluent, "_get_experiment_id", None)
        experiment = (current() if current is not None else None) or "0"
    run = client.create_run(experiment, run_name="loadprof")
    with _created_lock:  # ours, not the script's (a Profile around this one watches too)
        kept = [entry for entry in _created if entry[1] != run.info.run_id]
        _created.clear()
        _created.extend(kept)
    return Target(run.info.run_id, client)


def finish(target: Target) -> None:
    target.client.set_terminated(target.run_id)


def log(target: Target, numbers: dict[str, float], texts: dict[str, str], artifact: str, markdown: str,
        step: int, *, note: Callable[[str], None], warn: Callable[[str], None]) -> str:
    from mlflow.entities import Metric, RunTag
    from mlflow.tracking import MlflowClient

    client = target.client if target.client is not None else MlflowClient()
    now = int(time.time() * 1000)
    client.log_batch(target.run_id, metrics=[Metric(k, v, now, step) for k, v in numbers.items()],
                     tags=[RunTag(k, v[:TAG_LIMIT]) for k, v in texts.items()])
    client.log_artifact(target.run_id, artifact, artifact_path="loadprof")
    return f"MLflow run {target.run_id}"
