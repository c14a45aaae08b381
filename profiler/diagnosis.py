"""Pure diagnosis: a recorded ``Run`` in, a ``Diagnosis`` (verdict + evidence) out.

No I/O, no threads, no frameworks: tests build a ``Run`` by hand.

Verdicts, checked in this order:
1. ``inconclusive``: fewer than ``min_steps`` steps after warm-up, or a TensorFlow
   run whose input time could not be measured (``Run.data_wait_method`` empty).
2. ``memory-bound``: an out-of-memory error during the run.
3. ``data-starved``: input time (batch wait + host-to-device copies) >= 20% of
   step time, with a sub-cause (``CAUSES``). For a loader on the process's threads (tf.data) the sub-cause comes from
   the process's CPU while the loop waited (``_threads_data_cause``).
4. ``memory-bound``: GPU memory >= 90% of capacity, or host memory pressure
   (swap grew, or available memory fell under 5%); its cause ``workers-copy-on-read``
   where the loader workers' copies of the dataset's objects are what ran the host
   short (``copies_limit``), else ``host-memory``.
5. ``host-bound``: a GPU is in use but busy < 50% of the time although input is
   not the problem: Python or kernel-launch overhead leaves it idle.
6. ``compute-bound``: otherwise; the accelerator (or, with no GPU, the CPU) is
   doing the model's work and input keeps up.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from .frameworks import for_loader
from .loaderhost import (
    Copies,
    copy_on_read,
    oversubscribed,
    shards_fewer_than_workers,
    shm_fit,
    shm_small,
    slow_worker,
    start_up,
    worker_copies,
)
from .oom import OutOfMemory, WorkerDeath, classify, describe, worker_death
from .records import GpuSample, HostSample, LoaderInfo, Run, Step
from .stagemodel import loading, top_stage_line
from .units import percent_text as _pct
from .units import seconds_text as _secs
from .units import size_text
from .waits import Waits, input_waits, stalls_warning

VERDICTS = ("data-starved", "compute-bound", "memory-bound", "host-bound", "inconclusive")

#: Sub-causes of a data-starved verdict.
CAUSES = {
    "cpu-bound-preprocessing": "CPU-bound preprocessing: loading saturates the usable cores",
    "too-few-workers": "too few loader workers: loading is CPU work and cores are idle",
    "io-latency": "I/O or latency bound: the loop waits while the loaders are mostly idle",
    "host-to-device": "host-to-device copies: the loop is blocked copying batches to the GPU",
    "host-contended": "CPU contention: other processes hold the cores that the loop and its loaders "
                      "wait for (waiting for a CPU, not for I/O)",
    "workers-unmeasured": "not known: the loader workers ran too briefly for the host sampler to see them "
                          "(profile more steps, or measure with loadprof tune)",
}
#: The same sub-causes for a loop that reads its batches with no loader of a framework
#: (a generator, its own code): there are no workers to name.
LOOP_CAUSES = {
    "cpu-bound-preprocessing": "CPU-bound input: the loop's own code prepares each batch on the training thread",
    "io-latency": "I/O or latency bound: the loop's own input code waits without using the CPU",
}


@dataclass(frozen=True)
class Thresholds:
    """Every cut-off the diagnosis uses, with where it comes from."""

    #: TensorFlow Profiler input-pipeline analyzer (xprof op_stats_to_input_pipeline_analysis):
    #: >= 20% of step time waiting on input is HIGHLY input-bound ...
    input_high: float = 0.20
    #: ... and >= 5% MODERATELY input-bound. PyTorch's tb-plugin also flags DataLoader > 5%.
    input_moderate: float = 0.05
    #: PyTorch tb-plugin: peak memory > 90% of device memory -> memory advice.
    gpu_memory_high: float = 0.90
    #: PyTorch tb-plugin: GPU utilization < 50% -> low utilization advice.
    gpu_util_low: float = 50.0
    #: Ours: the loader's process tree uses >= 85% of the usable cores = saturated.
    #: (TraceML calls compute-bound at 0.85; we use the same share for "cores are full".)
    cpu_saturated: float = 0.85
    #: Ours: a loader worker busy >= 60% of a core is doing CPU work, not waiting on I/O.
    worker_busy: float = 0.60
    #: Ours: the training thread spent >= 60% of its wait on CPU -> in-process loading is CPU work.
    wait_cpu_bound: float = 0.60
    #: Ours: host memory pressure = swap grew by this much, or available memory under 5%.
    swap_growth_bytes: int = 256 * 2**20
    memory_available_low: float = 0.05
    #: Steps needed after warm-up to judge at all (TraceML needs 20; we judge from 5
    #: but say "low" confidence under 20).
    min_steps: int = 5
    confident_steps: int = 20
    #: Ours: the evidence line for garbage collection taken out of batch waits is shown
    #: from this share of the judged steps' time: it moved the input share by a point.
    gc_in_waits_shown: float = 0.01
    #: Ours: the host is contended when processes outside the job keep >= 25% of the
    #: usable cores busy (a quarter: half a core on the 2-core CI VM, 4 of 16) ...
    contended_others: float = 0.25
    #: ... or the training thread or the loader workers spend >= 10% of the time
    #: runnable but waiting for a CPU (Linux schedstat run-queue time): then a
    #: loader that looks idle is waiting for a core, not for I/O.
    contended_run_delay: float = 0.10
    #: Ours: ... and for at least a third of the time they were off a core: queued that much,
    #: more cores would cut their batches by a third; less, they sleep (storage, the network)
    contended_idle_share: float = 1 / 3
    #: Ours: a step's input wait is a stall from five times the judged steps' median wait
    #: (a batch a few times the usual one is jitter; five times is out of the body) ...
    stall_over_median: float = 5.0
    #: ... and from half the median step: a shorter hiccup is not a pause anyone sees, and
    #: with no median wait at all (workers keeping up) it is the only floor there is.
    stall_of_step: float = 0.5
    #: Ours: the loop waits for its tail (warning ``input-stalls``) when the stalls are at most
    #: a quarter of the judged steps (more, and the long waits are the body, the input
    #: share's business) ...
    stall_steps_max: float = 0.25
    #: ... hold at least half of the judged steps' input wait (the mean is made of them, so
    #: a faster median would not help), and at least ``input_moderate`` of their time (the
    #: share from which input is worth fixing at all).
    stall_wait_share: float = 0.50
    #: Ours: the epoch starts' stalls say how much of them was freeing the last epoch's
    #: iterator (tf.data's ``stop_s``) from a tenth: less is the pipeline's start.
    epoch_start_freeing_shown: float = 0.10
    #: ... and of the whole input wait, at which the cause line says it
    freeing_cause_share: float = 0.5


DEFAULT_THRESHOLDS = Thresholds()


@dataclass
class Evidence:
    """One measured number that took part in the decision."""

    key: str
    label: str
    value: float | None
    display: str
    threshold: str = ""  # the rule it was compared with, when one applies
    source: str = ""  # where the rule comes from


@dataclass
class Headroom:
    """Memory at its fullest while training and what was left, with the largest batch
    the loop was fed (the fullest point is where it is fed, as a rule)."""

    batch: int | None = None  # the largest batch the loop was fed
    gpu_index: int | None = None  # the fullest GPU
    gpu_peak: int | None = None  # bytes in use on it at its fullest
    gpu_total: int | None = None
    gpu_source: str = ""  # "NVML" (whole device) or the framework allocator's peak
    allocator_peak: int | None = None  # bytes, the framework allocator's peak reserved (GPU)
    host_available_min: int | None = None  # bytes of host memory available at the lowest
    host_total: int | None = None
    limit_left_min: int | None = None  # bytes left under the process's own limit (RLIMIT_AS, cgroup) at the lowest
    swap_growth: int = 0  # bytes swap grew over the run
    process_peak: int | None = None  # bytes: peak RSS of the training process (getrusage), else sampled
    model_state: int | None = None  # bytes: parameters, gradients and optimizer state (torch)
    step_transient: int | None = None  # bytes held only within a step: activations and temporaries

    @property
    def gpu_fraction(self) -> float | None:
        return self.gpu_peak / self.gpu_total if self.gpu_peak is not None and self.gpu_total else None

    @property
    def host_available_fraction(self) -> float | None:
        if self.host_available_min is None or not self.host_total:
            return None
        return self.host_available_min / self.host_total


@dataclass
class Metrics:
    """Aggregates of a run over the judged steps (warm-up excluded)."""

    steps_total: int = 0
    steps_judged: int = 0
    warmup_steps: int = 0
    step_time_median: float = 0.0
    step_time_mean: float = 0.0
    data_wait_fraction: float = 0.0  # (wait + h2d) / step time
    wait_fraction: float = 0.0
    h2d_fraction: float = 0.0
    wait_per_step: float = 0.0
    wait_cpu_ratio: float | None = None  # CPU seconds / wall seconds of the waiting thread
    #: The same, not capped at one core: tf.data records the whole process's CPU
    #: (its own threads do the work), so this is "cores busy while the loop waited".
    wait_cpu_cores: float | None = None
    compute_per_step: float = 0.0  # step time not spent on input
    batches_per_step: float = 1.0
    usable_cores: int = 1
    cpu_busy: float | None = None  # system CPU busy share over usable cores, 0..1
    tree_cpu_cores: float | None = None  # process + children, in cores
    children_cpu_cores: float | None = None
    workers_seen: int = 0  # max child processes seen
    #: CPU seconds of children the training process reaped that no listing saw (short-lived workers)
    workers_reaped_cpu: float = 0.0
    host_readings: int = 0  # host readings inside the judged steps
    others_cpu_cores: float | None = None  # cores busy outside the job's process tree
    memory_available_min: int | None = None  # bytes of host memory available at the lowest
    process_memory_peak: int | None = None  # bytes, the training process (PSS where read, else RSS)
    workers_memory_peak: int | None = None  # bytes, its loader workers together (PSS where read)
    oom_kills: int | None = None  # the kernel's OOM kills during the run, None where unreadable
    run_delay: float | None = None  # share of time the training thread waited for a CPU
    workers_run_delay: float | None = None  # the same, mean per loader worker
    #: cores' worth of the training process's other threads queued for a CPU (a loader on its
    #: own threads: tf.data, a thread mapper), and on one; None where not read
    threads_run_delay: float | None = None
    threads_cpu: float | None = None
    judged_seconds: float = 0.0  # from the first judged step's start to the last one's end
    swap_growth: int = 0
    memory_available_min_fraction: float | None = None
    disk_read_bps: float | None = None
    iowait: float | None = None
    gpu_in_use: bool = False
    gpu_available: bool = False
    gpu_util_median: float | None = None
    gpu_memory_peak_fraction: float | None = None
    pcie_rx_kbs: float | None = None
    headroom: Headroom | None = None  # memory at its fullest and what was left
    waits: Waits | None = None  # the input wait per step as a distribution, and its stalls (diagnose sets it)
    loader: LoaderInfo | None = None


@dataclass
class Diagnosis:
    verdict: str
    cause: str | None
    summary: str
    confidence: str  # "high", "medium", "low"
    evidence: list[Evidence] = field(default_factory=list)
    metrics: Metrics = field(default_factory=Metrics)
    moderate_input: bool = False  # input 5-20%: worth fixing though not the main limit
    #: (id, detail) of conditions that make the measurement itself less telling
    warnings: list[tuple[str, str]] = field(default_factory=list)

    def contended(self) -> bool:
        """Whether other processes held the cores: the cause, or a warning beside another cause."""
        return self.cause == "host-contended" or any(wid == "host-contended" for wid, _ in self.warnings)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["metrics"].pop("loader", None)
        return d


# -- metrics ---------------------------------------------------------------
def warmup_count(n: int) -> int:
    """Steps left out of judgement: compilation, allocator growth, worker start-up."""
    if n < 4:
        return 0
    return min(5, max(1, n // 10))


#: Readings over less than this (seconds: the host sampler lists the job's processes once a
#: second) cannot tell the job's new workers from other processes by the busy cores alone
ATTRIBUTION_WINDOW_S = 1.0


def _window(samples: list[Any], start: float, end: float) -> list[Any]:
    inside = [s for s in samples if start <= s.t <= end]
    return inside or samples


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _time_mean(readings: list[tuple[float, float]]) -> float | None:
    """The mean of (rate, window seconds) readings weighted by their windows; a plain
    mean when a window is unknown (0: a run saved before windows were recorded)."""
    if not readings:
        return None
    total = sum(w for _, w in readings)
    if total <= 0 or any(w <= 0 for _, w in readings):
        return _mean([v for v, _ in readings])
    return sum(v * w for v, w in readings) / total


def main_loader(run: Run) -> LoaderInfo | None:
    """The loader that fed training: the one most iterated with gradients on, first seen on ties."""
    if not run.loaders:
        return None
    return max(run.loaders, key=lambda li: (li.iterations - li.eval_iterations, li.iterations))


#: Steps a changed loader must run (after its own warm-up) for the report to judge it alone.
MIN_STEPS_AFTER_CHANGE = 5


def _after_change(steps: list[Step], when: float) -> int:
    """The records to leave out so that only the steps after a change at ``when`` (with
    their own warm-up: new workers start) are judged; none where too few came after."""
    first = next((i for i, s in enumerate(steps) if s.start >= when), len(steps))
    after = sum(s.merged for s in steps[first:])
    skip = first + warmup_count(after)
    return skip if sum(s.merged for s in steps[skip:]) >= MIN_STEPS_AFTER_CHANGE else 0


def compute_metrics(run: Run) -> Metrics:
    total_steps = sum(s.merged for s in run.steps)
    m = Metrics(steps_total=total_steps, usable_cores=max(1, run.environment.usable_cores))
    m.warmup_steps = warmup_count(total_steps)
    if run.judge_after is not None:
        m.warmup_steps = max(m.warmup_steps, _after_change(run.steps, run.judge_after))
    # Warm-up records are never merged (Timeline keeps its first records as they are).
    steps: list[Step] = run.steps[m.warmup_steps:]
    m.steps_judged = sum(s.merged for s in steps)
    m.loader = main_loader(run)
    m.gpu_available = run.environment.gpu_status == "available"
    m.headroom = headroom(run)  # a run that died before its steps were judged has one too
    if not steps:
        return m
    durations = [s.duration for s in steps]
    total = sum(durations) or 1e-12
    wait = sum(s.data_wait for s in steps)
    h2d = sum(s.h2d for s in steps)
    m.step_time_median = statistics.median(s.duration / s.merged for s in steps)
    m.step_time_mean = total / m.steps_judged
    m.wait_fraction = wait / total
    m.h2d_fraction = h2d / total
    m.data_wait_fraction = min(1.0, (wait + h2d) / total)
    m.wait_per_step = wait / m.steps_judged
    m.compute_per_step = max(0.0, (total - wait - h2d) / m.steps_judged)
    if wait > 0:
        m.wait_cpu_cores = sum(s.data_wait_cpu for s in steps) / wait
        m.wait_cpu_ratio = min(1.0, m.wait_cpu_cores)
    sizes = [s.batch_size / s.merged for s in steps if s.batch_size]
    if m.loader and m.loader.batch_size and sizes:
        m.batches_per_step = statistics.mean(sizes) / m.loader.batch_size

    start, end = steps[0].start, steps[-1].end
    m.judged_seconds = end - start
    host: list[HostSample] = _window(run.host_samples, start, end)
    m.host_readings = len(host)
    # A reading's CPU figures are rates over the time since the reading before it, so
    # they are averaged weighted by that window: the reading start() takes right after
    # the baselines, or the one stop() takes just after a tick, counts for its
    # milliseconds (over which /proc/stat's 10 ms clock ticks read 0% or 100%), not
    # for an interval's worth (in a run shorter than one interval it is one of the
    # two readings there are).
    cpu_host = [h for h in host if h.cpu_per_core] or host
    if cpu_host:
        busy = [(sum(h.cpu_per_core) / (100.0 * m.usable_cores), h.window) for h in cpu_host if h.cpu_per_core]
        m.cpu_busy = min(1.0, _time_mean(busy)) if busy else None  # type: ignore[type-var]
        # workers the listings missed count too, once reaped (HostSample.reaped_cpu)
        m.tree_cpu_cores = _time_mean([((h.process_cpu + h.children_cpu + h.reaped_cpu) / 100.0, h.window)
                                       for h in cpu_host])
        m.children_cpu_cores = _time_mean([((h.children_cpu + h.reaped_cpu) / 100.0, h.window) for h in cpu_host])
        m.workers_seen = max(h.n_children for h in cpu_host)
        m.workers_reaped_cpu = sum(h.reaped_cpu / 100.0 * h.window for h in cpu_host)
        # Busy cores minus the tree's own CPU: what other processes took of the usable
        # cores. Never negative (the tree may run on cores outside the affinity list), but
        # over the whole window, not reading by reading: workers the listings missed land
        # in the reading that reaped them, after readings that saw their CPU as no one's.
        others = [((sum(h.cpu_per_core) - h.process_cpu - h.children_cpu - h.reaped_cpu - h.profiler_cpu)
                   / 100.0, h.window)
                  for h in cpu_host if h.cpu_per_core]
        m.others_cpu_cores = max(0.0, _time_mean(others) or 0.0) if others else None
        workers = m.loader is not None and bool(m.loader.num_workers)
        # (a window of 0: a run saved before windows were recorded, its length unknown)
        short = all(h.window > 0 for h in cpu_host) and sum(h.window for h in cpu_host) < ATTRIBUTION_WINDOW_S
        if m.others_cpu_cores and workers and (not m.workers_seen or short):
            # workers no listing saw, or a window shorter than a listing's period: the busy
            # cores the tree did not account for may be its workers'; other processes hold at
            # most what they were seen to hold
            named = sum(p.cores for p in run.other_processes)
            m.others_cpu_cores = min(m.others_cpu_cores, named)
        delays = [(h.process_run_delay, h.window) for h in cpu_host if h.process_run_delay is not None]
        m.run_delay = _time_mean(delays) if delays else None
        worker_delays = [(h.children_run_delay / h.n_children, h.window) for h in cpu_host
                         if h.n_children and h.process_run_delay is not None]
        m.workers_run_delay = _time_mean(worker_delays) if worker_delays else None
        # read once a second: each reading's figures cover the time since the one before that had them
        threads = [(h.threads_cpu, h.threads_run_delay) for h in cpu_host
                   if h.threads_cpu is not None and h.threads_run_delay is not None]
        if threads:
            m.threads_cpu = sum(c for c, _ in threads) / len(threads)
            m.threads_run_delay = sum(d for _, d in threads) / len(threads)
    _memory_metrics(run, m)
    if run.host_samples:
        m.swap_growth = max(0, run.host_samples[-1].swap_used - run.host_samples[0].swap_used)
        if run.environment.memory_total:
            m.memory_available_min_fraction = min(h.memory_available for h in run.host_samples) / run.environment.memory_total
        m.disk_read_bps = _mean([h.disk_read_bps for h in host])
        m.iowait = _time_mean([(h.iowait_percent, h.window) for h in host if h.iowait_percent is not None])

    gpu: list[GpuSample] = _window(run.gpu_samples, start, end)
    m.gpu_in_use = run.environment.cuda_in_use or any((g.process_memory_used or 0) > 0 for g in gpu)
    if gpu:
        by_device: dict[int, list[GpuSample]] = {}
        for g in gpu:
            by_device.setdefault(g.index, []).append(g)
        # Judge the busiest device: the one this job trains on.
        medians = {
            i: statistics.median([g.util_gpu for g in gs if g.util_gpu is not None])
            for i, gs in by_device.items()
            if any(g.util_gpu is not None for g in gs)
        }
        if medians:
            m.gpu_util_median = max(medians.values())
        fractions = [
            g.memory_used / g.memory_total
            for g in gpu
            if g.memory_used is not None and g.memory_total
        ]
        if fractions:
            m.gpu_memory_peak_fraction = max(fractions)
        rx = [g.pcie_rx_kbs for g in gpu if g.pcie_rx_kbs is not None]
        m.pcie_rx_kbs = _mean(rx)
    # The framework's own allocator peak, when the GPU could not be sampled.
    for peak in run.allocator_peaks:
        if peak.total:
            m.gpu_memory_peak_fraction = max(m.gpu_memory_peak_fraction or 0.0, peak.peak_reserved / peak.total)
    return m


def _memory_metrics(run: Run, m: Metrics) -> None:
    """Memory over the whole run (an out-of-memory error ends it, often before the
    judged steps): the lowest available, the peaks of the process and its workers."""
    hosts = run.host_samples
    if not hosts:
        return
    available = [h.memory_available for h in hosts if h.memory_available]
    m.memory_available_min = min(available) if available else None
    m.process_memory_peak = max((h.process_pss or h.process_rss) for h in hosts) or None
    m.workers_memory_peak = max((h.children_pss if h.children_pss is not None else h.children_rss)
                                for h in hosts) or None
    kills = [h.oom_kills for h in hosts if h.oom_kills is not None]
    m.oom_kills = kills[-1] - kills[0] if len(kills) >= 2 else None


def _largest_batch(run: Run) -> int | None:
    """The largest batch the loop was fed at once: a training loader's batch size (under
    gradient accumulation a step's samples add up several of them), else a step's."""
    loaders = [li.batch_size for li in run.loaders if li.batch_size and li.iterations > li.eval_iterations]
    if run.oom_errors and len(loaders) > 1:
        loaders.pop()  # the loader the run died on: its batch never finished a step
    if loaders:
        return max(loaders)
    sizes = [s.batch_size // s.merged for s in run.steps if s.batch_size]
    return max(sizes) if sizes else None


def headroom(run: Run) -> Headroom | None:
    """Memory at its fullest and what was left (NOTE [ Memory headroom ])."""
    h = Headroom(batch=_largest_batch(run))
    gpus = [g for g in run.gpu_samples if g.memory_used is not None and g.memory_total]
    if gpus:
        g = max(gpus, key=lambda g: (g.memory_used or 0) / (g.memory_total or 1))
        h.gpu_index, h.gpu_peak, h.gpu_total, h.gpu_source = g.index, g.memory_used, g.memory_total, "NVML"
    for peak in run.allocator_peaks:
        h.allocator_peak = max(h.allocator_peak or 0, peak.peak_reserved)
        if peak.total and (h.gpu_fraction is None or peak.peak_reserved / peak.total > h.gpu_fraction):
            # The allocator's peak is exact; NVML sampled once a tick can miss a short one.
            h.gpu_index, h.gpu_peak, h.gpu_total = peak.index, peak.peak_reserved, peak.total
            h.gpu_source = f"{peak.allocator} allocator"
    hosts = run.host_samples
    available = [s.memory_available for s in hosts if s.memory_available]
    h.host_available_min = min(available) if available else None
    h.host_total = run.environment.memory_total or None
    limits = [s.memory_limit_left for s in hosts if s.memory_limit_left is not None]
    h.limit_left_min = min(limits) if limits else None
    if run.host_samples:
        h.swap_growth = max(0, run.host_samples[-1].swap_used - run.host_samples[0].swap_used)
        sampled = max((s.process_pss or s.process_rss) for s in run.host_samples) or None
        h.process_peak = run.probes.process_peak_rss_bytes or sampled
    elif run.probes.process_peak_rss_bytes:
        h.process_peak = run.probes.process_peak_rss_bytes
    h.model_state = run.probes.torch_model_state_bytes or None
    steady, top = run.probes.torch_steady_bytes, run.probes.torch_peak_bytes
    if steady and top and top > steady:
        h.step_transient = top - steady
    if h.gpu_peak is None and h.host_available_min is None and h.process_peak is None:
        return None
    return h


def headroom_line(h: Headroom) -> str:
    """The headroom for the report, in one line."""
    parts = []
    if h.gpu_peak is not None and h.gpu_total:
        parts.append(f"GPU {h.gpu_index}: {size_text(h.gpu_peak)} of {size_text(h.gpu_total)} at the peak, "
                     f"{size_text(max(0, h.gpu_total - h.gpu_peak))} free ({h.gpu_source})")
    if h.host_available_min is not None:
        total = f" of {size_text(h.host_total)}" if h.host_total else ""
        parts.append(f"host: {size_text(h.host_available_min)}{total} available at the lowest")
    if h.limit_left_min is not None:
        parts.append(f"{size_text(h.limit_left_min)} left under the process's memory limit at the lowest")
    if h.swap_growth:
        parts.append(f"swap grew {size_text(h.swap_growth)}")
    if h.process_peak:
        parts.append(f"training process peak {size_text(h.process_peak)}")
    if h.model_state and h.step_transient:
        parts.append(f"model state {size_text(h.model_state)}, activations and temporaries {size_text(h.step_transient)}")
    return "; ".join(parts)


def memory_in_use(run: Run, m: Metrics) -> str:
    """What the job held at the last readings, for the report's memory lines."""
    parts = []
    last = run.host_samples[-1] if run.host_samples else None
    if last is not None:
        own = last.process_pss or last.process_rss
        kind = "PSS" if last.process_pss else "RSS"
        parts.append(f"training process {size_text(own)} ({kind})")
        workers = last.children_pss if last.children_pss is not None else last.children_rss
        if last.n_children:
            parts.append(f"{last.n_children} loader worker(s) {size_text(workers)}")
        if last.memory_available:
            parts.append(f"host memory available {size_text(last.memory_available)}")
        if last.memory_limit_left is not None:
            parts.append(f"{size_text(last.memory_limit_left)} left under the process's memory limit")
    gpus = [g for g in run.gpu_samples if g.memory_used is not None and g.memory_total]
    if gpus:
        g = max(gpus, key=lambda g: g.t)
        parts.append(f"GPU {g.index} memory {size_text(g.memory_used or 0)} of {size_text(g.memory_total or 0)}")
    return ", ".join(parts) or "not read"


