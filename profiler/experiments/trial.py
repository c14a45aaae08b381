"""One trial: the user's unchanged script, run in a child process with fixes applied.

``loadprof tune`` runs many short trials and ``loadprof compare`` a few whole
runs; both go through ``run_trial(spec, timeout)`` here.

NOTE [ Trial lifecycle ]
- The parent writes the spec as JSON into a fresh temporary folder and starts
  ``python -c <child>``; the child runs the script as ``loadprof diagnose`` does
  (``runner.run``: argv, sys.path, exit codes, signals) under
  ``Profile(apply=Applier(...), max_steps=..., json=<report>)`` and then writes
  ``result.json``: exit code, what the fixes changed or skipped, the recorded
  losses, cache probes and set-up time. The parent reads the report back with
  ``load_report``, so a trial's numbers are those of a normal saved run.
- The child leads a new process group (``start_new_session``), so its DataLoader
  workers are in it too. At the time limit the parent sends SIGTERM to the group
  (the runner unwinds the script and still writes the report: partial steps
  survive), waits ``GRACE_S``, then SIGKILLs the group. Ctrl-C in the parent
  kills the group before it propagates; so does SIGTERM inside ``stopping()``
  (``tune`` and ``compare``), which raises ``Terminated`` instead of ending the
  parent where it stands, which left the child and its folder behind. While the
  group is stopped and the folder removed, SIGINT and SIGTERM are held, so a
  second Ctrl-C cannot cut the clean-up short.
- The script's stdout and stderr go to files in that folder; the tail of stderr
  is kept for a trial that crashed. The folder is removed afterwards.
- ``LOADPROF_TRIAL=1`` and the variant's own environment are set in the child;
  nothing else about the script's environment changes.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ..jsonio import write_json
from ..metrics import main_loader
from ..records import Run
from ..settings import Settings
from ..signals import Terminated

T = TypeVar("T")

#: Seconds between SIGTERM and SIGKILL for a trial past its time limit.
GRACE_S = 5.0
#: Lines of the child's stderr kept for a failed trial.
TAIL_LINES = 12

_ROOT = str(Path(__file__).resolve().parents[2])  # the folder that holds the package
_CHILD = (
    "import sys; sys.path.insert(0, {root!r}); import loadprof.experiments.trial as t; "
    "sys.path.remove({root!r}); sys.exit(t.child_main(sys.argv[1]))"
)


@dataclass
class TrialSpec:
    """What a child runs. ``changes`` is a ``Changes.to_dict()``."""

    script: str | None = None
    module: str | None = None
    args: list[str] = field(default_factory=list)
    changes: dict[str, Any] = field(default_factory=dict)
    max_steps: int | None = None
    seed: int | None = 0
    record_losses: bool = True
    probe: bool = False
    gpu: bool = Settings.gpu
    interval: float = Settings.interval
    #: A Python file run in the child just before the script (compare's user variants).
    hook: str | None = None
    #: seconds of what-if replays after the trial's run (whatif.py); a trial is measured whole: none
    what_if: float = 0.0
    #: Extra environment for the child (not written to the spec file).
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class TrialResult:
    """What one trial measured. Throughput counts only the steps after warm-up."""

    name: str
    changes: dict[str, Any] = field(default_factory=dict)
    status: str = "ok"  # "ok", "crashed", "timed out", "too few steps", "skipped"
    detail: str = ""
    exit_code: int | None = None
    wall_s: float = 0.0  # the child process, start to end (interpreter start and imports included)
    script_s: float = 0.0  # the script itself under the profiler
    train_s: float = 0.0  # first step start to last step end
    steps_total: int = 0
    steps_measured: int = 0
    steps_per_s: float | None = None
    samples_per_s: float | None = None
    speedup: float | None = None  # throughput / baseline throughput
    safe: bool | None = None  # None: not judged
    unsafe_reason: str = ""
    loss_check: str = ""
    applied: list[str] = field(default_factory=list)
    not_applied: list[str] = field(default_factory=list)
    setup_s: float = 0.0  # one-time work the fix did (cache fill), outside the measured steps
    losses: list[float] = field(default_factory=list)
    cache_checks: dict[str, Any] = field(default_factory=dict)
    pipeline: dict[str, Any] = field(default_factory=dict)
    tf_batch_sizes: list[int] = field(default_factory=list)
    sites: list[dict[str, Any]] = field(default_factory=list)
    loss_site: list[Any] | None = None
    verdict: str = ""
    cause: str | None = None
    data_wait_fraction: float | None = None
    #: the training process's minor page faults a measured step (None: not read)
    faults_per_step: float | None = None
    #: the share of the CPUs' time the hypervisor took over the measured steps (steal; None: not read)
    steal: float | None = None
    summary: str = ""
    #: the report's warnings ({id, detail}): host-contended makes this trial's timing noisy
    warnings: list[dict[str, str]] = field(default_factory=list)
    loaders: list[dict[str, Any]] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)
    #: the report's cost of the input wait (cost.py's ``Cost.to_dict()``)
    cost: dict[str, Any] = field(default_factory=dict)
    stderr_tail: str = ""
    #: peak memory: the GPU's at its fullest where one was read, else the training
    #: process's peak RSS (the trial's own process: its start-up counts too)
    memory_peak: int | None = None
    memory_where: str = ""  # "GPU" or "host"
    run: Run | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def rate(self) -> float | None:
        """The throughput trials are ranked by: samples/s when known, else steps/s."""
        return self.samples_per_s if self.samples_per_s is not None else self.steps_per_s

    def to_dict(self, losses: bool = False) -> dict[str, Any]:
        d = asdict(self)
        d.pop("run", None)
        if not losses:
            d["losses"] = len(self.losses)
        return d


# -- child side -----------------------------------------------------------------
def child_main(spec_path: str) -> int:
    """Entry of the child process (see NOTE [ Trial lifecycle ])."""
    import runpy

    from ..fixes.applier import Applier
    from ..fixes.spec import Changes
    from ..runner import run
    from ..target import Target, TargetError

    folder = Path(spec_path).parent
    spec = TrialSpec(**json.loads(Path(spec_path).read_text(encoding="utf-8")))
    changes = dict(spec.changes)
    if spec.hook:
        hook_globals = runpy.run_path(spec.hook, run_name="__loadprof_hook__")
        extra = hook_globals.get("changes")
        if isinstance(extra, dict):
            changes.update(extra)
    applier = Applier(Changes.from_dict(changes), record_losses=spec.record_losses, probe=spec.probe, seed=spec.seed)
    target = Target(script=spec.script, module=spec.module, args=list(spec.args))
    code = 0
    error = ""
    try:
        code = run(target, apply=applier, max_steps=spec.max_steps, json=str(folder / "report.json"),
                   print_report=False, gpu=spec.gpu, interval=spec.interval, what_if=spec.what_if)
    except TargetError as exc:
        code, error = 2, str(exc)
    result = {
        "exit_code": code,
        "error": error,
        "applied": applier.messages,
        "not_applied": applier.skipped,
        "losses": [x if math.isfinite(x) else repr(x) for x in applier.losses],
        "cache_checks": {k: v.to_dict() for k, v in applier.cache_checks.items()},
        "setup_s": applier.setup_seconds,
        "pipeline": applier.pipeline,
        "tf_batch_sizes": applier.batch_sizes,
        "sites": [asdict(s) for s in applier.sites],
        "loss_site": list(applier.loss_site) if applier.loss_site else None,
    }
    write_json(folder / "result.json", result, indent=None, default=repr)  # atomic: the parent reads it
    return code


# -- parent side ----------------------------------------------------------------
@contextmanager
def stopping() -> Iterator[None]:
    """SIGTERM raises ``Terminated`` inside the block, so that a trial running then is
    stopped and its folder removed (NOTE [ Trial lifecycle ]); the previous handler after."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers
        return

    def on_sigterm(signum: int, frame: Any) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_stopped_cleanly(command: str, running: str, fn: Callable[[], T]) -> tuple[T | None, int]:
    """``(fn(), 0)`` run under ``stopping()``; on Ctrl-C or SIGTERM, the trial running then
    already stopped and removed, one line naming ``command`` and ``(None, 130 or 143)``."""
    try:
        with stopping():
            return fn(), 0
    except KeyboardInterrupt:
        how, code = "interrupted", 130
    except Terminated:
        how, code = "stopped by SIGTERM", 143
    print(f"loadprof: {command}: {how}; {running} is stopped and removed", file=sys.stderr)
    return None, code


