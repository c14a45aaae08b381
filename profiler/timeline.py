"""Turns hook events into training steps.

Framework hooks (``instrument/``) know nothing about steps; they report events:
"the loop waited for a batch from t0 to t1", "an optimizer step finished at t",
"a forward pass began at t". The timeline folds these into ``Step`` records.

NOTE [ Step boundaries ]
A step ends when the optimizer step returns (or at ``Profile.step()`` when the
user marks steps by hand, which then overrides the optimizer signal). A step
starts where the previous one ended; the very first step starts at the first
event seen (the first batch request or forward pass), so script set-up before
the loop is never counted as a step. Batch waits between two step ends belong to
the later step, which is what gradient accumulation needs: several waits, one step.

NOTE [ Input time without a DataLoader ]
A hand-written generator gives us no iterator to time. Then the gap between the
end of one optimizer step and the first forward pass after it is input time: the
loop was producing the next batch (``method = "between-steps"``). When a timed
iterator wait was seen in the step, that measurement wins.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from .records import Step

#: Step records kept in memory. Past this, older records are merged pairwise
#: (sums of time and waits are kept exact; per-step detail halves), so a run of
#: millions of steps stays at a few MiB.
MAX_STEP_RECORDS = 20_000


class StopRun(BaseException):
    """Raised into the training loop to stop it after ``max_steps``.

    A BaseException, like KeyboardInterrupt, so a script's ``except Exception``
    cannot swallow it.
    """


class Timeline:
    """Collects per-step timings from hook events. Thread-safe; cheap per event."""

    def __init__(
        self,
        t0: float,
        clock: Callable[[], float] = time.perf_counter,
        max_steps: int | None = None,
        on_step: Callable[[Step], None] | None = None,
    ) -> None:
        self.t0 = t0
        self.clock = clock
        self.max_steps = max_steps
        self.on_step = on_step
        self.max_records = MAX_STEP_RECORDS
        self.count = 0  # steps seen, including merged ones
        self.steps: list[Step] = []
        self.manual = False
        self.methods: set[str] = set()
        self._lock = threading.Lock()
        self._step_start: float | None = None
        self._last_end: float | None = None
        self._wait = 0.0
        self._wait_cpu = 0.0
        self._h2d = 0.0
        self._waited = False  # a timed iterator wait was seen in the open step
        self._awaiting_forward = False
        #: thread CPU time at the last step end (between-steps method); None after a
        #: step whose input was timed at the iterator, where nobody needs it
        self._end_cpu: float | None = 0.0
        self._batch_size: int | None = None
        self.batches = 0
        self._cpu_read = 0.0  # CPU seconds of the waits whose CPU was read ...
        self._cpu_wall = 0.0  # ... and their wall seconds

    # -- events ---------------------------------------------------------------
    def batch_wait(self, start: float, end: float, cpu: float | None = 0.0, batch_size: int | None = None) -> None:
        """The loop was blocked from ``start`` to ``end`` getting a batch.

        ``cpu`` is the waiting thread's CPU seconds meanwhile, or None when it was
        not read: NOTE [ Sampled thread CPU ].
        """
        with self._lock:
            if self._step_start is None:
                self._step_start = start
            wall = end - start
            if cpu is None:
                cpu = wall * (self._cpu_read / self._cpu_wall) if self._cpu_wall > 0 else 0.0
            else:
                self._cpu_read += cpu
                self._cpu_wall += wall
            self._wait += wall
            self._wait_cpu += cpu
            self._waited = True
            self.batches += 1
            if batch_size is not None:
                self._batch_size = (self._batch_size or 0) + batch_size
            self.methods.add("iterator-next")

    def host_to_device(self, seconds: float) -> None:
        with self._lock:
            self._h2d += seconds

    def forward_start(self, t: float) -> None:
        """A model's forward pass began (first one after a step end counts)."""
        if not self._awaiting_forward and self._step_start is not None:
            return
        with self._lock:
            if self._step_start is None:
                self._step_start = t
            if self._awaiting_forward and not self._waited and self._last_end is not None:
                self._wait += max(0.0, t - self._last_end)
                if self._end_cpu is not None:
                    self._wait_cpu += max(0.0, time.thread_time() - self._end_cpu)
                self.methods.add("between-steps")
            self._awaiting_forward = False

    def optimizer_step(self, t: float) -> None:
        if not self.manual:
            self._close(t)

    def mark(self, t: float) -> None:
        """``Profile.step()``: the user delimits steps; optimizer events are ignored from now on."""
        if not self.manual:
            with self._lock:
                self.manual = True
                self.methods.add("manual")
                if self._step_start is None and self._last_end is None:
                    # The first mark closes a step that began when profiling began.
                    self._step_start = 0.0 + self.t0
        self._close(t)

    # -- internals ------------------------------------------------------------
    def _close(self, t: float) -> None:
        with self._lock:
            start = self._step_start if self._step_start is not None else self._last_end
            if start is None:
                start = t
            step = Step(
                index=self.count,
                start=start - self.t0,
                end=t - self.t0,
                data_wait=min(self._wait, t - start),
                data_wait_cpu=self._wait_cpu,
                h2d=self._h2d,
                batch_size=self._batch_size,
            )
            self.steps.append(step)
            self.count += 1
            if len(self.steps) > self.max_records:
                self._merge_older()
            self._step_start = t
            self._last_end = t
            self._wait = self._wait_cpu = self._h2d = 0.0
            # Only the between-steps method reads it; skipping the clock read after
            # an iterator-timed step keeps the per-step cost down (benchmarks/overhead.py).
            self._end_cpu = time.thread_time() if not self._waited else None
            self._waited = False
            self._batch_size = None
            self._awaiting_forward = True
            n = self.count
        if self.on_step is not None:
            self.on_step(step)
        if self.max_steps is not None and n >= self.max_steps:
            raise StopRun(f"stopped after {n} steps (--max-steps)")

    def _merge_older(self) -> None:
        """Merge pairs among the older half of the records (the first few, warm-up, stay as they are)."""
        keep_head = 8
        half = len(self.steps) // 2
        older, newer = self.steps[keep_head:half], self.steps[half:]
        merged = []
        for a, b in zip(older[0::2], older[1::2], strict=False):  # an odd last one is kept below
            merged.append(Step(
                index=a.index, start=a.start, end=b.end, data_wait=a.data_wait + b.data_wait,
                data_wait_cpu=a.data_wait_cpu + b.data_wait_cpu, h2d=a.h2d + b.h2d,
                batch_size=(a.batch_size or 0) + (b.batch_size or 0) or None, merged=a.merged + b.merged,
            ))
        if len(older) % 2:
            merged.append(older[-1])
        self.steps = self.steps[:keep_head] + merged + newer

    @property
    def waited_in_last_step(self) -> bool:
        return self._waited

    def method(self) -> str:
        if "manual" in self.methods and len(self.methods) == 1:
            return "manual"
        for m in ("iterator-next", "differential", "between-steps", "manual"):
            if m in self.methods:
                return m
        return ""
