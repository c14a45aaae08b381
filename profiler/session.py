"""``Profile``: the session that starts samplers and hooks and produces a report.

    with Profile() as prof:
        train()                      # unchanged
    prof.report.verdict              # "data-starved", "compute-bound", ...

NOTE [ Never break the run ]
Profiling must not change or stop training. Every piece that can fail for
reasons outside the user's code (NVML, psutil, a framework's private API that
moved) is started inside its own guard; a failure becomes a line in
``Run.limitations`` and the run goes on without that measurement. The only
exceptions loadprof raises into a training loop are ``StopRun`` (the user asked
for ``max_steps``) and the user's own.

The seams, each in its own guard (``_guard``): the environment facts, NVML, the
sampler (thread and host helper: a failed start closes what did start), the
framework hooks (installed inside the user's ``import torch``: instrument's
``FrameworkWatch`` guards each install and each removal, where the TensorFlow
probes run), and at the end each stop, the diagnosis (a failed one gives an
inconclusive report saying why), the JSON file (one warning line on stderr, the
report still printed) and the terminal report. Whatever fails, the session ends
inactive with its thread, its helper process, its hooks and its gc callback gone,
and ``__exit__`` raises nothing of ours.

Test seam: ``TEST_FAULTS`` below, set by a test and by nothing of loadprof's (no
environment variable reaches it), names the seams ("hooks", "sampler_start",
"report", "render", or an output's format, "json", "html", ...) that fail with an
injected RuntimeError, after they did their work where they have any (the
sampler's thread and helper are running): how tests/integration/test_never_break.py
proves each guard (tests/faulted.py sets it for the ``loadprof`` command).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import platform
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, TypeVar

import psutil

from . import __version__
from .cpufeatures import cpu_features
from .formats import formats
from .instrument import FrameworkWatch, Hooks, ProcessHooks
from .lines import first_line, note, warn
from .oom import classify as classify_oom
from .oom import record_line
from .outputs import Output
from .records import Environment, Run, Step
from .samplers import HostProcess, Neighbours, NvmlSource, Sampler, usable_cores
from .samplers.node import local_world_size, shm_space
from .settings import Settings, what_if_budget
from .settings import gpu_hour_price as check_price
from .signals import HeldSignals, SafePoint, Terminated
from .timeline import StopRun, Timeline
from .trackers import Trackers, parse_log_to
from .whatifrun import ReplayPlace, WhatIfRun, intra_op_threads

if TYPE_CHECKING:
    from .fixes.applier import Applier
    from .jobs import Job
    from .report import Report
    from .report.liveview import LiveView

T = TypeVar("T")

_active_lock = threading.Lock()
_active: Profile | None = None

#: The seams a Profile made from now on fails at: NOTE [ Never break the run ]. Tests only.
TEST_FAULTS: frozenset[str] = frozenset()


class Profile:
    """Profile the training loop inside the ``with`` block, then diagnose it.

        with Profile(json="run.json") as prof:
            train()
        prof.report.verdict          # "data-starved", "compute-bound", "memory-bound", ...
        prof.report.recommendations  # what to change, with estimated speed-ups

    The training loop runs unchanged: a measurement that fails is listed in
    ``report.limitations`` and the run goes on (NOTE [ Never break the run ]).
    A Profile started inside another (a script that profiles itself, run under
    ``loadprof diagnose``) measures nothing itself: its report is cut from the
    outer one's measurements of its span (NOTE [ A Profile inside another ]). A
    forked child (a DataLoader worker) records and reports nothing.

    Arguments (all keyword-only):

    interval
        Seconds between GPU and host samples (default 0.1, 10 Hz). Shorter
        catches briefer stalls and costs more CPU; must be > 0.
    json
        Path to write the report to at exit, with the raw measurements, so that
        ``loadprof report PATH`` can diagnose it again later. None: no file. A
        path that cannot be written is one warning line; the run is unaffected.
    max_steps
        Stop the loop after this many training steps (optimizer steps, Keras
        batches or ``prof.step()`` calls) by raising ``StopRun`` as the last one
        ends; the ``with`` block swallows it and the report covers those steps.
        None: run to the end.
    print_report
        Print the terminal summary (verdict, evidence, recommendations) at exit
        (default True); False for a silent run read through ``prof.report``.
    gpu
        Sample GPUs through NVML (default True). False skips NVML entirely.
    output
        Where the terminal summary and ``apply`` messages go (default stderr).
    apply
        True: change DataLoaders built inside the block from their second epoch
        on, with the measured safe settings (workers, prefetch, pinned memory;
        never what changes results), and say what changed (``prof.applied``).
        Default False: measure only (NOTE [ Live loader tuning ] in frameworks/torch/livetune.py).
    host_helper
        Read host CPU and memory from a small helper process (default True), off
        the training process's GIL; False reads them on the sampler thread.
    trace
        Path to write a Chrome trace-event file to at exit (Perfetto UI,
        chrome://tracing): steps split into input wait, copy and compute, and
        every sampled signal as a counter. None: no file. A path that cannot be
        written is one warning line.
    html
        Path to write a self-contained HTML page to at exit: the verdict, charts
        of the steps, GPU and host over time, the evidence and recommendations
        (report/html.py). None: no file. A path that cannot be written is one
        warning line.
    live
        Redraw a live view (steps/s, input share, GPU, CPU, running verdict) on
        the terminal about twice a second while the block runs (default False);
        only when stderr is a terminal. The final report still prints.
    gpu_hour_price
        What one GPU-hour costs you (any currency): ``report.cost`` then says what the
        input wait costs a day and an epoch in money too. No default price: None gives
        GPU-hours and energy only (docs/trackers.md).
    log_to
        Trackers to log the summary to even where the script has no run of its own
        (one is started and ended): ``"wandb,mlflow,tensorboard=DIR"`` or a list. A
        W&B, MLflow or TensorBoard run the script has gets it anyway, at the end
        (NOTE [ Logging into the script's own run ] in trackers/__init__.py).
    what_if
        Seconds the advised changes may take to measure on the job's own step, once:
        between two steps under PyTorch (the pause is taken out of the run's times),
        after the run under TensorFlow, so that their estimates are measured (NOTE
        [ What-if replays ] in whatif.py). None: ``LOADPROF_WHAT_IF``, else 20; 0:
        nothing measured or held.
    outputs
        Files to write at exit by format name (formats.py), ``{"html": "r.html"}``:
        ``json``, ``trace`` and ``html`` are the shorthands above; a format a plug-in
        registered is asked for the same way. An unknown name is a ValueError.

    After the block: ``prof.report`` (a ``loadprof.Report``: the JSON report's
    shape as attributes), ``prof.run`` (the raw measurements), ``prof.applied``.
    Use ``prof.step()`` to mark step ends in loops loadprof cannot see.
    """

    def __init__(
        self,
        *,
        interval: float = Settings.interval,
        json: str | os.PathLike[str] | None = None,
        max_steps: int | None = None,
        print_report: bool = Settings.print_report,
        gpu: bool = Settings.gpu,
        output: IO[str] | None = None,
        apply: Any = False,
        host_helper: bool = Settings.host_helper,
        trace: str | os.PathLike[str] | None = None,
        live: bool = Settings.live,
        html: str | os.PathLike[str] | None = None,
        gpu_hour_price: float | None = Settings.gpu_hour_price,
        log_to: str | Sequence[str] | None = None,
        what_if: float | None = None,
        outputs: Mapping[str, str | os.PathLike[str]] | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        if max_steps is not None and max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps!r}")
        try:
            gpu_hour_price = check_price(gpu_hour_price)
        except ValueError as exc:
            raise ValueError(f"gpu_hour_price: {exc}") from None
        try:
            # a run that applies fixes is measured whole: no replays unless asked for
            what_if = 0.0 if apply and what_if is None else what_if_budget(what_if)
        except ValueError as exc:
            raise ValueError(f"what_if: {exc}") from None
        files = {name: os.fspath(path) for name, path in (outputs or {}).items() if path is not None}
        for name, path in (("json", json), ("trace", trace), ("html", html)):
            if path is not None:
                files[name] = os.fspath(path)
        known = {f.name for f in formats("report")}
        unknown = sorted(set(files) - known)
        if unknown:
            raise ValueError(f"outputs: {unknown[0]!r} is no report format (expected one of {', '.join(sorted(known))})")
        self.settings = Settings(
            interval=interval,
            max_steps=max_steps,
            outputs=files,
            print_report=print_report,
            gpu=gpu,
            apply=bool(apply),
            host_helper=host_helper,
            live=live,
            gpu_hour_price=gpu_hour_price,
            log_to=tuple(f"{k}={v}" if v else k for k, v in parse_log_to(log_to).items()),
            what_if=what_if,
        )
        self.output = output
        # apply=True: measured safe loader fixes; a fixes.Applier: the fixes of a tune/compare trial.
        self._applier: Applier | None = None
        if apply:
            from .fixes.applier import make_applier

            self._applier = make_applier(apply, output=output, announce=print_report)
        #: What ``apply`` changed, one line each (printed as it happens when print_report).
        self.applied: list[str] = []
        self.run = Run(command=list(sys.argv))
        self._pid = os.getpid()
        self._faults = TEST_FAULTS  # NOTE [ Never break the run ]
        self._t0 = 0.0
        self._started = False
        self._stopped = False
        self._timeline: Timeline | None = None
        self._watch: FrameworkWatch | None = None
        self._sampler: Sampler | None = None
        self._nvml: NvmlSource | None = None
        self._host: HostProcess | None = None
        self._neighbours: Neighbours | None = None
        self._safepoint: SafePoint | None = None
        self._report: Report | None = None
        self._held: HeldSignals | None = None  # from stop() to the report's end
        self._whatif: WhatIfRun | None = None  # the what-if replays' place in the run (whatifrun.py)
        #: the report was made and written to the end (a second Ctrl-C stops it half way)
        self.reported = False
        self._live: LiveView | None = None  # while --live draws
        self._job: Job | None = None  # a torchrun job's part (None: a single process)
        self._rank_report: Report | None = None  # in a job, this rank's own report (``_report`` is the job's on rank 0)
        self._outer: Profile | None = None  # the Profile already running when this one started
        self._trackers: Trackers | None = None  # trackers/: the summary into the script's own runs
        #: outputs (--json, --trace, --html) that could not be written, one line each
        self.failed_outputs: list[str] = []
        #: how such a line is printed: a warning in a user's script; loadprof diagnose makes it an error
        self.failed_output_level = "warning"

    # -- lifecycle ------------------------------------------------------------
    def __enter__(self) -> Profile:
        self.start()
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        self.stop(exc)
        # Swallow only our own StopRun (max_steps reached); user exceptions propagate, and
        # so does the outer profile's StopRun out of an inner block, to the outer one.
        return exc_type is not None and issubclass(exc_type, StopRun) and self._outer is None

    def start(self) -> None:
        global _active
        with _active_lock:
            outer = _active
            if outer is None:
                _active = self
        if outer is not None:
            self._start_inside(outer)
            return
        self._started = True
        self._t0 = time.perf_counter()
        self.run.started_at = time.time()
        self.run.environment = self._guard("could not read the machine's facts", _environment) or Environment()
        self._timeline = Timeline(self._t0, max_steps=self.settings.max_steps)
        self._guard("could not join the job's report (each rank reports alone)", self._start_job)
        self._nvml = NvmlSource()
        if self.settings.gpu:
            self._guard("NVML could not start: no GPU samples", self._nvml.start)
            self.run.environment.gpu_status = self._nvml.status
            self.run.environment.gpus = list(self._nvml.gpus)
        else:
            self.run.environment.gpu_status = "unavailable (GPU sampling turned off)"
        self._guard("the sampler could not start: no host or GPU samples", self._start_sampler,
                    undo=self._close_sampler)
        self._neighbours = self._guard("the processes outside the job are not named",
                                       lambda: Neighbours(self._pid))
        self._whatif = WhatIfRun(ReplayPlace(
            self.settings, self.run, self._t0, self._timeline, self._job,
            lambda: self._watch.hooks if self._watch is not None else {}, self._run_so_far,
            lambda: self._held is not None and self._held.pending is not None))
        self._watch = FrameworkWatch(self._make_hooks, on_error=self.run.limitations.append)
        self._guard("framework hooks could not be installed: no steps seen", self._watch.start)
        self._trackers = self._guard("TensorBoard writers are not watched", Trackers(
            parse_log_to(self.settings.log_to), self.run.started_at, self._report_so_far).start)
        if self._applier is not None:  # after the watch: NOTE [ Import watch order ] in fixes/applier.py
            self._applier.start(self._snapshot)
        # NOTE [ Garbage collection in a wait ] in timeline.py; NOTE [ Signals during a collection ] in signals.py
        self._safepoint = SafePoint(self._timeline.on_gc).install()
        gc.callbacks.append(self._timeline.on_gc)
        if self.settings.live:
            self._start_live()

    def _start_live(self) -> None:
        """NOTE [ Live view ] in report/liveview.py: drawn on stderr by global rank 0 only."""
        from .report.liveview import LiveView, why_not_live

        why = why_not_live(sys.stderr)
        if why is None and os.environ.get("RANK", "0") != "0":
            why = "only rank 0 of a job draws it"
        if why is not None:
            warn(f"no live view: {why}")
            return
        timeline, sampler, t0 = self._timeline, self._sampler, self._t0
        assert timeline is not None
        try:
            self._live = LiveView(
                steps=lambda: timeline.steps,
                samples=sampler.recent if sampler is not None else lambda n: ([], []),
                snapshot=self._live_snapshot,
                clock=lambda: time.perf_counter() - t0,
                file=sys.stderr,
                title=" ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(self.run.command)),
                gpu_status=self.run.environment.gpu_status,
                warn=warn,
            ).start()
        except Exception as err:  # NOTE [ Never break the run ]
            warn(f"no live view ({type(err).__name__}: {first_line(err)})")

    def _start_inside(self, outer: Profile) -> None:
        """Start as a view of ``outer``'s measurements.

        NOTE [ A Profile inside another ]
        A script that profiles itself may be run under ``loadprof diagnose``, ``tune`` or
        ``compare``, which profile it already. Failing there would break the run, and
        hooking twice would count every step twice. So the inner block measures nothing
        itself: at its end its report is cut from the outer profile's measurements of the
        same span (the steps that ended inside it, the samples taken meanwhile), and
        written and printed as its arguments ask; in a torchrun job only rank 0 writes or
        prints it. ``apply`` and ``max_steps`` are the outer profile's to act on."""
        self._outer = outer
        self._started = True
        self._t0 = time.perf_counter()
        self.run.started_at = time.time()
        self._trackers = Trackers(parse_log_to(self.settings.log_to), self.run.started_at)  # writers: the outer's watch
        note("a Profile is already running in this process (loadprof diagnose, tune or compare start one): "
              "this block's report is cut from its measurements")

    def _stop_inside(self, exc: BaseException | None) -> None:
        outer = self._outer
        assert outer is not None
        end = time.perf_counter()
        self._stopped = True
        run = self._guard("the outer profile's measurements could not be read", outer._live_snapshot) or Run()
        low, high = self._t0 - outer._t0, end - outer._t0
        self.run = Run(
            command=self.run.command, started_at=self.run.started_at, environment=run.environment,
            # a step ending inside the block, begun before it: from the block's start, as a
            # Profile of its own would have timed it (its wait came after the start)
            steps=[st if st.start >= low else dataclasses.replace(st, start=low)
                   for st in run.steps if low < st.end <= high and st.merged == 1],
            host_samples=[h for h in run.host_samples if low <= h.t <= high],
            gpu_samples=[g for g in run.gpu_samples if low <= g.t <= high],
            loaders=run.loaders, data_wait_method=run.data_wait_method, amp_in_use=run.amp_in_use,
            duration=end - self._t0, exit_status=_exit_status(exc),
        )
        self.run.limitations.append("measured by the Profile already running in this process: its steps and "
                                    "samples from this block's span")
        ignored = [name for name, on in (("apply", self._applier is not None),
                                         ("max_steps", self.settings.max_steps is not None)) if on]
        if ignored:
            self.run.limitations.append(f"{' and '.join(ignored)} left to the outer Profile")
        job = outer._job
        if job is not None and job.ctx.rank != 0:
            self.settings = dataclasses.replace(self.settings, outputs={}, print_report=False)
        self._finish()

    def _live_snapshot(self) -> Run:
        """The run so far for the live view's running verdict: copies of the lists, read
        on its thread (the records in them are not changed while the run goes on)."""
        timeline, sampler = self._timeline, self._sampler
        assert timeline is not None
        return Run(environment=self.run.environment, steps=list(timeline.steps),
                   host_samples=sampler.host_samples if sampler else [],
                   gpu_samples=sampler.gpu_samples if sampler else [],
                   loaders=list(self.run.loaders), data_wait_method=timeline.method(),
                   amp_in_use=self.run.amp_in_use)

    def _start_job(self) -> None:
        """Under torchrun (2+ ranks): NOTE [ Merging a job's reports ] in jobs/exchange.py."""
        from .jobs.exchange import JobContext

        ctx = JobContext.from_env()
        if ctx is None:
            return
        from .jobs import Job

        timeline = self._timeline
        job = Job(ctx, self._t0)
        job.start(progress=lambda: timeline.count if timeline is not None else 0)
        self._job = job

    def _snapshot(self) -> Run:
        """A copy of the run so far, for live tuning to read (NOTE [ Live loader tuning ] in frameworks/torch/livetune.py)."""
        assert self._timeline is not None
        return Run(environment=dataclasses.replace(self.run.environment),
                   steps=[dataclasses.replace(step) for step in self._timeline.steps],
                   host_samples=list(self._sampler.host_samples) if self._sampler else [])

    def _report_so_far(self) -> Any:
        """The report of the run until now (a W&B run the script ends while profiled gets it:
        NOTE [ Logging into the script's own run ] in trackers/__init__.py)."""
        from .report import build_report

        return build_report(self._run_so_far(), self.settings.gpu_hour_price)

    def _run_so_far(self) -> Run:
        """A copy of the run until now: its steps and readings."""
        assert self._timeline is not None
        sampler, timeline = self._sampler, self._timeline
        return dataclasses.replace(
            self.run, steps=[dataclasses.replace(s) for s in timeline.steps], data_wait_method=timeline.method(),
            duration=time.perf_counter() - self._t0,
            host_samples=list(sampler.host_samples) if sampler else [],
            gpu_samples=list(sampler.gpu_samples) if sampler else [])

    def _start_sampler(self) -> None:
        assert self._timeline is not None and self._nvml is not None
        host = self._host = HostProcess(pid=self._pid, helper=self.settings.host_helper)
        sources = (self._nvml, host) if self.settings.gpu else (host,)
        self._sampler = Sampler(
            interval=self.settings.interval,
            sources=sources,
            max_samples=self.settings.max_samples,
            t0=self._t0,
            on_tick=self._timeline.fold,
        )
        self._sampler.start()
        self._fault("sampler_start")

    def _close_sampler(self) -> None:
        """Undo a sampler start that failed part way: nothing of it left running."""
        sampler, self._sampler = self._sampler, None
        if sampler is not None and sampler.running:
            sampler.stop()
        for source in (self._host, self._nvml):
            if source is not None:
                source.close()

    def _guard(self, what: str, fn: Callable[[], T], undo: Callable[[], object] | None = None) -> T | None:
        """Run one seam: NOTE [ Never break the run ]. A failure is a line in the report."""
        try:
            return fn()
        except Exception as err:
            self.run.limitations.append(f"{what} ({type(err).__name__}: {first_line(err)})")
            if undo is not None:
                try:
                    undo()
                except Exception as again:
                    self.run.limitations.append(f"... and could not undo it ({type(again).__name__}: {again})")
            return None

    def _fault(self, seam: str) -> None:
        """The test seam of NOTE [ Never break the run ]."""
        if seam in self._faults:
            raise RuntimeError(f"injected fault: {seam}")

    def _make_hooks(self, name: str, factory: type) -> Hooks:
        hooks = self._make_hooks_for(name, factory)
        if getattr(hooks, "capture", None) is not None:
            if not self.settings.what_if:
                hooks.capture = None  # type: ignore[attr-defined]  # nothing to replay: nothing held
            else:
                from .whatif import replay_step

                whatif = self._whatif
                hooks.replay = lambda: whatif.mid_run(hooks) if whatif is not None else None  # type: ignore[attr-defined]
                hooks.replay_step = replay_step(self.settings.max_steps)  # type: ignore[attr-defined]
        return hooks

    def _make_hooks_for(self, name: str, factory: type) -> Hooks:
        assert self._timeline is not None
        self._fault("hooks")
        hooks: Hooks = factory(self._timeline, self.run)
        if isinstance(hooks, ProcessHooks):
            hooks.settings = self.settings
        return hooks

    def step(self) -> None:
        """Mark the end of a training step by hand (for loops loadprof cannot see)."""
        if self._timeline is not None and not self._stopped and os.getpid() == self._pid:
            self._timeline.mark(time.perf_counter())

    def stop(self, exc: BaseException | None = None) -> Run:
        """Stops measuring, writes and prints what was asked for, and returns the run (its
        report: ``prof.report``; ``loadprof.report.build_report(run)`` renders it again).
        Stopping twice, or in a forked child, returns the run as it stands."""
        if self._stopped or not self._started or os.getpid() != self._pid:
            return self.run
        if self._outer is not None:
            self._stop_inside(exc)
            return self.run
        self._stopped = True
        held = self._held = HeldSignals().hold()  # NOTE [ Signals while the report is written ] in signals.py
        try:
            self._stop_and_report(exc)
            self.reported = True
        finally:
            held.release()
        return self.run

    def _stop_and_report(self, exc: BaseException | None) -> None:
        global _active
        if self._job is not None:
            self._job.hold_sigterm()  # the job's report must not die half way: jobs/__init__.py
        try:
            end = time.perf_counter()
            if self._live is not None:  # first: warnings and the report print on a clean terminal
                try:
                    self._live.stop()
                except Exception as err:  # NOTE [ Never break the run ]
                    warn(f"the live view could not stop ({type(err).__name__}: {first_line(err)})")
            if self._timeline is not None and self._timeline.on_gc in gc.callbacks:
                gc.callbacks.remove(self._timeline.on_gc)
            if self._safepoint is not None:
                self._safepoint.remove()
            if self._applier is not None:
                try:
                    self._applier.stop()
                except Exception as err:  # NOTE [ Never break the run ]
                    self.run.limitations.append(f"apply: could not undo every fix ({type(err).__name__}: {err})")
                self.applied = list(self._applier.messages) + [f"not applied: {m}" for m in self._applier.skipped]
                self.run.limitations.extend(f"apply: {line}" for line in self._applier.limitations)
                for info, note in self._applier.loader_notes:  # NOTE [ Live loader tuning ] in frameworks/torch/livetune.py
                    info.notes.append(note)
                for info, values, when in self._applier.loader_changes:
                    # The report judges the loader as it ran last, on the steps after the change.
                    for key, value in values.items():
                        setattr(info, key, value)
                    self.run.judge_after = max(self.run.judge_after or 0.0, when)
            if self._watch is not None:
                self._guard("framework hooks could not be removed", self._watch.stop)
            if self._trackers is not None:
                self.run.limitations.extend(self._guard("the TensorBoard watch could not be removed",
                                                        self._trackers.stop) or [])
            if self._job is not None:
                self.run.limitations.extend(self._guard("collective timing hooks could not be removed",
                                                        self._job.stop_hooks) or [])
            if self._sampler is not None:
                self._guard("the sampler could not stop", self._stop_sampler)
            if self._nvml is not None:
                self._guard("NVML could not shut down", self._nvml.close)
            if self._host is not None:
                self._guard("the host helper could not be stopped", self._host.close)
            neighbours = self._neighbours
            if neighbours is not None:
                self.run.other_processes = self._guard("the processes outside the job are not named",
                                                       lambda: neighbours.finish(end - self._t0)) or []
            assert self._timeline is not None
            timeline = self._timeline
            self.run.steps = self._guard("the steps could not be read", lambda: list(timeline.steps)) or []
            self.run.data_wait_method = self._guard("the input-time method could not be read", timeline.method) or ""
            if self._timeline.eval_batches:  # NOTE [ Evaluation batches ] in timeline.py
                self.run.probes.eval_batches = self._timeline.eval_batches
                self.run.probes.eval_wait_seconds = self._timeline.eval_seconds
                self.run.evaluations = list(self._timeline.eval_passes)
            if self._timeline.gc_collections:  # NOTE [ Garbage collection in a wait ] in timeline.py
                self.run.probes.gc_collections = self._timeline.gc_collections
                self.run.probes.gc_seconds = self._timeline.gc_seconds
                self.run.probes.gc_in_wait_seconds = self._timeline.gc_in_waits
            self.run.duration = end - self._t0
            self.run.environment.intra_op_threads = intra_op_threads()  # as the script left them
            self.run.exit_status = _exit_status(exc)
            if exc is not None and classify_oom(record_line(exc)) is not None:
                self.run.oom_errors.append(record_line(exc))
            if not self.run.steps:
                self.run.limitations.append(
                    "no training steps were seen: no optimizer step ran inside the block "
                    "(call prof.step() at the end of each step for custom loops)"
                )
            whatif = self._whatif
            if whatif is not None:
                self._guard("the what-if pause could not be taken out of the run's times", whatif.close_pause)
                self._guard("the advised changes could not be measured", whatif.at_end)
        finally:
            with _active_lock:
                _active = None
        self._finish()

    def _stop_sampler(self) -> None:
        assert self._sampler is not None
        self._sampler.stop()
        self.run.gpu_samples = self._sampler.gpu_samples
        self.run.host_samples = self._sampler.host_samples
        self.run.sampling = dict(self._sampler.stats)
        # NVML's, the host sampler's and the thread's own problems, counted.
        self.run.limitations.extend(self._sampler.problems())

    def _finish(self) -> None:
        from .outputs import report_outputs, write_outputs
        from .report import build_report, failed_report, render_console
        from .report.notebook import show_inline

        try:
            self._fault("report")
            self._report = build_report(self.run, self.settings.gpu_hour_price)
        except Exception as err:  # NOTE [ Never break the run ]
            self._report = failed_report(self.run, f"{type(err).__name__}: {first_line(err)}")
        if self._job is None:
            self._report = self._guard("the workers' report could not be read", self._workers_report) or self._report
        paths, print_report, outputs = dict(self.settings.outputs), self.settings.print_report, True
        json_path = paths.pop("json", None)
        if self._job is not None:  # NOTE [ Merging a job's reports ] in jobs/exchange.py
            rank_report = self._rank_report = self._report
            try:
                from .report.job import build_job_report

                self._report, json_path, print_report = self._job.finish(rank_report, json_path, print_report,
                                                                         build_job_report)
            except Exception as err:  # NOTE [ Never break the run ]: this rank reports alone
                self._report = rank_report
                warn(f"the job's report could not be merged ({type(err).__name__}: {first_line(err)})")
            # the trace and the HTML page show the job's ranks; from rank 0 only (one file)
            outputs = self._job.ctx.rank == 0
        # NOTE [ A failed output ] in outputs.py; the trace and page of a job from rank 0 only
        failed = write_outputs([self._seamed(out) for out in report_outputs(
            self._report, json=json_path, **(paths if outputs else {}))])
        for line in failed:
            self.run.limitations.append(f"not written: {line}")
            note(f"{self.failed_output_level}: {line}")
        self.failed_outputs = failed
        if print_report:
            try:
                self._fault("render")
                if self.output is not None or not show_inline(self._report):  # a notebook shows HTML
                    render_console(self._report, file=self.output or sys.stderr)
            except Exception as err:
                warn(f"the terminal report could not be printed ({type(err).__name__}: {first_line(err)})")
        self._log_trackers()
        if self._job is not None:
            self._job.release_sigterm()  # held since stop(): jobs/__init__.py

    def _workers_report(self) -> Any:
        """The merged report of a job whose ranks ran in processes the script's library started
        (NOTE [ Ray Train's workers profiled ] in frameworks/raytrain/worker.py), or None."""
        for hooks in list(self._watch.hooks.values()) if self._watch is not None else []:
            find = getattr(hooks, "job_report", None)
            report = find() if find is not None else None
            if report is not None:
                return report
        return None

    def _log_trackers(self) -> None:
        """NOTE [ Logging into the script's own run ] in trackers/__init__.py: rank 0's report
        (the job's, where the ranks' were merged)."""
        job = self._job or (self._outer._job if self._outer is not None else None)
        try:
            rank = job.ctx.rank if job is not None else int(os.environ.get("RANK", "0") or 0)
        except ValueError:
            rank = 0
        if self._trackers is not None:
            self._trackers.log(self._report, rank=rank, note=note, warn=warn, own=self._rank_report)

    def _seamed(self, out: Output) -> Output:
        """An output whose rendering passes the test seam named after it ("html", ...)."""

        def render() -> str | bytes:
            self._fault(out.option.lstrip("-"))
            return out.render()

        return out._replace(render=render)

    # -- results --------------------------------------------------------------
    @property
    def report(self) -> Report:
        """The diagnosed run, once the block has exited: a ``loadprof.Report`` on every
        rank (a ``RunReport``; on rank 0 of a multi-process job, the job's ``JobReport``)."""
        if self._report is None:
            raise RuntimeError("the report exists once the Profile block has exited")
        return self._report

    @property
    def steps(self) -> list[Step]:
        return list(self._timeline.steps) if self._timeline else []





def _exit_status(exc: BaseException | None) -> str:
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
    )
