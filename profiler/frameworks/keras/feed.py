"""A ``keras.utils.PyDataset`` or a Python generator under ``fit``: its batches timed where
they are made and where ``fit`` takes them, without reading them again. Imported by fit.py.

NOTE [ Waits of fit on a PyDataset or a generator ]
On the TensorFlow backend Keras hands a PyDataset (``PyDatasetAdapter``) or a generator
(``GeneratorDataAdapter``) to ``fit`` as ``tf.data.Dataset.from_generator``: tf.data calls a
Python generator (the adapter's ``_get_iterator()``, or its ``generator()``) on its own
thread, a new one for each iterator (each epoch, unless ``steps_per_epoch`` keeps one), and
hands its batches in order to the compiled train function, through a prefetch buffer (the
enqueuer's queue, where the PyDataset has workers). That generator is handed over wrapped
(``stream``): each batch's hand-over time, and the process's CPU clock then, are kept in
order. Each ``train_function`` call's start and the CPU clock then are timed (fit.py). A call
cannot compute before its batch is handed over, and a batch handed over before the call
began was waiting in the buffer: the call's wait is the time from its start to its batch's
hand-over (none where the batch came first), at most the call's time, and the process's
CPU meanwhile is the wait's CPU, as for a tf.data iterator's ``next()``.
Which stream a call reads: a stream starts when its first batch is asked for, and an
iterator is made between calls, so the calls ended before a stream began took theirs from
older streams, and its batches go, in order, to the calls after. What an older stream made
that no call took (its prefetch, a peek to build the model) is dropped with it.
With ``steps_per_execution`` k > 1 a call takes k batches and computes each as it comes: its
wait is the time its last batch came after the call began, less the compute of the k - 1
before it at the rate it computed the last (the time after the last came).

The user's code is timed where it runs: a PyDataset's ``__getitem__`` (wrapped on its class,
timed for the instances given to ``fit``, on tf.data's thread, the enqueuer's thread
pool, or in the enqueuer's worker processes (forked or spawned), whose figures come back through a pipe:
NOTE [ A PyDataset's batches timed in its worker processes ] in poolstages.py), a
generator's ``next()`` (Keras's peek at its first batches included).
"""

from __future__ import annotations

import collections
import os
import threading
import time
import weakref
from array import array
from collections.abc import Callable, Iterator
from typing import Any

from ...callables import callable_name
from ...instrument import ThisProcess
from ...records import LoaderInfo, StageTime
from ..tensorflow.tfdata import batch_facts
from .poolstages import Pools, PoolTimes, worker_for
from .pydataset import facts


class _Stream:
    """One generator tf.data called: its batches' hand-over (time, process CPU), not yet taken."""

    def __init__(self, base: int, start: float) -> None:
        self.base = base  # batches the calls ended before it began took
        self.start = start
        self.arrivals: collections.deque[tuple[float, float]] = collections.deque()


