"""The memory rules, for a memory-bound run: what the loader holds, the micro-batch and
gradient accumulation that fit (``micro_batch``), checkpointing, half precision."""

from __future__ import annotations

import math

from ..metrics import Metrics
from ..oom import OutOfMemory, classify
from ..records import Run
from .base import Recommendation, size_text
from .compute import mixed_precision
from .loader import shm_advice


def _batch_size(run: Run, m: Metrics, oom: OutOfMemory | None = None) -> int | None:
    """The batch to divide: the one the loop died on (the last loader iterated, when its
    batch is larger than every step's: that step never finished), else the largest
    batch the loop was fed, when the loader says."""
    sizes = [st.batch_size // st.merged for st in run.steps if st.batch_size]
    largest = max(sizes) if sizes else None
    if oom is not None:
        last = next((li for li in reversed(run.loaders) if li.iterations and li.batch_size), None)
        if last is not None and last.batch_size and last.batch_size > (largest or 0):
            return last.batch_size
    if largest:
        return largest
    return m.loader.batch_size if m.loader and m.loader.batch_size else None


def _free_bytes(run: Run, oom: OutOfMemory) -> int | None:
    """The most memory free where the allocation failed, over the readings taken while
    training: the last one before the error is often taken inside the step that failed,
    its memory still held; readings before the first step miss the model. On the host,
    the tighter of what the host has available and the process's own limit (RLIMIT_AS,
    a container's cgroup), which binds first; readings from before a limit the script
    set itself do not count."""
    first = run.steps[0].start if run.steps else -math.inf
    if oom.device == "gpu":
        gpus = [g for g in run.gpu_samples if g.memory_used is not None and g.memory_total]
        gpus = [g for g in gpus if g.t >= first] or gpus[-1:]
        if not gpus:
            return None
        return max(max(0, (g.memory_total or 0) - (g.memory_used or 0)) for g in gpus)
    hosts = [h for h in run.host_samples if h.t >= first] or run.host_samples[-1:]
    if hosts and hosts[-1].memory_limit_left is not None:
        hosts = [h for h in hosts if h.memory_limit_left is not None]
    free = [min(v for v in (h.memory_available or None, h.memory_limit_left) if v is not None)
            for h in hosts if h.memory_available or h.memory_limit_left is not None]
    return max(free) if free else None


def micro_batch(batch: int | None, requested: int | None, free: int | None,
                per_sample: float | None = None) -> tuple[int | None, int, str]:
    """(micro-batch, accumulation steps, basis): the largest halving of the batch whose
    memory fits in 90% of the most that was free. A step's memory beyond the model state
    is ``per_sample`` bytes a sample where that was measured (the peak less what stays
    between steps, over the largest batch seen); else the failing allocation is taken to
    grow with the batch. Without those figures: halve, and say so."""
    if batch and per_sample and free:
        micro = batch
        while micro > 1 and per_sample * micro > 0.9 * free:
            micro //= 2
        steps = math.ceil(batch / micro)
        if steps > 1:
            return micro, steps, (f"a step holds {size_text(per_sample)} a sample beyond the model state (its peak "
                                  f"less what stays between steps), and {micro} samples fit in 90% of the "
                                  f"{size_text(free)} free")
    if batch and requested and free is not None and requested > 0:
        micro = batch
        while micro > 1 and requested * micro / batch > 0.9 * free:
            micro //= 2
        steps = math.ceil(batch / micro)
        if steps > 1:
            return micro, steps, (f"the failed allocation ({size_text(requested)}) scaled to the micro-batch fits in "
                                  f"90% of the {size_text(free)} free")
    if batch and batch > 1:
        return batch // 2, 2, "halved: what the batch needs could not be estimated; loadprof tune searches it"
    return None, 2, "halved: the batch size was not seen; loadprof tune searches it"


def memory_advice(run: Run, m: Metrics, dialect: str, cause: str | None) -> list[Recommendation]:
    """The memory rules, their snippets in ``dialect`` (compute.py's module doc)."""
    if cause == "shared-memory":
        return [shm_advice(run, m)]
    out = []
    oom = next((o for o in (classify(line) for line in run.oom_errors) if o is not None), None)
    loader = m.loader
    workers = (loader.num_workers or 0) if loader else 0
    tree = (m.process_memory_peak or 0) + (m.workers_memory_peak or 0)
    loader_holds = workers > 0 and tree > 0 and (m.workers_memory_peak or 0) >= 0.5 * tree
    if cause == "loader-out-of-memory" or loader_holds:
        fewer = max(1, workers // 2) if workers else 0
        out.append(Recommendation(
            "loader_memory", "Hold fewer batches in the loader",
            (f"The loader workers held {size_text(m.workers_memory_peak or 0)} at their peak against "
             f"{size_text(m.process_memory_peak or 0)} for the training process. " if m.workers_memory_peak else "")
            + f"Each of the {workers} worker(s) keeps prefetch_factor={(loader.prefetch_factor or 2) if loader else 2} "
            "batches and its own copy of whatever the dataset loads into memory: fewer workers, a smaller "
            "prefetch, and a dataset that opens its files lazily in each worker hold less.",
            f"DataLoader(..., num_workers={fewer}, prefetch_factor=1)" if workers else
            "DataLoader(..., num_workers=0)",
            {"num_workers": fewer, "prefetch_factor": 1},
            basis=MEMORY,
        ))
        if cause == "loader-out-of-memory":
            return out
    batch = _batch_size(run, m, oom)
    h = m.headroom
    per_sample = h.step_transient / h.batch if h and h.step_transient and h.batch else None
    free = _free_bytes(run, oom) if oom else None
    steady = run.probes.torch_steady_bytes
    if oom is not None and oom.device == "gpu" and per_sample and steady and h and h.gpu_total:
        # PyTorch's caching allocator keeps its peak reserved, so NVML reads the device
        # full between steps too: the room a step has is the device less what stays.
        free = max(0, h.gpu_total - steady)
    micro, steps, basis = micro_batch(batch, oom.requested_bytes if oom else None, free, per_sample)
    size = str(micro) if micro else "batch_size // 2"
    if dialect == "tf":
        out.append(Recommendation(
            "gradient_accumulation", f"Train on micro-batches of {size} and accumulate {steps} of them",
            f"Memory is the limit: {steps} micro-batches per optimizer step keep the effective batch "
            f"({batch or 'as it is'}); {basis}.",
            f"optimizer = keras.optimizers.Adam(gradient_accumulation_steps={steps})\n"
            f"model.fit(ds.rebatch({size}), ...)",
            {"micro_batch": micro, "accumulation_steps": steps}, basis=MEMORY, framework="tf",
        ))
    else:
        out.append(Recommendation(
            "gradient_accumulation", f"Train on micro-batches of {size} and accumulate {steps} of them",
            f"Memory is the limit: {steps} micro-batches per optimizer step keep the effective batch "
            f"({batch or 'as it is'}); {basis}.",
            f"for i, (x, y) in enumerate(loader):  # a loader with batch_size={size}\n"
            f"    loss = loss_fn(model(x), y) / {steps}\n    loss.backward()\n"
            f"    if i % {steps} == {steps - 1}:\n        optimizer.step(); optimizer.zero_grad()",
            {"micro_batch": micro, "accumulation_steps": steps}, basis=MEMORY,
        ))
        ckpt = _checkpointing_advice(m, oom)
        if ckpt is not None:
            out.append(ckpt)
    mp = mixed_precision(run, dialect)
    if mp is not None:
        mp.detail = "Half-precision activations halve activation memory. " + mp.detail
        out.append(mp)
    return out


#: memory advice: what it buys is a run that fits, at about the speed it had
MEMORY = "memory: the run fits, at about its speed per sample; no speed-up is claimed"
RECOMPUTE = "memory: the activations it frees, for about a third more compute a step"

#: Ours: activations dominate when what a step holds only while it runs is at least half
#: its peak; then checkpointing cuts the larger part.
ACTIVATIONS_DOMINATE = 0.5


def _checkpointing_advice(m: Metrics, oom: OutOfMemory | None) -> Recommendation | None:
    """Checkpointing where activations dominate: for a run that died, a failed allocation
    larger than the whole model state (the steps measured before it may have been
    smaller ones); else the step's peak less what stays held between steps
    (NOTE [ Memory headroom ] in metrics.py). None when the model state is the larger
    part (checkpointing would not help); the general advice when nothing was measured."""
    h = m.headroom
    state = h.model_state if h else None
    transient = h.step_transient if h else None
    code = ("from torch.utils.checkpoint import checkpoint\n"
            "h = checkpoint(block, h, use_reentrant=False)  # for each large block of the model")
    if state and oom is not None and oom.requested_bytes:
        if oom.requested_bytes < state:
            return None
        why = (f"The allocation that failed ({size_text(oom.requested_bytes)}) is larger than all the parameters, "
               f"gradients and optimizer state ({size_text(state)}): it holds activations, which grow with the batch"
               + (f" (the steps before it held {size_text(transient)} of activations and temporaries at their peak)"
                  if transient else "")
               + ". Checkpointing a block stores only its input and recomputes the rest in backward.")
        values = {"failed_allocation_bytes": oom.requested_bytes, "model_state_bytes": state}
        if transient:
            values["activation_bytes"] = transient
        return Recommendation("gradient_checkpointing", "Recompute activations instead of storing them", why, code,
                              values, basis=RECOMPUTE)
    if state and transient:
        share = transient / (transient + state)
        if share < ACTIVATIONS_DOMINATE:
            return None
        why = (f"Activations and temporaries take {size_text(transient)} at the step's peak against "
               f"{size_text(state)} of parameters, gradients and optimizer state ({share:.0%} of the peak): "
               "checkpointing a block stores only its input and recomputes the rest in backward "
               "(about a third more compute).")
        return Recommendation("gradient_checkpointing", "Recompute activations instead of storing them", why, code,
                              {"activation_bytes": transient, "model_state_bytes": state,
                               "activation_share": round(share, 3)}, basis=RECOMPUTE)
    return Recommendation(
        "gradient_checkpointing", "Recompute activations instead of storing them",
        "Activations, which grow with the batch, usually dominate training memory (not measured here); "
        "checkpointing a block stores only its input and recomputes the rest in backward (about a third "
        "more compute).", code, basis=RECOMPUTE,
    )
