"""What-if replays under TensorFlow: the advised tf.data changes measured on the job's
own step, after the run.

NOTE [ What-if replays under Keras fit ]
The differential probes (probe.py) already time the model alone on one batch, after the
run. The replays go one step further: the fit's ``train_function`` (or a custom loop's
``tf.function`` step, held once traced where the loop called it on the batch it read, as
read: ``step(x, y)``) fed a fresh iterator over the pipeline as the script built it, and
over the same pipeline built again with one advised change (rebuild.py: a parallel map, or the one map
the advice per transformation names, a prefetch after the batch,
a filled cache after the deterministic maps, or their output stored as TFRecord records and
read back (the offline copy), the files read several at a time; a PyDataset's
batches as Keras's adapter makes them, and in the worker processes its advice names:
keras/pydataset/replay.py), in rounds while
the budget lasts, each round's calls after two of warm-up (the iterator's start, a shuffle
buffer filling), the rounds of each averaged. A change whose pipeline is the same is not
replayed. What a step took beyond the replayed call, read while the run ran (looptime.py),
goes into every replay alike: a custom loop's time between step calls beyond its waits for
batches is added to each replayed step; a fit's time between ``train_function`` calls within
an epoch (callbacks, the progress bar, mostly Python: keras/fit.py) is spent again after each
replayed call, the main thread kept busy as long (as the torch replays do, NOTE [ What-if
replays ]), so that the pipeline's threads make the next batch meanwhile as they did in the
run, where adding it after would count it twice against a prefetched pipeline. A fit of too
few calls for that figure gets what the run's steady step took beyond the replayed one, as
large as the load moved it. The variables the step uses (the model's, its
optimizer's and metrics'; a loop step's: those its traced functions capture) are copied to
host memory first and assigned back after, as the model-alone probe does, so the model
leaves as training left it. A pipeline that cannot be read again (its files gone with the
script's temporary folder) fails with TensorFlow's own error, and the run says so.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from ...advice.base import Recommendation
from ...epochfree import scaled_free
from ...fixes.spec import Changes
from ...records import LoaderInfo, Run, WhatIf
from ...whatif import Interrupted, plan
from ..keras.fit import FitRecord
from ..keras.pydataset.facts import PYDATASET
from ..keras.pydataset.replay import PyDatasetInput
from .probe import STATE_COPY_SHARE, _state_variables
from .rebuild import CACHE_BATCHES, Builds

if TYPE_CHECKING:
    from .hooks import TensorFlowHooks

#: the advice a replay measures: the changes a rebuild makes, and mixed precision under fit
MEASURED_IDS = ("parallel_map", "prefetch", "cache", "interleave", "mixed_precision", "offline_preprocessing")
#: ...and a PyDataset's worker processes (its advice's dialect is Keras's)
KERAS_IDS = ("num_workers",)
#: a custom loop's step is held at its call after this many (traced by then)
HOLD_STEP = 4
#: calls of each replay not timed: the iterator's start, a shuffle buffer filling
WARMUP_CALLS = 2
#: rounds of the replays, interleaved, at most
MAX_ROUNDS = 4
#: calls timed in one replay, at most
MAX_CALLS = 200


@dataclass
class LoopStep:
    """A custom loop's ``tf.function`` step and the pipeline whose batches it was called on."""

    fn: Any
    dataset: Any
    unpack: bool  # step(*batch), or step(batch)


@dataclass
class _Target:
    """What a replay calls: ``call(iterator)`` runs ``batches`` of the step."""

    dataset: Any
    iterate: Callable[[Any], Any]
    call: Callable[[Any], Any]
    variables: list[Any]
    batches: int
    #: the same step under a mixed-precision policy (a clone of the model), where one was built
    mixed: _Target | None = None
    #: the loop's own time a step, read in the run (looptime.py: a custom loop's, or fit's
    #: between its calls); None: too few steps to read it
    own: float | None = None
    #: ``own`` is spent after each replayed call (a fit's), not added to the step after
    spin: bool = False
    #: the input with a change no rebuild of a pipeline makes (a PyDataset's workers), and
    #: what lets its iterators go between two replays; None: a tf.data pipeline's
    feed: PyDatasetInput | None = None


