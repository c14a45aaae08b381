"""Ray Train hooks, on the driver: each ``fit()`` of a ``TorchTrainer`` (a Ray Train v2
``DataParallelTrainer`` with torch's backend) runs its workers' loop profiled, and its job's
report is read back (NOTE [ Ray Train's workers profiled ] in worker.py).

Imported only once the user's code has imported Ray Train's trainer
(``instrument.FrameworkWatch``). What is wrapped (through ``patch.Patches``: NOTE [ One
patcher ]), restored by ``remove()``: ``DataParallelTrainer.fit``, which for its length
sets the trainer's ``train_loop_per_worker`` to a ``ProfiledLoop`` and puts the user's back
after. A trainer in local mode (``num_workers=0``) runs the loop in this process, which the
session measures itself: it is left alone.
"""

from __future__ import annotations

import dataclasses
import functools
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from ...instrument import Limits, ThisProcess
from ...patch import Patches
from ...records import Run
from ...settings import Settings
from ...timeline import Timeline
from .handover import new_key, take_files
from .worker import REPORT, ProfiledLoop

#: the trainer's attribute its ``fit()`` reads the loop from (Ray Train v2)
LOOP = "train_loop_per_worker"


class RayTrainHooks:
    """Installs and removes the Ray Train hooks for one profiling session."""

    framework = "ray.train"

    def __init__(self, timeline: Timeline, run: Run) -> None:
        self.limit = Limits(run, self.framework)  # first: what __init__ builds may report through it
        self.run = run
        self.pid = ThisProcess.pid
        self.installed = False
        #: the session's settings, for the workers' Profiles (session.py sets them)
        self.settings: Settings | None = None
        self._patches = Patches("ray.train hooks")
        self._reports: list[Any] = []

    def install(self) -> None:
        if self.installed:
            return
        self.installed = True
        self.pid = ThisProcess.pid
        if self._patches.wrap(DataParallelTrainer, "fit", self._wrap_fit) is None:
            self.limit("DataParallelTrainer.fit not found: the workers are not profiled")
        if not _v2():
            self.limit("Ray Train v1 (RAY_TRAIN_V2_ENABLED=0): its trainers' workers are not profiled")

    def remove(self) -> None:
        if not self.installed:
            return
        self.installed = False
        for line in self._patches.restore():
            self.limit(line)

    def job_report(self) -> Any:
        """The report of the workers of the last ``fit()`` that gave one (a ``JobReport``; a
        run's report for one worker), or None: the session reports the driver then."""
        if not self._reports:
            return None
        report = self._reports[-1]
        if len(self._reports) > 1:
            report.limitations.append(f"the script ran {len(self._reports)} Ray Train fit() calls: "
                                      "this is the last one's report")
        return report

    # -- fit ------------------------------------------------------------------
    def _wrap_fit(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self

        @functools.wraps(original)
        def fit(trainer: Any, *args: Any, **kwargs: Any) -> Any:
            key = hooks._handover(trainer)
            loop: Any = getattr(trainer, LOOP, None)
            if key is not None:
                try:
                    setattr(trainer, LOOP, ProfiledLoop(loop, hooks._worker_settings(), key, hooks.run.command))
                except Exception as exc:  # NOTE [ Never break the run ] in session.py: fit() goes on unprofiled
                    hooks.limit(f"the workers are not profiled ({type(exc).__name__}: {exc})")
                    key = None
            if key is None:
                return original(trainer, *args, **kwargs)
            try:
                return original(trainer, *args, **kwargs)
            finally:
                setattr(trainer, LOOP, loop)
                hooks._read(key)

        return fit

    def _handover(self, trainer: Any) -> str | None:
        """This ``fit()``'s key in Ray's store for its workers' report (handover.py), or None
        where its loop is left alone."""
        if ThisProcess.pid != self.pid or not self.installed or self.settings is None:
            return None
        loop = getattr(trainer, LOOP, None)
        if not callable(loop) or isinstance(loop, ProfiledLoop) or getattr(trainer, "running_in_local_mode", False):
            return None
        backend = getattr(trainer, "backend_config", None)
        if getattr(getattr(backend, "framework", None), "value", None) != "torch":
            # the ranks meet at the store of torch's process group, which only TorchConfig sets up
            self.limit(f"{type(trainer).__name__}'s workers are not profiled: only a torch process group's are "
                       f"(its backend: {type(backend).__name__})")
            return None
        return new_key()

    def _worker_settings(self) -> Settings:
        """The session's settings, less what only the driver does (print, files, live view, trackers)."""
        assert self.settings is not None
        return dataclasses.replace(self.settings, outputs={}, print_report=False, live=False, log_to=(),
                                   apply=False)

    def _read(self, key: str) -> None:
        """The workers' report, taken from Ray's store into a folder of ours, read back and the
        folder removed; what fails is a limitation."""
        report = None
        folder = None
        try:
            folder = Path(tempfile.mkdtemp(prefix="loadprof-raytrain-"))
            take_files(key, folder)
            report = self._load(folder)
        except Exception as exc:  # a file half written by a worker killed meanwhile, say
            self.limit(f"the workers' report could not be read ({type(exc).__name__}: {exc})")
        finally:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
        if report is not None:
            self._reports.append(report)

    def _load(self, folder: Path) -> Any:
        from ...report import load_report

        price = self.settings.gpu_hour_price if self.settings is not None else None
        whole = folder / REPORT
        if whole.exists():
            return load_report(whole, price)
        ranks = sorted(folder.glob(f"{Path(REPORT).stem}.rank*.json"))
        if not ranks:
            self.limit("the workers handed over no report (a worker that could not be profiled or hand it "
                       "over says why on stderr): this report is the driver's own")
            return None
        from ...jobs.merge import merge_ranks, read_rank_file
        from ...report.job import build_job_report

        job = merge_ranks([read_rank_file(p) for p in ranks])  # as `loadprof merge` does
        return build_job_report(job, gpu_hour_price=price)


def _v2() -> bool:
    """Whether Ray Train's v2 trainers are the ones ``ray.train.torch`` gives (its default)."""
    try:
        from ray.train.v2._internal.constants import is_v2_enabled
    except ImportError:  # moved: its v2 API is the only one left
        return True
    return bool(is_v2_enabled())
