"""When a run's what-if replays run, and their place in it (NOTE [ What-if replays ] in
whatif.py): between two steps once the step is held, every rank of a job together, the
changes the advice at the end adds topped up then, the frameworks that replay after the
run (tf.data's) at its end; and the pause they made taken out of the run's times.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .heap import PAGE, two_states
from .lines import first_line, note
from .metrics import Metrics, epoch_steps, faults_per_step, warmup_count
from .records import Run, WhatIf
from .samplers.node import world_size
from .settings import Settings
from .timeline import Timeline


@dataclass
class ReplayPlace:
    """What the replays need of the profiled run, given once it started."""

    settings: Settings
    run: Run
    t0: float  # the run's start (perf_counter)
    timeline: Timeline | None
    job: Any  # a torchrun job's part (jobs/__init__.py), or None
    hooks: Callable[[], dict[str, Any]]  # the framework hooks installed so far, by name
    run_so_far: Callable[[], Run]
    interrupted: Callable[[], bool]  # a signal came (it is held until the report is written)
    #: a host reading asked for now, and the times of those that came (samplers/hostproc.py)
    mark: Callable[[], None] = lambda: None
    marks: Callable[[], list[float]] = list


class WhatIfRun:
    """The replays of one run: run once, between two steps or at the end."""

    def __init__(self, place: ReplayPlace) -> None:
        self.place = place
        self.measured = False  # the what-if replays ran (or were found impossible)
        self.topped = False  # they ran between two steps, the capture held for the end
        #: the replays run the model alone on its held batch, this measured wait a step added
        #: (its loader cannot be read again: whatif.model_only); None: beside its loader
        self.held_wait: float | None = None
        self.pause: tuple[float, float] | None = None  # when they ran mid-run: seconds since the start

    def at_end(self) -> None:
        """At the run's end: the replays not yet run, then the captured step let go."""
        try:
            self.measure(self.place.run, end=True)
        finally:
            self.measured = True
            capture = self.capture()
            if capture is not None:
                capture.drop()  # the script's model and loader, let go

    def mid_run(self, hooks: Any, deferred: bool = False) -> None:
        """The what-if replays between two steps, once the step is held (NOTE [ What-if
        replays ] in whatif.py): the hooks inert meanwhile, and the pause taken out of the
        run's times at the end (``close_pause``). Where another framework's loader fed the
        step, when it says (``ReplaySource.later``: Ray Data's at an iteration's end)."""
        capture = self.capture()
        if capture is not None and capture.loader is None:
            source = self._replay_source()
            if source is not None and not deferred and source.later(lambda: self.mid_run(hooks, deferred=True)):
                return
            capture.loader = source
        t0, cpu0 = time.perf_counter(), time.thread_time()
        self.place.mark()  # the run's readings closed where the pause begins (its reading after t0)
        try:
            with hooks.suspended():
                hooks.check_items()  # the plan's cache and offline copies need it
                hooks.fill_stages()  # and the stage table as far as it goes, not as last filled
                run = self.place.run_so_far()
                run.environment = dataclasses.replace(run.environment, intra_op_threads=intra_op_threads())
                self.measure(run)
        except Exception as err:  # NOTE [ Never break the run ]
            self.place.run.whatif_skipped = f"the replays failed ({type(err).__name__}: {first_line(err)})"
        finally:
            t1 = time.perf_counter()
            self.place.mark()  # and the pause's where it ends: the next reading is the run's alone
            self.pause = (t0 - self.place.t0, t1 - self.place.t0)
            if self.place.timeline is not None:  # a loop timed between steps: the pause is no wait of its
                self.place.timeline.profiler_pause(t0, t1, time.thread_time() - cpu0)

    def capture(self) -> Any:
        """The torch hooks' held step (frameworks/torch/stepcapture.py), or None."""
        hooks = self.place.hooks().get("torch")
        return getattr(hooks, "capture", None)

    def measure(self, run: Run, end: bool = False) -> None:
        """NOTE [ What-if replays ] in whatif.py: ``run`` is the run so far, to plan from;
        at the ``end``, the frameworks that replay after the run (``_measure_after``) too."""
        capture = self.capture()
        if self.measured:
            return
        if end and self.topped:
            self._top_up(capture, run)
            return
        if end and (capture is None or not capture.ready) and (self._measure_after(run) or capture is None):
            self.measured = True
            if capture is not None:
                capture.drop()
            return
        if capture is None:
            return
        done = True  # False: nothing to measure yet; the run's end plans again
        try:
            if not capture.ready:
                from .frameworks.torch.stepcapture import CAPTURE_STEP

                self.place.run.whatif_skipped = capture.problem or (
                    "no step was held to replay (the model is looked for after the first "
                    f"{CAPTURE_STEP} optimizer steps)")
                return
            from .advice import recommend
            from .diagnosis import diagnose
            from .frameworks.torch.replay import measure, step_unsafe, unsafe
            from .whatif import TOP_UP_SHARE, Interrupted, model_only, plan

            if capture.loader is None:  # batches from another framework's loader, read again beside the step
                capture.loader = self._replay_source()
            diagnosis = diagnose(run)
            changes = plan(recommend(run, diagnosis))
            if self.place.job is not None:  # the ranks replay together, once (NOTE [ What-if replays ])
                self._replay_together(capture, run, diagnosis, changes, end)
                return
            if not changes:
                done = False
                return
            ranks = self.place.job.ctx.world_size if self.place.job is not None else world_size()
            trained = diagnosis.metrics.loader
            not_read = ""  # why the loader is not read again where the model alone is replayed
            why = unsafe(capture, ranks, reread=trained is not None and trained.iterations >= 2)
            if why:
                if not end and not unsafe(capture, ranks, reread=True):
                    done = False  # a stream read once so far: by the run's end it may have been read again
                    self.place.run.whatif_skipped = why
                    return
                alone = [] if step_unsafe(capture, ranks) else model_only(changes, diagnosis.metrics.wait_fraction)
                self.place.run.whatif_skipped = why
                if not alone:
                    return
                if not end:  # at the run's end: a loader working ahead (Ray's, tf.data's) would share the cores
                    done = False
                    return
                not_read = why
                # the loader not read again: the model's own changes, alone on its held batch
                changes, self.held_wait = alone, diagnosis.metrics.wait_per_step
            budget = self.place.settings.what_if
            if self.place.settings.print_report:
                note(f"measuring {len(changes)} advised change(s) on the job's own step, at most "
                      f"{budget:.0f} s (--what-if 0 skips it)")
            if not end:  # a part kept for the changes the advice at the end may add
                budget *= 1 - TOP_UP_SHARE
            t0 = time.perf_counter()
            faults, state = self._run_faults(diagnosis.metrics)
            try:
                self.place.run.whatif, skipped = measure(
                    capture, changes, loop_compute(run, diagnosis.metrics), budget,
                    self.place.interrupted, self.held_wait, run_faults=faults, state_faults=state,
                    own_at_most=own_at_most(self.place.timeline, diagnosis))
                self.place.run.whatif_skipped = skipped or not_read
            except Interrupted:
                self.place.run.whatif_skipped = "stopped by a signal before the changes were measured"
            except Exception as err:  # the user's dataset or model failed outside the run
                self.place.run.whatif_skipped = f"the replays failed ({type(err).__name__}: {first_line(err)})"
            self.place.run.whatif_seconds = time.perf_counter() - t0
            if not end and self.place.run.whatif:
                done, self.topped = False, True  # held: the advice at the end may name more
        finally:
            if done:
                self.measured = True
                capture.drop()

    def _run_faults(self, m: Metrics) -> tuple[float | None, float | None]:
        """The run's page faults a step, as they are and as its heap's state: the latter as the
        first replays found them, kept for the advice (later ones count steps after replays
        that may have moved the heap) less its memory's growth (first touches of memory it
        keeps: no state of its heap)."""
        if self.place.run.whatif_run_faults is None and m.faults_per_step is not None:
            self.place.run.whatif_run_faults = max(0.0, m.faults_per_step - (m.rss_growth_per_step or 0.0) / PAGE)
        return m.faults_per_step, self.place.run.whatif_run_faults

    def _replay_source(self) -> Any:
        """A loader of another framework that fed the step and can be read again
        (``replay.ReplaySource``: Ray Data's), or None."""
        for hooks in self.place.hooks().values():
            get = getattr(hooks, "replay_source", None)
            source = get() if get is not None else None
            if source is not None:
                return source
        return None

    def _replay_together(self, capture: Any, run: Run, diagnosis: Any, changes: list[Any], end: bool) -> None:
        """A job's replays (NOTE [ What-if replays ] in whatif.py): every rank at the same step,
        the union of their plans, the job's all-reduce stood in for; at the run's end, none
        (the ranks no longer step together)."""
        from .frameworks.torch.replay import loader_unsafe, measure, step_unsafe
        from .jobs.replays import Plan, agree, join
        from .whatif import Interrupted

        job = self.place.job
        if end:
            if changes and not self.place.run.whatif_skipped:
                self.place.run.whatif_skipped = ("a job's ranks replay their step together between two steps; "
                                           "the run ended before")
            return
        trained = diagnosis.metrics.loader
        why = step_unsafe(capture, job.ctx.world_size, together=True) or loader_unsafe(
            capture, reread=trained is not None and trained.iterations >= 2)
        waited = job.collective_per_step(run, diagnosis.metrics.warmup_steps)
        t0 = time.perf_counter()
        agreed = agree(job.exchange, Plan(changes, why, waited,
                                          diagnosis.metrics.step_time_mean))
        if agreed.why or not agreed.changes:
            self.place.run.whatif_skipped = agreed.why
            self.place.run.whatif_seconds = time.perf_counter() - t0
            return
        budget = self.place.settings.what_if  # no top-up at the end: the whole budget now
        if self.place.settings.print_report and job.ctx.rank == 0:
            note(f"measuring {len(agreed.changes)} advised change(s) on every rank's own step together, at most "
                  f"{budget:.0f} s (--what-if 0 skips it)")
        # this rank's wait for the others is not the job's: the all-reduce alone stands in
        own = loop_compute(run, diagnosis.metrics) - (waited or 0.0) + agreed.collective
        faults, state = self._run_faults(diagnosis.metrics)
        try:
            self.place.run.whatif, self.place.run.whatif_skipped = measure(
                capture, agreed.changes, own, budget, lambda: False, slice_s=agreed.slice_s,
                collective=agreed.collective, run_faults=faults, state_faults=state)
        except Interrupted:
            self.place.run.whatif_skipped = "stopped by a signal before the changes were measured"
        except Exception as err:  # the user's dataset or model failed outside the run
            self.place.run.whatif_skipped = f"the replays failed ({type(err).__name__}: {first_line(err)})"
        late = join(job.exchange, max(5.0, budget / 2))
        if late:
            self.place.run.limitations.append(f"what-if: this rank went on while {late}: it waited in the next "
                                        "collective instead")
        self.place.run.whatif_seconds = time.perf_counter() - t0

    def _top_up(self, capture: Any, run: Run) -> None:
        """At the run's end, the advised changes the replays between two steps did not measure
        (the verdict moved since: a compute-bound end advises mixed precision, say), in the
        budget they left; the capture let go after."""
        from .advice import recommend
        from .diagnosis import diagnose
        from .frameworks.torch.replay import measure
        from .whatif import MIN_TOP_UP_S, model_only, plan

        self.measured = True
        try:
            left = self.place.settings.what_if - self.place.run.whatif_seconds
            done = {w.change for w in self.place.run.whatif}
            diagnosis = diagnose(run)
            changes = [c for c in plan(recommend(run, diagnosis)) if c.describe() not in done]
            if self.held_wait is not None:  # as the replays between two steps: the model alone
                changes = model_only(changes, diagnosis.metrics.wait_fraction)
            if not changes or left < MIN_TOP_UP_S:
                return
            t0 = time.perf_counter()
            faults, state = self._run_faults(diagnosis.metrics)
            try:
                found, _ = measure(capture, changes, loop_compute(run, diagnosis.metrics), left,
                                   self.place.interrupted, self.held_wait, run_faults=faults, state_faults=state,
                                   own_at_most=own_at_most(self.place.timeline, diagnosis))
                # each against its own replay of the run's settings; the model alone measured once
                self.place.run.whatif.extend(w for w in found if w.change not in done)
            except Exception:  # the script's data gone with its end: the earlier figures stand
                pass
            self.place.run.whatif_seconds += time.perf_counter() - t0
        finally:
            capture.drop()

    def _measure_after(self, run: Run) -> bool:
        """The replays of the frameworks whose adapters measure their changes after the run
        (NOTE [ What-if replays under Keras fit ] in frameworks/tensorflow/whatif.py);
        False where none measured anything or said why not."""
        from .frameworks import by_name

        budget = self.place.settings.what_if
        hooked = dict(self.place.hooks())
        replays: list[tuple[Any, Callable[..., tuple[list[WhatIf], str]]]] = []
        for name, hooks in hooked.items():
            adapter = by_name(name)
            if adapter is not None and adapter.whatif:
                replays.append((hooks, adapter.part("whatif")))
        if not budget or not replays or run.whatif:
            return False
        from .advice import recommend
        from .diagnosis import diagnose
        from .whatif import Interrupted

        recs = recommend(run, diagnose(run))
        t0 = time.perf_counter()
        for hooks, replay in replays:
            try:
                found, why = replay(hooks, run, recs, budget, self.place.interrupted)
            except Interrupted:
                found, why = [], "stopped by a signal before the changes were measured"
            except Exception as err:  # the user's pipeline or model failed outside the run
                found, why = [], f"the replays failed ({type(err).__name__}: {first_line(err)})"
            self.place.run.whatif.extend(found)
            if why and not self.place.run.whatif_skipped:
                self.place.run.whatif_skipped = why
            if found or why:
                break
        self.place.run.whatif_seconds = time.perf_counter() - t0
        return bool(self.place.run.whatif or self.place.run.whatif_skipped)

    def close_pause(self) -> None:
        """The replays' pause taken out of the run's times, as if the next step had begun
        after it: later steps, samples, evaluations and loaders' iteration starts moved back
        by its length, samples
        inside it dropped (they read the replays, not the run)."""
        if self.pause is None:
            return
        a, b = self.pause
        d = b - a
        self.place.run.whatif_paused_at_s = a
        b_read = b + 2 * self.place.settings.interval  # a reading just after still covers part of the pause
        # Where the readings asked for at its two ends came (within a tick of each), those
        # bound it: the first closes the run's readings before it (with the workers reaped
        # by then), the second the pause's, and the run's after it are kept from the next
        # on (the workers of an epoch that ended with the pause are reaped just after it).
        tick = self.place.settings.interval
        marks = self.place.marks()
        first = [t for t in marks if a <= t <= a + tick]
        last = [t for t in marks if b <= t <= b + tick]
        a_drop, b_drop = (first[0] + 1e-9, last[0]) if first and last else (a, b_read)
        run = self.place.run
        moved = heap_moved(run, a, b, b_read)  # on the run's own times, the pause still in them
        if moved:
            run.limitations.append(moved)
        for step in run.steps:
            if step.end >= b:
                step.end -= d
                if step.start >= b:
                    step.start -= d
        for ev in run.evaluations:
            if ev.start >= b:
                ev.start -= d
                ev.end -= d
        for info in run.loaders:  # an epoch's start is found among the steps by its time
            info.iteration_starts_s = [t - d if t >= b else t for t in info.iteration_starts_s]
        if self.place.job is not None:  # the collectives' waits are timed on the same clock
            self.place.job.take_out(a, b)
        run.host_samples = [h for h in run.host_samples if not a_drop <= h.t <= b_drop]
        run.gpu_samples = [g for g in run.gpu_samples if not a <= g.t <= b_read]
        for h in run.host_samples:
            h.t -= d if h.t > b else 0.0
        for g in run.gpu_samples:
            g.t -= d if g.t > b else 0.0
        run.duration -= d


