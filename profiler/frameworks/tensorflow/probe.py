"""Input time under Keras ``fit``, measured after the run. Imported by ``frameworks/tensorflow/hooks.py``.

NOTE [ Input time under Keras fit: the differential method ]
``fit`` pulls batches inside its compiled function (``iterator.get_next()`` in
``multi_step_on_iterator``): no Python ``next()`` to time. Measured with a
sleeping pipeline (``benchmarks/tf_differential.py``), the gap between one
batch's end and the next batch's begin callback holds no input wait at all:
Keras's epoch iterator hands the same iterator object to every step and never
touches data in Python. So input time is measured as a difference, after
DS-Analyzer (Mohan et al., VLDB 2021):
1. during training, each call of ``model.train_function`` is timed (one step, or
   ``steps_per_execution`` steps): input wait + compute (kerasfit.py);
2. after profiling, the model alone: the same ``train_function`` fed one cached
   batch (``Dataset.from_tensors(batch).repeat()``), so input costs nothing;
3. after profiling, the pipeline alone: a fresh iterator over the same dataset
   for a bounded time (its rate and CPU use go to ``Run.fit_probes``; its first batch
   is the cached batch of 2).
Each step's wait is max(0, its train_function time - the model-alone time),
capped at what the pipeline alone needs for that step's batches (its first
batch's time for an epoch's first step): a pipeline cannot hold a step up longer
than it takes to make the batch, and a larger difference on a tiny model is
callback or thread interference, not input (measured: 1.3 ms fit steps, 0.9 ms
model alone, 0.2 ms per batch for the pipeline alone);
``Run.data_wait_method`` is "differential". The pipeline's CPU cores while alone
stand in for the CPU spent per second of waiting (``Step.data_wait_cpu``).
The waits go to the timeline by step index (NOTE [ Waits measured after the run ]
in timeline.py), so steps a long run merged keep theirs.
Numpy inputs are probed through Keras's own array adapter (over their first
``ARRAY_PROBE_BATCHES`` batches).
Generators and ``PyDataset`` cannot be re-read without consuming them: their batches
are timed as they are made and handed over instead (``measure_feed_input``).

NOTE [ A PyDataset's Python beside the model ]
A PyDataset's ``__getitem__`` (or a generator) runs on tf.data's thread, beside the
training thread, and pure Python holds the GIL: the training thread, which needs it
for each call's dispatch and the callbacks between calls, waits for it up to the
interpreter's switch interval (5 ms) each time. Measured (docs/tensorflow.md: 8.5 ms
of Python per batch, a model of 0.37 ms alone, 2 cores): the train function found its
batch ready at every call (no wait at the hand-over) yet took 8.6 ms a call, the pace
of the Python. So where the model alone could be timed (on the first batch
handed over, as above), a call's wait is also what it took beyond the model alone, up
to the time its batches take to make (``Step.data_wait_cpu``: the user's code's CPU
share of its time): input the hand-over alone does not see. Method "handoff".

NOTE [ Probes never change the run ]
Both probes run in ``remove()``, after everything that was profiled. The
model-alone probe copies every model, optimizer and metric variable (random
seed states included) to host memory and assigns them back afterwards, so the
model leaves profiling exactly as training left it; it is skipped when that copy
would take more than a quarter of the available memory. The pipeline probe makes
a new iterator over the user's dataset: a reshuffling ``shuffle()`` draws its
next seed from the dataset's seed generator, and random ops in a ``map()`` advance
their state. Nothing profiled can see that; code that iterates the same dataset
object again after a ``with Profile():`` block sees a different (still random)
order than it would have. Under ``loadprof diagnose`` the probes run after the
script has finished.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tensorflow as tf

from ...records import FitProbe
from ..keras.fit import FitRecord
from . import tfdata
from .tfdata import optional_module

#: Each probe's time budget: this share of the profiled fit's wall time, within bounds
#: (at most ~10% of the run or a few seconds, for both probes).
PROBE_SHARE = 0.05
PROBE_MIN_S = 0.5
PROBE_MAX_S = 3.0
#: The model-alone probe is skipped when copying its state needs more than this
#: share of the available host memory.
STATE_COPY_SHARE = 0.25
#: Batches of numpy ``fit`` inputs given to the pipeline-alone probe.
ARRAY_PROBE_BATCHES = 64


@dataclass
class FitInput:
    """What the probes of one ``fit`` found."""

    probe: FitProbe | None = None  # None: nothing measured
    limitations: list[str] = field(default_factory=list)
    #: (step index, wait seconds, wait CPU seconds) for each step, ascending; None: not measured
    waits: Iterator[tuple[int, float, float]] | None = None


def measure_fit_input(record: FitRecord, fit: int, clock: Callable[[], float]) -> FitInput:
    """The differential method for the run's ``fit``-th fit call (see the NOTE above)."""
    found = FitInput()
    probe = FitProbe(fit)
    wall = sum(record.calls.seconds)
    budget = min(PROBE_MAX_S, max(PROBE_MIN_S, PROBE_SHARE * wall))
    batch: Any = None
    cores: float | None = None
    source = record.dataset
    if source is None and record.arrays:
        source = _array_dataset(record, found.limitations)
    if source is not None:
        try:
            pipe = tfdata.probe_pipeline(source, budget, clock=clock)
        except (tf.errors.OpError, RuntimeError, TypeError, ValueError) as exc:
            found.limitations.append(f"pipeline-alone probe failed ({type(exc).__name__}: {str(exc)[:120]})")
            return found
        batch = pipe.batch
        found.probe = probe
        probe.pipeline_first_batch_s = pipe.first_batch_seconds
        if pipe.batch_seconds:
            probe.pipeline_batch_s = pipe.batch_seconds
            probe.pipeline_batches_per_s = 1.0 / pipe.batch_seconds
            probe.pipeline_batches_timed = pipe.batches
            cores = probe.pipeline_cpu_cores = pipe.cpu_cores
        info = record.info
        if info is not None and batch is not None:
            size, nbytes = tfdata.batch_facts(batch)
            if size:
                info.batch_size = info.batch_size or size
                info.sample_nbytes = info.sample_nbytes or nbytes // size
                record.batch_size = record.batch_size or size
            if info.dataset_length is None and record.steps_per_epoch and info.batch_size:
                info.dataset_length = record.steps_per_epoch * info.batch_size
    if batch is None:
        found.limitations.append("model.fit input time not measured: no batch for the model-alone probe")
        return found
    try:
        per_call, timed = _probe_model(record, batch, budget, clock)
    except _ProbeSkipped as exc:
        found.limitations.append(f"model-alone probe skipped: {exc}")
        return found
    except (tf.errors.OpError, RuntimeError, TypeError, ValueError, AttributeError) as exc:
        found.limitations.append(f"model-alone probe failed ({type(exc).__name__}: {str(exc)[:120]})")
        return found
    per_batch = per_call / record.steps_per_execution
    probe.model_batch_s = per_batch
    probe.model_batches_per_s = 1.0 / per_batch if per_batch > 0 else 0.0
    probe.model_calls_timed = timed
    probe.fit_batch_s_median = statistics.median(seconds / batches for _, seconds, batches, _ in record.calls)
    # The pipeline cannot hold a step up longer than it takes to make its batches
    # alone; a larger difference is something else (callbacks, threads sharing
    # the cores), not waiting for input.
    pipe_batch = probe.pipeline_batch_s
    pipe_first = probe.pipeline_first_batch_s or 0.0
    capped = 0
    for _, seconds, batches, epoch_first in record.calls:
        wait = seconds - per_batch * batches
        if pipe_batch is not None:
            cap = pipe_batch * batches + (max(0.0, pipe_first - pipe_batch) if epoch_first else 0.0)
            capped += wait > cap
    probe.steps_wait_capped_by_pipeline = capped

    def waits() -> Iterator[tuple[int, float, float]]:
        for index, seconds, batches, epoch_first in record.calls:
            wait = max(0.0, seconds - per_batch * batches)
            if pipe_batch is not None:
                cap = pipe_batch * batches + (max(0.0, pipe_first - pipe_batch) if epoch_first else 0.0)
                wait = min(wait, cap)
            yield index, wait, wait * (cores or 0.0)

    found.waits = waits()
    return found