# NOTE [ Memory headroom ]
# Memory is read while training, not only at a crash, each source at the cost it allows:
# NVML's device memory and the host's available memory and swap at every sampler tick;
# the PSS of the process and its workers once a second (the kernel walks page tables for
# it); the framework allocator's peak (torch.cuda.max_memory_reserved/allocated,
# tf.config.experimental.get_memory_info) and the process's peak RSS (getrusage) once, at
# the end, since the allocator keeps its own peak exactly; and once, at the third optimizer
# step, what stays held between steps (parameters, gradients, optimizer state). The peak
# minus what stays between steps is what a step holds only while it runs: activations
# and temporaries, the share checkpointing and smaller micro-batches cut. The headroom is
# the least left over the run, shown with the largest batch fed at once (a loader's batch:
# under accumulation a step adds several), the one that decides whether a batch fits.
# Near the limit means the PyTorch tb-plugin's cut-off (> 90% of device memory), or host
# memory under ``memory_available_low`` or swapping.


def _headroom_evidence(h: Headroom, th: Thresholds) -> Evidence:
    at = f"at the largest batch ({h.batch})" if h.batch else "over the run"
    gpu = h.gpu_fraction
    if gpu is not None:
        return Evidence("memory_headroom", f"Memory headroom {at}", 1.0 - gpu, headroom_line(h),
                        f"peak >= {_pct(th.gpu_memory_high)} of the device = near the limit", "PyTorch tb-plugin")
    host = h.host_available_fraction
    return Evidence("memory_headroom", f"Memory headroom {at}", host, headroom_line(h),
                    f"available < {_pct(th.memory_available_low)} or swap growing = near the limit", "loadprof")


