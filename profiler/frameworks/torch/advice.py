"""The PyTorch DataLoader's input rules, in their order: workers, offline preprocessing,
pinned memory, persistent workers, prefetch, cache, convert (their parts in advice/loader.py)."""

from __future__ import annotations

import math

from ...advice.base import MEASURE, STORED, Recommendation
from ...advice.loader import (
    cache_advice,
    compute_cpu_per_step,
    convert_advice,
    offline_snippet,
    persistent_advice,
    step_with_workers,
    workers_needed,
)
from ...diagnosis import Diagnosis
from ...loaderhost import cores_per_rank
from ...records import LoaderInfo, Run
from ...thresholds import DEFAULT_THRESHOLDS, Thresholds


def input_advice(run: Run, diagnosis: Diagnosis, loader: LoaderInfo,
                 thresholds: Thresholds = DEFAULT_THRESHOLDS) -> list[Recommendation]:
    """The rules for a PyTorch DataLoader whose input matters, in their order: workers,
    offline preprocessing, pinned memory, persistent workers, prefetch, cache, convert."""
    th = thresholds
    m = diagnosis.metrics
    out: list[Recommendation] = []
    starved = diagnosis.verdict == "data-starved"
    cause = diagnosis.cause
    cores = m.usable_cores
    workers = loader.num_workers or 0
    step = m.step_time_mean
    tree = (m.tree_cpu_cores or 0.0) / m.cores_left
    saturated = workers > 0 and tree >= th.cpu_saturated
    # Leave one core to the training process itself (Lightning's max(1, cpus - 1)); the
    # ranks on a node (torchrun's LOCAL_WORLD_SIZE) share its cores: each has its part.
    per_rank = cores_per_rank(run.environment)
    cap = max(1, per_rank - 1)
    if cause == "io-latency":
        # Waiting on I/O does not use a core: more workers than cores can hide latency.
        cap = max(cap, 2 * per_rank)
    # A worker makes whole batches, and an epoch's iterator hands out only its own: more
    # workers than an epoch's batches wait idle
    capped_by = "the usable cores"
    epoch = math.ceil(loader.dataset_length / loader.batch_size) if loader.dataset_length and loader.batch_size else 0
    if 0 < epoch < cap:
        cap, capped_by = epoch, f"the {epoch} batch{'es' if epoch > 1 else ''} of an epoch"
    need = workers_needed(m, loader)
    # On a contended host more workers still win a larger share of the cores (the
    # scheduler is fair per thread), so the advice stands; only its estimate goes.
    contended = diagnosis.contended()
    if not saturated and need is not None and cause not in ("host-to-device", "workers-unmeasured"):
        target, load = need
        if cause == "io-latency":
            target = max(target, math.ceil(m.wait_per_step / max(m.compute_per_step, 1e-6)) + 1)
        target = min(target, cap)
        if target > workers:
            est, shares = step_with_workers(m, loader, load, target)
            new_step = est + m.h2d_fraction * step
            speedup = step / new_step if new_step > 0 else None
            limited = f" (capped by {capped_by}; loading alone would need more)" if need[0] > cap else ""
            basis = "estimate: the workers' CPU and wall time over the free cores"
            shared = ""
            if shares:
                # what the sharing costs the model's threads, no model here predicted within 15%
                # (docs/dev/advice-accuracy.md): no figure rather than one that does not come true
                speedup = None
                basis = "no estimate: the workers would share the cores with the model; " + MEASURE.split(": ", 1)[1]
                shared = (f" The model's own threads use {compute_cpu_per_step(m, loader) * 1000:.1f} ms of CPU "
                          "per step on the same cores, and the workers would share them: how much that costs "
                          "the model is not known until measured (a what-if replay, or `loadprof tune`).")
            if contended:
                speedup = None
                shared = (f" Other processes kept {m.others_cpu_cores or 0.0:.1f} of the {cores} cores busy: "
                          "the gain depends on them, so no estimate is given; `loadprof tune` measures it.")
            out.append(Recommendation(
                "num_workers", f"Load batches in {target} worker process{'es' if target > 1 else ''}",
                f"The loop waits {diagnosis.metrics.data_wait_fraction:.0%} of each step for data. "
                f"Loading costs {load * 1000:.1f} ms of CPU per step against {m.compute_per_step * 1000:.1f} ms "
                f"of compute, with {workers} worker(s) on {cores} usable core(s){limited}.{shared}",
                f"DataLoader(dataset, batch_size={loader.batch_size}, num_workers={target}"
                + (", persistent_workers=True" if (loader.iterations or 0) > 1 else "") + ")",
                {"num_workers": target, "current": workers, "usable_cores": cores},
                round(speedup, 2) if speedup else None,
                "no estimate: other processes share the cores; measure it with `loadprof tune`" if contended
                else basis,
            ))
    # Cores loading alone needs to keep pace with compute (no safety worker here).
    load_cores = need[1] / max(m.compute_per_step, 1e-6) if need is not None else None
    beyond_cores = load_cores is not None and load_cores > cap and cause != "io-latency"
    replayed = diagnosis.evidence_of("parallelism_replayed")
    if starved and (saturated or cause == "cpu-bound-preprocessing" or beyond_cores):
        out.append(Recommendation(
            "offline_preprocessing", "Move deterministic preprocessing offline",
            (f"More workers measured no faster on the job's own step ({replayed.display}). "
             if replayed is not None else
             f"The training process and its loader workers already use {tree:.0%} of the {m.cores_text()}"
             ": more workers cannot help. "
             if saturated or cause == "cpu-bound-preprocessing" else
             f"Loading needs {load_cores or 0:.1f} busy cores to keep pace with compute, and "
             + (f"this rank has {per_rank} of the node's {cores} usable cores (its "
                f"{run.environment.local_world_size} ranks share them). "
                if per_rank < cores else f"{cores} are usable. "))
            + "Decode/resize once, store the result, and keep only random augmentation online.",
            offline_snippet(loader),
            basis=STORED,
        ))
    if cause == "host-to-device" or (run.environment.cuda_in_use and loader.pin_memory is False and starved):
        out.append(Recommendation(
            "pin_memory", "Pin host memory and copy asynchronously",
            f"Host-to-device copies take {m.h2d_fraction:.0%} of step time; pinned buffers let "
            "the copy run asynchronously and faster.",
            "DataLoader(..., pin_memory=True)\nx = x.to(device, non_blocking=True)",
            {"pin_memory": True},
            basis="no estimate: a pinned copy's speed is the GPU link's, not measured here; "
                  "`loadprof tune` measures it",
        ))
    if workers > 0 and not loader.persistent_workers and (loader.iterations or 0) > 1:
        out.append(persistent_advice(run, m, loader))
    if workers > 0 and starved and cause in ("io-latency", "too-few-workers") and (loader.prefetch_factor or 2) <= 2:
        out.append(Recommendation(
            "prefetch", "Prefetch more batches per worker",
            f"With prefetch_factor={loader.prefetch_factor or 2}, each worker keeps "
            f"{loader.prefetch_factor or 2} batches ready; uneven batch times drain that buffer.",
            f"DataLoader(..., num_workers={workers}, prefetch_factor=4)",
            {"prefetch_factor": 4},
            basis="no estimate: it absorbs the spread of batch times, which the mean step does not show; "
                  "`loadprof tune` measures it",
        ))
    out.extend(cache_advice(run, m, loader, starved))
    if starved and cause == "io-latency":
        out.append(convert_advice(loader))
    return out