def measure_feed_input(record: FitRecord, fit: int, clock: Callable[[], float]) -> FitInput:
    """A PyDataset's or a generator's fit: each call's wait for its batches' hand-over
    (NOTE [ Waits of fit on a PyDataset or a generator ] in keras/feed.py), and what it took
    beyond the model alone (NOTE [ A PyDataset's Python beside the model ])."""
    found = FitInput()
    feed = record.feed
    assert feed is not None
    feed.finish()
    calls = len(record.calls)
    kind = record.info.kind if record.info is not None else "generator"
    if feed.unmatched * 2 > calls or len(feed.waits) != calls:
        found.limitations.append(f"model.fit on a {kind}: {feed.unmatched} of {calls} train_function calls "
                                 "could not be matched to the batches handed over: input time not measured")
        return found
    if feed.unmatched:
        found.limitations.append(f"model.fit on a {kind}: {feed.unmatched} of {calls} train_function calls not "
                                 "matched to their batches: their waits count as none")
    probe = found.probe = FitProbe(fit)
    probe.fit_batch_s_median = statistics.median(seconds / batches for _, seconds, batches, _ in record.calls)
    stage = feed.stage
    make = stage.seconds / stage.calls if stage.calls else None  # the user's code per batch
    busy = min(1.0, (stage.cpu or 0.0) / stage.seconds) if stage.seconds else 0.0
    per_batch: float | None = None
    if make and feed.batch is not None:
        budget = min(PROBE_MAX_S, max(PROBE_MIN_S, PROBE_SHARE * sum(record.calls.seconds)))
        try:
            per_call, timed = _probe_model(record, feed.batch, budget, clock)
        except _ProbeSkipped as exc:
            found.limitations.append(f"model-alone probe skipped: {exc}")
        except (tf.errors.OpError, RuntimeError, TypeError, ValueError, AttributeError) as exc:
            found.limitations.append(f"model-alone probe failed ({type(exc).__name__}: {str(exc)[:120]})")
        else:
            per_batch = per_call / record.steps_per_execution
            probe.model_batch_s = per_batch
            probe.model_batches_per_s = 1.0 / per_batch if per_batch > 0 else 0.0
            probe.model_calls_timed = timed
    feed.batch = None  # let it go
    handed, cpus = feed.waits, feed.cpus
    beyond_capped = 0
    if per_batch is not None and make:
        beyond_capped = sum(seconds - per_batch * batches > make * batches for _, seconds, batches, _ in record.calls)
        probe.steps_wait_capped_by_pipeline = beyond_capped

    def waits() -> Iterator[tuple[int, float, float]]:
        for i, (index, seconds, batches, _) in enumerate(record.calls):
            wait, cpu = float(handed[i]), float(cpus[i])
            if per_batch is not None and make:
                beyond = min(seconds - per_batch * batches, make * batches)
                if beyond > wait:
                    cpu += (beyond - wait) * busy
                    wait = beyond
            yield index, wait, cpu

    found.waits = waits()
    return found


