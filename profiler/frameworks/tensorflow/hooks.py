"""TensorFlow and Keras 3 hooks: input waits, steps, ``model.fit``, the pipeline graph.

Imported only once the user's code has imported TensorFlow (``instrument.FrameworkWatch``).
The hooks' helpers in this folder and ``keras/``, one job each, among them:

  hooks.py       this: install/remove, tf.data iterators, tf.function and optimizer steps
  iterstop.py    an iterator's freeing at an epoch's end, timed
  keras/fit.py   Keras ``fit``/``evaluate``/``predict``: fit steps timed, what the probe needs
  probe.py       after the run: the differential probe of fit's input time
  tfdata.py      a pipeline's graph read (cache, prefetch, parallel map, files) and its speed alone
  stages.py      the Python functions a pipeline calls (py_function, from_generator), timed per call
  inside.py      the profiler window: every transformation's time from TensorFlow's own profiler
  facts.py       mixed precision in use, GPU peak memory

What is hooked (through ``patch.Patches``: NOTE [ One patcher ]), and how it is undone
(all restored by ``remove()``):
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
- ``script_ops.FuncRegistry.__call__``, through which tf.data calls a pipeline's
  Python functions: their stages (NOTE [ Timing tf.data's Python functions ] in
  tfstages.py).

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

NOTE [ Fork safety ] (as in frameworks/torch/hooks.py): every wrapper checks the pid
that installed it and only calls through in any other process (Keras
``PyDataset`` workers, ``multiprocessing``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from types import ModuleType
from typing import Any

import tensorflow as tf

from ...instrument import ImportWatch, Limits, ThisProcess
from ...patch import Patches
from ...records import AUTOTUNE_OFF_NOTE, MAX_NOTED_ITERATIONS, LoaderInfo, Run
from ...timeline import CPU_READ_ALL, CPU_READ_EVERY, Timeline
from ..keras.fit import FitRecord, KerasFit
from . import tfdata
from .facts import check_amp, gpu_facts
from .inside import Window
from .iterstop import IteratorStop
from .looptime import LoopTime
from .probe import measure_feed_input, measure_fit_input
from .rebuild import Builds
from .stages import TfStages
from .tfdata import optional_module
from .whatif import HOLD_STEP, LoopStep

#: the profiler window's states in which it counts batches (NOTE [ The profiler window ] in inside.py)
_WINDOW_ACTIVE = ("waiting", "running")


class TensorFlowHooks:
    """Installs and removes the TensorFlow / Keras hooks for one profiling session."""

    framework = "tensorflow"

    def __init__(self, timeline: Timeline, run: Run, clock: Callable[[], float] = time.perf_counter) -> None:
        self.limit = Limits(run, self.framework)  # first: what __init__ builds may report through it
        self.timeline = timeline
        self.run = run
        self.clock = clock
        self.pid = os.getpid()
        self.installed = False
        self._patches = Patches("tensorflow hooks")
        self._local = threading.local()
        #: Keras loops open on any thread: zero spares the batch path its thread-local lookup
        self._keras_depth = 0
        self._nexts = 0  # eager next() calls timed: NOTE [ Sampled thread CPU ] in timeline.py
        self._finder: ImportWatch | None = None
        self._pending: dict[str, Callable[[ModuleType], None]] = {}
        self._step_functions: weakref.WeakSet[Any] = weakref.WeakSet()
        self._checked_functions: weakref.WeakSet[Any] = weakref.WeakSet()
        self._datasets: dict[int, tuple[weakref.ref[Any], LoaderInfo]] = {}
        #: how each pipeline was built, for the what-if replays (whatif.py)
        self.builds = Builds()
        #: the fits measured, once the hooks are removed: what the replays run
        self.replayable: list[FitRecord] = []
        #: a custom loop's step as it was called on the batch it read (whatif.py)
        self.loop_step: LoopStep | None = None
        #: a custom loop's own time a step, outside its step calls and waits (whatif.py adds it)
        self.loop_time = LoopTime()
        self._last: tuple[Any, Any] | None = None  # (the pipeline, its batch) the loop read last
        self._steps_seen = 0
        self.keras = KerasFit(self)
        self.stages = TfStages(self.ours, clock)
        #: every transformation of one pipeline, from TensorFlow's profiler (NOTE [ The profiler window ])
        self.inside = Window(run, clock, timeline.t0)
        self._graph_next_in_step = False

    # -- install / remove -----------------------------------------------------
    def install(self) -> None:
        if self.installed:
            return
        self.installed = True
        self.run.environment.frameworks["tensorflow"] = str(getattr(tf, "__version__", "?"))
        self.patch(tf.data.Dataset, "__iter__", self._wrap_iter)
        iterator_ops = optional_module("tensorflow.python.data.ops.iterator_ops")
        owned = getattr(iterator_ops, "OwnedIterator", None)
        if owned is None:
            self.limit("tf.data iterator class not found: batch waits of custom loops not timed")
        else:
            self.patch(owned, "__next__", self._wrap_next)
            self.patch(owned, "get_next", self._wrap_next)
        function_cls = self._function_class()
        if function_cls is None:
            self.limit("tf.function class not found: steps of compiled train steps not seen")
        else:
            self.patch(function_cls, "__call__", self._wrap_function_call)
        self.builds.install(self.patch, tf.data.Dataset)  # NOTE [ Rebuilding a pipeline ] in rebuild.py
        problem = self.stages.install(self._patches, optional_module("tensorflow.python.ops.script_ops"))
        if problem:
            self.limit(problem)
        self.inside.install(self._patches)
        self._when_imported("keras.src.optimizers.base_optimizer", self._patch_optimizer)
        self._when_imported("keras.src.models.model", self.keras.patch_model)
        if self._pending:
            self._finder = ImportWatch(list(self._pending), self._on_module_loaded).install()

    def remove(self) -> None:
        if not self.installed:
            return
        self.installed = False
        self.inside.close()
        if self._finder is not None:
            self._finder.remove()
            self._finder = None
        for line in self._patches.restore():
            self.limit(line)
        self.keras.remove()
        self._finish()

    def patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        if self._patches.wrap(owner, name, make) is None:
            self.limit(f"{owner.__name__}.{name} not found: not hooked")

    @staticmethod
    def _function_class() -> Any:
        for path in ("tensorflow.python.eager.polymorphic_function.polymorphic_function",
                     "tensorflow.python.eager.def_function"):
            cls = getattr(optional_module(path), "Function", None)
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
    def stack(self) -> list[Any]:
        """The ``tf.function`` calls this thread is inside, outermost first."""
        stack: list[Any] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def in_keras(self) -> bool:
        """Inside Keras's own loops (fit, evaluate, predict) on this thread."""
        return getattr(self._local, "keras", 0) > 0

    def enter_keras(self) -> None:
        self._local.keras = getattr(self._local, "keras", 0) + 1
        self._keras_depth += 1

    def exit_keras(self) -> None:
        self._local.keras = max(0, getattr(self._local, "keras", 0) - 1)
        self._keras_depth = max(0, self._keras_depth - 1)

    def ours(self) -> bool:
        """Installed, and in the process that installed us (NOTE [ Fork safety ])."""
        return self.installed and ThisProcess.pid == self.pid

    # -- tf.data ---------------------------------------------------------------
    def _wrap_iter(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self

        def __iter__(ds: Any) -> Any:
            t0 = hooks.clock()
            it = original(ds)
            if hooks.ours() and not hooks.in_keras() and tf.executing_eagerly():
                info = hooks.dataset_info(ds)
                if info is not None:
                    info.iterations += 1
                    try:
                        it._loadprof_info = info
                        it._loadprof_batches = 0
                        it._loadprof_ds = ds
                        it._loadprof_t_iter = t0
                        hooks._time_stop(it, info)
                    except (AttributeError, TypeError):  # a future iterator with __slots__: waits still timed
                        pass
                hooks.loop_time.waited(hooks.clock() - t0)  # a pass's start: the pipeline's, not the loop's
            elif hooks.ours() and tf.executing_eagerly() and getattr(hooks._local, "keras", 0) == 1:
                record = hooks.keras.training  # fit's own epochs (its validation runs inside evaluate)
                if record is not None and record.info is not None and record.feed is None \
                        and (record.dataset is None or record.dataset is ds):
                    try:
                        hooks._time_stop(it, record.info, record)
                    except (AttributeError, TypeError):
                        pass
            return it

        return __iter__

    def _wrap_next(self, original: Callable[..., Any]) -> Callable[..., Any]:
        # On every batch's path, inside a step whose work has left the CPU's caches cold:
        # each lookup and call here costs several times what it does in a tight loop
        # (benchmarks/overhead.py --framework tensorflow), so locals, and few of them.
        hooks = self
        clock = self.clock
        process_time = time.process_time
        eager = tf.executing_eagerly
        batch_wait = self.timeline.batch_wait
        leading_dim = tfdata.leading_dim
        loop_time = self.loop_time
        inside = self.inside

        def __next__(it: Any) -> Any:
            if ThisProcess.pid != hooks.pid or not hooks.installed or (hooks._keras_depth and hooks.in_keras()):
                return original(it)
            if not eager():
                # Traced into a tf.function: the compiled next() cannot be timed.
                if hooks.stack():
                    hooks._graph_next_in_step = True
                return original(it)
            n = hooks._nexts
            hooks._nexts = n + 1
            # The process's CPU (the pipeline's threads are its own): NOTE [ Sampled thread CPU ] in timeline.py
            read = n < CPU_READ_ALL or not n % CPU_READ_EVERY
            c0 = process_time() if read else 0.0
            t0 = clock()
            try:
                batch = original(it)
            except StopIteration:
                loop_time.waited(clock() - t0)
                hooks._end_of_pass(it)
                raise
            t1 = clock()
            cpu = process_time() - c0 if read else None
            loop_time.waited(t1 - t0)
            info = getattr(it, "_loadprof_info", None)
            if info is not None:
                batches = it._loadprof_batches
                if not batches:
                    hooks._pass_started(it, info, t1)
                it._loadprof_batches = batches + 1
                info.stage_batches += 1  # what its Python functions' times are per
                if info.sample_nbytes is None:
                    first, nbytes = tfdata.batch_facts(batch)
                    if first:
                        info.sample_nbytes = nbytes // first
                        info.batch_size = info.batch_size or first
            batch_wait(t0, t1, cpu, leading_dim(batch))
            if info is not None and inside.state in _WINDOW_ACTIVE:  # after the wait: the window's start and stop are no part of it
                inside.on_batch(info, getattr(it, "_loadprof_ds", None))
            if hooks.loop_step is None:
                hooks._last = (getattr(it, "_loadprof_ds", None), batch)
            return batch

        return __next__

    def _time_stop(self, it: Any, info: LoaderInfo, fit: Any = None) -> None:
        """Time the iterator's freeing once the loop lets it go (NOTE [ An iterator's stop ]);
        ``fit``: the ``FitRecord`` whose epochs it serves, timed while it trains."""
        stop = IteratorStop(self.clock, self.timeline, self.ours, info, fit)
        weakref.finalize(it, stop.begin).atexit = False
        it._loadprof_stop = stop  # its last attribute: freed after the iterator's resource

    def _pass_started(self, it: Any, info: LoaderInfo, t1: float) -> None:
        """A custom loop's pass over the pipeline (an epoch) gave its first batch at ``t1``:
        from ``iter()`` to it, the iterator's build and its buffers' first fill, which a loop
        over one iterator pays once (the ``one_iterator`` advice: frameworks/tensorflow/advice.py)."""
        t_iter = getattr(it, "_loadprof_t_iter", None)
        if t_iter is None or len(info.first_batch_s) >= MAX_NOTED_ITERATIONS:
            return
        info.first_batch_s.append(t1 - t_iter)
        info.iteration_starts_s.append(t1 - self.timeline.t0)
        info.start_wait_s.append(t1 - t_iter)  # iter() is the loop's wait too (loop_time)
        info.start_batches = 1

    def _end_of_pass(self, it: Any) -> None:
        info = getattr(it, "_loadprof_info", None)
        batches = getattr(it, "_loadprof_batches", 0)
        if info is not None and info.dataset_length is None and batches and info.batch_size:
            info.dataset_length = batches * info.batch_size  # last batch may be partial: an estimate

    def dataset_info(self, ds: Any, framework: str = "tf.data") -> LoaderInfo | None:
        """The record of a tf.data pipeline (one per dataset object), made on first sight."""
        entry = self._datasets.get(id(ds))
        if entry is not None and entry[0]() is ds:
            return entry[1]
        try:
            ref = weakref.ref(ds)
        except TypeError:
            return None
        facts = tfdata.inspect_dataset(ds)
        for problem in facts.problems:
            self.limit(problem)
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
        if not facts.autotune:
            info.notes.append(AUTOTUNE_OFF_NOTE)
        if facts.file_based and facts.parallel_reads is False:
            info.notes.append("sequential_file_reads")
        if tfdata.many_small_files(facts):
            info.notes.append("many_small_files")
        self._datasets[id(ds)] = (ref, info)
        self.run.loaders.append(info)
        self.stages.watch(info, facts.python_functions)
        return info

    # -- steps -----------------------------------------------------------------
    def _wrap_function_call(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self
        clock = self.clock

        eager = tf.executing_eagerly
        steps = self._step_functions
        timeline = self.timeline
        loop_time = self.loop_time

        def __call__(fn: Any, *args: Any, **kwargs: Any) -> Any:
            if ThisProcess.pid != hooks.pid or not hooks.installed:
                return original(fn, *args, **kwargs)
            stack = hooks.stack()
            outer = not stack and eager() and not (hooks._keras_depth and hooks.in_keras())
            step = outer and (fn in steps or hooks._traced_step(fn))
            if step:
                # Like a forward pass: the loop has its batch (NOTE [ Input time without a DataLoader ]).
                t = clock()
                timeline.forward_start(t)
                loop_time.call_starts(t)
            stack.append(fn)
            try:
                out = original(fn, *args, **kwargs)
            finally:
                stack.pop()
            if step or (outer and fn in steps):
                # (also the first call, recognised as a step while it was traced)
                t = clock()
                timeline.optimizer_step(t)
                loop_time.call_ends(t)
                if hooks.loop_step is None:
                    hooks._hold_step(fn, args, kwargs)
            return out

        return __call__

    def _hold_step(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A custom loop's step, held for the replays once traced (after ``HOLD_STEP`` steps),
        where it was called on the batch the loop read, as read: ``step(x, y)`` or ``step(batch)``."""
        self._steps_seen += 1
        last, self._last = self._last, None
        if self._steps_seen < HOLD_STEP or last is None or last[0] is None or kwargs:
            return
        ds, batch = last
        if isinstance(batch, tuple) and len(args) == len(batch) and all(a is b for a, b in zip(args, batch, strict=True)):
            self.loop_step = LoopStep(fn, ds, unpack=True)
        elif len(args) == 1 and args[0] is batch:
            self.loop_step = LoopStep(fn, ds, unpack=False)

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
            if not hooks.ours() or getattr(hooks._local, "applying", False):
                return original(optimizer, *args, **kwargs)
            hooks._local.applying = True
            try:
                out = original(optimizer, *args, **kwargs)
            finally:
                hooks._local.applying = False
            if hooks.in_keras():
                return out  # fit's steps come from its callback
            check_amp(hooks.run, optimizer=optimizer)
            stack = hooks.stack()
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
            self.limit("keras BaseOptimizer.apply not found: optimizer steps of custom loops not seen")
            return
        self.patch(base, "apply", self._wrap_apply)

    # -- at the end: facts and the fit probes -------------------------------------------
    def _finish(self) -> None:
        keras = sys.modules.get("keras")
        if keras is not None and getattr(keras, "__version__", None):
            self.run.environment.frameworks["keras"] = str(keras.__version__)
        check_amp(self.run)
        if self._graph_next_in_step:
            self.limit(
                "a train step's tf.function calls next() on the iterator inside the graph: "
                "those input waits cannot be timed (iterate in Python, or use model.fit)"
            )
        for record in self.keras.fits:
            if record.info is not None and record.feed is None:  # a feed counts its own (keras/feed.py)
                record.info.stage_batches += sum(batches for _, _, batches, _ in record.calls)
        self.stages.finish()
        for i, record in enumerate(self.keras.fits):
            if record.calls:
                # a PyDataset or a generator: NOTE [ Waits of fit on a PyDataset or a generator ] in keras/feed.py
                fed = record.feed is not None
                found = (measure_feed_input if fed else measure_fit_input)(record, i + 1, self.clock)
                if found.probe is not None:
                    found.probe.fit_own_batch_s = record.own.per_step()  # read in the run (keras/fit.py)
                    self.run.fit_probes.append(found.probe)
                for line in found.limitations:
                    self.limit(line)
                if found.waits is not None:  # NOTE [ Waits measured after the run ] in timeline.py
                    self.timeline.measured_waits(found.waits, "handoff" if fed else "differential")
        pipelines = [(ref(), info) for ref, info in list(self._datasets.values())]
        pipelines += [(r.dataset, r.info) for r in self.keras.fits if r.info is not None and r.dataset is not None]
        repeats: dict[int, list[bool | None]] = {}
        for ds, info in pipelines:
            if ds is not None and info.items_repeat is None:
                repeats[id(info)] = self.builds.maps_repeat(ds)
                _note_randomness(info, repeats[id(info)])
        self.inside.finish(self.stages.by_token(), repeats)
        # held for the what-if replays after the run (whatif.py), which let them go
        self.replayable = [record for record in self.keras.fits if record.calls]
        self.keras.fits.clear()
        self.keras.feeds.clear()
        if self.timeline.count:
            gpu_facts(self.run)


def _note_randomness(info: LoaderInfo, maps: list[bool | None]) -> None:
    """What the maps' outputs twice for one element say: every map the same, the items
    repeat; the first map random, nothing comes before the randomness to cache or store."""
    if maps and all(maps):
        info.items_repeat = True
    elif maps and maps[0] is False:
        info.items_repeat = False
        info.notes.append("first_map_random")
