"""Keras 3 ``fit`` under the TensorFlow hooks: its steps, and what its input probe needs.

Imported by ``frameworks/tensorflow/hooks.py``. ``Model.fit`` is wrapped to add a
callback (``LoadprofCallback``) and to time each call of ``model.train_function``
(one step, or ``steps_per_execution`` of them); ``evaluate``/``predict`` only
mark "inside Keras" so their iterators and functions are not taken for a custom
loop's; ``Model.__call__`` outside Keras's loops is a custom loop's forward pass.

Each timed call becomes timeline events (where the step begins, its samples, its
end) and one entry of ``FitCalls``: what the differential probe (tfprobe.py)
needs after the run to tell each step's input wait, in 4 bytes a call. The time between
one call's end and the next's within an epoch is fit's own (callbacks, the progress bar),
read as a custom loop's is (tensorflow/looptime.py) for the what-if replays. A
``keras.utils.PyDataset`` or a generator cannot be read again for that probe: its
batches are timed as they are made and taken instead (feed.py: NOTE [ Waits of fit
on a PyDataset or a generator ]).
"""

from __future__ import annotations

import functools
import inspect
import time
import types
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from ...patch import Patches, subclass
from ...records import FIT_NOTE, LoaderInfo, StageTime
from ..tensorflow.facts import check_amp
from ..tensorflow.looptime import LoopTime
from ..tensorflow.tfdata import optional_module
from .feed import Feed, Feeds, generator_name, getitem_name
from .pydataset import facts as pyfacts

if TYPE_CHECKING:
    from ..tensorflow.hooks import TensorFlowHooks


class FitCalls:
    """The ``train_function`` calls of one ``fit`` that ended a step.

    Per call only its seconds are stored (float32: a run of a million steps holds
    4 MiB); its step index and batch count are kept where they differ from what
    the previous call implies (the next index; ``steps_per_execution`` batches).
    """

    def __init__(self) -> None:
        self.seconds = array("f")
        self.epoch_firsts: set[int] = set()  # positions of each epoch's first call
        self._jumps: list[tuple[int, int]] = []  # (position, step index) where indices are not consecutive
        self._odd: dict[int, int] = {}  # position -> batches, where not steps_per_execution
        self._next_index = -1
        self._k = 1

    def add(self, index: int, seconds: float, batches: int, k: int, epoch_first: bool) -> None:
        pos = len(self.seconds)
        if index != self._next_index:
            self._jumps.append((pos, index))
        self._next_index = index + 1
        self._k = k
        if batches != k:
            self._odd[pos] = batches
        if epoch_first:
            self.epoch_firsts.add(pos)
        self.seconds.append(seconds)

    def __len__(self) -> int:
        return len(self.seconds)

    def __iter__(self) -> Iterator[tuple[int, float, int, bool]]:
        """(step index, seconds, batches, epoch's first call) for each call, in order."""
        jumps = dict(self._jumps)
        index = -1
        for pos, seconds in enumerate(self.seconds):
            index = jumps.get(pos, index + 1)
            yield index, seconds, self._odd.get(pos, self._k), pos in self.epoch_firsts


@dataclass
class FitRecord:
    """One ``model.fit`` call: what the probes need afterwards."""

    model: Any
    x: Any
    y: Any
    batch_size: int | None
    info: LoaderInfo | None
    dataset: Any = None  # the tf.data.Dataset given to fit, when one was
    arrays: bool = False  # numpy / tensor inputs
    steps_per_execution: int = 1
    steps_per_epoch: int | None = None
    original_fn: Any = None  # the train_function the timing wraps (the probe calls it)
    begin_step: int = 0
    first_in_epoch: bool = False
    epoch_start: float | None = None
    calls: FitCalls = field(default_factory=FitCalls)
    own: LoopTime = field(default_factory=LoopTime)  # fit's own time a batch, between its calls
    feed: Feed | None = None  # a PyDataset's or a generator's batches, timed (feed.py)
    training: bool = False  # between on_train_begin and on_train_end


