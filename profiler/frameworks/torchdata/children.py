"""The map function of a process mapper, timed in its worker processes.

NOTE [ Map time in worker processes ]
A ``ParallelMapper(method="process")`` hands its map function to worker processes. Where they
are forked (the default start method on Linux before Python 3.14), the function is handed
over wrapped: in a worker, each call adds its wall time, its CPU time and its square into a
small shared-memory array made in the training process before the fork, under the array's
lock; the hooks add the array to the map's stage when they are removed. Where the workers
are spawned, the function is pickled for them and ours cannot be: it is left as it is, not
timed, and the report says so. The start method is read without fixing it
(``allow_none``), as the script would otherwise find it set.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from typing import Any

from ...records import StageTime


def forks(context: Any) -> bool:
    """Whether ``context`` (a multiprocessing context or module) starts processes by fork."""
    get = getattr(context, "get_start_method", None)
    try:
        method = get(allow_none=True) if get is not None else None
    except (TypeError, ValueError):
        return False
    if method is None:  # not set yet: the platform's default, the first listed
        method = multiprocessing.get_all_start_methods()[0]
    return bool(method == "fork")


class ChildTimes:
    """The shared arrays of the map stages timed in worker processes."""

    def __init__(self, squares: dict[int, float]) -> None:
        self._squares = squares
        self._arrays: dict[int, tuple[StageTime, Any]] = {}
        self._owner = os.getpid()

    def timed(self, fn: Callable[[Any], Any], stage: StageTime) -> Callable[[Any], Any]:
        entry = self._arrays.get(id(stage))
        if entry is None:
            # seconds, CPU seconds, calls, squared seconds
            entry = self._arrays[id(stage)] = (stage, multiprocessing.get_context("fork").Array("d", 4))
        shared = entry[1]
        owner = self._owner
        clock, cpu_clock = time.perf_counter, time.thread_time

        def timed(item: Any) -> Any:
            if os.getppid() != owner:  # the training process itself, or a process not its worker
                return fn(item)
            c0 = cpu_clock()
            t0 = clock()
            try:
                return fn(item)
            finally:
                spent = clock() - t0
                cpu = cpu_clock() - c0
                with shared.get_lock():
                    shared[0] += spent
                    shared[1] += cpu
                    shared[2] += 1
                    shared[3] += spent * spent

        return timed

    def collect(self) -> None:
        """The workers' times into their stages (once: the arrays are then let go)."""
        arrays, self._arrays = self._arrays, {}
        for stage, shared in arrays.values():
            with shared.get_lock():
                seconds, cpu, calls, squares = shared[:]
            if calls:
                stage.seconds += seconds
                stage.cpu = (stage.cpu or 0.0) + cpu
                stage.calls += int(calls)
                stage.where = "processes"
                self._squares[id(stage)] = self._squares.get(id(stage), 0.0) + squares