def near_limit(h: Headroom | None, th: Thresholds = DEFAULT_THRESHOLDS, gpu_in_use: bool = True) -> str | None:
    """Why memory is near its limit though nothing ran out, or None when there is room
    (a full GPU the job does not use is not its limit)."""
    if h is None:
        return None
    if gpu_in_use and h.gpu_fraction is not None and h.gpu_fraction >= th.gpu_memory_high:
        return (f"GPU {h.gpu_index} memory peaked at {_pct(h.gpu_fraction)} of {size_text(h.gpu_total or 0)} "
                f"({h.gpu_source}): a larger batch or a longer input would run out")
    host = h.host_available_fraction
    if host is not None and host < th.memory_available_low:
        return f"host memory available fell to {_pct(host)} ({size_text(h.host_available_min or 0)})"
    if h.swap_growth >= th.swap_growth_bytes:
        return f"swap grew {size_text(h.swap_growth)} during the run"
    return None


def _host_short(m: Metrics, th: Thresholds, freed: int = 0) -> bool:
    """Host memory pressure: swap grew, or available memory fell under its mark; as it
    would have been with ``freed`` bytes more available all along."""
    low = m.memory_available_min_fraction is not None and m.memory_available_min_fraction < th.memory_available_low
    if low and freed and m.memory_available_min is not None and m.memory_available_min_fraction:
        total = m.memory_available_min / m.memory_available_min_fraction
        low = (m.memory_available_min + freed) / total < th.memory_available_low
    return m.swap_growth - freed >= th.swap_growth_bytes or low


