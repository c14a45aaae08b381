"""The stream's functions timed as stages, on whichever thread runs them.

Why calls on other threads count:
datasets reads a worker's shards side by side on a thread pool (``InterleavedShardsExamplesIterable``):
a map's function and the source's reads run on its threads, while the fetch that the torch
hooks time (frameworks/torch/stages.py) waits for them on its own. A call on the fetching
thread is timed as any other stage there (exclusive of the timed calls inside it). A call on
another thread while a fetch is timed goes to that fetch's recorder, under a lock: its wall
and that thread's CPU to its own row, and its wall to the time the fetch's own row leaves out
(``child_wall``), since the fetch was waiting for it meanwhile. Calls between timed fetches
are not counted, as the fetch around them is not. The pool's prefetch can overlap the fetching
thread's own work (its collate, at most an example a shard ahead); that overlap is counted
twice and the fetch's own row is at least zero, so the rows may add up to a little more than
the fetch took.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..torch import stages as torch_stages

_lock = threading.Lock()
_perf = time.perf_counter
_cpu = time.thread_time
_ident = threading.get_ident


class TimedCall:
    """``fn`` timed as stage (kind, name) (the module doc);
    pickles as ``fn`` itself, so that spawned workers get the user's own function."""

    def __init__(self, fn: Callable[..., Any], kind: str, name: str, order: int = 0,
                 random: bool | None = None) -> None:
        self.fn = fn
        self._kind = kind
        self._name = torch_stages.short(name)
        self._order = order
        self._random = random
        self._nested = torch_stages.timed(kind, self._name, fn, order, random)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        rec = torch_stages._state.current
        if rec is None:
            return self.fn(*args, **kwargs)
        if rec.thread == _ident():
            return self._nested(*args, **kwargs)
        c0 = _cpu()
        t0 = _perf()
        try:
            return self.fn(*args, **kwargs)
        finally:
            wall = _perf() - t0
            cpu = _cpu() - c0
            with _lock:
                if torch_stages._state.current is rec:  # the fetch is still on: it waited for this
                    acc = rec.slot(self._kind, self._name, self._order, self._random)
                    acc[0] += wall
                    acc[1] += cpu
                    acc[2] += 1
                    rec.child_wall += wall

    def __getattr__(self, name: str) -> Any:
        if name == "fn":  # not set yet: never recurse
            raise AttributeError(name)
        return getattr(self.fn, name)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_same, (self.fn,))


class TimedSource:
    """The stream's source generator function, each item it yields timed as a read; pickles as
    the generator function itself."""

    def __init__(self, fn: Callable[..., Iterator[Any]], kind: str, name: str) -> None:
        self.fn = fn
        self._next = TimedCall(next, kind, name, 0, False)

    def __call__(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        gen = self.fn(*args, **kwargs)
        step = self._next
        try:
            while True:
                try:
                    item = step(gen)
                except StopIteration:
                    return
                yield item
        finally:
            close = getattr(gen, "close", None)
            if close is not None:
                close()

    def __getattr__(self, name: str) -> Any:
        if name == "fn":
            raise AttributeError(name)
        return getattr(self.fn, name)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_same, (self.fn,))


def _same(obj: Any) -> Any:
    return obj
