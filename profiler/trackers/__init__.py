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
  script's, it starts one, logs, and ends it. That run is a new one of loadprof's own,
  never one an outer pipeline named (``MLFLOW_RUN_ID``, ``WANDB_RUN_ID``), and the
  tracker's global state is left as the script had it (its active run and experiment,
  the environment): mlflow_run.py and wandb_run.py say how.
- Only rank 0 of a job logs (``RANK``; the job's rank where loadprof joined one), once:
  the job's report where the ranks' reports were merged (its cost summed over the
  ranks' GPUs), else its own.
- A W&B run the script ends while profiled (most do: W&B's quickstart ends with
  ``run.finish()``) would take nothing at the end: as the script ends it, before its
  ``finish()`` goes on, it gets the report of the run so far (``report_so_far``).
- ``otlp`` is no run: the figures are exported while the job runs (trackers/otlp.py),
  by each process, and once more at the end, before the rank check.
- It runs at the end, after the report is written and printed, each tracker in its
  own guard: a tracker missing, offline or failing costs one warning line (a run that
  cannot be read is not started over it), never the training run (NOTE [ Never break
  the run ] in session.py), and a bounded wait: each tracker's ``calls()`` bounds its
  client's retries for loadprof's calls only.
- What loadprof writes into the script's folders goes through the one writer, which
  never follows a link planted there; a folder the script removed is not made again
  (tb_writer.py).
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
PACKAGES = {"wandb": "wandb", "mlflow": "mlflow", "tensorboard": "tensorboard (or tensorboardX)"}


class Trackers:
    """What one Profile logs to: the writer watch while it runs, the logging at its end.

    ``report_so_far`` makes the report of the run until now: a W&B run the script ends
    while profiled gets that, as it ends (NOTE [ Logging into the script's own run ])."""

    def __init__(self, log_to: dict[str, str | None], started_at: float,
                 report_so_far: Callable[[], Any] | None = None) -> None:
        self.log_to = dict(log_to)
        self.started_at = started_at
        self.report_so_far = report_so_far
        self._watch: MethodWatch | None = None
        self._runs: MethodWatch | None = None
        self._finishing: MethodWatch | None = None
        self._pid = os.getpid()
        self._early: list[str] = []  # runs logged as the script ended them
        self._early_problems: list[str] = []  # their warnings, said at the end with the rest
        self._ended: set[int] = set()  # ids of the runs seen ending (a run finished twice)
        self._otlp: Any = None  # otlp.Exporter while it exports
        self._otlp_problem = ""  # why it could not start, said at the end

    def start(self) -> Trackers:
        self._watch = tb_writer.watch().start()
        self._runs = mlflow_run.watch().start()
        if self.report_so_far is not None:
            self._finishing = wandb_run.finishing(self._on_wandb_finish).start()
            if "otlp" in self.log_to:
                self._start_otlp(self.report_so_far)
        return self

    def _start_otlp(self, report_so_far: Callable[[], Any]) -> None:
        try:
            from .otlp import Exporter

            self._otlp = Exporter(report_so_far)
        except ImportError as err:
            self._otlp_problem = (f"--log-to otlp: opentelemetry-sdk and opentelemetry-exporter-otlp-proto-http "
                                  f"are not installed (pip install 'loadprof[otlp]'; {_line(err)})")
        except Exception as err:  # NOTE [ Never break the run ]
            self._otlp_problem = f"--log-to otlp: the exporter could not start ({type(err).__name__}: {_line(err)})"

    def stop(self) -> list[str]:
        """Unwrap the watches; lines for ``Run.limitations`` where a wrap had to stay."""
        watches = (self._watch, self._runs, self._finishing)
        self._watch = self._runs = self._finishing = None
        return [line for w in watches if w is not None for line in w.stop()]

    def _on_wandb_finish(self, run: Any) -> None:
        """The script ends a W&B run while profiled: log the report so far into it first.
        Never raises: the script's finish() goes on whatever happens here."""
        if os.getpid() != self._pid or id(run) in self._ended or getattr(run, "_is_finished", False):
            return
        self._ended.add(id(run))
        try:
            if int(os.environ.get("RANK", "0") or 0) != 0:  # only rank 0 logs, as at the end
                return
        except ValueError:
            pass
        try:
            assert self.report_so_far is not None
            report = self.report_so_far()
            numbers, texts = summary_fields(report)
            with tempfile.TemporaryDirectory(prefix="loadprof-") as folder:
                from ..report import write_json

                artifact = os.path.join(folder, "loadprof-report.json")
                write_json(report, artifact)
                label = wandb_run.log(run, numbers, texts, artifact, markdown(report), logged_step(report),
                                      note=lambda line: None, warn=self._early_problems.append)
            self._early.append(f"{label} (as the script ended it)")
        except Exception as err:  # NOTE [ Never break the run ]: its finish() still runs
            self._early_problems.append(f"{wandb_run.label}: summary not logged as the script ended its run "
                                        f"({type(err).__name__}: {_line(err)})")

    def log(self, report: Any, *, rank: int, note: Callable[[str], None],
            warn: Callable[[str], None], own: Any = None) -> list[str]:
        """Log ``report`` into each tracker's run; what it logged to, one entry each. Never raises.
        ``own``: this process's own report where ``report`` is its job's (the OTLP export is
        each rank's)."""
        self._finish_otlp(own if own is not None else report, note, warn)
        early, problems = list(self._early), list(self._early_problems)
        self._early.clear()
        self._early_problems.clear()
        for line in problems:
            warn(line)
        if rank != 0:
            return []
        try:
            numbers, texts = summary_fields(report)
            text = markdown(report)
            step = logged_step(report)
        except Exception as err:  # NOTE [ Never break the run ]
            warn(f"trackers: the summary could not be made ({type(err).__name__}: {err})")
            return []
        done: list[str] = early
        with tempfile.TemporaryDirectory(prefix="loadprof-") as folder:
            artifact = os.path.join(folder, "loadprof-report.json")

            def logged(tracker: types.ModuleType, handle: Any) -> str | None:
                if not os.path.exists(artifact):  # written once, when a run is there to take it
                    from ..report import write_json

                    write_json(report, artifact)
                return tracker.log(handle, numbers, texts, artifact, text, step, note=note, warn=warn)

            for name, tracker in TRACKERS.items():
                try:
                    with tracker.calls():
                        done += self._log_one(name, tracker, logged, warn)
                except Exception as err:  # putting the tracker back as it was
                    warn(f"{tracker.label}: its state could not be restored ({type(err).__name__}: {_line(err)})")
        if done:
            note(f"summary logged to {', '.join(done)} (loadprof/* fields, loadprof-report.json)")
        return done

    def _finish_otlp(self, report: Any, note: Callable[[str], None], warn: Callable[[str], None]) -> None:
        """The OTLP export's last figures, and its end: a line either way."""
        if self._otlp_problem:
            warn(self._otlp_problem)
            self._otlp_problem = ""
        exporter, self._otlp = self._otlp, None
        if exporter is None:
            return
        try:
            problem = exporter.finish(report)
        except Exception as err:  # NOTE [ Never break the run ]
            problem = f"the exporter could not be shut down ({type(err).__name__}: {_line(err)})"
        if problem:
            warn(f"OTLP: {problem}")
        else:
            note(f"figures exported to OTLP {exporter.endpoint} while the job ran (loadprof.* metrics)")

    def _log_one(self, name: str, tracker: types.ModuleType,
                 logged: Callable[[types.ModuleType, Any], str | None], warn: Callable[[str], None]) -> list[str]:
        """Log into one tracker's runs (or the one loadprof starts, where asked): what it
        logged to; at most one warning line for each run."""
        unread = ""
        try:
            handles = tracker.active(self.started_at)
        except Exception as err:  # a tracker's own state we could not read
            unread = f"its run could not be read ({type(err).__name__}: {_line(err)})"
            handles = []
        started = None
        if not handles and name in self.log_to:
            try:
                started = tracker.start(self.log_to[name])
            except ImportError as err:
                warn(f"--log-to {name}: {PACKAGES[name]} is not installed ({_line(err)})")
                return []
            except Exception as err:
                warn(f"--log-to {name}: {unread + '; ' if unread else ''}no run could be started "
                     f"({type(err).__name__}: {_line(err)})")
                return []
            handles = [started]
        if unread:
            warn(f"{tracker.label}: {unread}")
        done: list[str] = []
        for handle in handles:
            problems = []
            try:
                label = logged(tracker, handle)
                if label:
                    done.append(label)
            except Exception as err:  # offline, a full disk, a server that said no
                problems.append(f"summary not logged ({type(err).__name__}: {_line(err)})")
            if handle is started:
                try:
                    tracker.finish(started)
                except Exception as err:
                    problems.append(f"the run loadprof started could not be ended ({type(err).__name__}: {_line(err)})")
            if problems:
                warn(f"{tracker.label}: {'; '.join(problems)}")
        return done


def _line(err: BaseException) -> str:
    """The error's first line; a long one keeps its end, where a client says the cause."""
    first = str(err).splitlines()[0] if str(err) else ""
    return first if len(first) <= 200 else f"{first[:120]} ... {first[-75:]}"