def _array_dataset(record: FitRecord, limitations: list[str]) -> Any:
    """The pipeline Keras's own array adapter builds for numpy inputs, over their first batches.

    ``ARRAY_PROBE_BATCHES`` batches at most: the per-batch cost of slicing is what
    is probed, and the adapter copies the arrays it is given into one tensor.
    """
    adapters = optional_module("keras.src.trainers.data_adapters")
    get = getattr(adapters, "get_data_adapter", None)
    if get is None:
        limitations.append("keras data adapters not found: no pipeline for the differential probes")
        return None
    n = record.batch_size or 32
    head_n = n * ARRAY_PROBE_BATCHES
    try:
        head = tf.nest.map_structure(lambda a: a[:head_n], record.x)
        ys = tf.nest.map_structure(lambda a: a[:head_n], record.y) if record.y is not None else None
        return get(x=head, y=ys, batch_size=n, shuffle=True).get_tf_dataset()
    except (TypeError, ValueError, tf.errors.OpError) as exc:
        limitations.append(f"no pipeline for the differential probes ({type(exc).__name__})")
        return None


class _ProbeSkipped(Exception):
    """The model-alone probe would cost too much; the message says why."""


def _state_variables(model: Any) -> list[Any]:
    seen: dict[int, Any] = {}
    groups = [getattr(model, "variables", []), getattr(model, "metrics_variables", [])]
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        groups.append(getattr(optimizer, "variables", []))
    for group in groups:
        for v in group:
            seen.setdefault(id(v), v)
    return list(seen.values())


def _probe_model(record: FitRecord, batch: Any, budget: float, clock: Callable[[], float]) -> tuple[float, int]:
    """Seconds per ``train_function`` call on one cached batch, and calls timed; state restored."""
    import psutil

    model = record.model
    fn = record.original_fn or model.train_function
    variables = _state_variables(model)
    nbytes = 0
    for v in variables:
        nbytes += int(np.prod(tuple(v.shape), dtype=np.int64)) * tf.as_dtype(v.dtype).size
    available = psutil.virtual_memory().available
    if nbytes > STATE_COPY_SHARE * available:
        raise _ProbeSkipped(
            f"copying the model state ({nbytes / 2**30:.1f} GiB) would take more than "
            f"{STATE_COPY_SHARE:.0%} of the available memory"
        )
    saved = [np.array(v.numpy(), copy=True) for v in variables]
    cached = tf.data.Dataset.from_tensors(batch).repeat()
    it = iter(model.distribute_strategy.experimental_distribute_dataset(cached))
    times: list[float] = []
    try:
        fn(it)  # may trace a new concrete function for the cached batch's shape
        out = fn(it)
        start = clock()
        while len(times) < 3 or (clock() - start < budget and len(times) < 500):
            t0 = clock()
            out = fn(it)
            times.append(clock() - t0)
            if clock() - start > 4 * budget:
                break
        tf.nest.map_structure(np.asarray, out)  # wait for the device before reading the clock
        total = clock() - start
    finally:
        for v, value in zip(variables, saved, strict=True):
            v.assign(value)
    # Per-call median on the host; on a GPU calls return before kernels finish: use the synced mean.
    gpus = tf.config.list_logical_devices("GPU")
    per_call = total / len(times) if gpus else statistics.median(times)
    return per_call, len(times)