def replay(hooks: TensorFlowHooks, run: Run, recommendations: list[Recommendation], budget: float,
           interrupted: Callable[[], bool]) -> tuple[list[WhatIf], str]:
    """The adapter's what-if entry, after the run: the advised tf.data changes measured
    on the longest ``fit``'s step, or a custom loop's, or why they are not."""
    fits, hooks.replayable = hooks.replayable, []  # the script's models and data, let go after
    loop, hooks.loop_step = hooks.loop_step, None
    changes = plan(recommendations, "tf", MEASURED_IDS) + plan(recommendations, "keras", KERAS_IDS)
    if not changes:
        return [], ""
    if fits:
        record = max(fits, key=lambda r: len(r.calls))
        feed = _pydataset_input(record)
        if record.dataset is None and feed is None:
            return [], ("the fit's input is not a tf.data pipeline or a PyDataset (arrays or a generator): its "
                        "changes are not replayed")
        target = _fit_target(record, feed.dataset() if feed is not None else record.dataset)
        target.feed = feed
        mixed = next((c for c in changes if c.amp), None)
        if mixed is not None:
            target.mixed = _mixed_target(record, mixed, target.dataset)
    elif loop is not None:
        target = _loop_target(loop)
        target.own = hooks.loop_time.per_step()
    else:
        return [], ("a custom tf.data loop whose step was not held (a tf.function called on the batch "
                    "as read, after its first steps): its changes are not replayed (`loadprof tune` measures them)")
    try:
        return measure(target, hooks.builds, changes, _steady_step(run), budget, interrupted, _per_epoch(run),
                       _epoch_frees(run))
    finally:
        if target.feed is not None:
            target.feed.release()


def _pydataset_input(record: FitRecord) -> PyDatasetInput | None:
    """A PyDataset's batches made as Keras makes them, where the fit read one (not a generator)."""
    if record.dataset is not None or record.feed is None or record.info is None \
            or record.info.framework != PYDATASET:
        return None
    return PyDatasetInput(record.x)


def _fit_target(record: FitRecord, dataset: Any) -> _Target:
    model = record.model
    fn = record.original_fn or model.train_function
    return _Target(dataset, lambda ds: iter(model.distribute_strategy.experimental_distribute_dataset(ds)),
                   fn, _state_variables(model), max(1, record.steps_per_execution), own=record.own.per_step(),
                   spin=True)


def _mixed_target(record: FitRecord, change: Changes, dataset: Any) -> _Target | None:
    """The fit's model built again, its layers under the mixed policy ``change`` means here
    (as the Keras fix sets it before the script builds its model), compiled alike; None
    where no policy fits or the model cannot be cloned."""
    import keras

    from ..keras.fixes import mixed_policy

    policy = mixed_policy(change.amp)
    model = record.model
    if policy is None or not getattr(model, "compiled", True):
        return None
    before = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        clone = keras.models.clone_model(
            model, clone_function=lambda layer: layer.__class__.from_config({**layer.get_config(), "dtype": policy}))
        clone.set_weights(model.get_weights())
        optimizer = model.optimizer.__class__.from_config(model.optimizer.get_config())
        clone.compile(optimizer=optimizer, loss=model.loss, steps_per_execution=record.steps_per_execution)
        clone.make_train_function()
    except (TypeError, ValueError, AttributeError, NotImplementedError):
        return None  # a subclassed model, a custom layer's config: not rebuilt
    finally:
        keras.mixed_precision.set_global_policy(before)
    return _Target(dataset,
                   lambda ds: iter(clone.distribute_strategy.experimental_distribute_dataset(ds)),
                   clone.train_function, [], max(1, record.steps_per_execution))


def _loop_target(loop: LoopStep) -> _Target:
    seen: dict[int, Any] = {}
    for concrete in loop.fn._list_all_concrete_functions():
        for v in getattr(concrete, "variables", ()):
            seen.setdefault(id(v), v)
    fn = loop.fn

    def call(it: Any) -> Any:
        batch = next(it)
        return fn(*batch) if loop.unpack else fn(batch)

    return _Target(loop.dataset, iter, call, list(seen.values()), 1)


def _steady_step(run: Run) -> float | None:
    """The run's median step, seconds a batch (epoch starts and stalls left out)."""
    per = [s.duration / max(1, s.merged) for s in run.steps if s.duration > 0]
    return statistics.median(per) if per else None


def _trained(run: Run) -> LoaderInfo | None:
    """The first pipeline the run trained on (iterated beyond its evaluations), or None."""
    return next((i for i in run.loaders if i.iterations > i.eval_iterations), None)