def heap_moved(run: Run, a: float, b: float, clear: float) -> str | None:
    """Where the steps before the replays' pause (``a`` to ``b``) and those after it ran in
    different states of glibc's heap, the one faulting in again what its step freed and the
    other not (``heap.two_states``), the line that says
    so; else None. The replays allocate, and where the process's blocks sit decides the state
    (docs/limits.md). Each side from the host readings wholly inside its judged steps (the
    run's warm-up left out; after the pause, from ``clear``, the first reading clear of it)."""
    if run.environment.malloc != "glibc":  # another allocator, or glibc's thresholds set already
        return None
    steps = run.steps[warmup_count(sum(s.merged for s in run.steps)):]

    def per_step(lo: float, hi: float) -> float | None:
        side = [s for s in steps if s.start >= lo and s.end <= hi]
        if len(side) < 2:
            return None
        read = [h for h in run.host_samples if h.t - h.window >= lo and h.t <= hi]
        return faults_per_step(read, side[-1].end - side[0].start, sum(s.merged for s in side))

    if not steps:
        return None
    before = per_step(steps[0].start, a)
    after = per_step(clear, steps[-1].end)
    if before is None or after is None:
        return None
    if not two_states(before, after):
        return None
    first = next((s.index for s in steps if s.start >= b), None)
    at = f" (from step {first})" if first is not None else ""
    return (f"the steps after the what-if replays{at} took {after:,.0f} page faults a step, {before:,.0f} before "
            "them: the replays' allocations moved glibc's heap (docs/limits.md), and the judged steps hold both "
            "states (MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ set take both away)")