def copies_limit(m: Metrics, copies: Copies | None, th: Thresholds = DEFAULT_THRESHOLDS) -> str | None:
    """What the loader workers' copies of the dataset did to the host's memory, where they
    are what ran it short: under pressure, and with the copies' bytes free it would not
    have been. None otherwise."""
    if copies is None or not _host_short(m, th) or _host_short(m, th, copies.copied):
        return None
    parts = []
    if m.memory_available_min_fraction is not None and m.memory_available_min_fraction < th.memory_available_low:
        parts.append(f"host memory available fell to {_pct(m.memory_available_min_fraction)} "
                     f"({size_text(m.memory_available_min or 0)}) at the lowest")
    if m.swap_growth >= th.swap_growth_bytes:
        parts.append(f"swap grew {size_text(m.swap_growth)}")
    return (" and ".join(parts) + f": the loader workers' {size_text(copies.copied)} of copies of the dataset's "
            f"objects are what ran it short (without them, {_pct(th.memory_available_low)} or more available and "
            f"swap growth under {size_text(th.swap_growth_bytes)})")


def _out_of_memory(run: Run, m: Metrics, oom: OutOfMemory, ev: list[Evidence]) -> Diagnosis:
    """The verdict of a run that ran out of memory: what failed, and what was held then."""
    ev.insert(0, Evidence("oom", "Out-of-memory error during the run", 1.0, describe(oom)))
    held = memory_in_use(run, m)
    ev.insert(1, Evidence("memory_at_oom", "Memory in use at the last reading before it", None, held))
    if m.headroom is not None:
        ev.append(_headroom_evidence(m.headroom, DEFAULT_THRESHOLDS))
    confidence = "high"
    if oom.kind == "shared-memory":
        fit = shm_fit(run.environment, m.loader)
        shm = (fit.line() if fit is not None else
               f"/dev/shm: {size_text(run.environment.shm_free)} free of {size_text(run.environment.shm_total or 0)} "
               "at the start" if run.environment.shm_free is not None else "/dev/shm was not read")
        ev.insert(1, Evidence("shm", "Batches in flight through /dev/shm", float(fit.in_flight) if fit else None, shm))
        return Diagnosis("memory-bound", "shared-memory",
                         f"{describe(oom)}: out of /dev/shm, where workers hand batches over; {shm}",
                         confidence, ev, m)
    if oom.kind == "worker-died":
        if m.oom_kills:
            ev.insert(1, Evidence("oom_kills", "Processes the kernel's OOM killer killed during the run",
                                  float(m.oom_kills), f"{m.oom_kills}", source="Linux /proc/vmstat oom_kill"))
            summary = f"the kernel's OOM killer ended loader worker {oom.worker} (SIGKILL)"
        else:
            summary = (f"loader worker {oom.worker} died without an error; the kernel's count of OOM kills "
                       "could not be read, so out of memory is likely, not shown")
            confidence = "low"
        return Diagnosis("memory-bound", "loader-out-of-memory", f"{summary}; {held}", confidence, ev, m)
    cause = "loader-out-of-memory" if oom.kind == "worker" else "out-of-memory"
    where = {"gpu": "on the GPU", "host": "in host memory"}[oom.device]
    return Diagnosis("memory-bound", cause, f"ran out of memory {where}: {describe(oom)}; {held}", confidence, ev, m)


