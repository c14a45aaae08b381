"""Ray Data hooks: the loop's wait at each batch of ``iter_batches`` / ``iter_torch_batches``,
the knobs of each ``map_batches`` call, and each operator's figures from Ray's own stats.

Imported only once the user's code has imported ``ray.data`` (``instrument.FrameworkWatch``).
What is wrapped (through ``patch.Patches``: NOTE [ One patcher ]), all restored by ``remove()``,
public methods only:
- ``Dataset.iter_batches`` / ``iter_torch_batches`` and ``DataIterator``'s (Ray Train's
  ``get_dataset_shard`` gives one): what they return is handed back wrapped; each batch's
  ``next()`` is the loop's wait. ``Dataset``'s call ``DataIterator``'s inside: only the
  outer call is watched.
- ``Dataset.map_batches``, ``map``, ``flat_map``, ``filter``: the call's function,
  ``batch_size``, ``concurrency``, ``num_cpus`` noted by the operator name Ray's stats give
  it (``MapBatches(fn)``), then the call goes on unchanged.

NOTE [ Ray Data's operators from its stats ]
Ray runs the pipeline in its own worker processes and keeps, per operator, its tasks'
wall and CPU time; ``Dataset.stats()`` (public) says them as text, which stats.py reads.
Nothing of Ray's execution is patched. The text is read when an iteration ends (its
last batch, a ``break`` that drops the iterator, or the session's end for one still
open), once per iteration: each iteration runs the pipeline again, and its figures are
added to the operator's row, over the batches that iteration gave the loop. A row's time
is summed over the operator's tasks, as loadprof's stages are over workers; the loop's
own wait is beside them (``Loading.wait_ms_per_batch``). The training process's CPU
during a wait is Ray's iterator threads (batching, formatting, collate) at most: the
operators run in Ray's worker processes, which the host sampler reads as the process's
descendants (Ray's own daemons among them), so the adapter is not ``threads``.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import ray
from ray.data import Dataset
from ray.data.iterator import DataIterator

from ...instrument import Limits, ThisProcess
from ...patch import Patches
from ...records import MAX_NOTED_ITERATIONS, LoaderInfo, Run, StageTime
from ...timeline import Timeline
from ..torchdata.sizes import sample_nbytes
from . import facts
from .stats import parse

ITERS = ("iter_batches", "iter_torch_batches")


def udf_name(fn: Any) -> str:
    """A function's name as Ray names its operator (``MapBatches(name)``)."""
    if isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.ismethod(fn):
        return f"{type(fn.__self__).__name__}.{fn.__name__}"
    name = getattr(fn, "__name__", None)
    return name if isinstance(name, str) else type(fn).__name__


def _most(concurrency: Any) -> int | None:
    """The most tasks or actors a ``concurrency`` allows: n, or the max of (min, max[, initial])."""
    if isinstance(concurrency, int) and concurrency > 0:
        return concurrency
    if isinstance(concurrency, tuple) and len(concurrency) >= 2 and isinstance(concurrency[1], int):
        return concurrency[1]
    return None


class _Call:
    """One map call's knobs."""

    def __init__(self, fn: str, batch_size: Any, concurrency: int | None, num_cpus: Any, actors: bool) -> None:
        self.fn = fn
        self.batch_size = batch_size if isinstance(batch_size, int) else None
        self.concurrency = concurrency
        self.num_cpus = float(num_cpus) if isinstance(num_cpus, (int, float)) and num_cpus > 0 else None
        self.actors = actors


class _Watched:
    """One loader: a dataset (or iterator) read through one method, and its operators'
    figures over the iterations whose stats were read."""

    def __init__(self, info: LoaderInfo, ref: Callable[[], Any]) -> None:
        self.info = info
        self.ref = ref  # its source: a weak reference where Ray's object takes one
        #: operator name -> [wall, cpu, tasks], in the order Ray lists them
        self.totals: dict[str, list[float]] = {}
        self.batches = 0
        #: the method's keyword arguments as the script last called it, for the replays
        #: (None: it passed some by position, which a replay does not guess)
        self.kwargs: dict[str, Any] | None = None


class _Iteration:
    """One iteration's state: its batches, whether its stats were read."""

    def __init__(self, watched: _Watched, source: Any, started: float) -> None:
        self.watched = watched
        self.source = source
        self.started: float | None = started
        torch = sys.modules.get("torch")
        self.training = torch is None or torch.is_grad_enabled()
        self.batches = 0
        self.ended = False


