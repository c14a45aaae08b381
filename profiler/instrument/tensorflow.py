"""TensorFlow and Keras 3 hooks: input waits, steps, ``model.fit``, the pipeline graph.

Imported only once the user's code has imported TensorFlow (``instrument.FrameworkWatch``).
This and ``tfdata.py`` are the only profiler modules that import TensorFlow.

What is hooked, and how it is undone (all restored by ``remove()``):
- ``tf.data.Dataset.__iter__`` (read the pipeline's graph, count epochs) and the
  eager iterator's ``__next__``/``get_next`` (``OwnedIterator``), at class level:
  the loop's wait for each batch, and the process's CPU time meanwhile (tf.data
  works in its own threads, so the waiting thread's CPU would say nothing).
- Keras 3: ``BaseOptimizer.apply`` (what ``apply_gradients`` calls) marks steps;
  ``Model.fit`` attaches a callback and times ``model.train_function``;
  ``Model.evaluate``/``predict`` only mark "inside Keras" so their internal
  iterators and functions are not mistaken for a custom loop. Keras is patched
  when its modules finish importing, whichever of keras and tensorflow came first.
- ``tf.function`` calls (``polymorphic_function.Function.__call__``): the step end
  of a compiled train step (NOTE [ TensorFlow step boundaries ]).

NOTE [ TensorFlow step boundaries ]
A step ends when the Keras optimizer's ``apply`` returns, if it ran eagerly.
Inside a ``tf.function`` the Python ``apply`` runs only while the function is
traced, never when the compiled graph runs, so the trace is used to *recognise*
a train step: the outermost ``tf.function`` being called while ``apply`` was
traced is remembered as a step function, and each later eager call of it ends a
step when it returns. A step function traced before profiling began is
recognised on its first call instead, by its traced graphs capturing an
optimizer's int64 step counter (``<optimizer>/iteration``). What it cannot see:
optimizers that are not Keras 3's updating variables by hand (raw
``assign_sub``; call ``prof.step()``), and the
iterator's ``next()`` inside the compiled function (its waits are invisible; the
report says so in ``limitations``).

NOTE [ Input time under Keras fit: the differential method ]
``fit`` pulls batches inside its compiled function (``iterator.get_next()`` in
``multi_step_on_iterator``): no Python ``next()`` to time. Measured with a
sleeping pipeline (``benchmarks/tf_differential.py``), the gap between one
batch's end and the next batch's begin callback holds no input wait at all:
Keras's epoch iterator hands the same iterator object to every step and never
touches data in Python. So input time is measured as a difference, after
DS-Analyzer (Mohan et al., VLDB 2021):
1. during training, each call of ``model.train_function`` is timed (one step, or
   ``steps_per_execution`` steps): input wait + compute;
2. after profiling, the model alone: the same ``train_function`` fed one cached
   batch (``Dataset.from_tensors(batch).repeat()``), so input costs nothing;
3. after profiling, the pipeline alone: a fresh iterator over the same dataset
   for a bounded time (its rate and CPU use go to ``Run.probes``; its first batch
   is the cached batch of 2).
Each step's wait is max(0, its train_function time - the model-alone time),
capped at what the pipeline alone needs for that step's batches (its first
batch's time for an epoch's first step): a pipeline cannot hold a step up longer
than it takes to make the batch, and a larger difference on a tiny model is
callback or thread interference, not input (measured: 1.3 ms fit steps, 0.9 ms
model alone, 0.2 ms per batch for the pipeline alone);
``Run.data_wait_method`` is "differential". The pipeline's CPU cores while alone
stand in for the CPU spent per second of waiting (``Step.data_wait_cpu``).
Numpy inputs are probed through Keras's own array adapter (over their first
``ARRAY_PROBE_BATCHES`` batches);
generators and ``PyDataset`` cannot be re-read without consuming them: their fit
steps are timed but their input is not measured (a line in ``limitations``).

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

NOTE [ Fork safety ] (as in instrument/torch.py): every wrapper checks the pid
that installed it and only calls through in any other process (Keras
``PyDataset`` workers, ``multiprocessing``).
"""

from __future__ import annotations

