"""Pure advice: a ``Diagnosis`` and its ``Run`` in, concrete recommendations out.

Each recommendation has a stable ``id`` (``IDS``), a reason tied to the measured
evidence, concrete values derived from the measurements, and a code snippet.
Rules that keep advice from being noise (users learn to ignore a tool that
recommends more workers when workers already fill every core, as Lightning's
num_workers warning shows):
- never more workers when the loader's processes already saturate the usable cores;
- never mixed precision when autocast/half weights are already in use, when the
  GPU lacks tensor cores or is unknown, or for a data-starved run (it speeds up
  compute, which is not the limit);
- never prefetch/cache advice for a run whose input takes < 5% of step time;
- tf.data: never ``prefetch`` when the pipeline has one, never ``cache`` when it
  caches, never ``parallel_map`` for a map TensorFlow already parallelises, and
  no speed-up promised for a prefetch TensorFlow already injects (NOTE [ What
  TensorFlow already does for a pipeline ] in instrument/tfdata.py).

Speed-ups here are *estimates* from the measured per-step costs; ``loadprof
tune`` measures them for real.
"""

from __future__ import annotations

from ..diagnosis import DEFAULT_THRESHOLDS, Diagnosis, Thresholds, is_tf, steady_wait
from ..loaderhost import restart_cost
from ..records import Run
from .base import IDS, MEASURE, Recommendation
from .compute import compute_advice, host_bound_advice, threads_advice
from .loader import (
    compute_cpu_per_step,
    contention_advice,
    loading_wall,
    loop_prefetch_advice,
    persistent_advice,
    shm_advice,
    step_with_workers,
    steps_seconds,
    torch_input_advice,
    workers_needed,
)
from .memory import ACTIVATIONS_DOMINATE, memory_advice, micro_batch
from .stages import READ_LATENCY_S, STAGE_DOMINATES, stage_advice
from .tfdata import tf_input_advice

__all__ = [
    "ACTIVATIONS_DOMINATE", "IDS", "MEASURE", "READ_LATENCY_S", "STAGE_DOMINATES", "Recommendation",
    "compute_cpu_per_step", "loading_wall", "micro_batch", "recommend", "step_with_workers", "workers_needed",
]


def recommend(run: Run, diagnosis: Diagnosis, thresholds: Thresholds = DEFAULT_THRESHOLDS) -> list[Recommendation]:
    """The recommendations for a run, in order: the input rules (the torch loader's or
    tf.data's), then those of the verdict, threads, contention and /dev/shm first, and the
    stage rules last, which replace a general advice of the same id."""
    m = diagnosis.metrics
    loader = m.loader
    tf = is_tf(loader)
    out: list[Recommendation] = []
    if diagnosis.verdict == "inconclusive":
        return out
    starved = diagnosis.verdict == "data-starved"
    input_matters = starved or diagnosis.moderate_input
    cause = diagnosis.cause
    if input_matters and loader is not None and not tf:
        out.extend(torch_input_advice(run, diagnosis, loader, thresholds))
    elif input_matters and tf and loader is not None:
        out.extend(tf_input_advice(run, m, loader, starved, diagnosis))
    if not input_matters and not tf and restart_cost(loader, steady_wait(m), steps_seconds(run)):
        assert loader is not None
        out.append(persistent_advice(run, m, loader))  # measured: epoch starts cost more than 1%
    elif starved and loader is None and cause in ("io-latency", "cpu-bound-preprocessing"):
        fw = run.environment.frameworks
        out.append(loop_prefetch_advice(m, cause, tf="tensorflow" in fw and "torch" not in fw))

    if diagnosis.verdict == "memory-bound":
        out.extend(memory_advice(run, m, tf, diagnosis.cause))
    if diagnosis.verdict == "host-bound":
        out.extend(host_bound_advice(m, tf))
    if diagnosis.verdict == "compute-bound":
        out.extend(compute_advice(run, m, tf))
    if diagnosis.verdict in ("compute-bound", "data-starved", "host-bound") and not tf:
        planned = next((r.values["num_workers"] for r in out if r.id == "num_workers"), None)
        threads = threads_advice(run, m, planned)
        if threads is not None:
            out.insert(0 if diagnosis.verdict == "compute-bound" else len(out), threads)
    if cause == "host-contended" or any(wid == "host-contended" for wid, _ in diagnosis.warnings):
        out.insert(0, contention_advice(run, m, cause == "host-contended"))
    if cause != "shared-memory" and any(wid == "shm-small" for wid, _ in diagnosis.warnings):
        out.insert(0, shm_advice(run, m))
    out = stage_advice(run, diagnosis, out)
    return out
