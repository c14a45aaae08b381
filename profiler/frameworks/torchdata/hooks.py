"""torchdata.nodes hooks: the loop's wait at ``Loader``'s next, each node's time, the map functions.

Imported only once the user's code has imported ``torchdata.nodes`` (``instrument.FrameworkWatch``).
torchdata.nodes keeps no metrics of its own; what is hooked (through ``patch.Patches``:
NOTE [ One patcher ]), all restored by ``remove()``:
- ``Loader.__iter__``: the pipeline under its root is read on first sight (graph.py), before
  the original starts its threads, so that they find its nodes watched; epochs counted.
- ``LoaderIterator.__next__``: the loop's wait for each batch, and the process's CPU meanwhile
  (a pipeline's threads are the process's: what they did while the loop waited).
- ``BaseNode.__next__``: NOTE [ Node self time ].
- ``_InlineMapperIter.__init__`` and ``_ParallelMapperIter.__init__`` (private: checked at
  install, a limitation where they changed): a mapper's function, where it runs in this
  process (no workers, or ``method="thread"``), is handed over timed. A process mapper's is
  left as it is: it is pickled for its workers (spawn), and what they do is theirs; the host
  sampler reads their CPU as loader workers.

NOTE [ Node self time ]
Every watched node's ``next()`` is timed on the thread that calls it, and a call's self time
is its own less that of the watched calls it made on the same thread (a per-thread stack):
a ``Batcher``'s row is its batching, not its source's reads. A node that takes its items from
a queue another thread fills (``Prefetcher``, ``PinMemory``, a ``ParallelMapper``; graph.py's
``HANDOFF``) waits in its ``next()``: its time is kept on the stack, so its caller does not
count it as its own, and is no stage; the thread that fills the queue times the nodes it
calls. A map function is timed as a stage named by its mapper's class and the function
(``ParallelMapper: parse (train.py:12)``), wall and the calling thread's CPU, on whichever of
the mapper's threads runs it. Nodes of pipelines no ``Loader`` of this session iterated pass
through untimed.

NOTE [ Fork safety ] (as in frameworks/torch/hooks.py): a forked process mapper's workers
inherit the wrapped classes; every wrapper checks the pid that installed it and only calls
through in any other process.
"""

from __future__ import annotations

import math
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torchdata
import torchdata.nodes as tn
from torchdata.nodes import base_node as _base
from torchdata.nodes import loader as _loader
from torchdata.nodes import map as _map

from ...instrument import Limits, ThisProcess
from ...patch import Patches
from ...records import MAX_NOTED_ITERATIONS, LoaderInfo, Run, StageTime
from ...timeline import Timeline
from . import facts
from .children import ChildTimes, forks
from .graph import HANDOFF, MapNode, Pipeline, stage_name, walk
from .sizes import sample_nbytes


class _Watched:
    """A loader's pipeline as watched: its record, its nodes' stages, its mappers' functions."""

    def __init__(self, info: LoaderInfo, pipeline: Pipeline) -> None:
        self.info = info
        self.pipeline = pipeline
        self.map_stages: list[tuple[StageTime, MapNode]] = []


