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

NOTE [ Evaluation batches ]
A training script often evaluates between epochs: a second DataLoader read under
``torch.no_grad()``. Its waits are no training step's input, and booking them
into the next step would call a run data-starved for its validation pass (100
steps of 10 ms with 1 ms waits, then 50 validation batches waiting 20 ms each,
read as 50% input-bound). So a batch read with gradients off is reported with
``eval_wait``: it is counted apart (``eval_batches``, ``eval_seconds``) and the open
step starts again at the next batch read with gradients on, dropping what the
evaluation pass left in it, as Keras fit does with validation
(``frameworks/keras/fit.py``). When the user marks steps by hand (an inference
loop, gradients off throughout), these are the steps' own waits and count as such.

NOTE [ Garbage collection in a wait ]
A collection of Python's garbage collector pauses the thread that triggered it,
wherever the allocation that tipped it happened; when that is inside ``next()`` on
the loader, the pause would be booked as input time (0.2 s for one full
collection of the test suite's heap, enough to call a 2-second run data-starved).
The pause is the whole program's cost, not the input pipeline's, so Profile
registers ``on_gc`` in ``gc.callbacks`` and each collection becomes an event; the
fold takes the part of a collection that falls inside a wait (or a between-steps
gap, or an evaluation batch) out of it, wall and CPU both: it stays in the step
as compute. ``gc_seconds`` and ``gc_in_waits`` are reported as probes. A training
loop collects rarely (one collection per ~40 steps in benchmarks/overhead.py's
loop), so this adds no per-step work. A collection on another thread (the
sampler's, a pin-memory thread) during a wait is taken out too, though the wait
went on meanwhile; such collections are short and rare (README, Known limits).

NOTE [ Events now, steps on read ]
The event methods run inside the training loop, once or twice per step, where
the interpreter's caches are cold from the model's work: there a few lines of
Python cost several times what a micro-benchmark says (building a ``Step`` under
a lock measured ~7 us per step in a real loop, ~1.6 us in a tight one). So an
event only appends a plain tuple or float to ``_events`` (``list.append`` is
atomic under the GIL, so hooks on any thread may call it), and the events are
folded into ``Step`` records in batches, off the loop where possible: on the
sampler thread at every tick (``Sampler(on_tick=...)``: there the fold mostly
overlaps the loop's own GIL-free compute), when ``steps`` is read, and in the loop
only as a bound on memory, past ``MAX_EVENTS`` events, should no tick come. The fold
runs under a lock and removes only the events it folded, so events appended
meanwhile, from any thread, are kept.
Events are:
- ``(start, end, cpu, batch_size)``: a batch wait (``cpu`` None: not read);
- ``t`` (a number): a step ended at ``t``;
- ``(_END_CPU, t, thread_cpu)``: a step ended with no iterator wait seen in it
  (only between-steps needs the thread's CPU clock; None: not read);
- ``(_FORWARD, t, thread_cpu)``: the first forward pass after a step end;
- ``(_H2D, seconds)``: a host-to-device copy;
- ``(_MANUAL, t0)``: the first ``Profile.step()``;
- ``(_EVAL, start, end)``: a batch read with gradients off (NOTE [ Evaluation batches ]);
- ``(_GC, start, end)``: a garbage collection (NOTE [ Garbage collection in a wait ]);
- ``(_BEGIN, t, batch_size)``: the open step starts at ``t`` (None: where it did) and
  holds ``batch_size`` more samples (NOTE [ Waits measured after the run ]);
- ``(_PAUSE, (start, end, thread_cpu))``: loadprof's own work between two steps (the
  what-if replays), which a between-steps gap leaves out;
- ``(_STOP, (start, end, thread_cpu))``: the loop blocked while a pipeline's iterator it let go of was
  freed (tf.data waits for the iterator's threads), or a DataLoader started or stopped its
  workers (NOTE [ A loader's start and stop ] in frameworks/torch/hooks.py): input time, no
  batch; a ``_BEGIN`` after it (fit's next epoch) starts its step that much earlier, the stop
  its wait.

NOTE [ Waits measured after the run ]
Under Keras ``fit`` the batches are pulled inside the compiled function: no wait
to time while the step runs. The fit hooks tell the timeline where each step
begins and how many samples it holds (``step_begins``), and measure the input
waits after the run (frameworks/tensorflow/probe.py); ``measured_waits`` then adds each to
the record holding its step, whether that record still stands for one step or,
in a long run, for several merged ones. The hooks keep nothing of a ``Step``:
the timeline's records are its own.

NOTE [ Sampled thread CPU ]
When the training thread itself produces the batch (a DataLoader with
``num_workers=0``, a generator), its CPU time while the loop waits tells
computation (decoding, augmenting) from waiting (storage, sleeps): causes.py's
``wait_cpu_bound`` rule. Reading a thread's CPU clock is a system call with no
fast path (~0.5 us in a tight loop, ~3 us inside a training loop on the CI VM),
and two per step were a measurable part of the per-step cost
(benchmarks/overhead.py). So the clock is read around the waits of the first
``CPU_READ_ALL`` batches (or steps) and then of one in ``CPU_READ_EVERY``; the
waits whose CPU was not read are booked at the CPU-per-wall ratio of those that
were. With DataLoader worker processes the training thread's CPU is not what
loads the data (the workers' CPU, sampled by host.py, is), and it is not read.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from .records import EvalPass, Step

#: Step records kept in memory. Past this, older records are merged pairwise
#: (sums of time and waits are kept exact; per-step detail halves), so a run of
#: millions of steps stays at a few MiB.
MAX_STEP_RECORDS = 20_000

#: NOTE [ Sampled thread CPU ]
CPU_READ_ALL = 64
CPU_READ_EVERY = 16

#: Events after which the loop folds them itself, should the sampler not have
#: (NOTE [ Events now, steps on read ]): a bound of a few MiB.
MAX_EVENTS = 65_536

#: Evaluation passes kept with their times (NOTE [ Evaluation batches ]); past this
#: they are still counted in ``eval_batches``, ``eval_seconds``.
MAX_EVAL_PASSES = 10_000

#: steps whose loop time outside the model's step is kept for its median (``loop_outside``)
OUTSIDE_KEPT = 4096
#: ...and the fewest that give one
OUTSIDE_MIN = 5

_END_CPU, _FORWARD, _H2D, _MANUAL, _EVAL, _GC, _BEGIN, _PAUSE, _STOP = range(9)


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
    ) -> None:
        self.t0 = t0
        self.clock = clock
        self.max_steps = max_steps
        self.max_records = MAX_STEP_RECORDS
        self.count = 0  # steps seen, including merged ones
        self.manual = False
        self.methods: set[str] = set()
        self._events: list[Any] = []
        self._steps: list[Step] = []
        self._lock = threading.Lock()
        # Hot-path flags, written by the event methods:
        self._waited = False  # a batch wait was seen since the last step end
        self._awaiting_forward = True  # no forward pass seen since the last step end (or start)
        self._cpu_forward = True  # read the CPU clock at the next forward (it was read at the step end)
        # Fold state, owned by fold():
        self._folded = 0  # steps built so far
        self._step_start: float | None = None
        self._last_end: float | None = None
        self._wait = 0.0
        self._wait_cpu = 0.0
        self._h2d = 0.0
        self._stopped = self._stopped_cpu = 0.0  # iterators freed since the last step end
        self._fold_waited = False
        self._fold_awaiting = False
        self._end_cpu: float | None = 0.0
        self._batch_size: int | None = None
        self.batches = 0
        self.eval_batches = 0  # NOTE [ Evaluation batches ]
        self.eval_seconds = 0.0
        self._after_eval = False
        self.eval_passes: list[EvalPass] = []
        self._eval_open: EvalPass | None = None  # the pass the next evaluation batch extends
        self._cpu_read = 0.0  # CPU seconds of the waits whose CPU was read ...
        self._cpu_wall = 0.0  # ... and their wall seconds
        # NOTE [ Garbage collection in a wait ]
        self._pid = os.getpid()
        self._gc_start: float | None = None
        #: seconds of garbage collection so far, as they end (not waiting for the fold)
        self.gc_paused = 0.0
        self._gc_recent: list[tuple[float, float]] = []  # collections since the last wait or step end
        self.gc_collections = 0
        self.gc_seconds = 0.0
        self.gc_in_waits = 0.0  # seconds of collections taken out of waits
        self._pauses: list[tuple[float, float, float]] = []  # loadprof's own, since the last forward
        # the loop's own time outside the model's step, a step: ``loop_outside``
        self._outside: deque[float] = deque(maxlen=OUTSIDE_KEPT)

    # -- events (NOTE [ Events now, steps on read ]) ---------------------------
    def batch_wait(self, start: float, end: float, cpu: float | None = 0.0, batch_size: int | None = None) -> None:
        """The loop was blocked from ``start`` to ``end`` getting a batch.

        ``cpu`` is the waiting thread's CPU seconds meanwhile, or None when it was
        not read: NOTE [ Sampled thread CPU ].
        """
        self._events.append((start, end, cpu, batch_size))
        self._waited = True

    def pipeline_stop(self, start: float, end: float, cpu: float | None) -> None:
        """The loop was blocked from ``start`` to ``end`` (``cpu`` seconds of its thread's CPU;
        None: not read) while an iterator it had let go of was freed, or a loader started or
        stopped its workers: the input pipeline's time, no batch."""
        self._events.append((_STOP, (start, end, cpu)))

    def eval_wait(self, start: float, end: float) -> None:
        """A batch was read with gradients off: NOTE [ Evaluation batches ]."""
        self._events.append((_EVAL, start, end))

    def gc_pause(self, start: float, end: float) -> None:
        """A garbage collection paused the program from ``start`` to ``end``."""
        self._events.append((_GC, start, end))

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        """A ``gc.callbacks`` entry: NOTE [ Garbage collection in a wait ]."""
        if phase == "start":
            self._gc_start = self.clock()
        elif self._gc_start is not None:
            start, self._gc_start = self._gc_start, None
            if os.getpid() == self._pid:  # a forked loader worker inherits the callback: never recorded
                end = self.clock()
                self.gc_paused += end - start
                self.gc_pause(start, end)

    def profiler_pause(self, start: float, end: float, cpu: float) -> None:
        """loadprof worked from ``start`` to ``end`` between two steps, ``cpu`` seconds of this
        thread's CPU: none of it the loop's wait for its next batch."""
        self._events.append((_PAUSE, (start, end, cpu)))

    def host_to_device(self, seconds: float) -> None:
        self._events.append((_H2D, seconds))

    def forward_start(self, t: float) -> None:
        """A model's forward pass began (only the first one after a step end counts)."""
        if self._awaiting_forward:
            self._awaiting_forward = False
            # After a timed batch wait the forward pass does not count: no clock read.
            read = self._cpu_forward and not self._waited
            self._events.append((_FORWARD, t, time.thread_time() if read else None))

    def step_begins(self, t: float | None, batch_size: int | None = None) -> None:
        """The open step starts at ``t`` (None: where it does) and holds ``batch_size``
        more samples: NOTE [ Waits measured after the run ]. Ignored once steps are marked by hand."""
        if not self.manual:
            self._events.append((_BEGIN, t, batch_size))

    def optimizer_step(self, t: float) -> None:
        if not self.manual:
            self._end(t)

    def mark(self, t: float) -> None:
        """``Profile.step()``: the user delimits steps; optimizer events are ignored from now on."""
        if not self.manual:
            self.manual = True
            self._events.append((_MANUAL, self.t0))
        self._end(t)

    def _end(self, t: float) -> None:
        n = self.count
        if self._waited:
            self._events.append(t)
            self._waited = False
            self._cpu_forward = False
        else:
            # Only the between-steps method needs the thread's CPU clock at a step end:
            # NOTE [ Sampled thread CPU ].
            self._cpu_forward = n < CPU_READ_ALL or not n % CPU_READ_EVERY
            self._events.append((_END_CPU, t, time.thread_time() if self._cpu_forward else None))
        self._awaiting_forward = True
        n = self.count = n + 1
        if len(self._events) > MAX_EVENTS:
            self.fold()
        if self.max_steps is not None and n >= self.max_steps:
            raise StopRun(f"stopped after {n} steps (--max-steps)")

    # -- reading ----------------------------------------------------------------
    @property
    def steps(self) -> list[Step]:
        """The steps so far, oldest first (the timeline's own list: read, do not keep)."""
        self.fold()
        return self._steps

    def method(self) -> str:
        self.fold()
        if "manual" in self.methods and len(self.methods) == 1:
            return "manual"
        for m in ("iterator-next", "differential", "handoff", "between-steps", "manual"):
            if m in self.methods:
                return m
        return ""

    # -- folding --------------------------------------------------------------
    def fold(self) -> None:
        with self._lock:
            events = self._events
            n = len(events)
            if not n:
                return
            for e in events[:n]:
                if type(e) is not tuple:
                    self._close(e, None)
                elif len(e) == 4:
                    self._fold_wait(*e)
                else:
                    kind = e[0]
                    if kind == _END_CPU:
                        self._close(e[1], e[2])
                    elif kind == _FORWARD:
                        self._fold_forward(e[1], e[2])
                    elif kind == _H2D:
                        self._h2d += e[1]
                    elif kind == _EVAL:
                        self._fold_eval(e[1], e[2])
                    elif kind == _STOP:
                        start, end, cpu = e[1]
                        self._fold_wait(start, end, cpu, None, batch=False)
                    elif kind == _GC:
                        if len(self._gc_recent) >= 64:  # no wait nor step end for a long time: keep it bounded
                            del self._gc_recent[:32]
                        self._gc_recent.append((e[1], e[2]))
                        self.gc_collections += 1
                        self.gc_seconds += e[2] - e[1]
                    elif kind == _BEGIN:
                        self._fold_begin(e[1], e[2])
                    elif kind == _PAUSE:
                        if len(self._pauses) < 16:
                            self._pauses.append(e[1])
                    elif kind == _MANUAL:
                        self.methods.add("manual")
                        if self._step_start is None and self._last_end is None:
                            # The first mark closes a step that began when profiling began.
                            self._step_start = e[1]
            del events[:n]  # events appended meanwhile by another thread stay

    def _own_between(self, start: float, end: float) -> float:
        """Seconds from ``start`` to ``end`` less the collections and loadprof's own pauses in
        them: the loop's own code's, as it ran."""
        own = end - start - _inside(self._gc_recent, start, end)
        return max(0.0, own - _inside(((a, b) for a, b, _ in self._pauses), start, end))

    def loop_outside(self) -> float | None:
        """The loop's own time a step outside the model's step, the median over the steps
        whose batch waits were timed: from the step's start (the last optimizer step's end) to
        its first batch's request (its logging, metrics, a scheduler's step). What comes between
        the batch and the optimizer's step (a copy to the device, the loss) is the model's step's:
        a DataLoader's waits timed, no forward pass is. None with fewer such steps than
        ``OUTSIDE_MIN``."""
        self.fold()
        with self._lock:  # the sampler's thread may fold meanwhile
            kept = list(self._outside)
        return statistics.median(kept) if len(kept) >= OUTSIDE_MIN else None

    def _gc_within(self, start: float, end: float) -> float:
        """Seconds of the collections since the last wait or step end that fall in
        [start, end], which they leave (NOTE [ Garbage collection in a wait ])."""
        inside = _inside(self._gc_recent, start, end)
        self._gc_recent.clear()
        self.gc_in_waits += inside
        return inside

    def _fold_eval(self, start: float, end: float) -> None:
        if self.manual:
            self._fold_wait(start, end, None, None)
            return
        self.eval_batches += 1
        wait = end - start - (self._gc_within(start, end) if self._gc_recent else 0.0)
        self.eval_seconds += wait
        self._after_eval = True
        ev = self._eval_open
        if ev is not None:
            ev.end, ev.batches, ev.wait = end - self.t0, ev.batches + 1, ev.wait + wait
        elif len(self.eval_passes) < MAX_EVAL_PASSES:
            self._eval_open = EvalPass(start - self.t0, end - self.t0, 1, wait)
            self.eval_passes.append(self._eval_open)

    def _fold_wait(self, start: float, end: float, cpu: float | None, batch_size: int | None,
                   batch: bool = True) -> None:
        if not self._fold_waited and not self._after_eval and self._last_end is not None and not self.manual:
            self._outside.append(self._own_between(self._last_end, start))
        if self._after_eval:
            # The first training batch after an evaluation pass: the step starts here.
            self._after_eval = False
            if self._eval_open is not None:  # the pass ran until training asked for a batch again
                self._eval_open.end = max(self._eval_open.end, start - self.t0)
                self._eval_open = None
            self._step_start = start
            self._wait = self._wait_cpu = self._h2d = 0.0
            self._stopped = self._stopped_cpu = 0.0
            self._batch_size = None
        if self._step_start is None:
            self._step_start = start
        wall = end - start
        if self._gc_recent:
            paused = self._gc_within(start, end)
            wall -= paused
            if cpu is not None:
                cpu = max(0.0, cpu - paused)  # a collection is CPU work
        self._wait += wall
        wall_cpu = self._cpu_of(wall, cpu)
        self._wait_cpu += wall_cpu
        if not batch:
            self._stopped += wall
            self._stopped_cpu += wall_cpu
        self._fold_waited = True
        self.batches += batch
        if batch_size is not None:
            self._batch_size = (self._batch_size or 0) + batch_size
        if batch:  # an iterator's stop under fit leaves its waits measured as they are
            self.methods.add("iterator-next")

    def _fold_begin(self, t: float | None, batch_size: int | None) -> None:
        if t is not None:
            # What came since the last step end (a validation pass, epoch-end callbacks) is no step's,
            # but an iterator freed meanwhile (fit's epoch end) is: the step waited for it, as if just before
            self._step_start = t - self._stopped
            self._wait, self._wait_cpu, self._h2d = self._stopped, self._stopped_cpu, 0.0
            self._batch_size = None
        if batch_size is not None:
            self._batch_size = (self._batch_size or 0) + batch_size

    def _fold_forward(self, t: float, cpu: float | None) -> None:
        if self._step_start is None:
            self._step_start = t
        if self._fold_awaiting and not self._fold_waited and self._last_end is not None:
            gap = max(0.0, t - self._last_end)
            gap_cpu = None if cpu is None or self._end_cpu is None else max(0.0, cpu - self._end_cpu)
            if self._gc_recent:
                paused = self._gc_within(self._last_end, t)
                gap = max(0.0, gap - paused)
                if gap_cpu is not None:
                    gap_cpu = max(0.0, gap_cpu - paused)
            for a, b, own_cpu in self._pauses:
                inside = max(0.0, min(b, t) - max(a, self._last_end))
                gap = max(0.0, gap - inside)
                if gap_cpu is not None and inside:
                    gap_cpu = max(0.0, gap_cpu - own_cpu * inside / max(b - a, 1e-9))
            self._wait += gap
            self._wait_cpu += self._cpu_of(gap, gap_cpu)
            self.methods.add("between-steps")
        self._pauses.clear()
        self._fold_awaiting = False

    def _cpu_of(self, wall: float, cpu: float | None) -> float:
        """CPU seconds of a wait: as read, or at the ratio of the waits that were read."""
        if cpu is None:
            return wall * (self._cpu_read / self._cpu_wall) if self._cpu_wall > 0 else 0.0
        self._cpu_read += cpu
        self._cpu_wall += wall
        return cpu

    def _close(self, t: float, cpu: float | None) -> None:
        start = self._step_start if self._step_start is not None else self._last_end
        if start is None:
            start = t
        self._steps.append(Step(
            index=self._folded,
            start=start - self.t0,
            end=t - self.t0,
            data_wait=min(self._wait, t - start),
            data_wait_cpu=self._wait_cpu,
            h2d=self._h2d,
            batch_size=self._batch_size,
        ))
        self._folded += 1
        if len(self._steps) > self.max_records:
            self._merge_older()
        self._step_start = t
        self._last_end = t
        self._wait = self._wait_cpu = self._h2d = 0.0
        self._stopped = self._stopped_cpu = 0.0
        self._end_cpu = cpu
        self._fold_waited = False
        self._batch_size = None
        self._fold_awaiting = True
        self._after_eval = False
        self._eval_open = None
        # Collections folded so far ran before this step end, in its compute: no wait's
        # (NOTE [ Garbage collection in a wait ]).
        self._gc_recent.clear()

    def measured_waits(self, waits: Iterable[tuple[int, float, float]], method: str) -> None:
        """Input waits measured after the run: (step index, seconds, CPU seconds), by
        ascending index; each joins the record holding its step, up to that record's
        duration (NOTE [ Waits measured after the run ])."""
        self.fold()
        with self._lock:
            steps = self._steps
            i = 0
            for index, wait, cpu in waits:
                while i < len(steps) and steps[i].index + steps[i].merged <= index:
                    i += 1
                if i == len(steps):
                    break
                step = steps[i]
                if step.index > index:
                    continue  # a step no record holds
                kept = min(wait, max(0.0, step.end - step.start - step.data_wait))
                step.data_wait += kept
                if kept > 0:
                    step.data_wait_cpu += cpu * kept / wait
            self.methods.add(method)

    def _merge_older(self) -> None:
        """Merge pairs among the older half of the records (the first few, warm-up, stay as they are)."""
        keep_head = 8
        half = len(self._steps) // 2
        older, newer = self._steps[keep_head:half], self._steps[half:]
        merged = []
        for a, b in zip(older[0::2], older[1::2], strict=False):  # an odd last one is kept below
            merged.append(Step(
                index=a.index, start=a.start, end=b.end, data_wait=a.data_wait + b.data_wait,
                data_wait_cpu=a.data_wait_cpu + b.data_wait_cpu, h2d=a.h2d + b.h2d,
                batch_size=(a.batch_size or 0) + (b.batch_size or 0) or None, merged=a.merged + b.merged,
            ))
        if len(older) % 2:
            merged.append(older[-1])
        self._steps = self._steps[:keep_head] + merged + newer


def _inside(spans: Iterable[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of the (a, b) spans that fall in [start, end]."""
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in spans)