class RayDataHooks:
    """Installs and removes the Ray Data hooks for one profiling session."""

    framework = "ray.data"

    def __init__(self, timeline: Timeline, run: Run, clock: Callable[[], float] = time.perf_counter) -> None:
        self.limit = Limits(run, self.framework)  # first: what __init__ builds may report through it
        self.timeline = timeline
        self.run = run
        self.clock = clock
        self.pid = ThisProcess.pid
        self.installed = False
        self._patches = Patches("ray.data hooks")
        self._lock = threading.Lock()
        self._local = threading.local()
        #: (id(source), method) -> its loader
        self._loaders: dict[tuple[int, str], _Watched] = {}
        #: operator name -> the knobs of the latest call that made it
        self._calls: dict[str, _Call] = {}
        self._open: weakref.WeakSet[_Iterator] = weakref.WeakSet()
        self._cpus: float | None = None
        #: the latest training iteration's (source, method, loader): the what-if replays read it again
        self._training: _Watched | None = None
        self._at_end: Callable[[], object] | None = None  # at_iteration_end's

    # -- install / remove -----------------------------------------------------
    def install(self) -> None:
        if self.installed:
            return
        self.installed = True
        self.pid = ThisProcess.pid
        self.run.environment.frameworks["ray"] = str(getattr(ray, "__version__", "?"))
        wrap = self._patches.wrap
        for method, op in facts.MAPS.items():
            if wrap(Dataset, method, self._wrap_map(op)) is None:
                self.limit(f"Dataset.{method} not found: its operators' knobs not read")
        for owner in (Dataset, DataIterator):
            for method in ITERS:
                if wrap(owner, method, self._wrap_iter(f"{owner.__name__}.{method}")) is None:
                    self.limit(f"{owner.__name__}.{method} not found: the loop's waits in it not timed")

    def remove(self) -> None:
        if not self.installed:
            return
        for it in list(self._open):
            self._ended(it.iteration)  # NOTE [ Ray Data's operators from its stats ]: still open
        self.installed = False
        for line in self._patches.restore():
            self.limit(line)

    # -- wrappers -------------------------------------------------------------
    def _wrap_map(self, op: str) -> Callable[[Any], Any]:
        hooks = self

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            signature = inspect.signature(original)

            @functools.wraps(original)
            def call(ds: Any, *args: Any, **kwargs: Any) -> Any:
                if ThisProcess.pid == hooks.pid and hooks.installed:
                    try:
                        bound = signature.bind(ds, *args, **kwargs).arguments
                    except TypeError:
                        bound = {}  # Ray itself says what is wrong with the call
                    fn = bound.get("fn")
                    if fn is not None:
                        hooks._calls[f"{op}({udf_name(fn)})"] = _Call(
                            udf_name(fn), bound.get("batch_size"), _most(bound.get("concurrency")),
                            bound.get("num_cpus"), inspect.isclass(fn))
                return original(ds, *args, **kwargs)

            return call

        return make

    def _wrap_iter(self, label: str) -> Callable[[Any], Any]:
        hooks = self

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            params = inspect.signature(original).parameters
            defaults = {k: params[k].default for k in ("batch_size", "prefetch_batches") if k in params}

            @functools.wraps(original)
            def call(source: Any, *args: Any, **kwargs: Any) -> Any:
                local = hooks._local
                if ThisProcess.pid != hooks.pid or not hooks.installed or getattr(local, "inside", False):
                    return original(source, *args, **kwargs)
                local.inside = True
                try:
                    iterable = original(source, *args, **kwargs)
                finally:
                    local.inside = False
                watched = hooks._watched(source, label, {**defaults, **kwargs})
                watched.kwargs = None if args else dict(kwargs)
                return _Iterable(iterable, hooks, watched, source)

            return call

        return make

    # -- the loader -----------------------------------------------------------
    def _watched(self, source: Any, label: str, kwargs: dict[str, Any]) -> _Watched:
        key = (id(source), label)
        with self._lock:
            found = self._loaders.get(key)
            if found is not None and found.ref() is source:
                watched = found
            else:
                size = kwargs.get("batch_size")
                info = LoaderInfo(framework=facts.FRAMEWORK, kind=label, iterable=True,
                                  batch_size=size if isinstance(size, int) else None,
                                  dataset_type=type(source).__name__)
                try:
                    ref: Callable[[], Any] = weakref.ref(source)
                except TypeError:
                    ref = lambda: source  # noqa: E731  held while the session lasts
                watched = self._loaders[key] = _Watched(info, ref)
                self.run.loaders.append(info)
            prefetch = kwargs.get("prefetch_batches")
            if isinstance(prefetch, int):
                facts.set_note(watched.info, facts.PREFETCH, prefetch)
            facts.set_note(watched.info, facts.METHOD, label.rsplit(".", 1)[-1])
        return watched

    def _started(self, it: _Iteration) -> None:
        info = it.watched.info
        info.iterations += 1
        if not it.training:
            info.eval_iterations += 1
        else:
            self._training = it.watched

    def replay_source(self) -> Any:
        """The latest training iteration's loader, to be read again by the what-if replays
        (NOTE [ Ray Data read again ] in replay.py; its ``unsafe`` says why not where its
        dataset is gone); None where there was none."""
        watched = self._training
        if watched is None:
            return None
        from .replay import RaySource

        return RaySource(self, watched.ref(), watched.info.kind.rsplit(".", 1)[-1], watched.kwargs)

    def at_iteration_end(self, call: Callable[[], object]) -> None:
        """``call`` once, when a training iteration's last batch was taken (its ``next()``
        ending it), between that step and the next."""
        self._at_end = call

    def _batch(self, it: _Iteration, batch: Any, t0: float, t1: float, cpu: float) -> None:
        info = it.watched.info
        it.batches += 1
        torch = sys.modules.get("torch")
        training = torch is None or torch.is_grad_enabled()
        if it.started is not None:
            if len(info.first_batch_s) < MAX_NOTED_ITERATIONS:
                info.first_batch_s.append(t1 - it.started)
                if training:
                    info.iteration_starts_s.append(t1 - self.timeline.t0)
            it.started = None
            if self._cpus is None:
                self._cpus = self._cluster_cpus()
            if self._cpus:
                facts.set_note(info, facts.CLUSTER_CPUS, self._cpus)
        if info.sample_nbytes is None:
            info.sample_nbytes = sample_nbytes(batch, info.batch_size)
        if training:
            self.timeline.batch_wait(t0, t1, cpu, info.batch_size)
        else:
            self.timeline.eval_wait(t0, t1)  # NOTE [ Evaluation batches ] in timeline.py

    def _cluster_cpus(self) -> float | None:
        """The CPUs the Ray cluster was given (``ray.init(num_cpus=...)``), read once, after the
        first batch: by then the pipeline has started Ray."""
        try:
            cpus = ray.cluster_resources().get("CPU") if ray.is_initialized() else None
        except Exception as exc:  # Ray's own errors: its GCS unreachable, shut down meanwhile
            self.limit(f"the cluster's CPUs not read ({type(exc).__name__}: {exc})")
            return None
        return float(cpus) if isinstance(cpus, (int, float)) and cpus > 0 else None

    def _ended(self, it: _Iteration) -> None:
        """NOTE [ Ray Data's operators from its stats ]: this iteration's figures added."""
        with self._lock:
            if it.ended or not self.installed or ThisProcess.pid != self.pid:
                return
            it.ended = True
        if not it.batches:
            return
        try:
            text = it.source.stats()
        except Exception as exc:  # Ray's own errors: an execution torn down, a split's coordinator gone
            self.limit(f"the operators' figures not read: stats() raised {type(exc).__name__}: {exc}")
            return
        operators, why = parse(text)
        if why:
            self.limit(f"the operators' figures not read: {why}")
            return
        with self._lock:
            watched = it.watched
            for op in operators:
                row = watched.totals.setdefault(op.name, [0.0, 0.0, 0.0])
                row[0] += op.wall or 0.0
                row[1] += op.cpu or 0.0
                row[2] += op.tasks or 0
            watched.batches += it.batches
            self._rows(watched)

    def _knobs(self, name: str) -> _Call | None:
        """The call that made an operator; a fused one (``ReadRange->MapBatches(fn)``) by its last mapped part."""
        return next((self._calls[part] for part in reversed(name.split("->")) if part in self._calls), None)

    def _rows(self, watched: _Watched) -> None:
        """The loader's stage rows, its slowest operator and what it can run at once (facts.py)."""
        info = watched.info
        cpus = facts.cluster_cpus(info)
        stages: list[StageTime] = []
        slowest: tuple[float, StageTime, _Call | None, int] | None = None
        for order, (name, (wall, cpu, tasks)) in enumerate(watched.totals.items()):
            call = self._knobs(name)
            where = "ray actors" if call is not None and call.actors else "ray tasks"
            stage = StageTime(facts.OPERATOR, name, wall, cpu, int(tasks), where, None, order)
            stages.append(stage)
            at_once = facts.slots(cpus, (call.num_cpus if call else None) or facts.DEFAULT_NUM_CPUS,
                                  call.concurrency if call else None)
            if slowest is None or wall / at_once > slowest[0]:
                slowest = (wall / at_once, stage, call, at_once)
        info.stages[:] = stages
        info.stage_batches = watched.batches
        info.stage_seconds = sum(s.seconds for s in stages)
        info.stage_source = facts.SOURCE
        if slowest is None:
            return
        _, stage, call, at_once = slowest
        stage.blocks = True
        info.num_workers = at_once
        facts.set_note(info, facts.SLOWEST, stage.name)
        for key, value in ((facts.FN, call.fn if call else None), (facts.BATCH, call.batch_size if call else None),
                           (facts.CONCURRENCY, call.concurrency if call else None),
                           (facts.NUM_CPUS, call.num_cpus if call else None),
                           (facts.ACTORS, call.actors if call else None)):
            facts.set_note(info, key, value)


