"""``FixContext``: what a framework's fixes are given, and all they may touch.

The fixes (frameworks/*/fixes.py) read what to change and write what they did here;
the ``Applier`` (applier.py) is one, with the lifecycle on top. A fix never sees the
applier's installing and removing, so no fix imports it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import IO, Any

from ..instrument import ThisProcess
from ..records import LoaderInfo, Run
from .cache import CacheCheck
from .spec import Changes, SiteRecord


class FixContext:
    def __init__(
        self,
        changes: Changes | None = None,
        *,
        live: bool = False,
        record_losses: bool = False,
        probe: bool = False,
        seed: int | None = None,
        announce: bool = False,
        output: IO[str] | None = None,
    ) -> None:
        self.changes = changes or Changes()
        self.live = live
        self.record_losses = record_losses
        self.probe = probe
        self.seed = seed
        self.announce = announce
        self.output = output
        self.pid = os.getpid()
        #: One line per change made ("DataLoader at train.py:40: num_workers 0 -> 2").
        self.messages: list[str] = []
        #: One line per requested fix that could not be applied, with the reason.
        self.skipped: list[str] = []
        #: One line per wrapper that could not be taken off (patch.Patches.restore).
        self.limitations: list[str] = []
        self.sites: list[SiteRecord] = []
        self.losses: list[float] = []
        self.loss_site: tuple[str, int] | None = None
        self.cache_checks: dict[str, CacheCheck] = {}
        self.setup_seconds = 0.0  # cache fills and other one-time work done by the fixes
        self.pipeline: dict[str, Any] = {}  # tf.data facts seen (observed even when nothing applies)
        self.batch_sizes: list[int] = []  # tf.data batch sizes requested by the script
        #: (a loader's record, a line for its notes): what live tuning changed, for the session to add.
        self.loader_notes: list[tuple[LoaderInfo, str]] = []
        #: settings live tuning changed on a loader's record, and when (the run's clock)
        self.loader_changes: list[tuple[LoaderInfo, dict[str, Any], float]] = []
        #: A copy of the run so far (steps, host samples, environment), for live tuning.
        self.snapshot: Callable[[], Run] | None = None

    def say(self, message: str) -> None:
        self.messages.append(message)
        if self.announce and ThisProcess.pid == self.pid:
            print(f"loadprof: {message}", file=self.output or sys.stderr)

    def skip(self, message: str) -> None:
        if message not in self.skipped:
            self.skipped.append(message)
            if self.announce and ThisProcess.pid == self.pid:
                print(f"loadprof: not applied: {message}", file=self.output or sys.stderr)

    def in_owner(self) -> bool:
        return ThisProcess.pid == self.pid

    def add_losses(self, values: list[float]) -> None:
        self.losses.extend(values)
