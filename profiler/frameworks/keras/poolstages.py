"""A PyDataset's ``__getitem__`` timed in the worker processes of Keras's pool
(``use_multiprocessing=True``), its figures sent back to the training process. Used by feed.py.

NOTE [ A PyDataset's batches timed in its worker processes ]
With ``use_multiprocessing=True`` Keras's ``OrderedEnqueuer`` makes a ``multiprocessing.Pool``
for each epoch, on its own thread (``_run``), through the function ``_get_executor_init``
returns; the pool's tasks, ``get_index(uid, i)``, call the PyDataset's ``__getitem__`` in the
pool's processes. Their figures come back through one pipe per pool (profiler/workerpipe.py):

- That pool function is wrapped (``Pools``): for a PyDataset a watched ``fit`` was given, where
  the pool forks, it opens a pipe and, on its thread and while the pool is made only,
  ``get_pool_class`` hands out a Pool whose initializer is wrapped (``PoolInit``: the write
  end, the dataset's identity, Keras's own initializer, which it then calls). The pool forks
  its processes in its constructor; the training process closes its write end right after,
  so a process the pool starts later in place of a dead one finds it closed and goes untimed.
- A forked process inherits the class's wrapped ``__getitem__`` and the dataset at the same
  address. A spawned or forkserver one (a script's ``set_start_method("spawn")``; Linux's
  default from Python 3.14) gets ``PoolInit`` pickled, the write end sent along by
  multiprocessing (``reduction.DupFd``), and its own copy of the dataset, unpickled by Keras's
  initializer into ``_SHARED_SEQUENCES``: ``PoolInit`` finds that copy by the enqueuer's
  ``uid`` after Keras's initializer ran and puts the timing ``__getitem__`` on its class, in
  that process only. There (``ThisProcess.pid`` is not the hooks'), a call on that dataset is timed by
  the process's ``_Worker``: its first ``TIME_FIRST`` calls and one in ``TIME_EVERY`` after, as
  torch's workers do (NOTE [ Timing a sample of the batches ] in torch/stages.py). Each timed
  call sends the process's cumulative figures (seconds, CPU, calls, squares) at once: Keras
  lets the pool go at the epoch's end and its processes may be terminated, running no exit
  handler, so no send waits for later.
- The training process drains the pipes at most every ``DRAIN_EVERY`` seconds on a
  ``train_function`` call and at the end, keeps each process's latest figures, and adds their
  sums to the ``__getitem__`` row it builds itself (Keras's peek at the first batches is made
  there): ``where`` is "workers". A pipe is let go once its processes are gone.
- A process started after the training process closed its write end (in place of a dead
  one) gets no pipe: under fork it finds the end closed, under spawn ``PoolInit`` is pickled
  without it, so the pool's own restart never fails on ours.
"""

from __future__ import annotations

import functools
import itertools
import multiprocessing
import os
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing import connection
from typing import Any

from ... import workerpipe
from ...instrument import ThisProcess
from ..torchdata.children import forks

#: Each pool process times its first TIME_FIRST calls, then one in TIME_EVERY (torch's figures,
#: NOTE [ Timing a sample of the batches ]): each timed call costs one write to the pipe.
TIME_FIRST = 8
TIME_EVERY = 16
#: Seconds between two drains of a feed's pipes in the training process (on a call).
DRAIN_EVERY = 0.2

Figures = tuple[float, float, int, float]  # seconds, CPU seconds, calls, squared seconds


# -- in a pool's process ---------------------------------------------------------------
class _Worker:
    """This pool process's timed calls on one dataset, sent as they are made."""

    def __init__(self, writer: workerpipe.Writer, key: int) -> None:
        self.writer = writer
        self.key = key  # id() of the dataset, the same in the forked process
        self.pid = ThisProcess.pid
        self.seen = 0
        self.seconds = self.cpu = self.squares = 0.0
        self.calls = 0
        self.inside = False

    def call(self, original: Callable[[Any, Any], Any], ds: Any, index: Any) -> Any:
        if self.inside:
            return original(ds, index)  # a nested call is its caller's time
        self.seen += 1
        if self.seen > TIME_FIRST and self.seen % TIME_EVERY:
            return original(ds, index)
        self.inside = True
        try:
            c0 = time.thread_time()
            t0 = time.perf_counter()
            out = original(ds, index)  # an error: no batch, no time
            spent = time.perf_counter() - t0
            cpu = time.thread_time() - c0
        finally:
            self.inside = False
        self.seconds += spent
        self.cpu += cpu
        self.calls += 1
        self.squares += spent * spent
        self.writer.write((("k", self.pid, self.seconds, self.cpu, self.calls, self.squares),))
        return out