class NodesHooks:
    """Installs and removes the torchdata.nodes hooks for one profiling session."""

    framework = "torchdata"

    def __init__(self, timeline: Timeline, run: Run, clock: Callable[[], float] = time.perf_counter) -> None:
        self.limit = Limits(run, self.framework)  # first: what __init__ builds may report through it
        self.timeline = timeline
        self.run = run
        self.clock = clock
        self.pid = os.getpid()
        self.installed = False
        self._patches = Patches("torchdata hooks")
        self._lock = threading.Lock()
        self._local = threading.local()
        self._loaders: dict[int, tuple[Callable[[], Any], _Watched]] = {}
        #: id(node) -> (its weak reference, its stage; None: a handoff, kept on the stack only)
        self._nodes: dict[int, tuple[Callable[[], Any], StageTime | None]] = {}
        #: id(map function) -> (its weak reference or None, its stage)
        self._maps: dict[int, tuple[Callable[[], Any] | None, StageTime]] = {}
        #: id(map stage) -> the sum of its calls' squared times, for their spread
        self._squares: dict[int, float] = {}
        self._children = ChildTimes(self._squares)  # NOTE [ Map time in worker processes ]

    # -- install / remove -----------------------------------------------------
    def install(self) -> None:
        if self.installed:
            return
        self.installed = True
        self.run.environment.frameworks["torchdata"] = str(getattr(torchdata, "__version__", "?"))
        wrap = self._patches.wrap
        wrap(tn.Loader, "__iter__", self._wrap_iter)
        # before BaseNode's: the iterator's own next is the loop's wait, no node's stage
        wrap(_loader.LoaderIterator, "__next__", self._wrap_next)
        wrap(_base.BaseNode, "__next__", self._wrap_node_next)
        for name in ("_InlineMapperIter", "_ParallelMapperIter"):
            cls = getattr(_map, name, None)
            if cls is None or wrap(cls, "__init__", self._wrap_mapper_init) is None:
                self.limit(f"torchdata.nodes.map.{name} not found: its map functions not timed")

    def remove(self) -> None:
        if not self.installed:
            return
        self.installed = False
        self.pid = -1  # a wrapper left in a chain is inert from now on (NOTE [ One patcher ])
        for line in self._patches.restore():
            self.limit(line)
        for _, watched in list(self._loaders.values()):
            self._finish(watched)

    # -- the loader -----------------------------------------------------------
    def _watched(self, loader: Any) -> _Watched | None:
        entry = self._loaders.get(id(loader))
        if entry is not None and entry[0]() is loader:
            return entry[1]
        root = getattr(loader, "root", None)
        if not isinstance(root, _base.BaseNode):
            return None
        pipeline = walk(root, _base.BaseNode)
        info = LoaderInfo(
            framework=facts.FRAMEWORK, kind="Loader", batch_size=pipeline.batch_size,
            pin_memory=pipeline.pin_memory, prefetch_factor=pipeline.prefetch_factor,
            dataset_length=pipeline.length, dataset_type=pipeline.chain,
        )
        watched = _Watched(info, pipeline)
        self._watch_nodes(watched)
        self._main_mapper(watched)
        self._loaders[id(loader)] = (weakref.ref(loader), watched)
        self.run.loaders.append(info)
        return watched

    def _watch_nodes(self, watched: _Watched) -> None:
        """NOTE [ Node self time ]: a stage for each node and map function of the pipeline."""
        info = watched.info
        for order, node in enumerate(watched.pipeline.nodes):
            cls = type(node).__name__
            stage = None if cls in HANDOFF else StageTime(cls, stage_name(node), 0.0, None, 0, "", None, order)
            if stage is not None:
                info.stages.append(stage)
            self._nodes[id(node)] = (weakref.ref(node), stage)
        for m in watched.pipeline.maps:
            if m.fn is None:
                continue
            stage = StageTime(facts.MAPPER, m.name, 0.0, 0.0, 0, "", None, len(info.stages))
            info.stages.append(stage)
            try:
                ref: Callable[[], Any] | None = weakref.ref(m.fn)
            except TypeError:  # a callable that takes no weak reference: its id alone stands for it
                ref = None
            self._maps[id(m.fn)] = (ref, stage)
            watched.map_stages.append((stage, m))

    def _main_mapper(self, watched: _Watched) -> None:
        """The mapper the advice is about (facts.py): a process mapper, whose work is the one
        not timed here, else the one whose function took the most time, else the first from the loop."""
        maps = watched.pipeline.maps
        if not maps:
            return
        timed = {id(m): stage.seconds for stage, m in watched.map_stages}
        main = next((m for m in maps if m.workers and m.method == "process"), None)
        if main is None:
            main = max(maps, key=lambda m: timed.get(id(m), 0.0)) if any(timed.values()) else maps[0]
        info = watched.info
        info.num_workers = main.workers
        facts.set_note(info, facts.METHOD, main.method)
        facts.set_note(info, facts.IN_ORDER, main.in_order)
        facts.set_note(info, facts.MAP, main.name)
        facts.set_note(info, facts.CALLS, f"{main.calls_per_batch:g}")
        if main.max_concurrent is not None:
            facts.set_note(info, facts.MAX_CONCURRENT, main.max_concurrent)
        stage = next((s for s, m in watched.map_stages if m is main), None)
        if stage is not None and stage.calls >= 2 and stage.seconds > 0:
            mean = stage.seconds / stage.calls
            var = max(0.0, self._squares.get(id(stage), 0.0) / stage.calls - mean * mean)
            facts.set_note(info, facts.SPREAD, round(math.sqrt(var) / mean, 3))

    def _finish(self, watched: _Watched) -> None:
        self._children.collect()
        self._main_mapper(watched)
        info = watched.info
        info.stages[:] = [s for s in info.stages if s.calls]
        info.stage_seconds = sum(s.seconds for s in info.stages)

    # -- wrappers -------------------------------------------------------------
    def _wrap_iter(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self

        def __iter__(loader: Any) -> Any:
            if ThisProcess.pid != hooks.pid:
                return original(loader)
            t0 = hooks.clock()
            watched = hooks._watched(loader)  # before the original: its threads start in it
            it = original(loader)
            if watched is not None:
                info = watched.info
                info.iterations += 1
                if not torch.is_grad_enabled():
                    info.eval_iterations += 1
                try:
                    it._loadprof_info = info
                    it._loadprof_iter_at = t0
                except AttributeError:  # an iterator with __slots__: its waits still timed
                    pass
            return it

        return __iter__

    def _wrap_next(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self
        clock = self.clock
        process_time = time.process_time
        batch_wait = self.timeline.batch_wait
        eval_wait = self.timeline.eval_wait
        grad_enabled = torch.is_grad_enabled

        def __next__(it: Any) -> Any:
            if ThisProcess.pid != hooks.pid:
                return original(it)
            c0 = process_time()
            t0 = clock()
            batch = original(it)  # StopIteration passes through untimed: no batch was waited for
            t1 = clock()
            cpu = process_time() - c0
            info = getattr(it, "_loadprof_info", None)
            size = None
            if info is not None:
                info.stage_batches += 1
                size = info.batch_size
                started = getattr(it, "_loadprof_iter_at", None)
                if started is not None:
                    it._loadprof_iter_at = None
                    if len(info.first_batch_s) < MAX_NOTED_ITERATIONS:
                        info.first_batch_s.append(t1 - started)
                        if grad_enabled():
                            info.iteration_starts_s.append(t1 - hooks.timeline.t0)
                if info.sample_nbytes is None:
                    info.sample_nbytes = sample_nbytes(batch, info.batch_size)
            if grad_enabled():
                batch_wait(t0, t1, cpu, size)
            else:
                eval_wait(t0, t1)  # NOTE [ Evaluation batches ] in timeline.py
            return batch

        return __next__

    def _stack(self) -> list[list[float]]:
        stack: list[list[float]] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def _wrap_node_next(self, original: Callable[..., Any]) -> Callable[..., Any]:
        # On every item's path, on every thread of the pipeline: one dict lookup for a node
        # no loader of ours holds.
        hooks = self
        nodes = self._nodes
        clock = self.clock
        lock = self._lock
        main = threading.main_thread

        def __next__(node: Any) -> Any:
            entry = nodes.get(id(node))
            if entry is None or ThisProcess.pid != hooks.pid or entry[0]() is not node:
                return original(node)
            stage = entry[1]
            stack = hooks._stack()
            frame = [0.0]
            stack.append(frame)
            t0 = clock()
            try:
                return original(node)
            finally:
                spent = clock() - t0
                stack.pop()
                if stack:
                    stack[-1][0] += spent
                if stage is not None:
                    with lock:
                        stage.seconds += spent - frame[0]
                        stage.calls += 1
                        if not stage.where:
                            stage.where = "main" if threading.current_thread() is main() else "threads"

        return __next__

    def _wrap_mapper_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self

        def __init__(it: Any, *args: Any, **kwargs: Any) -> None:
            fn: Any = kwargs.get("map_fn")
            entry = hooks._maps.get(id(fn)) if fn is not None and ThisProcess.pid == hooks.pid else None
            if entry is not None and (entry[0] is None or entry[0]() is fn):
                method = kwargs.get("method", "thread")
                if method == "thread":
                    kwargs["map_fn"] = hooks._timed(fn, entry[1])
                elif method == "process" and forks(kwargs.get("mp_context")):
                    kwargs["map_fn"] = hooks._children.timed(fn, entry[1])
                elif method == "process":  # NOTE [ Map time in worker processes ] in children.py
                    hooks.limit(f"ParallelMapper({entry[1].name}): its worker processes are spawned, "
                                "so its map is not timed (their CPU is read by the host sampler)")
            original(it, *args, **kwargs)

        return __init__

    def _timed(self, fn: Callable[[Any], Any], stage: StageTime) -> Callable[[Any], Any]:
        """``fn`` timed into ``stage`` (NOTE [ Node self time ]); its result and errors are its own."""
        hooks = self
        clock = self.clock
        cpu_clock = time.thread_time
        lock = self._lock
        main = threading.main_thread
        squares = self._squares
        key = id(stage)

        def timed(item: Any) -> Any:
            if ThisProcess.pid != hooks.pid:
                return fn(item)
            stack = hooks._stack()
            frame = [0.0]
            stack.append(frame)
            c0 = cpu_clock()
            t0 = clock()
            try:
                return fn(item)
            finally:
                spent = clock() - t0
                cpu = cpu_clock() - c0
                stack.pop()
                if stack:
                    stack[-1][0] += spent
                with lock:
                    own = spent - frame[0]
                    stage.seconds += own
                    squares[key] = squares.get(key, 0.0) + own * own
                    stage.cpu = (stage.cpu or 0.0) + cpu
                    stage.calls += 1
                    if not stage.where:
                        stage.where = "main" if threading.current_thread() is main() else "threads"

        return timed