#: a step whose time outside its waits is this many times the median step's, where such
#: steps are at most this share of them, held a one-time stall (a full garbage collection
#: of a heap grown by the imports), not the loop's own code between two steps
STALL_FACTOR, STALL_SHARE = 5.0, 0.05


def loop_compute(run: Run, m: Metrics) -> float:
    """The run's step time outside its waits for batches, a step, over the judged steps
    less those an epoch began in (the last iterator's workers stopped and the next one's
    started there: one-time costs a replay measures apart, as its start) and a one-time
    stall (``STALL_FACTOR``: in the mean it would be spun in every replayed step): the
    replays read what their own step lacks of the loop's (its code between two steps) from it."""
    steps = epoch_steps(run, m.warmup_steps)[1]
    n = sum(s.merged for s in steps)
    if not n:
        return m.compute_per_step
    own = [((s.duration - s.data_wait - s.h2d) / s.merged, s.merged) for s in steps]
    limit = STALL_FACTOR * statistics.median(t for t, _ in own)
    stalled = sum(k for t, k in own if t > limit)
    if 0 < stalled <= STALL_SHARE * n:
        own, n = [(t, k) for t, k in own if t <= limit], n - stalled
    return max(0.0, sum(t * k for t, k in own) / n)


def own_at_most(timeline: Timeline | None, diagnosis: Any) -> float | None:
    """On a host other processes crowd (the diagnosis' contention), the loop's time outside
    the model's step as it ran, from the optimizer's step to the next batch's request
    (``Timeline.loop_outside``), else None. There the run's step less the replayed one can be
    a stall rather than code: a loop that waits on storage in its main thread lets the model's
    intra-op threads sleep, and waking them waits for a busy core, where a replay's steps back
    to back keep them awake. Only the time outside the step is then stood in for (a costly
    loss function, inside it, is not)."""
    if timeline is None or not diagnosis.contended():
        return None
    return timeline.loop_outside()


def intra_op_threads() -> int | None:
    """PyTorch's intra-op threads now, where the script imported it."""
    torch = sys.modules.get("torch")
    get = getattr(torch, "get_num_threads", None)
    try:
        return int(get()) if get is not None else None
    except (RuntimeError, TypeError, ValueError):
        return None