import functools
import inspect
import os
import statistics
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np
import tensorflow as tf

from ..records import LoaderInfo, Run, Step
from ..timeline import Timeline
from . import ImportWatch, ThisProcess, tfdata

_MISSING = object()

#: Each probe's time budget: this share of the profiled fit's wall time, within bounds.
#: (The issue's bound: at most ~10% of the run or a few seconds, for both probes.)
PROBE_SHARE = 0.05
PROBE_MIN_S = 0.5
PROBE_MAX_S = 3.0
#: The model-alone probe is skipped when copying its state needs more than this
#: share of the available host memory.
STATE_COPY_SHARE = 0.25
#: Batches of numpy ``fit`` inputs given to the pipeline-alone probe.
ARRAY_PROBE_BATCHES = 64


def _module(name: str) -> ModuleType | None:
    try:
        return __import__(name, fromlist=["_"])
    except ImportError:
        return None


@dataclass
class _FitRun:
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
    original_fn: Any = None
    begin_step: int = 0
    first_in_epoch: bool = False
    epoch_start: float | None = None
    #: (step, seconds in train_function, batches in that call)
    calls: list[tuple[Step, float, int]] = field(default_factory=list)
    #: positions in ``calls`` of each epoch's first call (a fresh iterator fills its buffers)
    epoch_firsts: set[int] = field(default_factory=set)


