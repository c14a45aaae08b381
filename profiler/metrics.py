"""A run's aggregates over its judged steps (``compute_metrics``: warm-up left out), and
its memory at the fullest (``headroom``): what the diagnosis and the advice read."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from .records import GpuSample, HostSample, LoaderInfo, Run, Step
from .units import size_text
from .waits import Waits  # a run's saved metrics are read back by their annotations


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
    cpu_busy: float | None = None  # system CPU busy share over usable cores, 0..1 (steal not busy)
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
    #: minor page faults of the training process a judged step, and the bytes its resident
    #: memory grew by a step meanwhile (first touches, not memory touched again); None: not read
    faults_per_step: float | None = None
    rss_growth_per_step: float | None = None
    judged_seconds: float = 0.0  # from the first judged step's start to the last one's end
    swap_growth: int = 0
    memory_available_min_fraction: float | None = None
    disk_read_bps: float | None = None
    iowait: float | None = None
    #: share of the VM's CPUs' time the hypervisor took (Linux steal, all CPUs: taken to fall
    #: alike on the usable ones), 0..1; None: not read
    steal: float | None = None
    gpu_in_use: bool = False
    gpu_available: bool = False
    gpu_util_median: float | None = None
    gpu_memory_peak_fraction: float | None = None
    pcie_rx_kbs: float | None = None
    headroom: Headroom | None = None  # memory at its fullest and what was left
    waits: Waits | None = None  # the input wait per step as a distribution, and its stalls (diagnose sets it)
    loader: LoaderInfo | None = None

    @property
    def cores_left(self) -> float:
        """The usable cores less the hypervisor's share of their time (steal): the most the
        job's processes could run on, against which "saturated" is judged."""
        return self.usable_cores * (1.0 - min(self.steal or 0.0, 0.9))

    @property
    def cores_free(self) -> float:
        """``cores_left`` less those other processes kept busy: what the job's loading and
        compute can share."""
        return self.cores_left - (self.others_cpu_cores or 0.0)

    def cores_text(self) -> str:
        """``cores_left`` in words (as the usable cores where steal takes under a tenth of a core)."""
        if round(self.cores_left, 1) < self.usable_cores:
            return f"{self.cores_left:.1f} cores the hypervisor left of {self.usable_cores} usable"
        return f"{self.usable_cores} usable cores"


def warmup_count(n: int) -> int:
    """Steps left out of judgement: compilation, allocator growth, worker start-up."""
    if n < 4:
        return 0
    return min(5, max(1, n // 10))


#: Readings over less than this (seconds: the host sampler lists the job's processes once a
#: second) cannot tell the job's new workers from other processes by the busy cores alone
ATTRIBUTION_WINDOW_S = 1.0


def _window(samples: list[Any], start: float, end: float) -> list[Any]:
    """The readings that cover part of ``start``-``end``: a host reading's rates are over
    the ``window`` before its time, so the first one after the end counts too (a worker's
    CPU is read as its process is reaped: the last epoch's, just after the last step)."""
    inside = [s for s in samples if s.t >= start and s.t - getattr(s, "window", 0.0) < end]
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


def epoch_steps(run: Run, warmup: int) -> tuple[list[Step], list[Step]]:
    """The judged steps an epoch of a training loader began in (the last iterator's workers
    stopped and the next one's started inside them), and the others."""
    import bisect

    starts = sorted(t for info in run.loaders if info.iterations > info.eval_iterations
                    for t in info.iteration_starts_s)
    began: list[Step] = []
    others: list[Step] = []
    for s in run.steps[warmup:]:
        (began if bisect.bisect_right(starts, s.end) != bisect.bisect_right(starts, s.start) else others).append(s)
    return began, others


def epoch_start_excess(run: Run, warmup: int) -> tuple[int, float, float]:
    """What the epochs' starts cost the loop over the judged steps: (the steps an epoch began
    in, the seconds they took beyond as many of the others' mean step, the seconds of all the
    judged steps). Zeros where no epoch began in them, or every one began one."""
    began, others = epoch_steps(run, warmup)
    if not began or not others:
        return 0, 0.0, 0.0
    usual = sum(s.duration for s in others) / sum(s.merged for s in others)
    excess = sum(max(0.0, s.duration - s.merged * usual) for s in began)
    return len(began), excess, sum(s.duration for s in (*began, *others))


def epoch_starts_stand_out(run: Run, warmup: int) -> bool:
    """More than half of the judged steps an epoch began in took longer than nine in ten of
    the others: what every start costs, not one step's stall on a busy host that happened
    to fall on a start."""
    began, others = epoch_steps(run, warmup)
    if not began or not others:
        return False
    usual = sorted(s.duration / max(1, s.merged) for s in others)
    high = usual[min(len(usual) - 1, int(0.9 * len(usual)))]
    return 2 * sum(s.duration / max(1, s.merged) > high for s in began) > len(began)


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
    _fault_metrics(host, m)
    _memory_metrics(run, m)
    if run.host_samples:
        m.swap_growth = max(0, run.host_samples[-1].swap_used - run.host_samples[0].swap_used)
        if run.environment.memory_total:
            m.memory_available_min_fraction = min(h.memory_available for h in run.host_samples) / run.environment.memory_total
        m.disk_read_bps = _mean([h.disk_read_bps for h in host])
        m.iowait = _time_mean([(h.iowait_percent, h.window) for h in host if h.iowait_percent is not None])
        steal = _time_mean([(h.steal_percent / 100.0, h.window) for h in host if h.steal_percent is not None])
        m.steal = None if steal is None else min(1.0, steal)

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


def faults_per_step(host: list[HostSample], seconds: float, steps: int) -> float | None:
    """The training process's page faults a step, over ``steps`` steps that took ``seconds``,
    from the readings' counts over their windows (a reading counts those since the one before
    it); None where no reading counted them."""
    read = [h for h in host if h.process_faults is not None and h.window > 0]
    window = sum(h.window for h in read)
    if not read or window <= 0 or not steps:
        return None
    return sum(h.process_faults or 0 for h in read) / window * seconds / steps


def _fault_metrics(host: list[HostSample], m: Metrics) -> None:
    """Page faults a judged step (a reading's window may have begun before the first step)."""
    m.faults_per_step = faults_per_step(host, m.judged_seconds, m.steps_judged)
    if m.faults_per_step is None:
        return
    read = [h for h in host if h.process_faults is not None and h.window > 0]
    if len(read) >= 2 and read[0].process_rss and read[-1].process_rss:
        m.rss_growth_per_step = max(0, read[-1].process_rss - read[0].process_rss) / m.steps_judged


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