_worker: _Worker | None = None


def worker_for(ds: Any) -> _Worker | None:
    """The timing of ``ds``'s calls in this process, where it is a pool's process of ours."""
    w = _worker
    if w is None or w.key != id(ds) or w.pid != ThisProcess.pid:
        return None
    return w


class PoolInit:
    """A pool's initializer while its processes are timed: starts the process's ``_Worker``,
    then calls the pool's own initializer; in a spawned process, then finds its copy of the
    dataset and times its class's ``__getitem__``."""

    def __init__(self, conn: connection.Connection, key: int, uid: Any = None) -> None:
        self.conn: connection.Connection | None = conn
        self.key = key
        self.uid = uid  # the enqueuer's key to its dataset in Keras's globals; None: forked
        self.parent = os.getpid()
        self.initializer: Callable[..., Any] | None = None
        self.used = False  # handed to a pool

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if self.conn is not None and self.conn.closed:
            state["conn"] = None  # pickling a closed end would fail the pool's restart of a process
        return state

    def __call__(self, *initargs: Any) -> None:
        global _worker
        child = os.getpid() != self.parent  # a pool of threads runs it in the training process
        if child:
            try:
                _worker = _Worker(workerpipe.Writer(self.conn), self.key) if self.conn is not None else None
            except (OSError, ValueError):  # the write end closed: a process started later
                _worker = None
        if self.initializer is not None:
            self.initializer(*initargs)
        if child and self.uid is not None and _worker is not None:
            _worker = _adopt(_worker, self.initializer, self.uid)


def _adopt(worker: _Worker, initializer: Callable[..., Any] | None, uid: Any) -> _Worker | None:
    """In a spawned process: ``worker`` keyed to this process's copy of the dataset, which
    Keras's initializer put in its module's ``_SHARED_SEQUENCES``, and the copy's class given
    the timing ``__getitem__``; None (untimed) where either is not there."""
    module = sys.modules.get(getattr(initializer, "__module__", "") or "")
    shared = getattr(module, "_SHARED_SEQUENCES", None)
    ds = shared.get(uid) if isinstance(shared, dict) else None
    if ds is None:
        return None
    cls = type(ds)
    original = next((vars(base)["__getitem__"] for base in cls.__mro__ if "__getitem__" in vars(base)), None)
    if original is None:
        return None

    def __getitem__(ds: Any, index: Any) -> Any:
        w = worker_for(ds)
        return original(ds, index) if w is None else w.call(original, ds, index)

    try:
        cls.__getitem__ = __getitem__  # type: ignore[method-assign]
    except (TypeError, AttributeError):  # a class that takes no attribute
        return None
    worker.key = id(ds)
    return worker


def _pool(cls: Callable[..., Any], init: PoolInit, *args: Any, **kwargs: Any) -> Any:
    """``cls(*args, **kwargs)`` with ``init`` around the initializer given."""
    init.used = True
    if len(args) > 1:
        init.initializer, args = args[1], (args[0], init, *args[2:])
    else:
        init.initializer, kwargs["initializer"] = kwargs.get("initializer"), init
    return cls(*args, **kwargs)