class _Iterable:
    """What ``iter_batches`` returned, iterated as it is: each ``iter()`` an iteration."""

    def __init__(self, inner: Any, hooks: RayDataHooks, watched: _Watched, source: Any) -> None:
        self._inner = inner
        self._hooks = hooks
        self._watched = watched
        self._source = source

    def __iter__(self) -> Any:
        hooks = self._hooks
        if ThisProcess.pid != hooks.pid or not hooks.installed:
            return iter(self._inner)
        started = hooks.clock()
        iteration = _Iteration(self._watched, self._source, started)
        it = _Iterator(iter(self._inner), hooks, iteration)
        hooks._started(iteration)
        hooks._open.add(it)
        return it

    def __getattr__(self, name: str) -> Any:
        return _delegate(self, name)


class _Iterator:
    """Ray's batch generator, each ``next()`` timed as the loop's wait."""

    def __init__(self, inner: Any, hooks: RayDataHooks, iteration: _Iteration) -> None:
        self._inner = inner
        self._hooks = hooks
        self.iteration = iteration

    def __iter__(self) -> _Iterator:
        return self

    def __next__(self) -> Any:
        hooks = self._hooks
        if ThisProcess.pid != hooks.pid or not hooks.installed:
            return next(self._inner)
        c0 = time.process_time()
        t0 = hooks.clock()
        try:
            batch = next(self._inner)
        except StopIteration:
            hooks._ended(self.iteration)
            call, hooks._at_end = hooks._at_end, None
            if call is not None and self.iteration.training:
                try:
                    call()  # the what-if replays (NOTE [ Ray Data read again ] in replay.py)
                except Exception as exc:  # NOTE [ Never break the run ]
                    hooks.limit(f"the what-if replays failed ({type(exc).__name__}: {exc})")
            elif call is not None:
                hooks._at_end = call  # an evaluation's end: the next training one's
            raise
        t1 = hooks.clock()
        hooks._batch(self.iteration, batch, t0, t1, time.process_time() - c0)
        return batch

    def close(self) -> None:
        self._hooks._ended(self.iteration)
        close = getattr(self._inner, "close", None)
        if close is not None:
            close()

    def __getattr__(self, name: str) -> Any:
        return _delegate(self, name)

    def __del__(self) -> None:
        # a loop that stops early drops its iterator: NOTE [ Ray Data's operators from its stats ]
        try:
            self._hooks._ended(self.iteration)
        except Exception:  # noqa: S110 never raise from a finaliser, at exit least of all
            pass


def _delegate(wrapper: Any, name: str) -> Any:
    """Ray's object's attribute, for what the wrapper does not define (none while half made)."""
    inner = wrapper.__dict__.get("_inner")
    if inner is None:
        raise AttributeError(name)
    return getattr(inner, name)