def holders(run: Run) -> str:
    """The busiest processes outside the job, as a report names them, or ""."""
    return ", ".join(f"pid {p.pid} `{p.command}` {p.cores:.2f} cores" for p in run.other_processes[:3])


def _worker_statuses(run: Run) -> dict[str, WorkerDeath]:
    """Loader workers that died of something other than memory (an exit code, a signal
    other than the OOM killer's SIGKILL and /dev/shm's SIGBUS), by pid."""
    lines = [run.exit_status.removeprefix("exception: ")] + run.oom_errors
    found = (worker_death(line) for line in lines)
    return {d.worker: d for d in found if d is not None and not d.could_be_oom and d.signal != "Bus error"}


def _worker_crash(run: Run) -> str | None:
    """What a loader worker that crashed died of, in the report's words; None when none did."""
    died = next(iter(_worker_statuses(run).values()), None)
    if died is None:
        return None
    how = ("a crash in native code or a signal sent to it" if died.signal is not None
           else "its own exit (os._exit or sys.exit in the dataset or a library it calls)")
    return (f"{died.what()}: {how}, not out of memory (the kernel's OOM killer sends SIGKILL); "
            "rerun with num_workers=0 to see the error where it happens")


# -- decision --------------------------------------------------------------
def _data_cause(m: Metrics, th: Thresholds, ev: list[Evidence]) -> str:
    input_time = m.wait_fraction + m.h2d_fraction
    if input_time > 0 and m.h2d_fraction / input_time >= 0.5:
        return "host-to-device"
    adapter = for_loader(m.loader)
    if adapter is not None and adapter.on_threads(m.loader):
        return _threads_data_cause(m, th, ev, adapter.label)
    workers = m.loader.num_workers if m.loader else None
    if not workers:
        # Loading runs on the training thread (num_workers=0 or a generator): its
        # own CPU time during the waits says whether that is computation or waiting.
        ratio = m.wait_cpu_ratio
        if ratio is not None:
            ev.append(Evidence(
                "wait_cpu_ratio", "CPU use of the training thread while it waited for data", ratio,
                _pct(ratio), f">= {_pct(th.wait_cpu_bound)} = loading is CPU work", "loadprof",
            ))
        if ratio is not None and ratio < th.wait_cpu_bound:
            return _idle_or_contended(m, th, ev, m.run_delay, m.wait_fraction * (1.0 - ratio))
        if m.usable_cores >= 2 and m.loader is not None:
            return "too-few-workers"
        return "cpu-bound-preprocessing"
    if not m.workers_seen and m.workers_reaped_cpu <= 0:
        # The tree is relisted once a second: workers that lived through fewer readings
        # than that read as no CPU at all, which is no evidence of idle loaders (unless
        # the training process reaped them: their CPU is known then, their wait for a core not).
        ev.append(Evidence(
            "workers_unseen", "Loader workers seen by the host sampler during the judged steps", 0.0,
            f"0 of {workers} in {m.host_readings} reading(s) over {_secs(m.judged_seconds)}",
        ))
        return "workers-unmeasured"
    tree = (m.tree_cpu_cores or 0.0) / m.usable_cores
    per_worker = (m.children_cpu_cores or 0.0) / workers
    ev.append(Evidence(
        "tree_cpu_share", "CPU used by the training process and its loader workers", tree,
        f"{_pct(tree)} of {m.usable_cores} usable cores", f">= {_pct(th.cpu_saturated)} = saturated", "loadprof",
    ))
    ev.append(Evidence(
        "worker_cpu", "CPU per loader worker", per_worker, f"{_pct(per_worker)} of a core ({workers} workers)",
        f">= {_pct(th.worker_busy)} = busy", "loadprof",
    ))
    if tree >= th.cpu_saturated or (m.cpu_busy or 0.0) >= th.cpu_saturated and per_worker >= th.worker_busy:
        return "cpu-bound-preprocessing"
    if per_worker >= th.worker_busy:
        return "too-few-workers"
    return _idle_or_contended(m, th, ev, m.workers_run_delay, 1.0 - min(1.0, per_worker))