class KerasFit:
    """The Keras side of ``TensorFlowHooks`` (``hooks``: its state, timeline and limits)."""

    def __init__(self, hooks: TensorFlowHooks) -> None:
        self.h = hooks
        self.fits: list[FitRecord] = []
        self.training: FitRecord | None = None  # the fit call running, if any
        self._callback_cls: Any = None
        self._patches = Patches("tensorflow hooks")  # per-fit train_function wraps
        self.feeds = Feeds(hooks.clock, hooks.limit)
        self._pydataset_cls: Any = None

    def patch_model(self, module: ModuleType) -> None:
        h = self.h
        model_cls = getattr(module, "Model", None)
        callbacks = optional_module("keras.src.callbacks.callback")
        base_cb = getattr(callbacks, "Callback", None)
        if model_cls is None or base_cb is None or not hasattr(model_cls, "fit"):
            h.limit("keras Model.fit not found: fit is not profiled")
            return
        backend = optional_module("keras.src.backend")
        name = getattr(backend, "backend", lambda: "?")()
        if name != "tensorflow":
            h.limit(f"keras runs on the {name} backend: fit is profiled only on the TensorFlow backend")
            return
        self._callback_cls = _callback_class(base_cb)
        h.patch(model_cls, "fit", self._wrap_fit)
        h.patch(model_cls, "__call__", self._wrap_model_call)
        for method in ("evaluate", "predict"):
            if hasattr(model_cls, method):
                h.patch(model_cls, method, self._wrap_keras_loop)
        self._patch_adapters()

    def _patch_adapters(self) -> None:
        """Where a PyDataset's and a generator's batches are handed to tf.data (feed.py)."""
        h = self.h
        py = optional_module("keras.src.trainers.data_adapters.py_dataset_adapter")
        gen = optional_module("keras.src.trainers.data_adapters.generator_data_adapter")
        self._pydataset_cls = getattr(py, "PyDataset", None)
        adapter = getattr(py, "PyDatasetAdapter", None)
        if adapter is None or not hasattr(adapter, "_get_iterator"):
            self._pydataset_cls = None
            h.limit("keras PyDatasetAdapter._get_iterator not found: fit's waits on a PyDataset not measured")
        else:
            h.patch(adapter, "_get_iterator", self.feeds.wrap_get_iterator)
        enqueuer = getattr(py, "OrderedEnqueuer", None)
        if enqueuer is None or not hasattr(enqueuer, "_get_executor_init") or not hasattr(py, "get_pool_class"):
            h.limit("keras OrderedEnqueuer's pool not found: a PyDataset's __getitem__ in worker processes "
                    "is not timed")
        else:  # NOTE [ A PyDataset's batches timed in its worker processes ] in poolstages.py
            h.patch(enqueuer, "_get_executor_init", self.feeds.pools.wrap_executor_init)
            h.patch(py, "get_pool_class", self.feeds.pools.wrap_pool_class)
        gen_adapter = getattr(gen, "GeneratorDataAdapter", None)
        if gen_adapter is None:
            h.limit("keras GeneratorDataAdapter not found: fit's waits on a generator not measured")
        else:
            h.patch(gen_adapter, "__init__", self.feeds.wrap_generator_init)

    def remove(self) -> None:
        self.h.run.limitations.extend(f"tensorflow: {line}" for line in self._patches.restore())

    # -- wrappers --------------------------------------------------------------------
    def _wrap_model_call(self, original: Callable[..., Any]) -> Callable[..., Any]:
        h = self.h
        clock = h.clock

        def __call__(model: Any, *args: Any, **kwargs: Any) -> Any:
            # An eager model call outside Keras's loops and outside any tf.function is a
            # forward pass of a custom loop: its start ends the loop's input time.
            if h.ours() and not h.in_keras() and not h.stack() and tf.executing_eagerly():
                h.timeline.forward_start(clock())
            return original(model, *args, **kwargs)

        return __call__

    def _wrap_keras_loop(self, original: Callable[..., Any]) -> Callable[..., Any]:
        h = self.h

        @functools.wraps(original)
        def loop(model: Any, *args: Any, **kwargs: Any) -> Any:
            if not h.ours():
                return original(model, *args, **kwargs)
            h.enter_keras()
            try:
                return original(model, *args, **kwargs)
            finally:
                h.exit_keras()

        return loop

    def _wrap_fit(self, original: Callable[..., Any]) -> Callable[..., Any]:
        fit_hooks = self
        h = self.h
        try:
            signature: inspect.Signature | None = inspect.signature(original)
        except (TypeError, ValueError):
            signature = None

        @functools.wraps(original)
        def fit(model: Any, *args: Any, **kwargs: Any) -> Any:
            if not h.ours() or h.in_keras() or signature is None:
                return original(model, *args, **kwargs)
            try:
                bound = signature.bind(model, *args, **kwargs)
            except TypeError:
                return original(model, *args, **kwargs)  # Keras reports the bad call itself
            record = fit_hooks._start_fit(model, bound.arguments)
            given = bound.arguments.get("callbacks")
            callback = fit_hooks._callback_cls(fit_hooks, record)
            if given is None:
                bound.arguments["callbacks"] = [callback]
            elif isinstance(given, (list, tuple)):
                bound.arguments["callbacks"] = [*given, callback]
            else:
                h.limit(f"fit(callbacks={type(given).__name__}): cannot add a callback; fit steps not timed")
            h.enter_keras()
            fit_hooks.training = record
            try:
                return original(*bound.args, **bound.kwargs)
            finally:
                fit_hooks.training = None
                h.exit_keras()
                fit_hooks.restore_train_function(record)

        return fit

    def _start_fit(self, model: Any, arguments: dict[str, Any]) -> FitRecord:
        h = self.h
        x, y = arguments.get("x"), arguments.get("y")
        batch_size = arguments.get("batch_size")
        record = FitRecord(model=model, x=x, y=y, batch_size=batch_size, info=None)
        if isinstance(x, tf.data.Dataset):
            record.dataset = x
            record.info = h.dataset_info(x)
            if record.info is not None:
                record.batch_size = record.info.batch_size
                if FIT_NOTE not in record.info.notes:
                    record.info.notes.append(FIT_NOTE)
        elif _is_arrays(x):
            record.arrays = True
            record.batch_size = batch_size or 32  # Keras's default
            length = _first_len(x)
            nbytes = _nbytes(x) + (_nbytes(y) if y is not None else 0)
            record.info = LoaderInfo(
                framework="keras", kind="arrays", batch_size=record.batch_size, dataset_length=length,
                dataset_type=type(x).__module__ + "." + type(x).__qualname__,
                sample_nbytes=nbytes // length if length else None,
                transformations=["keras_arrays", "shuffle", "batch", "prefetch"],
                has_cache=True, has_prefetch=True,  # in memory; Keras prefetches (ArrayDataAdapter)
                notes=["Keras slices the arrays in a tf.data pipeline it builds itself"],
            )
            h.run.loaders.append(record.info)
        elif isinstance(x, types.GeneratorType) or (self._pydataset_cls is not None
                                                     and isinstance(x, self._pydataset_cls)):
            record.feed = self._watch_feed(x)
            record.info = record.feed.info
            if not any(info is record.info for info in h.run.loaders):
                h.run.loaders.append(record.info)
        else:
            record.info = LoaderInfo(framework="keras", kind=type(x).__name__,
                                     dataset_type=type(x).__module__ + "." + type(x).__qualname__)
            h.run.loaders.append(record.info)
            h.limit(f"model.fit on a {type(x).__name__}: steps are timed but input time is not measured")
        check_amp(h.run, model=model)
        self.fits.append(record)
        return record

    def _watch_feed(self, x: Any) -> Feed:
        """A generator's or PyDataset's record, its knobs as notes, and its batches watched (feed.py)."""
        feed = self.feeds.of(x)
        if feed is not None:  # fit again on the same object: one record, as for a tf.data pipeline
            return self.feeds.add(x, feed.info, feed.stage, feed.num_batches)
        if isinstance(x, types.GeneratorType):
            name = generator_name(x)
            info = LoaderInfo(framework=pyfacts.GENERATOR, kind="generator", dataset_type=name, num_workers=0,
                              iterable=True)
            return self.feeds.add(x, info, StageTime("user", name, 0.0, 0.0, 0, ""))
        cls = type(x)
        # read as Keras's adapter reads them, without the properties' warning (Keras gives it itself)
        knobs = {key: getattr(x, "_" + key, default) for key, default in pyfacts.DEFAULTS.items()}
        processes = bool(knobs[pyfacts.MULTIPROCESSING]) and int(knobs[pyfacts.WORKERS] or 0) > 0
        info = LoaderInfo(framework=pyfacts.PYDATASET, kind="PyDataset", dataset_type=f"{cls.__module__}.{cls.__qualname__}",
                          num_workers=int(knobs[pyfacts.WORKERS]) if processes else 0, iterable=False)
        for key, value in knobs.items():
            pyfacts.set_note(info, key, value)
        try:
            num_batches = len(x)
        except Exception:  # the user's __len__: Keras calls it next and reports its error itself
            num_batches = None
        stage = StageTime("user", getitem_name(cls, self.feeds.getitem_of(cls)), 0.0, 0.0, 0, "")
        if cls not in self.feeds.wrapped:
            self.feeds.wrapped[cls] = self.feeds.getitem_of(cls)
            self.h.patch(cls, "__getitem__", self.feeds.wrap_getitem)
        return self.feeds.add(x, info, stage, num_batches)

    # -- callback events ----------------------------------------------------------------
    def train_begin(self, record: FitRecord, params: dict[str, Any]) -> None:
        model = record.model
        if getattr(model, "train_function", None) is None:
            self.h.limit("model.train_function missing at on_train_begin: fit steps not timed")
            return
        record.training = True
        record.steps_per_execution = max(1, int(getattr(model, "steps_per_execution", 1) or 1))
        steps = params.get("steps") if params else None
        record.steps_per_epoch = int(steps) if steps else None
        fit_hooks = self
        clock = self.h.clock

        process_time = time.process_time
        feed = record.feed

        def make(fn: Callable[..., Any]) -> Callable[..., Any]:
            record.original_fn = fn

            def train_function(*args: Any, **kwargs: Any) -> Any:
                cpu0 = process_time() if feed is not None else 0.0  # the wait's CPU (feed.py)
                t0 = clock()
                out = fn(*args, **kwargs)  # StopIteration (end of data) is no step
                fit_hooks._step(record, t0, clock(), cpu0)
                return out

            return train_function

        self._patches.wrap(model, "train_function", make)

    def train_end(self, record: FitRecord) -> None:
        record.training = False
        self.restore_train_function(record)

    def restore_train_function(self, record: FitRecord) -> None:
        self.h.run.limitations.extend(
            f"tensorflow: {line}" for line in self._patches.restore(record.model, "train_function"))

    def epoch_begin(self, record: FitRecord) -> None:
        record.first_in_epoch = True
        if record.info is not None:
            record.info.iterations += 1

    def batch_begin(self, record: FitRecord, batch: int) -> None:
        record.begin_step = batch
        if record.first_in_epoch:
            # The epoch's first step starts here, not at the last step of the previous
            # epoch: validation and epoch-end callbacks in between are no step's.
            record.epoch_start = self.h.clock()
            record.first_in_epoch = False

    def _step(self, record: FitRecord, t0: float, t1: float, cpu0: float = 0.0) -> None:
        if not self.h.ours():
            return  # the model-alone probe, after profiling, calls the function this wraps
        k = record.steps_per_execution
        batches = k
        if record.steps_per_epoch:
            batches = max(1, min(k, record.steps_per_epoch - record.begin_step))
        tl = self.h.timeline
        start, record.epoch_start = record.epoch_start, None
        if start is None:  # not an epoch's first call: the epoch's end and validation before that are no step's
            record.own.call_starts(t0, batches)
        record.own.call_ends(t1)
        feed = record.feed
        waited = feed.taken(t0, cpu0, t1, batches) if feed is not None else None
        size = record.batch_size or (feed.info.batch_size if feed is not None else None)
        samples = batches * size if size else None
        if start is not None or samples is not None:
            tl.step_begins(start, samples)
        n = tl.count
        try:
            tl.optimizer_step(t1)  # may raise StopRun (--max-steps): the call is recorded still
        finally:
            if tl.count > n:
                record.calls.add(n, t1 - t0, batches, k, start is not None)
                if feed is not None and waited is not None:
                    feed.waits.append(waited[0])
                    feed.cpus.append(waited[1])
        if record.info is not None and record.dataset is not None:  # between calls: no step's time
            self.h.inside.on_batch(record.info, record.dataset, batches)


