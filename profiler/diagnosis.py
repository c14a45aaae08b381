"""Pure diagnosis: a recorded ``Run`` in, a ``Diagnosis`` (verdict + evidence) out, from its
aggregates (metrics.py), judged by ``Thresholds`` (thresholds.py).

No I/O, no threads, no frameworks: tests build a ``Run`` by hand.

Verdicts, checked in this order:
1. ``inconclusive``: fewer than ``min_steps`` steps after warm-up, or a TensorFlow
   run whose input time could not be measured (``Run.data_wait_method`` empty).
2. ``memory-bound``: an out-of-memory error during the run.
3. ``data-starved``: input time (batch wait + host-to-device copies) >= 20% of
   step time, with a sub-cause (causes.py; for a loader on the process's threads,
   tf.data, from the process's CPU while the loop waited).
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
from dataclasses import asdict, dataclass, field
from typing import Any

from .causes import CAUSES, LOOP_CAUSES, contended, data_cause, freeing_line, measured_cause
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
from .metrics import Headroom, Metrics, compute_metrics, headroom_line, memory_in_use
from .oom import OutOfMemory, WorkerDeath, classify, describe, worker_death
from .records import Run
from .stagemodel import loading, top_stage_line
from .thresholds import DEFAULT_THRESHOLDS, Evidence, Thresholds
from .units import percent_text as _pct
from .units import seconds_text as _secs
from .units import size_text
from .waits import input_waits, stalls_warning

VERDICTS = ("data-starved", "compute-bound", "memory-bound", "host-bound", "inconclusive")


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

    def evidence_of(self, key: str) -> Evidence | None:
        """The measured figure of that key, where it took part."""
        return next((e for e in self.evidence if e.key == key), None)

    def contended(self) -> bool:
        """Whether other processes held the cores: the cause, or a warning beside another cause."""
        return self.cause == "host-contended" or any(wid == "host-contended" for wid, _ in self.warnings)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["metrics"].pop("loader", None)
        return d


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
        if contended(m, thresholds):
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
    if d.verdict != "inconclusive" and m.steal is not None and m.steal >= thresholds.steal_warn:
        d.evidence.append(Evidence(
            "steal", "CPU time the hypervisor took for other work (steal)", m.steal,
            f"{_pct(m.steal)} of the CPUs' time", f">= {_pct(thresholds.steal_warn)} = the VM ran slower "
            "than its cores read", "Linux /proc/stat steal",
        ))
        d.warnings.append((
            "host-steal",
            f"the hypervisor took {_pct(m.steal)} of this VM's CPU time for other work (steal): the job ran "
            "slower than its cores read, and no setting of the job changes that; timings and the advice's "
            "estimates may not repeat",
        ))
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
        cause, measured = measured_cause(data_cause(m, th, ev), run.whatif, m.loader, ev)
        if m.h2d_fraction:
            ev.append(Evidence("h2d_fraction", "Step time in host-to-device copies", m.h2d_fraction, _pct(m.h2d_fraction)))
        if cause == "io-latency" and m.disk_read_bps is not None:
            ev.append(Evidence("disk_read", "Disk reads", m.disk_read_bps, f"{m.disk_read_bps / 2**20:.1f} MiB/s"))
        if m.data_wait_fraction < th.input_high + th.verdict_band and confidence == "high":
            confidence = "medium"
        if cause == "workers-unmeasured":
            confidence = "low"
        own = adapter.words.cause(cause) if adapter is not None else None
        if measured is not None:
            words = measured
        elif own is not None:
            words = own
        elif m.loader is None:
            words = LOOP_CAUSES.get(cause, CAUSES[cause])
        else:
            words = CAUSES[cause]
        summary = f"{_pct(m.data_wait_fraction)} of step time waits for input; cause: {words}"
        summary += freeing_line(m, cause, th)
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
    # as close to the line as a data-starved verdict just over it: another run may cross it
    if m.data_wait_fraction >= th.input_high - th.verdict_band and confidence == "high" and not overlapped:
        confidence = "medium"
        summary += f", near the {_pct(th.input_high)} that would make it data-starved"
    return Diagnosis("compute-bound", "gpu" if m.gpu_in_use else "cpu", summary, confidence, ev, m, moderate)


def expected_speedup(current_step: float, new_step: float) -> float:
    """Throughput ratio of a change that turns ``current_step`` into ``new_step`` seconds."""
    if new_step <= 0 or not math.isfinite(new_step):
        return 1.0
    return current_step / new_step