def _contended(m: Metrics, th: Thresholds) -> bool:
    """Whether processes outside the job take a material share of the usable cores."""
    return m.others_cpu_cores is not None and m.others_cpu_cores / m.usable_cores >= th.contended_others


def _idle_or_contended(m: Metrics, th: Thresholds, ev: list[Evidence], delay: float | None,
                       idle: float) -> str:
    """The cause when the input pipeline looks idle: waiting for I/O, unless its own threads
    (the workers, or the thread that loads) were waiting for a CPU (schedstat): for cores that
    other processes held, or that the job's own threads fill.

    ``delay`` is the share of the time those threads were runnable without a core, ``idle``
    the share they spent neither on a core nor, where the wait is the CPU's, queued for one.
    A pipeline starved of CPU is queued for most of its idle time; one that waits on storage
    sleeps through it, however busy the neighbours keep the cores. Queued for a third of it
    or more, more cores would cut its batches by as much: the cause is the CPU; under that,
    I/O."""
    delays = [d for d in (m.run_delay, m.workers_run_delay) if d is not None]
    if delays:
        ev.append(Evidence(
            "run_delay", "Time the training thread (and each worker) waited for a CPU", max(delays),
            " / ".join(_pct(d) for d in delays),
            f">= {_pct(th.contended_run_delay)} and >= a third of the loaders' idle time = waiting for CPU",
            "Linux schedstat",
        ))
    queued = delay is None or delay >= max(th.contended_run_delay, th.contended_idle_share * idle)
    # Other processes are to blame only when the pipeline's own threads were seen
    # queued for a core: with schedstat saying they rarely waited, the wait is I/O.
    if _contended(m, th) and queued:
        return "host-contended"
    # The job's own threads queue for the cores only where the cores are busy: on idle
    # ones the queueing is each wake-up's latency, which a thread waking for every read
    # (a sleeping or I/O-bound loader) piles up to ~10% of its time on a VM.
    if delay is not None and queued and (m.cpu_busy or 0.0) >= th.cpu_saturated:
        return "cpu-bound-preprocessing"
    return "io-latency"


def _freeing_line(m: Metrics, cause: str, th: Thresholds) -> str:
    """Where a pipeline that barely used the CPU spent most of the loop's wait being freed at
    epoch ends (its iterator's stop, timed by the hooks), the summary says so: that idle time
    is the pipeline's own threads winding down, not storage."""
    li = m.loader
    if cause != "io-latency" or li is None:
        return ""
    waited = m.wait_per_step * m.steps_judged
    freed = sum(li.stops_between_epochs())
    if waited <= 0 or freed < th.freeing_cause_share * waited:
        return ""
    return (f"; {_pct(min(1.0, freed / waited))} of that wait was freeing each epoch's iterator, not "
            "storage: one iterator over all epochs is freed once")


def _threads_data_cause(m: Metrics, th: Thresholds, ev: list[Evidence], label: str) -> str:
    """Sub-cause for a loader that runs on the process's own threads (tf.data): there are
    no worker processes.

    ``Step.data_wait_cpu`` holds the process's CPU time while the loop waited
    (iterator-next), or the pipeline's CPU cores measured alone times the wait
    (differential), so cores = CPU seconds / wait seconds. The cut-offs are the
    ones used for workers: the usable cores saturated at ``cpu_saturated``, and
    ``wait_cpu_bound`` of one core meaning the input is CPU work.
    """
    cores = m.wait_cpu_cores
    if cores is None:
        return "io-latency"
    ev.append(Evidence(
        "input_cpu_cores", f"CPU cores busy in the process while the loop waited for {label}", cores,
        f"{cores:.2f} of {m.usable_cores} usable cores",
        f">= {_pct(th.cpu_saturated)} of the cores = saturated; >= {th.wait_cpu_bound:.1f} core = CPU work",
        "loadprof",
    ))
    if cores >= th.cpu_saturated * m.usable_cores:
        return "cpu-bound-preprocessing"
    if cores >= th.wait_cpu_bound:
        if _contended(m, th) and cores + (m.others_cpu_cores or 0.0) >= th.cpu_saturated * m.usable_cores:
            return "host-contended"  # the cores it could grow into while the loop waits are others'
        return "too-few-workers"
    # the loader's threads wait for a core, not the main thread (it sleeps in the wait for a batch)
    delay = m.run_delay
    if m.threads_run_delay is not None:
        delay = min(1.0, m.threads_run_delay)
        ev.append(Evidence(
            "threads_run_delay", f"The process's other threads ({label}'s) waiting for a CPU", delay,
            f"{m.threads_run_delay:.2f} cores' worth (on a CPU: {m.threads_cpu or 0.0:.2f})",
            f">= {_pct(th.contended_run_delay)} of a core and >= a third of the loader's idle time = waiting "
            "for CPU", "Linux schedstat",
        ))
    return _idle_or_contended(m, th, ev, delay, m.wait_fraction * (1.0 - min(1.0, cores)))


