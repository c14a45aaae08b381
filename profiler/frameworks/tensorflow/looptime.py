"""A custom loop's own time a step, read while the run goes: from one call of its step
function's end to the next one's start, less the time spent waiting for batches (an
iterator's start and its end of pass counted as waiting). It is what a what-if replay,
which calls the step on the next batch and nothing else, must add to each replayed step
(NOTE [ What-if replays under Keras fit ] in whatif.py): the loop's logging, its metrics,
the profiler's own hooks. Read directly, not as the run's step less the replayed one,
whose difference is as large as the load or the pipeline's epoch starts moved it.

Keras ``fit``'s own time is read alike (keras/fit.py): from one ``train_function`` call's end
to the next one's start within an epoch (callbacks, the progress bar, metrics' logs), a call
of ``steps_per_execution`` batches counted per batch; its waits are inside its calls.
"""

from __future__ import annotations

import statistics

#: steps left out at the start: tracing, the first pass's set-up
SKIP_STEPS = 2


class LoopTime:
    """The loop's time outside its step calls and its waits, one figure a step."""

    def __init__(self) -> None:
        self._ended: float | None = None
        self._waited = 0.0
        self.outside: list[float] = []

    def waited(self, seconds: float) -> None:
        self._waited += seconds

    def call_starts(self, t: float, batches: int = 1) -> None:
        """A call of ``batches`` steps starts at ``t``: the time since the last one ended is theirs."""
        if self._ended is not None:
            self.outside.append(max(0.0, t - self._ended - self._waited) / max(1, batches))
        self._waited = 0.0

    def call_ends(self, t: float) -> None:
        self._ended = t
        self._waited = 0.0

    def per_step(self) -> float | None:
        """The median step's own time, seconds; None before enough steps."""
        kept = self.outside[SKIP_STEPS:]
        return statistics.median(kept) if kept else None
