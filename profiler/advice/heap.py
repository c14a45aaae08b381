"""The heap rule: page faults on memory glibc's malloc gave back to the OS and the step
touches again (heap.py says why), priced at the cost of a fault measured on the host."""

from __future__ import annotations

from ..heap import MMAP_THRESHOLD, PAGE, environment_line, trim_threshold
from ..metrics import Metrics
from ..records import Run
from .base import Recommendation, size_text

#: the faults' time must reach this share of a step to be advised on...
HEAP_SHARE = 0.05
#: ...and they this many a step (1 MiB touched anew): a short step's few faults are no pattern
MIN_FAULTS = 256


def churn_faults(run: Run, m: Metrics) -> float | None:
    """The training process's page faults a step beyond its memory's growth (first touches
    of memory it keeps) and the batches its worker processes hand over through shared
    memory (each one a new mapping, whatever the allocator); None where not measured."""
    if m.faults_per_step is None:
        return None
    handed = 0.0
    loader = m.loader
    if loader is not None and loader.framework == "torch" and loader.num_workers and loader.sample_nbytes \
            and loader.batch_size:
        handed = loader.sample_nbytes * loader.batch_size * (m.batches_per_step or 1.0) / PAGE
    return max(0.0, m.faults_per_step - (m.rss_growth_per_step or 0.0) / PAGE - handed)


def heap_advice(run: Run, m: Metrics, verdict: str | None) -> Recommendation | None:
    """Fixed glibc thresholds where the faults on memory freed and touched again take at
    least ``HEAP_SHARE`` of a step, at the fault's measured cost: their time is the gain
    (the trims' own system calls, not counted, are gone too; a fault the step's other
    threads overlap costs it less: docs/memory.md). Not for a memory-bound run: the
    thresholds keep freed memory in the process."""
    if verdict == "memory-bound":
        return None
    env = run.environment
    churn = churn_faults(run, m)
    cost = env.fault_seconds
    step = m.step_time_mean
    if env.malloc != "glibc" or churn is None or churn < MIN_FAULTS or not cost or step <= 0:
        return None
    seconds = min(churn * cost, 0.9 * step)
    if seconds < HEAP_SHARE * step:
        return None
    churned = churn * PAGE
    trim = trim_threshold(churned)
    speedup = step / (step - seconds)
    line = environment_line(trim)
    return Recommendation(
        "heap", "Keep freed memory in the process (glibc's malloc thresholds)",
        f"The training process took {churn:,.0f} page faults a step beyond its memory's growth "
        f"({size_text(churned)} touched anew): glibc's malloc returns freed blocks to the OS and maps "
        f"them again, and each fault took {cost * 1e6:.1f} us here: {seconds * 1e3:.1f} ms of the "
        f"{step * 1e3:.1f} ms step. Fixed thresholds keep up to {size_text(trim)} of freed memory and serve "
        f"blocks up to {size_text(MMAP_THRESHOLD)} from the heap (set both: either alone stops glibc adapting "
        "the other). They hold the other figures here steady too: a fresh process's heap falls in either "
        "state, the other changes' speed-ups with it; diagnose again with them set for figures that hold "
        "(docs/memory.md).",
        f"{line} python train.py  # set before the process starts",
        {"faults_per_step": round(churn), "fault_seconds": cost, "trim_threshold": trim,
         "mmap_threshold": MMAP_THRESHOLD},
        estimated_speedup=round(speedup, 2),
        basis=(f"estimate: the faults' time gone ({churn:,.0f} a step at {cost * 1e6:.1f} us, a fresh mapping "
               "touched page by page at the run's end); blocks over "
               f"{size_text(MMAP_THRESHOLD)} are mapped anew whatever the thresholds say (jemalloc or tcmalloc, "
               "preloaded, keep those too); `loadprof tune --fixes heap` measures it"),
    )
