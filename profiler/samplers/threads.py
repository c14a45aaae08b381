"""The training process's threads other than its main one, on a core and queued for one
(Linux schedstat, per thread: /proc/PID/task/TID/schedstat). A loader that makes its batches
on the process's own threads (tf.data, a torchdata thread mapper, Ray Data's iterator) waits
there for a core when other work holds the cores, while its main thread sleeps in the wait
for a batch: the main thread's run delay says nothing of it.

Read once a second (the tree's listing cadence, NOTE [ Sampling cost ] in host.py): a listing
of the task folder and one read per thread, through files kept open.
"""

from __future__ import annotations

import os
from pathlib import Path

from .procfs import ProcFile

#: threads read at most (a process of thousands would cost a read each)
MAX_THREADS = 512


class ThreadQueues:
    """Cores' worth of the process's other threads on a CPU and queued for one, between reads."""

    def __init__(self, proc_root: Path, pid: int) -> None:
        self._task = proc_root / str(pid) / "task"
        self._main = str(pid)
        self._files: dict[str, ProcFile] = {}
        self._last: dict[str, tuple[float, float]] = {}  # tid -> (seconds on a CPU, seconds queued)
        self._last_t: float | None = None

    def read(self, now: float) -> tuple[float, float] | None:
        """(cores on a CPU, cores queued) since the last read; None at the first or where unreadable."""
        try:
            tids = [t for t in os.listdir(self._task) if t != self._main][:MAX_THREADS]
        except OSError:
            return None
        seen: dict[str, tuple[float, float]] = {}
        cpu = queued = 0.0
        first = self._last_t is None
        for tid in tids:
            file = self._files.get(tid) or ProcFile(self._task / tid / "schedstat")
            try:
                fields = file.head(128).split()
                got = (int(fields[0]) / 1e9, int(fields[1]) / 1e9)
            except (OSError, ValueError, IndexError):  # exited since the listing
                file.close()
                self._files.pop(tid, None)
                continue
            self._files[tid] = file
            seen[tid] = got
            last = self._last.get(tid, (0.0, 0.0))  # a thread started since: all of its life is in the window
            cpu += max(0.0, got[0] - last[0])
            queued += max(0.0, got[1] - last[1])
        for tid in [t for t in self._files if t not in seen]:
            self._files.pop(tid).close()
        dt = now - self._last_t if self._last_t is not None else 0.0
        self._last, self._last_t = seen, now
        if first or dt <= 0:
            return None
        return cpu / dt, queued / dt

    def close(self) -> None:
        for file in self._files.values():
            file.close()
        self._files.clear()