class TensorFlowHooks:
    """Installs and removes the TensorFlow / Keras hooks for one profiling session."""

    framework = "tensorflow"

    def __init__(self, timeline: Timeline, run: Run, clock: Callable[[], float] = time.perf_counter) -> None:
        self.timeline = timeline
        self.run = run
        self.clock = clock
        self.pid = os.getpid()
        self.installed = False
        self._saved: list[tuple[Any, str, Any]] = []
        self._local = threading.local()
        self._finder: ImportWatch | None = None
        self._pending: dict[str, Callable[[ModuleType], None]] = {}
        self._step_functions: weakref.WeakSet[Any] = weakref.WeakSet()
        self._checked_functions: weakref.WeakSet[Any] = weakref.WeakSet()
        self._datasets: dict[int, tuple[weakref.ref[Any], LoaderInfo]] = {}
        self._fits: list[_FitRun] = []
        self._callback_cls: Any = None
        self._graph_next_in_step = False
        self._limits: set[str] = set()

    # -- install / remove -----------------------------------------------------
    def install(self) -> None:
        if self.installed:
            return
        self.installed = True
        self.run.environment.frameworks["tensorflow"] = str(getattr(tf, "__version__", "?"))
        self._patch(tf.data.Dataset, "__iter__", self._wrap_iter)
        iterator_ops = _module("tensorflow.python.data.ops.iterator_ops")
        owned = getattr(iterator_ops, "OwnedIterator", None)
        if owned is None:
            self._limit("tf.data iterator class not found: batch waits of custom loops not timed")
        else:
            self._patch(owned, "__next__", self._wrap_next)
            self._patch(owned, "get_next", self._wrap_next)
        function_cls = self._function_class()
        if function_cls is None:
            self._limit("tf.function class not found: steps of compiled train steps not seen")
        else:
            self._patch(function_cls, "__call__", self._wrap_function_call)
        self._when_imported("keras.src.optimizers.base_optimizer", self._patch_optimizer)
        self._when_imported("keras.src.models.model", self._patch_model)
        if self._pending:
            self._finder = ImportWatch(list(self._pending), self._on_module_loaded).install()

    def remove(self) -> None:
        if not self.installed:
            return
        self.installed = False
        if self._finder is not None:
            self._finder.remove()
            self._finder = None
        for owner, name, original in reversed(self._saved):
            if original is _MISSING:
                try:
                    delattr(owner, name)
                except AttributeError:
                    pass
            else:
                setattr(owner, name, original)
        self._saved.clear()
        for fit in self._fits:
            self._restore_train_function(fit)
        self._finish()

    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        original = getattr(owner, name, None)
        if original is None:
            self._limit(f"{owner.__name__}.{name} not found: not hooked")
            return
        self._saved.append((owner, name, owner.__dict__.get(name, _MISSING)))
        setattr(owner, name, make(original))

    def _limit(self, line: str) -> None:
        if line not in self._limits:
            self._limits.add(line)
            self.run.limitations.append(f"tensorflow: {line}")

    @staticmethod
    def _function_class() -> Any:
        for path in ("tensorflow.python.eager.polymorphic_function.polymorphic_function",
                     "tensorflow.python.eager.def_function"):
            cls = getattr(_module(path), "Function", None)
            if cls is not None:
                return cls
        return None

    def _when_imported(self, name: str, patch: Callable[[ModuleType], None]) -> None:
        module = sys.modules.get(name)
        spec = getattr(module, "__spec__", None)
        initializing = getattr(spec, "_initializing", False)
        if module is not None and not initializing:
            patch(module)
        else:
            self._pending[name] = patch

    def _on_module_loaded(self, name: str) -> None:
        patch = self._pending.pop(name, None)
        module = sys.modules.get(name)
        if patch is not None and module is not None and self.installed:
            patch(module)

    # -- per-thread state -----------------------------------------------------
    def _stack(self) -> list[Any]:
        stack: list[Any] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _in_keras(self) -> bool:
        return getattr(self._local, "keras", 0) > 0

    def _ours(self) -> bool:
        return self.installed and ThisProcess.pid == self.pid

    # -- tf.data ---------------------------------------------------------------
    def _wrap_iter(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self

        def __iter__(ds: Any) -> Any:
            it = original(ds)
            if hooks._ours() and not hooks._in_keras() and tf.executing_eagerly():
                info = hooks._dataset_info(ds)
                if info is not None:
                    info.iterations += 1
                    try:
                        it._loadprof_info = info
                        it._loadprof_batches = 0
                    except AttributeError:  # a future iterator with __slots__: waits still timed
                        pass
            return it

        return __iter__

    def _wrap_next(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self
        clock = self.clock
        process_time = time.process_time

        def __next__(it: Any) -> Any:
            if not hooks._ours() or hooks._in_keras():
                return original(it)
            if not tf.executing_eagerly():
                # Traced into a tf.function: the compiled next() cannot be timed.
                if hooks._stack():
                    hooks._graph_next_in_step = True
                return original(it)
            c0 = process_time()
            t0 = clock()
            try:
                batch = original(it)
            except StopIteration:
                hooks._end_of_pass(it)
                raise
            t1 = clock()
            cpu = process_time() - c0
            size = tfdata.leading_dim(batch)
            info = getattr(it, "_loadprof_info", None)
            if info is not None:
                it._loadprof_batches += 1
                if info.sample_nbytes is None:
                    first, nbytes = tfdata.batch_facts(batch)
                    if first:
                        info.sample_nbytes = nbytes // first
                        info.batch_size = info.batch_size or first
            hooks.timeline.batch_wait(t0, t1, cpu, size)
            return batch

        return __next__

    def _end_of_pass(self, it: Any) -> None:
        info = getattr(it, "_loadprof_info", None)
        batches = getattr(it, "_loadprof_batches", 0)
        if info is not None and info.dataset_length is None and batches and info.batch_size:
            info.dataset_length = batches * info.batch_size  # last batch may be partial: an estimate

    def _dataset_info(self, ds: Any, framework: str = "tf.data") -> LoaderInfo | None:
        entry = self._datasets.get(id(ds))
        if entry is not None and entry[0]() is ds:
            return entry[1]
        try:
            ref = weakref.ref(ds)
        except TypeError:
            return None
        facts = tfdata.inspect_dataset(ds)
        for problem in facts.problems:
            self._limit(problem)
        info = LoaderInfo(
            framework=framework,
            kind="tf.data pipeline",
            batch_size=facts.batch_size,
            dataset_length=facts.samples_per_epoch,
            dataset_type=" -> ".join(facts.transformations) or type(ds).__name__,
            transformations=list(facts.transformations),
            has_cache=facts.has_cache,
            has_prefetch=facts.has_prefetch,
            parallel_map=facts.parallel_map,
            file_based=facts.file_based,
            notes=list(facts.notes),
        )
        if facts.prefetch_injected:
            info.notes.append("prefetch_injected")
        if facts.file_based and facts.parallel_reads is False:
            info.notes.append("sequential_file_reads")
        if tfdata.many_small_files(facts):
            info.notes.append("many_small_files")
        self._datasets[id(ds)] = (ref, info)
        self.run.loaders.append(info)
        return info

    # -- steps -----------------------------------------------------------------
    def _wrap_function_call(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self
        clock = self.clock

        def __call__(fn: Any, *args: Any, **kwargs: Any) -> Any:
            if not hooks._ours():
                return original(fn, *args, **kwargs)
            stack = hooks._stack()
            outer = not stack and tf.executing_eagerly() and not hooks._in_keras()
            step = outer and (fn in hooks._step_functions or hooks._traced_step(fn))
            if step:
                # Like a forward pass: the loop has its batch (NOTE [ Input time without a DataLoader ]).
                hooks.timeline.forward_start(clock())
            stack.append(fn)
            try:
                out = original(fn, *args, **kwargs)
            finally:
                stack.pop()
            if outer and fn in hooks._step_functions:
                # (also the first call, recognised as a step while it was traced)
                hooks.timeline.optimizer_step(clock())
            return out

        return __call__

    def _traced_step(self, fn: Any) -> bool:
        """A ``tf.function`` traced before profiling began: is it a train step?

        Checked once per function: its traced graphs capture an optimizer's step
        counter (Keras 3 ``<optimizer>/iteration``, tf_keras ``<optimizer>/iter``, int64),
        which only an optimizer's ``apply`` updates.
        """
        try:
            if fn in self._checked_functions:
                return False
            self._checked_functions.add(fn)
            concrete = fn._list_all_concrete_functions()
        except (AttributeError, TypeError):
            return False
        for cf in concrete:
            for v in getattr(cf, "variables", ()):
                name = str(getattr(v, "name", ""))
                if name.rsplit("/", 1)[-1] in ("iteration:0", "iter:0") and v.dtype == tf.int64:
                    self._step_functions.add(fn)
                    return True
        return False

    def _wrap_apply(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self
        clock = self.clock

        def apply(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            if not hooks._ours() or getattr(hooks._local, "applying", False):
                return original(optimizer, *args, **kwargs)
            hooks._local.applying = True
            try:
                out = original(optimizer, *args, **kwargs)
            finally:
                hooks._local.applying = False
            if hooks._in_keras():
                return out  # fit's steps come from its callback
            hooks._check_amp(optimizer=optimizer)
            stack = hooks._stack()
            if stack:
                # Traced (or run eagerly) inside a tf.function: that function is a train step.
                hooks._step_functions.add(stack[0])
            elif tf.executing_eagerly():
                hooks.timeline.optimizer_step(clock())
            return out

        return apply

    def _patch_optimizer(self, module: ModuleType) -> None:
        base = getattr(module, "BaseOptimizer", None)
        if base is None or not hasattr(base, "apply"):
            self._limit("keras BaseOptimizer.apply not found: optimizer steps of custom loops not seen")
            return
        self._patch(base, "apply", self._wrap_apply)

    # -- Keras fit ---------------------------------------------------------------
    def _patch_model(self, module: ModuleType) -> None:
        model_cls = getattr(module, "Model", None)
        callbacks = _module("keras.src.callbacks.callback")
        base_cb = getattr(callbacks, "Callback", None)
        if model_cls is None or base_cb is None or not hasattr(model_cls, "fit"):
            self._limit("keras Model.fit not found: fit is not profiled")
            return
        backend = _module("keras.src.backend")
        name = getattr(backend, "backend", lambda: "?")()
        if name != "tensorflow":
            self._limit(f"keras runs on the {name} backend: fit is profiled only on the TensorFlow backend")
            return
        self._callback_cls = _callback_class(base_cb)
        self._patch(model_cls, "fit", self._wrap_fit)
        self._patch(model_cls, "__call__", self._wrap_model_call)
        for method in ("evaluate", "predict"):
            if hasattr(model_cls, method):
                self._patch(model_cls, method, self._wrap_keras_loop)

    def _wrap_model_call(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self
        clock = self.clock

        def __call__(model: Any, *args: Any, **kwargs: Any) -> Any:
            # An eager model call outside Keras's loops and outside any tf.function is a
            # forward pass of a custom loop: its start ends the loop's input time.
            if hooks._ours() and not hooks._in_keras() and not hooks._stack() and tf.executing_eagerly():
                hooks.timeline.forward_start(clock())
            return original(model, *args, **kwargs)

        return __call__

    def _enter_keras(self) -> None:
        self._local.keras = getattr(self._local, "keras", 0) + 1

    def _exit_keras(self) -> None:
        self._local.keras = max(0, getattr(self._local, "keras", 0) - 1)

    def _wrap_keras_loop(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self

        @functools.wraps(original)
        def loop(model: Any, *args: Any, **kwargs: Any) -> Any:
            if not hooks._ours():
                return original(model, *args, **kwargs)
            hooks._enter_keras()
            try:
                return original(model, *args, **kwargs)
            finally:
                hooks._exit_keras()

        return loop

    def _wrap_fit(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self
        try:
            signature: inspect.Signature | None = inspect.signature(original)
        except (TypeError, ValueError):
            signature = None

        @functools.wraps(original)
        def fit(model: Any, *args: Any, **kwargs: Any) -> Any:
            if not hooks._ours() or hooks._in_keras() or signature is None:
                return original(model, *args, **kwargs)
            try:
                bound = signature.bind(model, *args, **kwargs)
            except TypeError:
                return original(model, *args, **kwargs)  # Keras reports the bad call itself
            record = hooks._start_fit(model, bound.arguments)
            given = bound.arguments.get("callbacks")
            callback = hooks._callback_cls(hooks, record)
            if given is None:
                bound.arguments["callbacks"] = [callback]
            elif isinstance(given, (list, tuple)):
                bound.arguments["callbacks"] = [*given, callback]
            else:
                hooks._limit(f"fit(callbacks={type(given).__name__}): cannot add a callback; fit steps not timed")
            hooks._enter_keras()
            try:
                return original(*bound.args, **bound.kwargs)
            finally:
                hooks._exit_keras()
                hooks._restore_train_function(record)

        return fit

    def _start_fit(self, model: Any, arguments: dict[str, Any]) -> _FitRun:
        x, y = arguments.get("x"), arguments.get("y")
        batch_size = arguments.get("batch_size")
        record = _FitRun(model=model, x=x, y=y, batch_size=batch_size, info=None)
        if isinstance(x, tf.data.Dataset):
            record.dataset = x
            record.info = self._dataset_info(x)
            if record.info is not None:
                record.batch_size = record.info.batch_size
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
            self.run.loaders.append(record.info)
        else:
            record.info = LoaderInfo(framework="keras", kind=type(x).__name__,
                                     dataset_type=type(x).__module__ + "." + type(x).__qualname__)
            self.run.loaders.append(record.info)
            self._limit(
                f"model.fit on a {type(x).__name__}: steps are timed but input time is not measured "
                "(a generator or PyDataset cannot be re-read for the differential probe)"
            )
        self._check_amp(model=model)
        self._fits.append(record)
        return record

    def _fit_train_begin(self, record: _FitRun, params: dict[str, Any]) -> None:
        model = record.model
        fn = getattr(model, "train_function", None)
        if fn is None or getattr(fn, "_loadprof_timed", False):
            self._limit("model.train_function missing at on_train_begin: fit steps not timed")
            return
        record.original_fn = fn
        record.steps_per_execution = max(1, int(getattr(model, "steps_per_execution", 1) or 1))
        steps = params.get("steps") if params else None
        record.steps_per_epoch = int(steps) if steps else None
        hooks = self
        clock = self.clock

        def train_function(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            out = fn(*args, **kwargs)  # StopIteration (end of data) is no step
            hooks._fit_step(record, t0, clock())
            return out

        train_function._loadprof_timed = True  # type: ignore[attr-defined]
        model.train_function = train_function

    def _restore_train_function(self, record: _FitRun) -> None:
        model = record.model
        current = getattr(model, "train_function", None)
        if record.original_fn is not None and getattr(current, "_loadprof_timed", False):
            model.train_function = record.original_fn

    def _fit_epoch_begin(self, record: _FitRun) -> None:
        record.first_in_epoch = True
        if record.info is not None:
            record.info.iterations += 1

    def _fit_batch_begin(self, record: _FitRun, batch: int) -> None:
        record.begin_step = batch
        if record.first_in_epoch:
            # The epoch's first step starts here, not at the last step of the previous
            # epoch: validation and epoch-end callbacks in between are no step's.
            record.epoch_start = self.clock()
            record.first_in_epoch = False

    def _fit_step(self, record: _FitRun, t0: float, t1: float) -> None:
        k = record.steps_per_execution
        batches = k
        if record.steps_per_epoch:
            batches = max(1, min(k, record.steps_per_epoch - record.begin_step))
        n = self.timeline.count
        try:
            self.timeline.optimizer_step(t1)
        finally:
            if self.timeline.count > n:
                step = self.timeline.steps[-1]
                if record.epoch_start is not None:
                    step.start = min(step.end, record.epoch_start - self.timeline.t0)
                    record.epoch_start = None
                    record.epoch_firsts.add(len(record.calls))
                if record.batch_size:
                    step.batch_size = batches * record.batch_size
                record.calls.append((step, t1 - t0, batches))

    # -- facts at the end ------------------------------------------------------
    def _check_amp(self, model: Any = None, optimizer: Any = None) -> None:
        if self.run.amp_in_use:
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
            self.run.amp_in_use = True

    def _finish(self) -> None:
        keras = sys.modules.get("keras")
        if keras is not None and getattr(keras, "__version__", None):
            self.run.environment.frameworks["keras"] = str(keras.__version__)
        self._check_amp()
        if self._graph_next_in_step:
            self._limit(
                "a train step's tf.function calls next() on the iterator inside the graph: "
                "those input waits cannot be timed (iterate in Python, or use model.fit)"
            )
        for i, record in enumerate(self._fits):
            if record.calls:
                self._differential(record, "" if i == 0 else f"fit{i + 1}_")
        self._fits.clear()
        self._gpu_facts()

    def _gpu_facts(self) -> None:
        try:
            gpus = tf.config.list_physical_devices("GPU")
        except (RuntimeError, ValueError, tf.errors.OpError):
            return
        if not gpus or not self.timeline.steps:
            return
        self.run.environment.cuda_in_use = True
        for i in range(len(gpus)):
            try:
                peak = tf.config.experimental.get_memory_info(f"GPU:{i}").get("peak")
            except (RuntimeError, ValueError, tf.errors.OpError):
                continue
            if peak:
                self.run.probes[f"tf_gpu{i}_peak_reserved_bytes"] = float(peak)
                known = [g for g in self.run.environment.gpus if g.index == i]
                if known:
                    self.run.probes[f"tf_gpu{i}_total_bytes"] = float(known[0].memory_total)

    # -- the differential probe (NOTE [ Input time under Keras fit: the differential method ]) --
    def _differential(self, record: _FitRun, prefix: str) -> None:
        wall = sum(seconds for _, seconds, _ in record.calls)
        budget = min(PROBE_MAX_S, max(PROBE_MIN_S, PROBE_SHARE * wall))
        batch: Any = None
        cores: float | None = None
        probes = self.run.probes
        source = record.dataset
        if source is None and record.arrays:
            source = self._array_dataset(record)
        if source is not None:
            try:
                pipe = tfdata.probe_pipeline(source, budget, clock=self.clock)
            except (tf.errors.OpError, RuntimeError, TypeError, ValueError) as exc:
                self._limit(f"pipeline-alone probe failed ({type(exc).__name__}: {str(exc)[:120]})")
                return
            batch = pipe.batch
            probes[prefix + "pipeline_first_batch_s"] = pipe.first_batch_seconds
            if pipe.batch_seconds:
                probes[prefix + "pipeline_batch_s"] = pipe.batch_seconds
                probes[prefix + "pipeline_batches_per_s"] = 1.0 / pipe.batch_seconds
                probes[prefix + "pipeline_batches_timed"] = float(pipe.batches)
                cores = pipe.cpu_cores
                if cores is not None:
                    probes[prefix + "pipeline_cpu_cores"] = cores
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
            self._limit("model.fit input time not measured: no batch for the model-alone probe")
            return
        try:
            per_call, timed = _probe_model(record, batch, budget, self.clock)
        except _ProbeSkipped as exc:
            self._limit(f"model-alone probe skipped: {exc}")
            return
        except (tf.errors.OpError, RuntimeError, TypeError, ValueError, AttributeError) as exc:
            self._limit(f"model-alone probe failed ({type(exc).__name__}: {str(exc)[:120]})")
            return
        k = record.steps_per_execution
        per_batch = per_call / k
        probes[prefix + "model_batch_s"] = per_batch
        probes[prefix + "model_batches_per_s"] = 1.0 / per_batch if per_batch > 0 else 0.0
        probes[prefix + "model_calls_timed"] = float(timed)
        in_fit = [seconds / batches for _, seconds, batches in record.calls]
        probes[prefix + "fit_batch_s_median"] = statistics.median(in_fit)
        # The pipeline cannot hold a step up longer than it takes to make its batches
        # alone; a larger difference is something else (callbacks, threads sharing
        # the cores), not waiting for input.
        pipe_batch = probes.get(prefix + "pipeline_batch_s")
        pipe_first = probes.get(prefix + "pipeline_first_batch_s", 0.0)
        capped = 0
        for i, (step, seconds, batches) in enumerate(record.calls):
            wait = max(0.0, seconds - per_batch * batches)
            if pipe_batch is not None:
                cap = pipe_batch * batches
                if i in record.epoch_firsts:
                    cap += max(0.0, pipe_first - pipe_batch)
                if wait > cap:
                    wait = cap
                    capped += 1
            step.data_wait = min(wait, max(0.0, step.duration))
            step.data_wait_cpu = step.data_wait * (cores or 0.0)
        probes[prefix + "steps_wait_capped_by_pipeline"] = float(capped)
        self.timeline.methods.add("differential")

    def _array_dataset(self, record: _FitRun) -> Any:
        """The pipeline Keras's own array adapter builds for numpy inputs, over their first batches.

        ``ARRAY_PROBE_BATCHES`` batches at most: the per-batch cost of slicing is what
        is probed, and the adapter copies the arrays it is given into one tensor.
        """
        adapters = _module("keras.src.trainers.data_adapters")
        get = getattr(adapters, "get_data_adapter", None)
        if get is None:
            self._limit("keras data adapters not found: no pipeline for the differential probes")
            return None
        n = record.batch_size or 32
        head_n = n * ARRAY_PROBE_BATCHES
        try:
            head = tf.nest.map_structure(lambda a: a[:head_n], record.x)
            ys = tf.nest.map_structure(lambda a: a[:head_n], record.y) if record.y is not None else None
            return get(x=head, y=ys, batch_size=n, shuffle=True).get_tf_dataset()
        except (TypeError, ValueError, tf.errors.OpError) as exc:
            self._limit(f"no pipeline for the differential probes ({type(exc).__name__})")
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


def _probe_model(record: _FitRun, batch: Any, budget: float, clock: Callable[[], float]) -> tuple[float, int]:
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

    It overrides no ``on_*_batch_end``: Keras 3 dispatches batch-end callbacks on a
    thread when all of them are defaults, and profiling must not switch that off.
    """

    class LoadprofCallback(base):  # type: ignore[valid-type, misc]
        def __init__(self, hooks: TensorFlowHooks, record: _FitRun) -> None:
            super().__init__()
            self._loadprof = hooks
            self._record = record

        def on_train_begin(self, logs: Any = None) -> None:
            self._loadprof._fit_train_begin(self._record, dict(getattr(self, "params", None) or {}))

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self._loadprof._fit_epoch_begin(self._record)

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self._loadprof._fit_batch_begin(self._record, batch)

        def on_train_end(self, logs: Any = None) -> None:
            self._loadprof._restore_train_function(self._record)

    LoadprofCallback.__qualname__ = LoadprofCallback.__name__ = "LoadprofCallback"
    return LoadprofCallback
