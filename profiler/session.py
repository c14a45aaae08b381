"""``Profile``: the session; its ``Collector`` (collector.py) measures the run, it reports it.

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

The seams, each in its own guard (``guard`` in collector.py): the environment
facts, NVML, the sampler (thread and host helper: a failed start closes what did start), the
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
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, TypeVar

from .collector import Collector, exit_status, fault, guard
from .formats import formats
from .lines import first_line, note, warn
from .outputs import Output
from .records import Run, Step
from .settings import Settings, what_if_budget
from .settings import gpu_hour_price as check_price
from .signals import HeldSignals
from .timeline import StopRun
from .trackers import Trackers, parse_log_to

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
        self._collector: Collector | None = None  # what measures the run (collector.py); None inside another
        self._report: Report | None = None
        #: the report was made and written to the end (a second Ctrl-C stops it half way)
        self.reported = False
        self._live: LiveView | None = None  # while --live draws
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
        collector = self._collector = Collector(self.settings, self.run, self._applier, self._faults)
        collector.start()
        self._t0 = collector.t0
        self._trackers = self._guard("TensorBoard writers are not watched", Trackers(
            parse_log_to(self.settings.log_to), self.run.started_at, self._report_so_far).start)
        if self.settings.live:
            self._start_live(collector)

    def _start_live(self, collector: Collector) -> None:
        """NOTE [ Live view ] in report/liveview.py: drawn on stderr by global rank 0 only."""
        from .report.liveview import LiveView, why_not_live

        why = why_not_live(sys.stderr)
        if why is None and os.environ.get("RANK", "0") != "0":
            why = "only rank 0 of a job draws it"
        if why is not None:
            warn(f"no live view: {why}")
            return
        timeline, sampler, t0 = collector.timeline, collector.sampler, collector.t0
        assert timeline is not None
        try:
            self._live = LiveView(
                steps=lambda: timeline.steps,
                samples=sampler.recent if sampler is not None else lambda n: ([], []),
                snapshot=collector.live_snapshot,
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
        outer_collector = outer._collector
        run = (self._guard("the outer profile's measurements could not be read", outer_collector.live_snapshot)
               if outer_collector is not None else None) or Run()
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
            duration=end - self._t0, exit_status=exit_status(exc),
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

    def _report_so_far(self) -> Any:
        """The report of the run until now (a W&B run the script ends while profiled gets it:
        NOTE [ Logging into the script's own run ] in trackers/__init__.py)."""
        from .report import build_report

        assert self._collector is not None
        return build_report(self._collector.run_so_far(), self.settings.gpu_hour_price)

    def _guard(self, what: str, fn: Callable[[], T], undo: Callable[[], object] | None = None) -> T | None:
        """Run one seam: NOTE [ Never break the run ]. A failure is a line in the report."""
        return guard(self.run, what, fn, undo)

    def step(self) -> None:
        """Mark the end of a training step by hand (for loops loadprof cannot see)."""
        if self._collector is not None and not self._stopped and os.getpid() == self._pid:
            self._collector.mark()

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
        held = HeldSignals().hold()  # NOTE [ Signals while the report is written ] in signals.py
        try:
            self._stop_and_report(exc, held)
            self.reported = True
        finally:
            held.release()
        return self.run

    def _stop_and_report(self, exc: BaseException | None, held: HeldSignals) -> None:
        global _active
        collector = self._collector
        assert collector is not None
        collector.held = held
        if collector.job is not None:
            collector.job.hold_sigterm()  # the job's report must not die half way: jobs/__init__.py
        try:
            end = time.perf_counter()
            if self._live is not None:  # first: warnings and the report print on a clean terminal
                try:
                    self._live.stop()
                except Exception as err:  # NOTE [ Never break the run ]
                    warn(f"the live view could not stop ({type(err).__name__}: {first_line(err)})")
            if self._trackers is not None:
                self.run.limitations.extend(self._guard("the TensorBoard watch could not be removed",
                                                        self._trackers.stop) or [])
            collector.stop(exc, end)
            self.applied = collector.applied
        finally:
            with _active_lock:
                _active = None
        self._finish()

    def _finish(self) -> None:
        from .outputs import report_outputs, write_outputs
        from .report import build_report, failed_report, render_console
        from .report.notebook import show_inline

        try:
            fault(self._faults, "report")
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
                fault(self._faults, "render")
                if self.output is not None or not show_inline(self._report):  # a notebook shows HTML
                    render_console(self._report, file=self.output or sys.stderr)
            except Exception as err:
                warn(f"the terminal report could not be printed ({type(err).__name__}: {first_line(err)})")
        self._log_trackers()
        if self._job is not None:
            self._job.release_sigterm()  # held since stop(): jobs/__init__.py

    @property
    def _job(self) -> Job | None:
        """A torchrun job's part of this run (None: a single process, or a Profile inside another)."""
        return self._collector.job if self._collector is not None else None

    def _workers_report(self) -> Any:
        """The merged report of a job whose ranks ran in processes the script's library started."""
        return self._collector.workers_report() if self._collector is not None else None

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
            fault(self._faults, out.option.lstrip("-"))
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
        timeline = self._collector.timeline if self._collector is not None else None
        return list(timeline.steps) if timeline is not None else []