@contextmanager
def _held() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block is done (delivered after it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def run_trial(name: str, spec: TrialSpec, timeout: float, warmup: int = 0) -> TrialResult:
    """Run one trial in a child process; never raises for the script's own failures."""
    folder = Path(tempfile.mkdtemp(prefix="loadprof-trial-"))
    try:
        return _run_in(folder, name, spec, timeout, warmup)
    finally:
        with _held():
            shutil.rmtree(folder, ignore_errors=True)


def _run_in(folder: Path, name: str, spec: TrialSpec, timeout: float, warmup: int) -> TrialResult:
    from ..report import ReportError, load_report

    data = asdict(spec)
    env_extra = data.pop("env")
    spec_path = folder / "spec.json"
    write_json(spec_path, data, indent=None)
    env = {**os.environ, **env_extra, "LOADPROF_TRIAL": "1"}
    out = (folder / "stdout.txt").open("wb")
    err = (folder / "stderr.txt").open("wb")
    result = TrialResult(name, changes=dict(spec.changes))
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD.format(root=_ROOT), str(spec_path)],
        stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env, start_new_session=True,
    )
    timed_out = False
    try:
        try:
            proc.wait(timeout=max(0.1, timeout))
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop_group(proc)
    except BaseException:
        with _held():
            _stop_group(proc, grace=0.5)
        raise
    finally:
        out.close()
        err.close()
    result.wall_s = time.perf_counter() - t0
    result.exit_code = proc.returncode
    result.stderr_tail = _tail(folder / "stderr.txt")
    child: dict[str, Any] = {}
    try:
        child = json.loads((folder / "result.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        pass
    if child:
        result.exit_code = child.get("exit_code", result.exit_code)
        result.applied = list(child.get("applied", []))
        result.not_applied = list(child.get("not_applied", []))
        result.losses = [float(x) for x in child.get("losses", [])]
        result.cache_checks = dict(child.get("cache_checks", {}))
        result.setup_s = float(child.get("setup_s", 0.0))
        result.pipeline = dict(child.get("pipeline", {}))
        result.tf_batch_sizes = list(child.get("tf_batch_sizes", []))
        result.sites = list(child.get("sites", []))
        result.loss_site = child.get("loss_site")
        if child.get("error"):
            result.detail = child["error"]
    report = None
    if (folder / "report.json").exists():
        try:
            report = load_report(folder / "report.json")
        except ReportError as exc:
            result.detail = result.detail or str(exc)
    if report is not None:
        _measure(result, report, warmup, spec)
    if timed_out:
        result.status = "timed out"
        result.detail = f"stopped after {timeout:.0f} s" + (f" ({result.steps_total} steps seen)" if report else "")
    elif child.get("error"):
        result.status = "crashed"
    elif report is None or (result.exit_code not in (0, None) and not _stopped_by_max_steps(report)):
        result.status = "crashed"
        last = result.stderr_tail.strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
        result.detail = f"exit code {result.exit_code}: {last[0][:200]}"
    return result


def _stopped_by_max_steps(report: Any) -> bool:
    return str(report.run.exit_status).startswith("stopped after")


def _measure(result: TrialResult, report: Any, warmup: int, spec: TrialSpec) -> None:
    run: Run = report.run
    result.run = run
    result.script_s = run.duration
    result.steps_total = len(run.steps)
    result.verdict = report.verdict
    result.cause = report.cause
    result.summary = report.diagnosis.summary
    result.warnings = [w._asdict() for w in report.warnings]
    result.data_wait_fraction = report.data_wait_fraction
    faults = report.diagnosis.metrics.faults_per_step
    result.faults_per_step = round(faults, 1) if faults is not None else None
    result.steal = report.diagnosis.metrics.steal
    result.cost = report.cost.to_dict()
    h = report.diagnosis.metrics.headroom
    if h is not None and (h.gpu_peak or h.process_peak):
        result.memory_peak, result.memory_where = (h.gpu_peak, "GPU") if h.gpu_peak else (h.process_peak, "host")
    result.loaders = [asdict(li) for li in run.loaders]
    env = run.environment
    result.environment = {
        "usable_cores": env.usable_cores, "logical_cores": env.logical_cores, "platform": env.platform,
        "python": env.python, "frameworks": dict(env.frameworks), "gpu_status": env.gpu_status,
        "gpus": [asdict(g) for g in env.gpus], "cuda_in_use": env.cuda_in_use, "memory_total": env.memory_total,
    }
    if run.steps:
        result.train_s = run.steps[-1].end - run.steps[0].start
    n, steps_per_s, samples_per_s = throughput(run, warmup)
    result.steps_measured = n
    result.steps_per_s = steps_per_s
    result.samples_per_s = samples_per_s
    if samples_per_s is None and steps_per_s is not None:
        result.samples_per_s = _samples_from_batch_size(result, steps_per_s)
    if spec.max_steps is not None and n < 3:
        result.status = "too few steps"
        result.detail = (f"{len(run.steps)} steps seen, {n} after {warmup} warm-up: "
                         "need 3 or more (is the loop visible to loadprof?)")


def _samples_from_batch_size(result: TrialResult, steps_per_s: float) -> float | None:
    """samples/s when steps carry no batch size: the main loader's batch size (times the
    micro-batches per optimizer step under accumulation), or the tf.data batch size when unique."""
    main = main_loader(result.run) if result.run is not None else None  # the report's main loader
    if main is not None and main.framework == "torch" and main.batch_size:
        divided = any("batch_size" in s.get("after", {}) for s in result.sites)
        k = int(result.changes.get("accumulation") or 1) if divided else 1
        return steps_per_s * main.batch_size * k
    sizes = set(result.tf_batch_sizes)
    if len(sizes) == 1:
        return steps_per_s * sizes.pop()
    return None


def throughput(run: Run, warmup: int) -> tuple[int, float | None, float | None]:
    """(measured steps, steps/s, samples/s) over the steps after ``warmup``.

    Steps are contiguous (each starts where the previous ended), so their span is
    the time the loop took. samples/s needs every measured step's batch size. The
    steps TensorFlow's profiler window traced (slower, by as much as the pipeline has
    ops: a parallel map more than a serial one) are left out, in trials alike.
    """
    steps = run.steps[warmup:]
    a, b = run.probes.tf_window_start_s, run.probes.tf_window_end_s
    traced = {id(s): s for s in steps if a is not None and b is not None and s.end > a and s.start < b}
    if traced and len(traced) < len(steps):
        span = steps[-1].end - steps[0].start - sum(s.duration for s in traced.values())
        steps = [s for s in steps if id(s) not in traced]
    else:
        span = steps[-1].end - steps[0].start if steps else 0.0
    if not steps:
        return 0, None, None
    if span <= 0:
        return len(steps), None, None
    sizes = [s.batch_size for s in steps]
    samples = sum(s for s in sizes if s) / span if all(sizes) else None
    return len(steps), len(steps) / span, samples


def _stop_group(proc: subprocess.Popen[bytes], grace: float = GRACE_S) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the workers too, even when the leader already left
    except ProcessLookupError:
        pass
    proc.wait()


def _tail(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-TAIL_LINES:])


# -- the correctness guard --------------------------------------------------------
#: Windows the loss trajectory is split into; each window's mean is compared.
LOSS_WINDOWS = 4


#: Standard errors a window's mean may move by noise alone. Four windows are
#: compared, so each needs a small false-alarm rate: 3 (0.3% for normal noise).
NOISE_Z = 3.0


def compare_losses(base: list[float], trial: list[float], tolerance: float) -> tuple[bool | None, str]:
    """Is ``trial``'s loss trajectory within ``tolerance`` (relative) of ``base``'s,
    or within the baseline's own noise where that is larger?

    Both runs made the same number of optimizer steps from the same seed. Each
    trajectory is cut into ``LOSS_WINDOWS`` equal parts by position (so a trial
    recording two micro-batch losses per step lines up with the baseline) and
    the window means are compared. None: nothing to compare.

    NOTE [ Loss noise ]
    A harmless change can still move the loss: loader workers draw their own
    random streams (Python ``random`` or NumPy augmentation in ``__getitem__``), so
    every batch differs from the baseline's by as much as batches differ from one
    another. That spread is measured on the baseline itself: the step-to-step
    standard deviation of its loss from successive differences (so the falling
    trend does not count), ``loss_noise``. A window's mean moves by noise alone up
    to ``NOISE_Z`` standard errors of the difference of two such means; only a
    move beyond both that and ``tolerance`` makes a fix unsafe.
    """
    if not base or not trial:
        return None, "no losses recorded"
    if not all(math.isfinite(x) for x in trial) and all(math.isfinite(x) for x in base):
        return False, "the loss became NaN or infinite"
    windows = min(LOSS_WINDOWS, len(base), len(trial))
    sigma = loss_noise(base)
    worst, worst_ratio, worst_allowed = 0.0, -1.0, tolerance
    for i in range(windows):
        b = _window_mean(base, i, windows)
        t = _window_mean(trial, i, windows)
        scale = max(abs(b), 1e-3)
        moved = abs(t - b) / scale
        n_b, n_t = _window_size(len(base), i, windows), _window_size(len(trial), i, windows)
        allowed = max(tolerance, NOISE_Z * sigma * math.sqrt(1 / n_b + 1 / n_t) / scale)
        if moved / allowed > worst_ratio:
            worst, worst_ratio, worst_allowed = moved, moved / allowed, allowed
    ok = worst_ratio <= 1.0
    noise = f", the baseline's noise allows {worst_allowed:.1%}" if worst_allowed > tolerance else ""
    return ok, f"loss within {worst:.1%} of the baseline's{noise}" if ok else \
        f"loss moved {worst:.1%} from the baseline's (tolerance {tolerance:.0%}{noise})"


def loss_noise(losses: list[float]) -> float:
    """The step-to-step standard deviation of a loss trajectory, trend left out:
    sqrt(mean((x[i+1] - x[i])**2) / 2), von Neumann's estimator (NOTE [ Loss noise ])."""
    xs = [x for x in losses if math.isfinite(x)]
    if len(xs) < 3:
        return 0.0
    diffs = [b - a for a, b in zip(xs, xs[1:], strict=False)]
    return math.sqrt(sum(d * d for d in diffs) / (2 * len(diffs)))


def _window_size(n: int, i: int, windows: int) -> int:
    lo = n * i // windows
    return max(1, max(lo + 1, n * (i + 1) // windows) - lo)


def _window_mean(values: list[float], i: int, windows: int) -> float:
    lo = len(values) * i // windows
    hi = max(lo + 1, len(values) * (i + 1) // windows)
    part = [v for v in values[lo:hi] if math.isfinite(v)]
    return sum(part) / len(part) if part else float("nan")