def diagnose(run: Run, thresholds: Thresholds = DEFAULT_THRESHOLDS) -> Diagnosis:
    """The verdict on a run, with its evidence, and the warnings that qualify it."""
    d = _decide(run, thresholds)
    m = d.metrics
    if d.verdict != "inconclusive" and m.others_cpu_cores is not None:
        d.evidence.append(Evidence(
            "others_cpu", "CPU used by processes outside the job", m.others_cpu_cores,
            f"{m.others_cpu_cores:.1f} of {m.usable_cores} usable cores",
            f">= {_pct(thresholds.contended_others)} of them = contended", "loadprof",
        ))
        if _contended(m, thresholds):
            waits = "; ".join(
                f"{who} waited for a CPU {_pct(delay)} of the time"
                for who, delay in (("the training thread", m.run_delay), ("each loader worker", m.workers_run_delay))
                if delay is not None
            )
            held = holders(run)
            d.warnings.append((
                "host-contended",
                f"other processes kept {m.others_cpu_cores:.1f} of the {m.usable_cores} usable cores busy"
                + (f" ({held})" if held else "")
                + (f"; {waits}" if waits else "")
                + ": timings and the advice's estimates depend on them",
            ))
            d.confidence = "medium" if d.confidence == "high" else "low"
    crash = _worker_crash(run)
    if crash is not None:
        d.warnings.append(("loader-worker-died", crash))
    near = (near_limit(m.headroom, thresholds, m.gpu_in_use)
            if d.verdict not in ("memory-bound", "inconclusive") else None)
    if near:
        d.warnings.append(("memory-near-limit", near))
    _loader_host(run, d, thresholds)
    m.waits = input_waits(run, m, thresholds)
    stalls = stalls_warning(m, thresholds) if d.verdict != "inconclusive" else None
    if stalls:
        d.warnings.append(("input-stalls", stalls))
    return d


def steady_wait(m: Metrics) -> float:
    """Seconds the loop waited for a batch over the judged steps: the wait once started."""
    return m.wait_per_step / max(m.batches_per_step, 1e-9)


def _loader_host(run: Run, d: Diagnosis, th: Thresholds) -> None:
    """The training loader against its host (loaderhost.py): its start-up as evidence,
    its shards, cores and /dev/shm as warnings with the measured figures."""
    loader = d.metrics.loader
    start = start_up(loader, steady_wait(d.metrics))
    if start is not None:
        d.evidence.append(Evidence("first_batch", "Time from iter(loader) to its first batch", start.first_batch,
                                   start.line(), source="loadprof"))
    shards = shards_fewer_than_workers(loader)
    if shards:
        d.warnings.append(("shards-fewer-than-workers", shards))
    # Workers that wait on I/O hold no core: more of them than cores is the io-latency advice.
    adapter = for_loader(loader)
    fix = None
    if adapter is not None and loader is not None:
        words, info = adapter.words, loader
        fix = lambda fit: words.oversubscribed_fix(info, fit)  # noqa: E731  its own knobs (Ray's CPUs)
    busy = oversubscribed(run.environment, loader, fix) if d.cause != "io-latency" else None
    if busy:
        d.warnings.append(("workers-oversubscribed", busy))
    shm = shm_small(run.environment, loader)
    if shm and d.cause != "shared-memory":  # a run that died of it says so in its verdict
        d.warnings.append(("shm-small", shm))
    # a run whose verdict names the copies as its memory's limit says so in its summary
    limit = copies_limit(d.metrics, worker_copies(loader, run.host_samples), th) \
        if d.cause != "workers-copy-on-read" else None
    copied = copy_on_read(loader, run.host_samples, f"{limit}: memory is the limit" if limit else "")
    if copied:
        d.warnings.append(("workers-copy-on-read", copied))
    slow = slow_worker(loader)
    if slow:
        d.warnings.append(("slow-worker", slow))


