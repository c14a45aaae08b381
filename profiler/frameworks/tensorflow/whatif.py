"""What-if replays under Keras ``fit``: the advised tf.data changes measured on the job's
own training function, after the run.

NOTE [ What-if replays under Keras fit ]
The differential probes (probe.py) already time the model alone on one batch, after the
run. The replays go one step further: the fit's ``train_function`` fed a fresh iterator
over the pipeline as the script built it, and over the same pipeline built again with one
advised change (rebuild.py: a parallel map, a prefetch after the batch), in rounds while
the budget lasts, each round's calls after two of warm-up (the iterator's start, a shuffle
buffer filling), the rounds of each averaged. A change whose pipeline is the same is not
replayed. The model's variables (its optimizer's and metrics' too) are copied to host
memory first and assigned back after, as the model-alone probe does, so the model leaves
as training left it. A pipeline that cannot be read again (its files gone with the
script's temporary folder) fails with TensorFlow's own error, and the run says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from ...advice.base import Recommendation
from ...fixes.spec import Changes
from ...records import WhatIf
from ...whatif import Interrupted, plan
from ..keras.fit import FitRecord
from .probe import STATE_COPY_SHARE, _state_variables
from .rebuild import Builds

if TYPE_CHECKING:
    from .hooks import TensorFlowHooks

#: the advice a replay measures: the changes a rebuild makes
MEASURED_IDS = ("parallel_map", "prefetch")
#: calls of each replay not timed: the iterator's start, a shuffle buffer filling
WARMUP_CALLS = 2
#: rounds of the replays, interleaved, at most
MAX_ROUNDS = 4
#: calls timed in one replay, at most
MAX_CALLS = 200


def replay(hooks: TensorFlowHooks, recommendations: list[Recommendation], budget: float,
           interrupted: Callable[[], bool]) -> tuple[list[WhatIf], str]:
    """The adapter's what-if entry, after the run: the advised tf.data changes measured
    on the longest ``fit``'s step, or why they are not."""
    fits, hooks.replayable = hooks.replayable, []  # the script's models and data, let go after
    changes = plan(recommendations, "tf", MEASURED_IDS)
    if not changes:
        return [], ""
    if not fits:
        return [], ("a custom tf.data loop: its step is not held, so its changes are not replayed "
                    "(`loadprof tune` measures them)")
    record = max(fits, key=lambda r: len(r.calls))
    return measure(record, hooks.builds, changes, budget, interrupted)


def rebuild_of(change: Changes) -> str | None:
    """The rebuild a change is, or None (not one the replays make)."""
    if change.parallel_map:
        return "parallel_map"
    if change.prefetch:
        return "prefetch"
    return None


def measure(record: FitRecord, builds: Builds, changes: list[Changes], budget: float,
            interrupted: Callable[[], bool]) -> tuple[list[WhatIf], str]:
    """The fit's step with the pipeline as built and with each change: the measurements,
    or why there are none (NOTE [ What-if replays under Keras fit ])."""
    import psutil

    if record.dataset is None:
        return [], "the fit's input is not a tf.data pipeline (arrays or a generator): its changes are not replayed"
    variants: list[tuple[Changes, Any]] = []
    for change in changes:
        rebuilt = rebuild_of(change)
        built = builds.rebuild(record.dataset, rebuilt) if rebuilt else None
        if built is not None:
            variants.append((change, built))
    if not variants:
        return [], ("no advised change could be built into the pipeline again (built before profiling began, "
                    "or the change leaves it as it is)")
    model = record.model
    fn = record.original_fn or model.train_function
    variables = _state_variables(model)
    nbytes = sum(int(np.prod(tuple(v.shape), dtype=np.int64)) * tf.as_dtype(v.dtype).size for v in variables)
    if nbytes > STATE_COPY_SHARE * psutil.virtual_memory().available:
        return [], (f"copying the model state ({nbytes / 2**30:.1f} GiB) would take more than "
                    f"{STATE_COPY_SHARE:.0%} of the available memory")
    saved = [np.array(v.numpy(), copy=True) for v in variables]
    configs: list[tuple[Changes, Any]] = [(Changes(), record.dataset), *variants]
    per_batch = max(1, record.steps_per_execution)
    results: dict[int, tuple[float, int]] = {}
    deadline = time.perf_counter() + budget
    slice_s = budget / (MAX_ROUNDS * len(configs))
    try:
        for _ in range(MAX_ROUNDS):
            for i, (_, ds) in enumerate(configs):
                if time.perf_counter() >= deadline:
                    break
                got = _replay(model, fn, ds, slice_s, interrupted)
                if got is not None:
                    seconds, calls = results.get(i, (0.0, 0))
                    results[i] = (seconds + got[0], calls + got[1])
    finally:
        for v, value in zip(variables, saved, strict=True):
            v.assign(value)
    if 0 not in results:
        return [], "the fit's step could not be replayed in the time given"
    base_s, base_n = results[0]
    base = base_s / base_n / per_batch
    out = [WhatIf(configs[i][0].describe(), s / n / per_batch, base, min(n, base_n) * per_batch)
           for i, (s, n) in sorted(results.items()) if i]
    return out, "" if out else "no change could be replayed in the time given"


def _replay(model: Any, fn: Any, ds: Any, slice_s: float, interrupted: Callable[[], bool]) -> tuple[float, int] | None:
    """Seconds of ``fn``'s calls timed on a fresh iterator over ``ds``, and their count."""
    it = iter(model.distribute_strategy.experimental_distribute_dataset(ds.repeat()))
    out: Any = None
    for _ in range(WARMUP_CALLS):
        if interrupted():
            raise Interrupted
        out = fn(it)
    tf.nest.map_structure(np.asarray, out)  # the warm-up done on the device too
    calls = 0
    start = time.perf_counter()
    while calls < MAX_CALLS and (calls < 3 or time.perf_counter() - start < slice_s):
        if interrupted():
            raise Interrupted
        out = fn(it)
        calls += 1
        if time.perf_counter() - start > 4 * slice_s + 1.0:
            break
    tf.nest.map_structure(np.asarray, out)  # the device finished what was timed
    return time.perf_counter() - start, calls