class Feed:
    """One ``fit``'s PyDataset or generator: its streams, the user's code timed, each call's wait."""

    def __init__(self, source: Any, info: LoaderInfo, stage: StageTime, limit: Callable[[str], None],
                 num_batches: int | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.ref = weakref.ref(source)
        self.limit = limit
        self.num_batches = num_batches
        self.info = info
        self.stage = stage
        self.clock = clock
        self.pid = ThisProcess.pid
        self.adapter: Any = None  # weak reference to the adapter that feeds training (the first to stream)
        self.consumed = 0  # batches the ended train_function calls took
        self.waits = array("f")  # per call fit.py recorded, in FitCalls' order
        self.cpus = array("f")
        self.unmatched = 0  # calls no stream's batches could be matched to
        self.batch: Any = None  # the first batch handed over: the model-alone probe's (probe.py)
        self.pool = PoolTimes()  # __getitem__ timed in the enqueuer's worker processes
        self._streams: list[_Stream] = []
        self._lock = threading.Lock()
        self._on_main = 0
        self._squares = 0.0

    # -- the producer side (tf.data's thread) ----------------------------------------------
    def claims(self, adapter: Any) -> bool:
        """Whether ``adapter`` is the one that feeds training: the first to stream (a validation
        pass over the same object comes later, through another adapter)."""
        with self._lock:
            if self.adapter is None:
                self.adapter = weakref.ref(adapter)
            return self.adapter() is adapter

    def stream(self, source: Iterator[Any]) -> Iterator[Any]:
        """``source``'s batches as they are, their hand-over times kept (see the NOTE)."""
        clock, process_time = self.clock, time.process_time
        s = None
        try:
            while True:
                if s is None:
                    s = _Stream(self.consumed, clock())
                    with self._lock:
                        self._streams.append(s)
                try:
                    batch = next(source)
                except StopIteration:
                    return
                s.arrivals.append((clock(), process_time()))
                if self.batch is None:
                    self.batch = batch
                    self._first_batch(batch)
                yield batch
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()  # as the adapter's own generator is when tf.data lets it go

    def _first_batch(self, batch: Any) -> None:
        size, nbytes = batch_facts(batch)
        if size:
            self.info.batch_size = size
            self.info.sample_nbytes = nbytes // size

    def timed(self, call: Callable[[], Any]) -> Any:
        """``call()`` (the user's code making one batch), its time added to the stage where it
        made one (a generator's end, an error: no batch, no row's time)."""
        clock, thread_time = self.clock, time.thread_time
        c0 = thread_time()
        t0 = clock()
        out = call()
        spent = clock() - t0
        cpu = thread_time() - c0
        with self._lock:
            stage = self.stage
            stage.seconds += spent
            stage.cpu = (stage.cpu or 0.0) + cpu
            stage.calls += 1
            self._squares += spent * spent
            self._on_main += threading.current_thread() is threading.main_thread()
        return out

    # -- the consumer side (the training thread, fit.py) ---------------------------------------
    def taken(self, t0: float, cpu0: float, t1: float, batches: int) -> tuple[float, float]:
        """One train_function call from ``t0`` to ``t1`` took ``batches`` batches; the process's
        CPU clock read ``cpu0`` at ``t0``. Its (wait, the wait's CPU seconds): see the NOTE. The
        caller keeps them (``waits``, ``cpus``) where the call was recorded as a step."""
        self.pool.maybe_drain(t1)
        c = self.consumed
        self.consumed = c + batches
        got = self._take(c, t1, batches)
        if got is None:
            self.unmatched += 1
            return 0.0, 0.0
        last, last_cpu = got
        if last <= t0:
            return 0.0, 0.0  # it was in the buffer
        after = max(0.0, t1 - last)  # the last batch's compute
        wait = min(t1 - t0, max(0.0, last - t0 - (batches - 1) * after))
        return wait, max(0.0, last_cpu - cpu0) * wait / (last - t0)

    def _take(self, consumed: int, t1: float, batches: int) -> tuple[float, float] | None:
        """The hand-over of the last of the batches a call ending at ``t1`` took, or None."""
        with self._lock:
            streams = self._streams
            pos = next((i for i in range(len(streams) - 1, -1, -1)
                        if streams[i].start < t1 and streams[i].base <= consumed), None)
            if pos is None:
                return None
            del streams[:pos]  # older streams: no call takes from them again
            s = streams[0]
        arrivals = s.arrivals
        if len(arrivals) < batches:
            arrivals.clear()
            return None
        for _ in range(batches - 1):
            arrivals.popleft()
        return arrivals.popleft()

    def finish(self) -> None:
        """The stage's place, and its spread, into the loader's record."""
        stage, info = self.stage, self.info
        if self.num_batches and info.batch_size:
            info.dataset_length = self.num_batches * info.batch_size  # the last batch may be short
        seconds, cpu, calls, squares = self.pool.take()
        if calls:
            stage.seconds += seconds
            stage.cpu = (stage.cpu or 0.0) + cpu
            stage.calls += calls
            self._squares += squares
        if self.pool.unread:
            self.limit(f"{self.pool.unread} pipe(s) from a PyDataset's worker processes sent what is not ours: "
                       "their __getitem__ figures after it are left out")
        if self.pool.opened and not calls:
            self.limit("a PyDataset's worker processes sent no __getitem__ figures (none found its copy of the "
                       "dataset, or none made a batch): the stage is the training process's calls")
        if not stage.calls:
            info.stages.clear()
            return
        if calls:
            stage.where = "workers"
        else:
            stage.where = "main" if self._on_main * 2 > stage.calls else "threads"
        info.stage_batches = stage.calls  # each call makes one batch
        info.stage_seconds = stage.seconds
        if stage.calls >= 2:
            mean = stage.seconds / stage.calls
            var = max(0.0, self._squares / stage.calls - mean * mean)
            facts.set_note(info, facts.SPREAD, round(var ** 0.5 / mean, 3) if mean > 0 else 0.0)


class Feeds:
    """The Feeds of the session's fits, by their source, and the wrappers that find them."""

    def __init__(self, clock: Callable[[], float], limit: Callable[[str], None]) -> None:
        self.clock = clock
        self._by_id: dict[int, Feed] = {}
        self.limit = limit
        #: the enqueuer's worker processes, for the feeds' datasets (poolstages.py)
        self.pools = Pools(self._pool_times, limit)
        self._local = threading.local()
        #: PyDataset classes whose __getitem__ is wrapped -> what it was
        self.wrapped: dict[type, Any] = {}

    def add(self, source: Any, info: LoaderInfo, stage: StageTime, num_batches: int | None = None) -> Feed:
        feed = Feed(source, info, stage, self.limit, num_batches, self.clock)
        self._by_id[id(source)] = feed
        if not any(s is stage for s in info.stages):
            info.stages.append(stage)
        return feed

    def of(self, source: Any) -> Feed | None:
        feed = self._by_id.get(id(source))
        if feed is None or feed.ref() is not source or ThisProcess.pid != feed.pid:
            return None
        return feed

    def _pool_times(self, source: Any) -> PoolTimes | None:
        feed = self.of(source)
        return feed.pool if feed is not None else None

    def getitem_of(self, cls: type) -> Any:
        """``cls.__getitem__`` as the user wrote it (ours may be on it, or on a class it inherits from)."""
        for base in cls.__mro__:
            if base in self.wrapped:
                return self.wrapped[base]
            if "__getitem__" in vars(base):
                return vars(base)["__getitem__"]
        return None

    def clear(self) -> None:
        self._by_id.clear()

    # -- wrappers -----------------------------------------------------------------------------
    def wrap_getitem(self, original: Callable[..., Any]) -> Callable[..., Any]:
        feeds = self
        local = self._local

        def __getitem__(ds: Any, index: Any) -> Any:
            feed = feeds.of(ds)
            if feed is None:
                worker = worker_for(ds)  # in a pool's process of ours
                return original(ds, index) if worker is None else worker.call(original, ds, index)
            if getattr(local, "inside", False):
                return original(ds, index)  # a nested call is its caller's time
            local.inside = True
            try:
                return feed.timed(lambda: original(ds, index))
            finally:
                local.inside = False

        return __getitem__

    def wrap_get_iterator(self, original: Callable[..., Any]) -> Callable[..., Any]:
        feeds = self

        def _get_iterator(adapter: Any) -> Any:
            it = original(adapter)
            feed = feeds.of(getattr(adapter, "py_dataset", None))
            if feed is None or not feed.claims(adapter):
                return it
            return feed.stream(iter(it))

        return _get_iterator

    def wrap_generator_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        feeds = self

        def __init__(adapter: Any, generator: Any, *args: Any, **kwargs: Any) -> None:
            feed = feeds.of(generator)
            if feed is None or not feed.claims(adapter):
                original(adapter, generator, *args, **kwargs)
                return
            original(adapter, _Timed(generator, feed), *args, **kwargs)
            made = getattr(adapter, "generator", None)
            if callable(made):
                adapter.generator = lambda: feed.stream(iter(made()))

        return __init__


class _Timed:
    """A generator's batches as they are, each ``next()`` timed into its feed's stage."""

    def __init__(self, generator: Any, feed: Feed) -> None:
        self._generator = generator
        self._feed = feed

    def __iter__(self) -> _Timed:
        return self

    def __next__(self) -> Any:
        feed = self._feed
        if ThisProcess.pid != feed.pid:
            return next(self._generator)
        return feed.timed(lambda: next(self._generator))


def getitem_name(cls: type, fn: Any = None) -> str:
    """``MyBatches.__getitem__ (train.py:12)``, as the class defines (or inherits) it (``fn``:
    that function, where ours is on the class now)."""
    fn = fn if fn is not None else getattr(cls, "__getitem__", None)
    name = callable_name(fn) if fn is not None else f"{cls.__qualname__}.__getitem__"
    if not name.startswith(cls.__qualname__ + "."):
        name = f"{cls.__qualname__}: {name}"  # inherited: the class given to fit, then where it is written
    return name


def generator_name(generator: Any) -> str:
    """``batches (train.py:5)``: the generator function as written."""
    name = getattr(generator, "__qualname__", None) or type(generator).__qualname__
    code = getattr(generator, "gi_code", None)
    if code is None:
        return str(name)
    return f"{name} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"
