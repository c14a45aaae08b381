"""The live view (``--live``, ``Profile(live=True)``): a few lines on the terminal,
redrawn while the training runs.

NOTE [ Live view ]
What it shows, about twice a second (``PERIOD``): steps and steps/s over the last
``RECENT`` seconds; the input share of step time (wait + host-to-device copy, as the
report counts it) over that window and so far (after the first ``WARMUP`` steps, the
report's warm-up once a run has 50); each GPU's utilization and memory; the CPU of
the training process and of its loader workers (from the newest host reading that
listed workers within the last ``TREE_EVERY`` readings, else the newest: the tree is
listed once a second and the helper's readings arrive once a second, in step with it,
so the newest alone could miss, for a whole run, workers of epochs under a second); the
running verdict, the
report's own diagnosis of the run so far; and the training loader's slowest stage
with its share of loading ("top stage", docs/stages.md), read from the same
snapshot as the verdict, once its ``LoaderInfo.stages`` hold figures (the stage
collector, frameworks/torch/stagepipe.py, sums them there every ``FILL_EVERY`` seconds).

When: only where stderr (where the report goes) is a terminal and ``TERM`` is not
``dumb``; elsewhere (a CI log, a pipe) ``--live`` is off with one warning line. It
first draws at the first step (or ``FIRST_DRAW`` seconds): what the script's imports
write straight to fd 2 (TensorFlow's C++ logging), which rich cannot redirect and
which would leave a frame behind, lands before it. The view is transient: stopping
erases it, so the terminal holds what the script printed and then the final report.
While it runs, what the script prints goes above the view
(rich's redirection of stderr, and of stdout when stdout is a terminal too: a
redirected stdout, ``> log.txt``, is left alone). A DataLoader worker forked
meanwhile gets the real streams back (``_restore_in_child``): the redirecting
object and its console's lock belong to this process's threads.

Cost: the training thread does nothing for it, but the view's thread
("loadprof-live") holds the GIL while it works, and the training thread's Python
waits that long. So a frame reads only what is new: the steps recorded since the
last frame (the recent window and the sums so far are kept as they come, never
rescanned), the newest samples (``Sampler.recent``), and for the verdict a snapshot
of the whole run, diagnosed no more often than every ``VERDICT_EVERY`` seconds nor
than ``VERDICT_COST_RATIO`` times what the last diagnosis took (diagnosing 20,000
steps takes ~10-60 ms: then once in 5-30 s); a run of fewer than ``FEW_STEPS``
steps still inconclusive is diagnosed again at the next frame, however long a busy
host made the last diagnosis. Reading the steps may fold the
timeline's events instead of the sampler. A failure of the view itself ends the
view with one warning line, never the run.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from rich.console import Console
from rich.live import Live
from rich.text import Text

from ..records import GpuSample, HostSample, Run, Step
from ..samplers.host import TREE_EVERY
from ..stagemodel import StageRow

PERIOD = 0.5  # seconds between redraws
RECENT = 10.0  # seconds of the "recent" window
WARMUP = 5  # steps left out of "so far": diagnosis.warmup_count's cap
VERDICT_EVERY = 5.0  # the verdict moves slowly; each diagnosis holds the GIL in one piece
VERDICT_COST_RATIO = 500  # at most 0.2% of the time on diagnosis
FEW_STEPS = 200  # an inconclusive run this short is judged again at the next frame
THREAD_NAME = "loadprof-live"
JOIN_TIMEOUT = 5.0
FIRST_DRAW = 20.0  # seconds: the view waits for the first step at most this long
TITLE_WIDTH = 56  # characters of the command shown; a longer one ends in "…"
LIVE_WORKERS = 8  # loader workers shown each with its CPU; the count of the others after them

_COLOURS = {"data-starved": "bold red", "memory-bound": "bold magenta", "host-bound": "bold yellow",
            "compute-bound": "bold green", "inconclusive": "bold white"}


def why_not_live(stream: IO[str] | None) -> str | None:
    """None where the view can draw on ``stream``; otherwise the reason, in a few words."""
    try:
        tty = stream is not None and stream.isatty()
    except (ValueError, OSError):  # closed
        tty = False
    if not tty:
        return "stderr is not a terminal"
    if os.environ.get("TERM") == "dumb":
        return "TERM is dumb"
    return None


@dataclass
class LiveState:
    """What one frame shows, computed from copies off the training thread."""

    elapsed: float = 0.0
    steps: int = 0
    steps_per_s: float | None = None
    recent_share: float | None = None
    total_share: float | None = None
    gpus: list[GpuSample] = field(default_factory=list)
    gpu_status: str = ""
    host: HostSample | None = None
    verdict: str | None = None
    cause: str | None = None
    verdict_at: float = 0.0
    #: False while the run has steps but no timed input wait: under Keras ``fit`` the
    #: waits are measured after the run, so a verdict now would read them as zero
    waits_timed: bool = True
    #: the training loader's slowest stage, where its stages were timed (NOTE [ Live view ])
    top_stage: StageRow | None = None


class LiveView:
    """Draws ``LiveState`` frames on a terminal from its own thread (NOTE [ Live view ]).

    ``steps()`` gives the steps so far (a list only read), ``samples(n)`` copies of the
    newest host and GPU readings, ``snapshot()`` a Run of everything so far (for the
    verdict), ``clock()`` seconds since the run started."""

    def __init__(self, *, steps: Callable[[], Sequence[Step]],
                 samples: Callable[[int], tuple[list[HostSample], list[GpuSample]]],
                 snapshot: Callable[[], Run], clock: Callable[[], float], file: IO[str],
                 title: str = "", gpu_status: str = "", period: float = PERIOD,
                 warn: Callable[[str], None] | None = None) -> None:
        self._steps, self._samples, self._snapshot, self._clock = steps, samples, snapshot, clock
        self.title, self.period, self._warn = title, period, warn
        self.state = LiveState(gpu_status=gpu_status)
        self.frames = 0  # frames drawn, and the CPU seconds their reading and drawing took
        self.busy = 0.0  # on the view's thread (benchmarks/overhead.py prints both)
        self._counted = 0  # steps (by index) already read into the sums below
        self._total_wait = 0.0
        self._total_time = 0.0
        # The recent window, kept as the steps come: (start, end, steps, input wait, duration)
        # of each record, oldest first, and their sums. A frame reads only the steps that
        # are new since the last one: rescanning the window held the GIL in proportion to
        # its steps, time the training thread waited.
        self._window: deque[tuple[float, float, int, float, float]] = deque()
        self._win_steps = 0
        self._win_wait = 0.0
        self._win_time = 0.0
        self._next_verdict = 0.0
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        stdout_tty = _isatty(sys.stdout)
        self.console = Console(file=file, highlight=False)
        self._live = Live(console=self.console, transient=True, auto_refresh=False,
                          redirect_stdout=stdout_tty, redirect_stderr=True)
        self._stopped = False

    def start(self) -> LiveView:
        global _ACTIVE
        _ACTIVE = self
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop drawing and erase the view; idempotent."""
        global _ACTIVE
        if self._stopped:
            return
        self._stopped = True
        self._done.set()
        if self._thread is not None:
            self._thread.join(JOIN_TIMEOUT)
        _ACTIVE = None
        self._live.stop()

    def _run(self) -> None:
        while not self._done.wait(self.period):
            began = time.thread_time()
            try:
                self.update()
                if not self._live.is_started:
                    # Not before the first step (or FIRST_DRAW seconds): until then the
                    # terminal is the script's, whose imports may write straight to fd 2.
                    if not self.state.steps and self.state.elapsed < FIRST_DRAW:
                        continue
                    self._live.update(self.render(), refresh=False)
                    self._live.start(refresh=True)
                else:
                    self._live.update(self.render(), refresh=True)
                self.frames += 1
                self.busy += time.thread_time() - began
            except Exception as err:  # the view's own failure: the run goes on without it
                if self._warn is not None:
                    self._warn(f"the live view stopped ({type(err).__name__}: {err})")
                return

    # -- state ------------------------------------------------------------------
    def update(self) -> LiveState:
        """Read the newest measurements into ``state`` (on the view's thread)."""
        s = self.state
        now = self._clock()
        s.elapsed = now
        steps = self._steps()
        new: list[Step] = []
        for step in reversed(steps):  # newest first: only the records not yet read
            if step.index + step.merged <= self._counted:
                break
            new.append(step)
        window = self._window
        for step in reversed(new):
            wait = step.data_wait + step.h2d
            if step.index >= WARMUP:
                self._total_wait += wait
                self._total_time += step.duration
            window.append((step.start, step.end, step.merged, wait, step.duration))
            self._win_steps += step.merged
            self._win_wait += wait
            self._win_time += step.duration
        if new:
            self._counted = new[0].index + new[0].merged
        while window and window[0][1] < now - RECENT:
            _, _, n, wait, duration = window.popleft()
            self._win_steps -= n
            self._win_wait -= wait
            self._win_time -= duration
        if not window:  # start the sums again from zero: no rounding carried over
            self._win_steps, self._win_wait, self._win_time = 0, 0.0, 0.0
        s.steps = self._counted
        if window:
            span = now - max(0.0, window[0][0], now - RECENT)
            s.steps_per_s = self._win_steps / span if span > 0 else None
            busy = self._win_time
            s.recent_share = min(1.0, max(0.0, self._win_wait) / busy) if busy > 0 else None
        else:
            s.steps_per_s = 0.0 if steps else None
            s.recent_share = None
        s.total_share = min(1.0, self._total_wait / self._total_time) if self._total_time > 0 else None
        hosts, gpus = self._samples(TREE_EVERY)
        if hosts:
            s.host = next((h for h in reversed(hosts) if h.n_children), hosts[-1])
        newest: dict[int, GpuSample] = {}
        for g in gpus:
            newest[g.index] = g
        if newest:
            s.gpus = [newest[i] for i in sorted(newest)]
        if s.steps and now >= self._next_verdict:  # no verdict, nor a copy of the run, before a step
            self._verdict(now)
        return s

    def _verdict(self, now: float) -> None:
        from ..diagnosis import diagnose
        from ..metrics import main_loader
        from ..stagemodel import loading

        began = self._clock()
        run = self._snapshot()
        s = self.state
        load = loading(run, main_loader(run))
        s.top_stage = load.rows[0] if load is not None and load.rows else s.top_stage
        s.waits_timed = bool(run.data_wait_method) or not run.steps
        if s.waits_timed:
            d = diagnose(run)
            s.verdict, s.cause, s.verdict_at = d.verdict, d.cause, now
        cost = self._clock() - began
        # no steps yet: look again at the next frame, not to show a fit's zero waits for 5 s;
        # too few steps to judge: again at the next frame too, or a short run shows
        # "inconclusive" throughout (its steps are few, and so is a diagnosis's cost)
        every = VERDICT_EVERY if s.verdict != "inconclusive" else 0.0
        pause = max(every, VERDICT_COST_RATIO * cost)
        if s.verdict == "inconclusive" and len(run.steps) < FEW_STEPS:
            # a few steps cost little to judge: a busy host stretching this one diagnosis must
            # not push the next past a short run's end
            pause = min(pause, PERIOD)
        self._next_verdict = now + pause if run.steps else now

    # -- drawing ------------------------------------------------------------------
    def render(self) -> Text:
        """The frame: plain lines of styled text (a rich Table measured its columns at
        every frame, several times the cost of the rest of the frame)."""
        s = self.state
        out = Text(no_wrap=True, overflow="ellipsis")
        title = self.title if len(self.title) <= TITLE_WIDTH else self.title[:TITLE_WIDTH - 1] + "…"
        out.append(f"loadprof live: {title}   {s.elapsed:.0f} s", style="bold cyan")

        def row(label: str, value: str, style: str = "") -> None:
            out.append(f"\n{label:<12}", style="bold")
            out.append(value, style=style)

        rate = f"  {s.steps_per_s:.1f} steps/s (last {RECENT:.0f} s)" if s.steps_per_s is not None else ""
        row("steps", f"{s.steps:,}{rate}")
        if s.waits_timed:
            row("input wait", f"{_pct(s.recent_share)} of step time (last {RECENT:.0f} s)   {_pct(s.total_share)} so far")
        else:
            row("input wait", "not timed yet (under Keras fit, measured when the run ends)", "dim")
        for g in s.gpus:
            mem = ""
            if g.memory_used is not None and g.memory_total:
                mem = f"   memory {g.memory_used / 2**30:.1f} / {g.memory_total / 2**30:.0f} GiB"
            util = f"{g.util_gpu:.0f}%" if g.util_gpu is not None else "n/a"
            row(f"GPU {g.index}", f"utilization {util}{mem}")
        if not s.gpus:
            row("GPU", s.gpu_status or "no readings yet", "dim")
        if s.host is not None:
            h = s.host
            workers = f"   {h.n_children} loader worker{'s' if h.n_children != 1 else ''} {h.children_cpu:.0f}%" \
                if h.n_children else "   no loader workers"
            if h.worker_cpu:  # each worker's, busiest first
                each = sorted(h.worker_cpu, reverse=True)
                more = f" +{len(each) - LIVE_WORKERS} more" if len(each) > LIVE_WORKERS else ""
                workers += ": " + " ".join(f"{c:.0f}%" for c in each[:LIVE_WORKERS]) + more
            row("CPU", f"process {h.process_cpu:.0f}% of a core{workers}")
        else:
            row("CPU", "no readings yet", "dim")
        if not s.waits_timed:
            row("verdict", "when the run ends, once its input waits are measured", "dim")
        elif s.verdict is None:
            row("verdict", "not yet", "dim")
        else:
            row("verdict", s.verdict, _COLOURS.get(s.verdict, "bold"))
            if s.cause:
                out.append(f" ({s.cause})")
            out.append(f"   as of {s.verdict_at:.0f} s", style="dim")
        if s.top_stage is not None:
            top = s.top_stage
            row("top stage", f"{top.stage}   {top.share:.0%} of loading ({top.where}), "
                             f"{top.ms_per_batch:.1f} ms a batch")
        return out


def _pct(share: float | None) -> str:
    return "n/a" if share is None else f"{share:.0%}"


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream is not None and stream.isatty())
    except (ValueError, OSError):
        return False


_ACTIVE: LiveView | None = None


def _restore_in_child() -> None:
    """In a forked child, the real streams back (NOTE [ Live view ])."""
    from rich.file_proxy import FileProxy

    if _ACTIVE is None:
        return
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, FileProxy):
            setattr(sys, name, stream.rich_proxied_file)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_restore_in_child)
