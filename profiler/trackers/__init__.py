"""Experiment trackers: loadprof's summary logged into the run the script already has.

NOTE [ Logging into the script's own run ]
A script that logs to W&B, MLflow or TensorBoard gets loadprof's summary in the same
run, with no code: flat ``loadprof/...`` fields (trackers/fields.py), text where the
tracker keeps text, and the JSON report as an artifact.
- Finding the run reads only what the script imported (``sys.modules``); loadprof
  never imports a tracker the script did not (trackers/wandb_run.py, mlflow_run.py,
  tb_writer.py say how each is found).
- loadprof never starts a run the script did not, unless asked (``--log-to``,
  ``Profile(log_to=...)``): then, for each tracker named that has no run of the
  script's, it starts one, logs, and ends it.
- Only rank 0 of a job logs (``RANK``; the job's rank where loadprof joined one), once:
  the job's report where the ranks' reports were merged (its cost summed over the
  ranks' GPUs), else its own.
- It runs at the end, after the report is written and printed, each tracker in its
  own guard: a tracker missing, offline or failing costs one warning line, never the
  training run (NOTE [ Never break the run ] in session.py).
"""

from __future__ import annotations

import os
import tempfile
import types
from collections.abc import Callable
from typing import Any

from . import mlflow_run, tb_writer, wandb_run
from .fields import NAMES, logged_step, markdown, parse_log_to, summary_fields
from .watch import MethodWatch

__all__ = ["TRACKERS", "Trackers", "parse_log_to"]

#: --log-to names -> their modules, in the order they are logged to
TRACKERS: dict[str, types.ModuleType] = {"wandb": wandb_run, "mlflow": mlflow_run, "tensorboard": tb_writer}
assert tuple(TRACKERS) == NAMES
#: the module each needs, for the warning when it is missing
PACKAGES = {"wandb": "wandb", "mlflow": "mlflow", "tensorboard": "tensorboard (with torch or tensorboardX)"}


class Trackers:
    """What one Profile logs to: the writer watch while it runs, the logging at its end."""

    def __init__(self, log_to: dict[str, str | None], started_at: float) -> None:
        self.log_to = dict(log_to)
        self.started_at = started_at
        self._watch: MethodWatch | None = None
        self._runs: MethodWatch | None = None

    def start(self) -> Trackers:
        self._watch = tb_writer.watch().start()
        self._runs = mlflow_run.watch().start()
        return self

    def stop(self) -> list[str]:
        """Unwrap the watches; lines for ``Run.limitations`` where a wrap had to stay."""
        watch, self._watch = self._watch, None
        runs, self._runs = self._runs, None
        return (watch.stop() if watch is not None else []) + (runs.stop() if runs is not None else [])

    def log(self, report: Any, *, rank: int, note: Callable[[str], None],
            warn: Callable[[str], None]) -> list[str]:
        """Log ``report`` into each tracker's run; what it logged to, one entry each. Never raises."""
        if rank != 0:
            return []
        try:
            numbers, texts = summary_fields(report)
            text = markdown(report)
            step = logged_step(report)
        except Exception as err:  # NOTE [ Never break the run ]
            warn(f"trackers: the summary could not be made ({type(err).__name__}: {err})")
            return []
        done: list[str] = []
        with tempfile.TemporaryDirectory(prefix="loadprof-") as folder:
            artifact = os.path.join(folder, "loadprof-report.json")
            wrote = False
            for name, tracker in TRACKERS.items():
                try:
                    handles = tracker.active(self.started_at)
                except Exception as err:  # a tracker's own state we could not read
                    warn(f"{tracker.label}: its run could not be read ({type(err).__name__}: {_line(err)})")
                    handles = []
                started = None
                if not handles and name in self.log_to:
                    try:
                        started = tracker.start(self.log_to[name])
                    except ImportError as err:
                        warn(f"--log-to {name}: {PACKAGES[name]} is not installed ({_line(err)})")
                        continue
                    except Exception as err:
                        warn(f"--log-to {name}: no run could be started ({type(err).__name__}: {_line(err)})")
                        continue
                    handles = [started]
                for handle in handles:
                    try:
                        if not wrote:
                            from ..report import write_json

                            write_json(report, artifact)
                            wrote = True
                        done.append(tracker.log(handle, numbers, texts, artifact, text, step))
                    except Exception as err:  # offline, a full disk, a server that said no
                        warn(f"{tracker.label}: summary not logged ({type(err).__name__}: {_line(err)})")
                if started is not None:
                    try:
                        tracker.finish(started)
                    except Exception as err:
                        warn(f"{tracker.label}: the run loadprof started could not be ended "
                             f"({type(err).__name__}: {_line(err)})")
        if done:
            note(f"summary logged to {', '.join(done)} (loadprof/* fields, loadprof-report.json)")
        return done


def _line(err: BaseException) -> str:
    text = str(err)
    return text.splitlines()[0][:200] if text else ""
