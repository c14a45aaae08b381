"""``Applier``: installs the fixes for each framework the script imports and removes them.

It serves three callers:

- ``loadprof tune`` / ``loadprof compare`` trials: a child process runs the
  unchanged script under ``Profile(apply=Applier(changes, ...))``; ``changes``
  (a ``Changes``) says what to alter. The applier also records the loss (the
  correctness guard compares trajectories), seeds the RNGs so two trials see
  the same data, and probes whether each dataset could be cached.
- ``Profile(apply=True)``: DataLoaders created inside the block get the safe
  loader settings (workers, prefetch, pinned memory) that the measured first
  iteration calls for, from their next iteration on (NOTE [ Live loader tuning ]
  in livetune.py).
- ``loadertune.tune_loader``: the in-memory cache and loadprof's own reads (cache.py).

What is wrapped, and only while a fix needs it:
- torch (torchfixes.py): ``DataLoader.__init__`` (rewrite settings, wrap the dataset
  in a cache, remember the call site), ``DataLoader._get_iterator`` (live tuning,
  the one-batch ideal), ``nn.Module.__call__`` (autocast around the outermost
  module call), ``Tensor.backward`` (loss record, GradScaler, accumulation
  scaling), ``Optimizer.__init__`` (per-instance ``step``/``zero_grad`` for
  GradScaler and accumulation) and ``nn.Module.zero_grad`` (accumulation).
- tf.data (tfdatafixes.py): ``Dataset.map/shuffle/batch/repeat/cache/prefetch``
  (observe the pipeline; insert ``cache()``, ``prefetch(AUTOTUNE)``, parallel ``map``).
- Keras (kerasfixes.py): the global dtype policy, ``BaseOptimizer.__init__``
  (gradient accumulation steps), ``Model.fit`` (a callback that records losses).

The fixes only change what the script builds; they measure nothing and write
no record: live tuning reads a copy of the run so far (``snapshot``), and what
it would note on a loader is handed back in ``loader_notes`` for the session to
add at the end (``record_in``). Every wrapper checks the pid that installed it (NOTE [ Fork
safety ] in frameworks/torch/hooks.py): DataLoader workers call straight through. A
fix that cannot be applied is skipped with a message; it never stops the run
(NOTE [ Never break the run ] in session.py).

NOTE [ Import watch order ]
Profile's own framework watch puts an ``ImportWatch`` (instrument/__init__.py)
at ``sys.meta_path[0]``. The applier starts after it and puts its own in front;
each watch asks the finders behind it (so the applier's asks Profile's) for the
spec and wraps the resulting ``exec_module`` once more. So when the script imports
torch, Profile's hooks install first and the fixes second, and on stop the fixes
are removed first. Either order would restore cleanly (NOTE [ One patcher ] in
patch.py); this one keeps the fixes' wrappers outermost while both are in place.
"""

from __future__ import annotations

import importlib
import os
import random
import sys
import threading
from collections.abc import Callable
from typing import IO, Any, Protocol

from ..frameworks import fixes_by_module
from ..heap import environment_line, keep_freed_memory
from ..instrument import ImportWatch, ThisProcess
from ..records import Run
from .context import FixContext
from .spec import Changes


class Fixes(Protocol):
    """One framework's fixes (frameworks/*/fixes.py), made from a ``FixContext``."""

    def install(self) -> None: ...

    def finish(self) -> None: ...

    def remove(self) -> list[str]: ...


def _factory(module: str) -> Callable[[FixContext], Fixes]:
    """The fixes that the adapter installed by the top-level ``module`` names."""
    where, _, attr = fixes_by_module()[module].partition(":")
    factory: Callable[[FixContext], Fixes] = getattr(importlib.import_module(where), attr)
    return factory


# -- the applier -------------------------------------------------------------
class Applier(FixContext):
    """Applies ``Changes`` (or, with ``live=True``, measured safe loader settings)
    to whatever the script builds while it is started. See the module doc; what the
    fixes read and write is its ``FixContext`` part."""

    def __init__(self, changes: Changes | None = None, **options: Any) -> None:
        super().__init__(changes, **options)
        self._watch: ImportWatch | None = None
        self._fixes: dict[str, Fixes] = {}
        self._started = False
        self._lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------
    def start(self, snapshot: Callable[[], Run] | None = None) -> None:
        if self._started:
            return
        self._started = True
        self.pid = os.getpid()
        self.snapshot = snapshot
        if self.seed is not None:
            random.seed(self.seed)
            import numpy

            numpy.random.seed(self.seed)
        if self.changes.heap:
            why = keep_freed_memory(self.changes.heap)
            if why is None:
                self.say(f"heap: {environment_line(self.changes.heap)} (set by mallopt)")
            else:
                self.skip(f"heap: {why}")
        pending = set()
        live_only = self.live and self.changes.empty and not self.record_losses
        # live tuning touches only the loaders of an adapter that tunes live; trials every framework
        for name in fixes_by_module(live_only):
            if name in sys.modules:
                self._install(name)
            else:
                pending.add(name)
        if pending:
            self._watch = ImportWatch(pending, self._install).install()

    def stop(self) -> None:
        if not self._started or ThisProcess.pid != self.pid:
            return
        self._started = False
        if self._watch is not None:
            self._watch.remove()
            self._watch = None
        for name in reversed(list(self._fixes)):
            fixes = self._fixes.pop(name)
            try:
                fixes.finish()
            finally:
                self.limitations.extend(fixes.remove())

    def record_in(self, run: Run) -> list[str]:
        """What the fixes did, written into ``run`` once they are removed: their limitations,
        the loaders' notes and the settings live tuning left them with (the report judges a
        loader as it ran last, on the steps after the change). Returns ``Profile.applied``."""
        run.limitations.extend(f"apply: {line}" for line in self.limitations)
        for info, note in self.loader_notes:  # NOTE [ Live loader tuning ] in frameworks/torch/livetune.py
            info.notes.append(note)
        for info, values, when in self.loader_changes:
            for key, value in values.items():
                setattr(info, key, value)
            run.judge_after = max(run.judge_after or 0.0, when)
        return list(self.messages) + [f"not applied: {m}" for m in self.skipped]

    def __enter__(self) -> Applier:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _install(self, name: str) -> None:
        with self._lock:
            if name in self._fixes or not self._started:
                return
            fixes: Fixes | None = None
            try:
                fixes = _factory(name)(self)
                fixes.install()
            except Exception as exc:  # a framework version whose internals moved: run unchanged
                if fixes is not None:
                    self.limitations.extend(fixes.remove())
                self.skip(f"{name}: fixes unavailable ({type(exc).__name__}: {exc})")
                return
            self._fixes[name] = fixes


def make_applier(apply: Any, output: IO[str] | None = None, announce: bool = True) -> Applier:
    """What ``Profile(apply=...)`` accepts: True (live safe loader tuning) or an ``Applier``."""
    if isinstance(apply, Applier):
        return apply
    if apply is True:
        return Applier(live=True, announce=announce, output=output)
    raise TypeError(f"apply: expected True or a loadprof.fixes.Applier, got {type(apply).__name__}")