def _is_arrays(x: Any) -> bool:
    leaves = tf.nest.flatten(x) if x is not None else []
    return bool(leaves) and all(isinstance(a, (np.ndarray, tf.Tensor)) for a in leaves)


def _first_len(x: Any) -> int | None:
    leaves = tf.nest.flatten(x)
    try:
        return int(leaves[0].shape[0])
    except (IndexError, TypeError, AttributeError):
        return None


def _nbytes(x: Any) -> int:
    total = 0
    for a in tf.nest.flatten(x):
        if isinstance(a, np.ndarray):
            total += a.nbytes
        elif isinstance(a, tf.Tensor) and a.dtype != tf.string:
            total += int(np.prod(a.shape, dtype=np.int64)) * a.dtype.size
    return total


def _callback_class(base: type) -> type:
    """The fit callback, a subclass of keras.callbacks.Callback made once keras is imported.

    It defines no ``on_*_batch_end`` (``patch.AVOID``: Keras dispatches batch-end
    callbacks on a thread only while all of them are defaults)."""

    def __init__(cb: Any, fit_hooks: KerasFit, record: FitRecord) -> None:
        base.__init__(cb)  # type: ignore[misc]
        cb._loadprof = fit_hooks
        cb._record = record

    return subclass(base, "LoadprofCallback", {
        "__init__": __init__,
        "on_train_begin": lambda cb, logs=None: cb._loadprof.train_begin(
            cb._record, dict(getattr(cb, "params", None) or {})),
        "on_epoch_begin": lambda cb, epoch, logs=None: cb._loadprof.epoch_begin(cb._record),
        "on_train_batch_begin": lambda cb, batch, logs=None: cb._loadprof.batch_begin(cb._record, batch),
        "on_train_end": lambda cb, logs=None: cb._loadprof.train_end(cb._record),
    })