def _per_epoch(run: Run) -> int | None:
    """The batches of an epoch of the pipeline trained on, where its length is known."""
    info = _trained(run)
    if info is None or not info.dataset_length or not info.batch_size:
        return None
    return -(-info.dataset_length // info.batch_size)


def _epoch_frees(run: Run) -> LoaderInfo | None:
    """The tf.data pipeline trained on where it freed an iterator between two epochs, whose
    frees a changed epoch's figure reads (NOTE [ An iterator's free and autotune's wakes ]);
    None where it freed none (one iterator over the epochs) or is no tf.data pipeline."""
    info = _trained(run)
    return info if info is not None and info.framework == "tf.data" and info.stops_between_epochs() else None


def rebuild_of(change: Changes) -> str | None:
    """The rebuild a change is, or None (not one the replays make)."""
    if change.parallel_map or change.map_fn:
        return "parallel_map"
    if change.prefetch:
        return "prefetch"
    if change.cache:
        return "cache"
    if change.stored:
        return "stored"
    if change.parallel_reads:
        return "parallel_reads"
    return None


def measure(target: _Target, builds: Builds, changes: list[Changes], run_step: float | None, budget: float,
            interrupted: Callable[[], bool], per_epoch: int | None = None,
            frees: LoaderInfo | None = None) -> tuple[list[WhatIf], str]:
    """The step with the pipeline as built and with each change: the measurements, and why
    a change or all are not (NOTE [ What-if replays under Keras fit ]). ``per_epoch``: the
    batches of an epoch, where known; ``frees``: the pipeline whose iterators the run freed
    between epochs (``_epoch_frees``)."""
    try:
        return _measure(target, builds, changes, run_step, budget, interrupted, per_epoch, frees)
    finally:
        builds.drop_copies()


def _measure(target: _Target, builds: Builds, changes: list[Changes], run_step: float | None, budget: float,
             interrupted: Callable[[], bool], per_epoch: int | None,
             frees: LoaderInfo | None = None) -> tuple[list[WhatIf], str]:
    import psutil

    # the budget counts the rebuilds: a stored copy's are written then
    deadline = time.perf_counter() + budget
    variants: list[tuple[Changes, Any, _Target]] = []
    problems: list[str] = []
    for change in changes:
        if change.amp:
            if target.mixed is not None:
                variants.append((change, target.dataset, target.mixed))
            continue
        rebuilt = rebuild_of(change)
        calls = change.parallel_reads if rebuilt == "parallel_reads" else change.map_calls
        if change.num_workers and target.feed is not None:
            built = target.feed.dataset(change)
        elif rebuilt == "stored":
            try:
                built = builds.rebuild(target.dataset, rebuilt)
            except Exception as err:  # an element a record cannot hold, the script's map failing again
                problems.append(f"a stored copy of the pipeline's elements could not be written "
                                f"({type(err).__name__}: {err})")
                continue
        else:
            built = builds.rebuild(target.dataset, rebuilt, change.map_fn, calls) if rebuilt else None
        if built is not None:
            variants.append((change, built, target))
    if not variants:
        return [], "; ".join([*problems, "no advised change could be built into the pipeline again (built before "
                              "profiling began, or the change leaves it as it is)"])
    variables = target.variables
    nbytes = sum(int(np.prod(tuple(v.shape), dtype=np.int64)) * tf.as_dtype(v.dtype).size for v in variables)
    if nbytes > STATE_COPY_SHARE * psutil.virtual_memory().available:
        return [], (f"copying the model state ({nbytes / 2**30:.1f} GiB) would take more than "
                    f"{STATE_COPY_SHARE:.0%} of the available memory")
    saved = [np.array(v.numpy(), copy=True) for v in variables]
    # each pipeline repeated once, one object for all its rounds: a fresh dataset object
    # rewrites its graph at its first iterator (tens of ms for a costly map), which a job
    # iterating the same dataset every epoch pays once
    configs: list[tuple[Changes, Any, _Target]] = [(c, ds.repeat(), t)
                                                   for c, ds, t in [(Changes(), target.dataset, target), *variants]]
    results: dict[int, tuple[float, int]] = {}  # seconds, calls
    rounds: dict[int, list[float]] = {}  # each round's seconds a call
    firsts: dict[int, list[float]] = {}  # each round's first call: an epoch's start
    stops: dict[int, list[float]] = {}  # a PyDataset's pool stopped: an epoch's end
    slice_s = max(0.0, deadline - time.perf_counter()) / (MAX_ROUNDS * len(configs))
    spin = target.own * target.batches if target.spin and target.own else 0.0
    # a PyDataset's input starts again at each repetition (a new pool, as at an epoch): a slice
    # stays inside one epoch, so its steady calls hold no start
    most = (min(MAX_CALLS, max(3, per_epoch // target.batches - WARMUP_CALLS))
            if target.feed is not None and per_epoch else MAX_CALLS)
    try:
        for _ in range(MAX_ROUNDS):
            for i, (change, ds, replayed) in enumerate(configs):
                if time.perf_counter() >= deadline:
                    break
                # a cache's replay fills it first: the batches it holds, untimed
                warmup = WARMUP_CALLS + (CACHE_BATCHES if change.cache else 0)
                try:
                    seconds, calls, first = _replay(replayed, ds, slice_s, interrupted, warmup, spin, most)
                finally:
                    if target.feed is not None:
                        t_stop = time.perf_counter()
                        target.feed.reset()
                        stops.setdefault(i, []).append(time.perf_counter() - t_stop)
                s0, n0 = results.get(i, (0.0, 0))
                results[i] = (s0 + seconds, n0 + calls)
                if calls:
                    rounds.setdefault(i, []).append(seconds / calls)
                firsts.setdefault(i, []).append(first)
    finally:
        for v, value in zip(variables, saved, strict=True):
            v.assign(value)
    if 0 not in results:
        return [], "; ".join([*problems, "the step could not be replayed in the time given"])
    base_s, base_n = results[0]
    base = base_s / base_n / target.batches
    # the loop's own time, read in the run; without it, what the run's steady step took beyond the replay
    extra = target.own if target.own is not None else max(0.0, run_step - base) if run_step else 0.0
    added = 0.0 if spin else extra  # spent in each replayed call already

    def start(i: int) -> float:
        """A fresh iterator's first call beyond a steady one: the pipeline starting (an epoch's
        start). The first round's only where no other ran: its first iterator rewrites the
        pipeline's graph, once a job, and a cache's starts filling it, no epoch's start at all."""
        s, n = results[i]
        got = firsts.get(i, [])
        got = got[1:] or ([] if configs[i][0].cache else got)
        return max(0.0, statistics.mean(got) - s / n) if got else 0.0

    out = []
    for i, (s, n) in sorted(results.items()):
        if not i:
            continue
        change, step, was = configs[i][0], s / n / target.batches, base
        stop, was_stop = min(stops.get(i, [0.0])), min(stops.get(0, [0.0]))
        if (change.cache or change.stored) and per_epoch and firsts.get(i, [])[1:]:
            # its figure is for every epoch after the first: each starts again, from the filled
            # cache (from the stored copy: every epoch), and frees its iterator at its end
            # (NOTE [ An iterator's free and autotune's wakes ])
            life, was_life = per_epoch * (step + added) + start(i), per_epoch * (base + added) + start(0)
            if frees is not None and was_life > 0:
                stop, was_stop = scaled_free(frees, life / was_life), statistics.mean(frees.stops_between_epochs())
                step, was = step + stop / per_epoch, base + was_stop / per_epoch
            step, was = step + start(i) / per_epoch, was + start(0) / per_epoch
        out.append(WhatIf(change.describe(), step + added, was + added, min(n, base_n) * target.batches,
                          extra_seconds=extra, start_seconds=start(i), baseline_start_seconds=start(0),
                          stop_seconds=stop, baseline_stop_seconds=was_stop,
                          round_gains=[(b / target.batches + added) / (c / target.batches + added)
                                       for b, c in zip(rounds.get(0, []), rounds.get(i, []), strict=False) if c > 0]))
    return out, "; ".join([*problems, *([] if out else ["no change could be replayed in the time given"])])


def _replay(target: _Target, ds: Any, slice_s: float, interrupted: Callable[[], bool],
            warmup: int = WARMUP_CALLS, spin: float = 0.0, most: int = MAX_CALLS) -> tuple[float, int, float]:
    """Seconds of the step's calls timed on a fresh iterator over ``ds`` (repeated), their count, and
    the seconds of the first call (the iterator's start with it); ``spin``: seconds the main
    thread is kept busy after each call (fit's own time)."""
    t0 = time.perf_counter()
    it = target.iterate(ds)
    out: Any = None
    first = 0.0
    for n in range(warmup):
        if interrupted():
            raise Interrupted
        out = target.call(it)
        _busy(spin)  # the first call's own time too: an epoch's start is what it took beyond a steady one
        if not n:
            tf.nest.map_structure(np.asarray, out)
            first = time.perf_counter() - t0
    tf.nest.map_structure(np.asarray, out)  # the warm-up done on the device too
    calls = 0
    start = time.perf_counter()
    while calls < most and (calls < 3 or time.perf_counter() - start < slice_s):
        if interrupted():
            raise Interrupted
        out = target.call(it)
        _busy(spin)
        calls += 1
        if time.perf_counter() - start > 4 * slice_s + 1.0:
            break
    tf.nest.map_structure(np.asarray, out)  # the device finished what was timed
    return time.perf_counter() - start, calls, first


def _busy(seconds: float) -> None:
    """The main thread kept busy (in Python, as Keras's callbacks keep it) for ``seconds``."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
