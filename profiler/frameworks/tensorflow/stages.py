"""The stages of a tf.data pipeline that Python can time: the Python functions it calls.

Imported by the TensorFlow hooks (``frameworks/tensorflow/hooks.py``) only.

NOTE [ Timing tf.data's Python functions ]
tf.data runs its transformations in TensorFlow's C++ runtime, on its own threads.
The only work that comes back to Python is the functions a pipeline calls back:
``tf.py_function``, ``tf.numpy_function``, ``tf.compat.v1.py_func``, and
``Dataset.from_generator`` (a ``numpy_function`` that calls ``next`` on the
user's generator). All of them reach Python through one object: the runtime
calls ``script_ops._py_funcs`` (a ``FuncRegistry``) with the op's ``token``.
So:
- When a dataset is first seen (``TensorFlowHooks.dataset_info``), the graph walk
  in tfdata.py lists the tokens of the Python-function ops in its functions
  (nested datasets' functions too). Each token becomes a ``StageTime`` on that
  dataset's ``LoaderInfo``, named after the callable the registry holds for it
  (``slow_read (data.py:12)``); tokens of one callable share one stage.
- ``FuncRegistry.__call__`` is wrapped at class level: a call whose token is
  watched is timed (wall clock, and the calling thread's CPU) into its stage;
  every other call (a ``py_function`` in a train step, an unseen dataset) passes
  straight through. Arguments, result and exceptions are the call's own.
- A dataset built before profiling began is covered: its tokens are in its graph.
- The time is the whole callback, the conversion of its arguments and results
  included: what the Python function costs the pipeline, GIL held.
- Per batch: the calls' total over the batches the training loop took from that
  dataset. Elements made ahead (prefetch buffers) when the loop stops early count
  in the total, not in the batches: a loop that stops after few batches reads high.
Not timed: graph transformations (a ``map`` of TensorFlow ops, ``interleave``'s
reads, ``batch``, ``shuffle``): they never leave C++ (TensorFlow's own profiler
traces them), and the report says so instead of a number.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ...callables import callable_name as _callable_name
from ...patch import Patches
from ...records import LoaderInfo, StageTime

#: ``StageTime.where`` for these stages: tf.data's own thread pool runs them.
WHERE = "tf.data threads"
#: The module whose helper functions make ``Dataset.from_generator`` elements.
_FROM_GENERATOR = "tensorflow.python.data.ops.from_generator_op"


def callable_name(fn: Any) -> str:
    """The name of the user's callable inside TensorFlow's wrappers (``callables.py``)."""
    return _callable_name(_unwrap(fn))


def _unwrap(fn: Any) -> Any:
    """The user's callable inside TensorFlow's wrappers (``EagerFunc``, autograph's
    ``do_not_convert``, which sets ``__wrapped__``)."""
    fn = getattr(fn, "_func", fn)  # EagerFunc (py_function)
    for _ in range(16):
        inner = getattr(fn, "__wrapped__", None)
        if inner is None or inner is fn:
            break
        fn = inner
    return fn


def stage_of(registered: Any) -> tuple[str, str] | None:
    """(kind, name) of the stage a registered Python function is; None for TensorFlow's
    own bookkeeping (``from_generator``'s per-iteration id and finalize functions)."""
    fn = _unwrap(registered)
    module = str(getattr(fn, "__module__", "") or "")
    if module.startswith("tensorflow."):
        if module != _FROM_GENERATOR or "generator_py_func" not in str(getattr(fn, "__qualname__", "")):
            return None
        generator = _generator_of(fn)
        return ("read", callable_name(generator) if generator is not None else "from_generator")
    return ("user", callable_name(fn))


def _generator_of(fn: Any) -> Any:
    """The user's generator callable held by ``from_generator``'s element function."""
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            held = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        generator = getattr(held, "_generator", None)
        if generator is not None:
            return generator
    return None


class TfStages:
    """The Python functions of the tf.data pipelines one session has seen, timed per call."""

    def __init__(self, ours: Callable[[], bool], clock: Callable[[], float] = time.perf_counter,
                 cpu_clock: Callable[[], float] = time.thread_time) -> None:
        self._ours = ours
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._lock = threading.Lock()
        #: token -> its stage (read by the wrapper on every call: a dict lookup)
        self._by_token: dict[str, StageTime] = {}
        self._loaders: list[LoaderInfo] = []
        self._registry: Any = None

    def install(self, patches: Patches, script_ops: Any) -> str | None:
        """Wrap ``FuncRegistry.__call__``; the reason where it cannot be (nothing is changed)."""
        registry = getattr(script_ops, "_py_funcs", None)
        cls = type(registry)
        if registry is None or not callable(getattr(registry, "get", None)) or "__call__" not in vars(cls):
            return "tf.data Python functions (py_function, from_generator) not timed: their registry was not found"
        self._registry = registry
        patches.wrap(cls, "__call__", self._wrap_call)
        return None

    def watch(self, info: LoaderInfo, tokens: list[str]) -> None:
        """Time the calls of the Python functions registered under ``tokens`` (from
        tfdata.inspect_dataset) into stages of ``info``; a token already watched for
        another dataset stays with that one."""
        if self._registry is None:
            return
        by_name = {(s.kind, s.name): s for s in info.stages}
        for order, token in enumerate(tokens):
            if token in self._by_token:
                continue
            registered = self._registry.get(token)
            found = stage_of(registered) if registered is not None else None
            if found is None:
                continue
            stage = by_name.get(found)
            if stage is None:
                stage = StageTime(found[0], found[1], 0.0, 0.0, 0, WHERE, None, order)
                by_name[found] = stage
                info.stages.append(stage)
            self._by_token[token] = stage
        if info.stages and not any(seen is info for seen in self._loaders):
            self._loaders.append(info)

    def by_token(self) -> dict[str, StageTime]:
        """Registry token -> the stage its calls are timed into."""
        return dict(self._by_token)

    def finish(self) -> None:
        """Drop the stages that were never called (a branch not taken)."""
        for info in self._loaders:
            info.stages[:] = [s for s in info.stages if s.calls]

    def _wrap_call(self, original: Callable[..., Any]) -> Callable[..., Any]:
        by_token = self._by_token
        ours = self._ours
        clock = self._clock
        cpu_clock = self._cpu_clock
        lock = self._lock

        # the rest of the call passed as it came: another TensorFlow's signature still runs
        def __call__(registry: Any, token: Any, *rest: Any, **kwargs: Any) -> Any:
            stage = by_token.get(token)
            if stage is None or not ours():
                return original(registry, token, *rest, **kwargs)
            c0 = cpu_clock()
            t0 = clock()
            try:
                return original(registry, token, *rest, **kwargs)
            finally:
                t1 = clock()
                c1 = cpu_clock()
                with lock:  # tf.data calls a parallel map's function from several threads
                    stage.seconds += t1 - t0
                    stage.cpu = (stage.cpu or 0.0) + (c1 - c0)
                    stage.calls += 1

        return __call__