# -- in the training process -----------------------------------------------------------
class PoolTimes:
    """One feed's pipes from its pools' processes and each process's latest figures."""

    def __init__(self) -> None:
        self._pipes: list[tuple[int, connection.Connection]] = []
        self._latest: dict[tuple[int, int], Figures] = {}
        self._serial = itertools.count()
        self._lock = threading.Lock()
        self._next = 0.0
        self.unread = 0  # pipes dropped for a message not ours
        self.opened = 0  # pipes ever added: a pool of ours was made

    def add(self, read: connection.Connection) -> None:
        with self._lock:
            self._pipes.append((next(self._serial), read))
            self.opened += 1

    def maybe_drain(self, now: float) -> None:
        if self._pipes and now >= self._next:
            self._next = now + DRAIN_EVERY
            self.drain()

    def drain(self) -> None:
        with self._lock:
            keep = []
            for serial, conn in self._pipes:
                if self._read(serial, conn):
                    keep.append((serial, conn))
                else:
                    conn.close()
            self._pipes = keep

    def _read(self, serial: int, conn: connection.Connection) -> bool:
        latest = self._latest

        def handle(msg: Any) -> None:
            kind, pid, seconds, cpu, calls, squares = msg
            if kind != "k":
                raise ValueError(kind)
            latest[(serial, int(pid))] = (float(seconds), float(cpu), int(calls), float(squares))

        try:
            return workerpipe.receive(conn, handle)
        except (ValueError, TypeError, IndexError):
            self.unread += 1
            return False

    def take(self) -> Figures:
        """The processes' figures summed, the pipes drained a last time and closed; once."""
        self.drain()
        with self._lock:
            for _, conn in self._pipes:
                conn.close()
            self._pipes = []
            latest, self._latest = self._latest, {}
        figures = list(latest.values())
        return (sum(f[0] for f in figures), sum(f[1] for f in figures), sum(f[2] for f in figures),
                sum(f[3] for f in figures))


class Pools:
    """The wrappers that give a watched PyDataset's pool its timed initializer."""

    def __init__(self, times_of: Callable[[Any], PoolTimes | None], limit: Callable[[str], None]) -> None:
        self.times_of = times_of  # a dataset's PoolTimes, where a fit of ours was given it
        self.limit = limit
        self._local = threading.local()

    def wrap_executor_init(self, original: Callable[..., Any]) -> Callable[..., Any]:
        pools = self

        def _get_executor_init(enqueuer: Any, *args: Any, **kwargs: Any) -> Any:
            pool_fn = original(enqueuer, *args, **kwargs)
            if not callable(pool_fn):
                return pool_fn
            return lambda *a, **kw: pools._made(enqueuer, pool_fn, *a, **kw)

        return _get_executor_init

    def wrap_pool_class(self, original: Callable[..., Any]) -> Callable[..., Any]:
        local = self._local

        def get_pool_class(use_multiprocessing: Any, *args: Any, **kwargs: Any) -> Any:
            cls = original(use_multiprocessing, *args, **kwargs)
            init = getattr(local, "init", None)
            if init is None or cls is not multiprocessing.Pool:
                return cls  # threads (or no pool of ours being made)
            local.init = None  # one pool
            return functools.partial(_pool, cls, init)

        return get_pool_class

    def _made(self, enqueuer: Any, pool_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """The enqueuer's pool, made by ``pool_fn``, with its processes timed where they fork."""
        ds = getattr(enqueuer, "py_dataset", None)
        times = self.times_of(ds)
        if times is None:
            return pool_fn(*args, **kwargs)
        uid = None
        if not forks(multiprocessing):  # spawned: each finds its copy of the dataset by the enqueuer's uid
            uid = getattr(enqueuer, "uid", None)
            if uid is None:
                self.limit("keras's enqueuer has no uid: a PyDataset's spawned worker processes cannot find "
                           "their copy of it, their __getitem__ is not timed (the stage is the training "
                           "process's calls)")
                return pool_fn(*args, **kwargs)
        try:
            read, write = workerpipe.open_pipe()
        except OSError as exc:
            self.limit(f"a PyDataset's worker processes: no pipe ({exc}): their __getitem__ is not timed")
            return pool_fn(*args, **kwargs)
        init = self._local.init = PoolInit(write, id(ds), uid)
        try:
            pool = pool_fn(*args, **kwargs)
        except BaseException:
            read.close()
            raise  # Keras's own error, as it would have been
        finally:
            self._local.init = None
            write.close()  # the processes hold theirs: the pipe ends when they do
        if not init.used:
            read.close()
            self.limit("keras made a PyDataset's pool without get_pool_class: its __getitem__ in worker "
                       "processes is not timed")
            return pool
        times.add(read)
        return pool
