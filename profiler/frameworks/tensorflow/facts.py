"""Facts about a TensorFlow run read at its edges: mixed precision already in use,
and the GPUs' peak memory. Imported by ``frameworks/tensorflow/hooks.py``."""

from __future__ import annotations

import sys
from typing import Any

import tensorflow as tf

from ...records import AllocatorPeak, Run


def check_amp(run: Run, model: Any = None, optimizer: Any = None) -> None:
    """Set ``run.amp_in_use`` when a Keras mixed-precision policy (the model's or the
    global one) or a ``LossScaleOptimizer`` is in use."""
    if run.amp_in_use:
        return
    names: list[str] = []
    policy = getattr(model, "dtype_policy", None)
    if policy is not None:
        names.append(str(getattr(policy, "name", "")))
    mp = getattr(sys.modules.get("keras"), "mixed_precision", None)
    try:
        if mp is not None:
            names.append(str(mp.global_policy().name))
    except (AttributeError, TypeError, ValueError):
        pass
    if optimizer is not None and type(optimizer).__name__ == "LossScaleOptimizer":
        names.append("mixed_float16")
    if any(n.startswith("mixed") for n in names):
        run.amp_in_use = True


def gpu_facts(run: Run) -> None:
    """Each visible GPU's peak memory as TensorFlow's allocator saw it (``Run.allocator_peaks``)."""
    try:
        gpus = tf.config.list_physical_devices("GPU")
    except (RuntimeError, ValueError, tf.errors.OpError):
        return
    if not gpus:
        return
    run.environment.cuda_in_use = True
    for i in range(len(gpus)):
        try:
            peak = tf.config.experimental.get_memory_info(f"GPU:{i}").get("peak")
        except (RuntimeError, ValueError, tf.errors.OpError):
            continue
        if peak:
            known = [g.memory_total for g in run.environment.gpus if g.index == i]
            run.allocator_peaks.append(AllocatorPeak("TensorFlow", i, int(peak), total=known[0] if known else None))
