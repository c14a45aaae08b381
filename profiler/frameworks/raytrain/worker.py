"""What each Ray Train worker runs: the user's ``train_loop_per_worker`` inside a ``Profile``.

NOTE [ Ray Train's workers profiled ]
A ``TorchTrainer``'s training runs in Ray's worker processes (actors), which ``loadprof
diagnose`` never starts: profiled alone, the driver is an idle process waiting for ``fit()``.
So for the length of ``fit()`` the trainer's ``train_loop_per_worker`` is a ``ProfiledLoop``
(hooks.py), which Ray pickles to each worker (cloudpickle: this class by reference, the
user's loop as Ray ships it anyway). There it runs the loop inside a ``Profile`` with the
diagnose run's settings, quiet. Ray Train sets RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT in each worker before the loop (its process
group's ``env://`` rendezvous, ray/train/torch/config.py), so each worker's Profile is a rank
of a job as under torchrun: the reports meet on rank 0 through the store that rank 0's
process hosts for the process group (NOTE [ Merging a job's reports ] in jobs/exchange.py,
without an agent store), while the loop, inside the Profile, still holds it. Rank 0 writes
the job's report (``REPORT``) in a folder of its own host; a rank the exchange missed writes
its own beside it (``report.rankR.json``). Each worker then hands its files to the driver
through Ray's key-value store, under this ``fit()``'s key (handover.py), so a rank 0 on
another node than the driver's is read alike. When ``fit()`` returns, the driver takes them
(merging rank files itself where rank 0 wrote none), and ``loadprof diagnose`` writes and
prints the job's report instead of the driver's.

The loop's return value and exceptions are its own; a Profile that cannot be made is one
warning on the worker's stderr (Ray forwards it to the driver's) and the loop runs
unprofiled (NOTE [ Never break the run ] in session.py).
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...lines import warn
from ...samplers.node import world_size
from ...settings import Settings
from .handover import put_files

#: the file rank 0 writes (rank R's own: ``report.rankR.json``)
REPORT = "report.json"


class ProfiledLoop:
    """``train_loop_per_worker`` profiled in the worker that runs it."""

    def __init__(self, loop: Callable[..., Any], settings: Settings, key: str, command: list[str]) -> None:
        # Ray counts the loop's parameters (0 or the config) through ``__wrapped__``
        functools.update_wrapper(self, loop)
        self.loop = loop
        self.settings = settings
        self.key = key  # this fit()'s key in Ray's store (handover.py)
        self.command = list(command)

    def __call__(self, *args: Any) -> Any:
        try:
            folder = tempfile.mkdtemp(prefix="loadprof-raytrain-")
        except OSError as exc:
            warn(f"this Ray Train worker is not profiled: no folder for its report ({exc})")
            return self.loop(*args)
        try:
            prof = self._profile(folder)
            if prof is None:
                return self.loop(*args)
            with prof:
                return self.loop(*args)
            return None  # max_steps reached: the Profile swallowed its StopRun
        finally:
            self._hand_over(Path(folder))

    def _hand_over(self, folder: Path) -> None:
        """The report files this worker wrote, put in Ray's store for the driver; the folder removed."""
        try:
            put_files(self.key, folder)
        except Exception as exc:  # NOTE [ Never break the run ] in session.py
            warn(f"this Ray Train worker's report could not be handed to the driver ({type(exc).__name__}: {exc})")
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _profile(self, folder: str) -> Any:
        try:
            from ...jobs.context import JobContext
            from ...session import Profile

            s = self.settings
            alone = JobContext.from_env() is None and world_size() > 1
            # without MASTER_ADDR (TorchConfig(init_method="tcp")) the ranks cannot meet:
            # rank 0 reports alone, the others write nothing over its file
            json = None if alone and os.environ.get("RANK", "0") != "0" else os.path.join(folder, REPORT)
            prof = Profile(interval=s.interval, json=json, max_steps=s.max_steps, print_report=False, gpu=s.gpu,
                           host_helper=s.host_helper, gpu_hour_price=s.gpu_hour_price, what_if=s.what_if)
            prof.run.command = list(self.command)  # the driver's, not Ray's worker's
            if alone:
                prof.run.limitations.append(
                    f"Ray Train worker {os.environ.get('RANK', '?')} of {world_size()} reports alone: no MASTER_ADDR "
                    "to meet the others at (TorchConfig(init_method='tcp')); their reports are not merged")
            return prof
        except Exception as exc:  # NOTE [ Never break the run ] in session.py
            warn(f"this Ray Train worker is not profiled ({type(exc).__name__}: {exc})")
            return None