def _decide(run: Run, thresholds: Thresholds) -> Diagnosis:
    th = thresholds
    m = compute_metrics(run)
    ev: list[Evidence] = []

    # An out-of-memory error decides, however few steps ran before it.
    statuses = _worker_statuses(run)
    for oom in (classify(line) for line in run.oom_errors):
        if oom is None:
            continue
        if oom.kind == "worker-died" and any(pid.strip() in statuses for pid in (oom.worker or "").split(",")):
            continue  # its exit status, read after it died, says what it died of
        if oom.kind == "worker-died" and m.oom_kills == 0:
            # The kernel's OOM killer did not run: the worker crashed some other way.
            ev.append(Evidence("worker_died", "A loader worker died without an error", None,
                               f"{oom.message}; the kernel's OOM killer did not run (/proc/vmstat)"))
            continue
        return _out_of_memory(run, m, oom, ev)

    if m.steps_judged < th.min_steps:
        reason = (
            f"only {m.steps_judged} step(s) measured after {m.warmup_steps} warm-up; "
            f"need at least {th.min_steps}"
        )
        if m.steps_total == 0:
            reason = "no training steps were seen (no optimizer step, no Profile.step())"
        return Diagnosis("inconclusive", None, reason, "low", ev, m)
    adapter = for_loader(m.loader)
    if not run.data_wait_method and adapter is not None and adapter.on_threads(m.loader):
        return Diagnosis(
            "inconclusive", None,
            f"input time of {adapter.label} could not be measured (see limitations)", "low", ev, m,
        )

    ev.append(Evidence(
        "data_wait_fraction", "Step time waiting for input (batch wait + host-to-device copy)",
        m.data_wait_fraction, _pct(m.data_wait_fraction),
        f">= {_pct(th.input_high)} highly, >= {_pct(th.input_moderate)} moderately input-bound",
        "TensorFlow Profiler input-pipeline analyzer",
    ))
    ev.append(Evidence(
        "step_time", "Median step time", m.step_time_median, _secs(m.step_time_median),
        source=f"{m.steps_judged} steps after {m.warmup_steps} warm-up",
    ))
    probes = run.probes
    if probes.eval_batches:
        ev.append(Evidence(
            "eval_batches", "Batches read with gradients off (evaluation), left out of the steps",
            float(probes.eval_batches), f"{probes.eval_batches} batches, {_secs(probes.eval_wait_seconds or 0.0)} waiting",
        ))
    gc_in_waits = probes.gc_in_wait_seconds or 0.0
    if gc_in_waits and gc_in_waits >= th.gc_in_waits_shown * m.step_time_mean * m.steps_judged:
        ev.append(Evidence(
            "gc_in_waits", "Garbage collection inside batch waits, counted as compute, not input", gc_in_waits,
            f"{_secs(gc_in_waits)} of {_secs(probes.gc_seconds or 0.0)} in {probes.gc_collections or 0} collections",
        ))
    if m.gpu_util_median is not None:
        ev.append(Evidence(
            "gpu_util", "GPU busy (NVML: time with >= 1 kernel running)", m.gpu_util_median / 100,
            f"{m.gpu_util_median:.0f}%", f"< {th.gpu_util_low:.0f}% = low", "PyTorch tb-plugin",
        ))
    if m.gpu_memory_peak_fraction is not None:
        ev.append(Evidence(
            "gpu_memory_peak", "Peak GPU memory in use", m.gpu_memory_peak_fraction,
            _pct(m.gpu_memory_peak_fraction), f">= {_pct(th.gpu_memory_high)} = near full", "PyTorch tb-plugin",
        ))
    if m.headroom is not None:
        ev.append(_headroom_evidence(m.headroom, th))
    if m.cpu_busy is not None:
        ev.append(Evidence(
            "cpu_busy", "Host CPU busy over usable cores", m.cpu_busy,
            f"{_pct(m.cpu_busy)} of {m.usable_cores} cores",
        ))

    confidence = "high" if m.steps_judged >= th.confident_steps else "medium"
    if not m.gpu_available and m.gpu_in_use:
        confidence = "low" if confidence == "medium" else "medium"

    # CUDA runs ahead of the host: the GPU idles at most (100 - busy)% of the time, so
    # host-side waits beyond that overlapped kernels already queued and starved nothing.
    util = m.gpu_util_median
    overlapped = (m.gpu_in_use and util is not None and m.data_wait_fraction >= th.input_high
                  and 100 - util < 100 * th.input_high)
    if overlapped and util is not None:
        ev.append(Evidence(
            "gpu_idle_bound", "GPU idle time that input waits could have caused", 1 - util / 100,
            f"at most {_pct(1 - util / 100)} (GPU busy {util:.0f}%)",
            f"< {_pct(th.input_high)}: the waits overlapped queued GPU work", "loadprof",
        ))
    if m.data_wait_fraction >= th.input_high and not overlapped:
        cause = _data_cause(m, th, ev)
        if m.h2d_fraction:
            ev.append(Evidence("h2d_fraction", "Step time in host-to-device copies", m.h2d_fraction, _pct(m.h2d_fraction)))
        if cause == "io-latency" and m.disk_read_bps is not None:
            ev.append(Evidence("disk_read", "Disk reads", m.disk_read_bps, f"{m.disk_read_bps / 2**20:.1f} MiB/s"))
        if m.data_wait_fraction < th.input_high + 0.05 and confidence == "high":
            confidence = "medium"
        if cause == "workers-unmeasured":
            confidence = "low"
        own = adapter.words.cause(cause) if adapter is not None else None
        if own is not None:
            words = own
        elif m.loader is None:
            words = LOOP_CAUSES.get(cause, CAUSES[cause])
        else:
            words = CAUSES[cause]
        summary = f"{_pct(m.data_wait_fraction)} of step time waits for input; cause: {words}"
        summary += _freeing_line(m, cause, th)
        summary += top_stage_line(loading(run, m.loader))
        return Diagnosis("data-starved", cause, summary, confidence, ev, m)

    moderate = m.data_wait_fraction >= th.input_moderate
    memory_pressure = _host_short(m, th)
    if (m.gpu_memory_peak_fraction or 0.0) >= th.gpu_memory_high:
        return Diagnosis(
            "memory-bound", "gpu-memory",
            f"GPU memory peaked at {_pct(m.gpu_memory_peak_fraction)} of capacity: near the limit, though "
            "nothing ran out",
            confidence, ev, m, moderate,
        )
    if memory_pressure:
        ev.append(Evidence("swap_growth", "Swap growth during the run", float(m.swap_growth), f"{m.swap_growth / 2**20:.0f} MiB",
                           f">= {th.swap_growth_bytes // 2**20} MiB = pressure"))
        if m.memory_available_min_fraction is not None:
            ev.append(Evidence("memory_available_min", "Lowest available host memory", m.memory_available_min_fraction,
                               _pct(m.memory_available_min_fraction), f"< {_pct(th.memory_available_low)} = pressure"))
        copies = worker_copies(m.loader, run.host_samples)
        limit = copies_limit(m, copies, th)
        if copies is not None and limit:
            ev.append(Evidence("workers_copies", "Loader workers' copies of the dataset's Python objects (USS)",
                               float(copies.copied), copies.line(),
                               "the host short of memory without them = the copies are the limit", "loadprof"))
            return Diagnosis("memory-bound", "workers-copy-on-read",
                             f"host memory is the limit: {limit}; the fix is in the warning workers-copy-on-read",
                             confidence, ev, m, moderate)
        return Diagnosis("memory-bound", "host-memory", "host memory is under pressure (swapping or nearly full)",
                         confidence, ev, m, moderate)
    if m.gpu_in_use and m.gpu_util_median is not None and m.gpu_util_median < th.gpu_util_low:
        return Diagnosis(
            "host-bound", "launch-overhead",
            f"the GPU is busy only {m.gpu_util_median:.0f}% of the time while input takes "
            f"{_pct(m.data_wait_fraction)}: Python or kernel-launch overhead",
            confidence, ev, m, moderate,
        )
    where = "the GPU" if m.gpu_in_use else "the CPU (no GPU in use)"
    summary = f"{where} is doing the model's work; input takes {_pct(m.data_wait_fraction)} of step time"
    if overlapped:
        summary += f", while the GPU stayed busy ({m.gpu_util_median:.0f}%): the waits overlapped queued GPU work"
    if m.gpu_in_use and m.gpu_util_median is None:
        summary += " (GPU utilization unavailable)"
        confidence = "low" if confidence == "medium" else "medium"
    return Diagnosis("compute-bound", "gpu" if m.gpu_in_use else "cpu", summary, confidence, ev, m, moderate)


def expected_speedup(current_step: float, new_step: float) -> float:
    """Throughput ratio of a change that turns ``current_step`` into ``new_step`` seconds."""
    if new_step <= 0 or not math.isfinite(new_step):
        return 1.0
    return current_step / new_step
