"""``Collector``: what measures one profiled run, started and stopped seam by seam.

``Profile`` (session.py) owns what a run is asked for and what becomes of it: the
report, the files, the trackers, the live view. The collector owns what measures it:
the timeline of steps, NVML and the host sampler, the processes outside the job, the
framework hooks, a torchrun job's collective hooks, the fixes ``apply`` installs and
the what-if replays. ``start()`` begins each in its own guard; ``stop()`` ends each in
its own guard and returns the ``Run`` (NOTE [ Never break the run ] in session.py).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import platform
import socket
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import psutil

from . import __version__
from .cpufeatures import cpu_features
from .heap import allocator, fault_seconds
from .instrument import FrameworkWatch, Hooks, ProcessHooks
from .lines import first_line
from .oom import classify as classify_oom
from .oom import record_line
from .records import Environment, Run
from .samplers import HostProcess, Neighbours, NvmlSource, Sampler, usable_cores
from .samplers.node import local_world_size, shm_space
from .settings import Settings
from .signals import HeldSignals, SafePoint, Terminated
from .timeline import StopRun, Timeline
from .whatifrun import ReplayPlace, WhatIfRun, intra_op_threads

if TYPE_CHECKING:
    from .fixes.applier import Applier
    from .jobs import Job

T = TypeVar("T")


def guard(run: Run, what: str, fn: Callable[[], T], undo: Callable[[], object] | None = None) -> T | None:
    """Run one seam: NOTE [ Never break the run ] in session.py. A failure is a line in
    ``run.limitations``; ``undo`` closes what the seam did start."""
    try:
        return fn()
    except Exception as err:
        run.limitations.append(f"{what} ({type(err).__name__}: {first_line(err)})")
        if undo is not None:
            try:
                undo()
            except Exception as again:
                run.limitations.append(f"... and could not undo it ({type(again).__name__}: {again})")
        return None


def fault(faults: frozenset[str], seam: str) -> None:
    """The test seam of NOTE [ Never break the run ] in session.py: ``seam`` fails where a
    test named it in ``faults``."""
    if seam in faults:
        raise RuntimeError(f"injected fault: {seam}")


class Collector:
    """The measuring parts of a ``Profile``: see the module doc. ``faults``: the test
    seams that fail (NOTE [ Never break the run ] in session.py)."""

    def __init__(self, settings: Settings, run: Run, applier: Applier | None, faults: frozenset[str]) -> None:
        self.settings = settings
        self.run = run
        self.applier = applier
        self.faults = faults
        self.pid = os.getpid()
        self.t0 = 0.0
        self.timeline: Timeline | None = None
        self.watch: FrameworkWatch | None = None
        self.sampler: Sampler | None = None
        self.nvml: NvmlSource | None = None
        self.host: HostProcess | None = None
        self.neighbours: Neighbours | None = None
        self.safepoint: SafePoint | None = None
        self.whatif: WhatIfRun | None = None  # the what-if replays' place in the run (whatifrun.py)
        self.job: Job | None = None  # a torchrun job's part (None: a single process)
        #: signals held from the stop to the report's end (a replay starts with none pending)
        self.held: HeldSignals | None = None
        #: What ``apply`` changed, one line each, once stopped.
        self.applied: list[str] = []

    def guard(self, what: str, fn: Callable[[], T], undo: Callable[[], object] | None = None) -> T | None:
        return guard(self.run, what, fn, undo)

    # -- start ----------------------------------------------------------------
    def start(self) -> None:
        self.t0 = time.perf_counter()
        self.run.started_at = time.time()
        self.run.environment = self.guard("could not read the machine's facts", _environment) or Environment()
        timeline = self.timeline = Timeline(self.t0, max_steps=self.settings.max_steps)
        self.guard("could not join the job's report (each rank reports alone)", self._start_job)
        self.nvml = NvmlSource()
        if self.settings.gpu:
            self.guard("NVML could not start: no GPU samples", self.nvml.start)
            self.run.environment.gpu_status = self.nvml.status
            self.run.environment.gpus = list(self.nvml.gpus)
        else:
            self.run.environment.gpu_status = "unavailable (GPU sampling turned off)"
        self.guard("the sampler could not start: no host or GPU samples", self._start_sampler,
                   undo=self._close_sampler)
        self.neighbours = self.guard("the processes outside the job are not named", lambda: Neighbours(self.pid))
        self.whatif = WhatIfRun(ReplayPlace(
            self.settings, self.run, self.t0, timeline, self.job,
            lambda: self.watch.hooks if self.watch is not None else {}, self.run_so_far,
            lambda: self.held is not None and self.held.pending is not None,
            lambda: self.host.mark() if self.host is not None else None,
            lambda: list(self.host.marks) if self.host is not None else []))
        self.watch = FrameworkWatch(self._make_hooks, on_error=self.run.limitations.append)
        self.guard("framework hooks could not be installed: no steps seen", self.watch.start)
        if self.applier is not None:  # after the watch: NOTE [ Import watch order ] in fixes/applier.py
            self.applier.start(self.snapshot)
        # NOTE [ Garbage collection in a wait ] in timeline.py; NOTE [ Signals during a collection ] in signals.py
        self.safepoint = SafePoint(timeline.on_gc).install()
        gc.callbacks.append(timeline.on_gc)

    def _start_job(self) -> None:
        """Under torchrun (2+ ranks): NOTE [ Merging a job's reports ] in jobs/exchange.py."""
        from .jobs.context import JobContext

        ctx = JobContext.from_env()
        if ctx is None:
            return
        from .jobs import Job

        timeline = self.timeline
        job = Job(ctx, self.t0)
        job.start(progress=lambda: timeline.count if timeline is not None else 0)
        self.job = job

    def _start_sampler(self) -> None:
        assert self.timeline is not None and self.nvml is not None
        host = self.host = HostProcess(pid=self.pid, helper=self.settings.host_helper)
        sources = (self.nvml, host) if self.settings.gpu else (host,)
        self.sampler = Sampler(
            interval=self.settings.interval,
            sources=sources,
            max_samples=self.settings.max_samples,
            t0=self.t0,
            on_tick=self.timeline.fold,
        )
        self.sampler.start()
        fault(self.faults, "sampler_start")

    def _close_sampler(self) -> None:
        """Undo a sampler start that failed part way: nothing of it left running."""
        sampler, self.sampler = self.sampler, None
        if sampler is not None and sampler.running:
            sampler.stop()
        for source in (self.host, self.nvml):
            if source is not None:
                source.close()

    def _make_hooks(self, name: str, factory: type) -> Hooks:
        assert self.timeline is not None
        fault(self.faults, "hooks")
        hooks: Hooks = factory(self.timeline, self.run)
        if isinstance(hooks, ProcessHooks):
            hooks.settings = self.settings
        if getattr(hooks, "capture", None) is not None:
            if not self.settings.what_if:
                hooks.capture = None  # type: ignore[attr-defined]  # nothing to replay: nothing held
            else:
                from .whatif import replay_step

                whatif = self.whatif
                hooks.replay = lambda: whatif.mid_run(hooks) if whatif is not None else None  # type: ignore[attr-defined]
                hooks.replay_step = replay_step(self.settings.max_steps)  # type: ignore[attr-defined]
        return hooks

    # -- while it runs --------------------------------------------------------
    def mark(self) -> None:
        """A step's end marked by hand (``Profile.step``)."""
        if self.timeline is not None:
            self.timeline.mark(time.perf_counter())

    def snapshot(self) -> Run:
        """A copy of the run so far, for live tuning to read (NOTE [ Live loader tuning ] in frameworks/torch/livetune.py)."""
        assert self.timeline is not None
        return Run(environment=dataclasses.replace(self.run.environment),
                   steps=[dataclasses.replace(step) for step in self.timeline.steps],
                   host_samples=list(self.sampler.host_samples) if self.sampler else [])

    def live_snapshot(self) -> Run:
        """The run so far for the live view's running verdict and a Profile inside this one:
        copies of the lists, read on their thread (the records in them are not changed while
        the run goes on)."""
        timeline, sampler = self.timeline, self.sampler
        assert timeline is not None
        return Run(environment=self.run.environment, steps=list(timeline.steps),
                   host_samples=sampler.host_samples if sampler else [],
                   gpu_samples=sampler.gpu_samples if sampler else [],
                   loaders=list(self.run.loaders), data_wait_method=timeline.method(),
                   amp_in_use=self.run.amp_in_use)

    def run_so_far(self) -> Run:
        """A copy of the run until now: its steps and readings."""
        assert self.timeline is not None
        sampler, timeline = self.sampler, self.timeline
        return dataclasses.replace(
            self.run, steps=[dataclasses.replace(s) for s in timeline.steps], data_wait_method=timeline.method(),
            duration=time.perf_counter() - self.t0,
            host_samples=list(sampler.host_samples) if sampler else [],
            gpu_samples=list(sampler.gpu_samples) if sampler else [])

    def workers_report(self) -> object | None:
        """The merged report of a job whose ranks ran in processes the script's library started
        (NOTE [ Ray Train's workers profiled ] in frameworks/raytrain/worker.py), or None."""
        for hooks in list(self.watch.hooks.values()) if self.watch is not None else []:
            find = getattr(hooks, "job_report", None)
            report = find() if find is not None else None
            if report is not None:
                return report
        return None

    # -- stop -----------------------------------------------------------------
    def stop(self, exc: BaseException | None, end: float) -> Run:
        """Ends every measurement, each in its guard, and fills in the run: ``end`` is when the
        block ended (``time.perf_counter()``), ``exc`` what ended it."""
        timeline = self.timeline
        assert timeline is not None
        if timeline.on_gc in gc.callbacks:
            gc.callbacks.remove(timeline.on_gc)
        if self.safepoint is not None:
            self.safepoint.remove()
        if self.applier is not None:
            try:
                self.applier.stop()
            except Exception as err:  # NOTE [ Never break the run ] in session.py
                self.run.limitations.append(f"apply: could not undo every fix ({type(err).__name__}: {err})")
            self.applied = self.applier.record_in(self.run)
        if self.watch is not None:
            self.guard("framework hooks could not be removed", self.watch.stop)
        if self.job is not None:
            self.run.limitations.extend(self.guard("collective timing hooks could not be removed",
                                                   self.job.stop_hooks) or [])
        if self.sampler is not None:
            self.guard("the sampler could not stop", self._stop_sampler)
        if self.nvml is not None:
            self.guard("NVML could not shut down", self.nvml.close)
        if self.host is not None:
            self.guard("the host helper could not be stopped", self.host.close)
        neighbours = self.neighbours
        if neighbours is not None:
            self.run.other_processes = self.guard("the processes outside the job are not named",
                                                  lambda: neighbours.finish(end - self.t0)) or []
        self._read_timeline(timeline)
        if any(h.process_faults for h in self.run.host_samples):
            self.run.environment.fault_seconds = self.guard("the cost of a page fault could not be measured",
                                                            fault_seconds)
        self.run.duration = end - self.t0
        self.run.environment.intra_op_threads = intra_op_threads()  # as the script left them
        self.run.exit_status = exit_status(exc)
        if exc is not None and classify_oom(record_line(exc)) is not None:
            self.run.oom_errors.append(record_line(exc))
        if not self.run.steps:
            self.run.limitations.append(
                "no training steps were seen: no optimizer step ran inside the block "
                "(call prof.step() at the end of each step for custom loops)"
            )
        whatif = self.whatif
        if whatif is not None:
            self.guard("the what-if pause could not be taken out of the run's times", whatif.close_pause)
            self.guard("the advised changes could not be measured", whatif.at_end)
        return self.run

    def _read_timeline(self, timeline: Timeline) -> None:
        run = self.run
        run.steps = self.guard("the steps could not be read", lambda: list(timeline.steps)) or []
        run.data_wait_method = self.guard("the input-time method could not be read", timeline.method) or ""
        if timeline.eval_batches:  # NOTE [ Evaluation batches ] in timeline.py
            run.probes.eval_batches = timeline.eval_batches
            run.probes.eval_wait_seconds = timeline.eval_seconds
            run.evaluations = list(timeline.eval_passes)
        if timeline.gc_collections:  # NOTE [ Garbage collection in a wait ] in timeline.py
            run.probes.gc_collections = timeline.gc_collections
            run.probes.gc_seconds = timeline.gc_seconds
            run.probes.gc_in_wait_seconds = timeline.gc_in_waits

    def _stop_sampler(self) -> None:
        assert self.sampler is not None
        self.sampler.stop()
        self.run.gpu_samples = self.sampler.gpu_samples
        self.run.host_samples = self.sampler.host_samples
        self.run.sampling = dict(self.sampler.stats)
        # NVML's, the host sampler's and the thread's own problems, counted.
        self.run.limitations.extend(self.sampler.problems())


def exit_status(exc: BaseException | None) -> str:
    """How the profiled block ended, as ``Run.exit_status`` says it."""
    if exc is None:
        return "ok"
    if isinstance(exc, StopRun):
        return str(exc)
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if isinstance(exc, Terminated):
        return "terminated by SIGTERM"
    if isinstance(exc, SystemExit):
        return f"exit {exc.code}" if exc.code not in (None, 0) else "ok"
    return f"exception: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def _environment() -> Environment:
    frameworks = {}
    for name in ("torch", "tensorflow", "keras"):
        mod = sys.modules.get(name)
        if mod is not None:
            frameworks[name] = str(getattr(mod, "__version__", "?"))
    shm = shm_space()
    return Environment(
        python=platform.python_version(),
        platform=platform.platform(),
        hostname=socket.gethostname(),
        loadprof=__version__,
        frameworks=frameworks,
        usable_cores=usable_cores(),
        logical_cores=psutil.cpu_count(logical=True) or 1,
        memory_total=psutil.virtual_memory().total,
        cpu_features=cpu_features(),
        local_world_size=local_world_size(),
        shm_free=shm[0] if shm else None,
        shm_total=shm[1] if shm else None,
        malloc=allocator(),
    )
