"""Memory of the training process tree, for the host sampler (host.py): each process's PSS
and its workers' USS (smaps_rollup, read within a CPU budget), the kernel's OOM kills, and
the bytes left under the process's own limits (RLIMIT_AS, its cgroup's memory.max).
"""

from __future__ import annotations

import time
from pathlib import Path

from .procfs import (
    PAGE_SIZE,
    ProcFile,
    address_space_limit,
    cgroup_memory_files,
    read_pss,
    vmstat_oom_kills,
)

#: PSS makes the kernel walk every mapping (3.5 ms of CPU for a process with torch
#: loaded, more with CUDA's): read at most this share of a core on it, and at least
#: every PSS_MAX_PERIOD seconds ...
PSS_BUDGET = 0.001
PSS_MAX_PERIOD = 5.0
#: ... unless that takes more than this share: the walk grows with the pages mapped (13 ms
#: a read for a worker holding 380 MiB, benchmarks/worker_memory_cost.py), and eight workers
#: of 3 GiB read every 5 s would take a sixth of a core. Between reads the last figures stand.
PSS_CEILING = 0.01


class TreeMemory:
    """The memory readings of one process (``pid``) and its workers, through files kept open."""

    def __init__(self, proc_root: Path, pid: int) -> None:
        self.proc_root = proc_root
        self.pid = pid
        self._vmstat_file = ProcFile(proc_root / "vmstat")
        self._pss_files: dict[int, ProcFile] = {}  # pid -> its smaps_rollup, kept open
        self._limits_file = ProcFile(proc_root / str(pid) / "limits")
        self._vm_file = ProcFile(proc_root / str(pid) / "statm")
        self._cgroup_files: tuple[ProcFile, ProcFile] | tuple[()] | None = None  # memory.max, .current
        self._pss: tuple[int | None, int | None] = (None, None)  # the process's, its workers' summed
        self._uss: dict[int, int] = {}  # each worker's USS at the last PSS read
        self._worker_uss: list[int] = []  # the last reading's, shared while it stands
        self._next_pss = 0.0  # time.monotonic() from which PSS is read again (PSS_BUDGET)

    def due(self, now: float) -> bool:
        """Whether PSS may be read again at ``now`` (time.monotonic()) within its budget."""
        return now >= self._next_pss

    def close(self) -> None:
        """Close the files kept open. Idempotent; a later read opens them again."""
        for file in (self._vmstat_file, self._limits_file, self._vm_file, *(self._cgroup_files or ()),
                     *self._pss_files.values()):
            file.close()

    def uss_of(self, pids: list[int]) -> list[int]:
        """Each worker's USS at the last PSS read, in ``pids``' order; [] until every one was read."""
        if not pids or any(p not in self._uss for p in pids):
            return []
        uss = [self._uss[p] for p in pids]
        if uss != self._worker_uss:
            self._worker_uss = uss
        return self._worker_uss

    def read(self, pids: list[int], pss: bool = True) -> tuple[int | None, int | None, int | None, int | None]:
        """PSS of the process and of its workers together (None when ``pss`` is False), and
        the kernel's count of OOM kills so far (Linux). PSS shares each page among the
        processes that map it, so a forked worker's pages shared with its parent are not
        counted once per worker, as RSS counts them. The kernel walks the page tables for
        it: within PSS_BUDGET; without ``pss``, the last PSS figures stand. ``pids``: the
        process and its workers."""
        if not pss:
            return (*self._pss, vmstat_oom_kills(self._vmstat_file), self._limit_left())
        began = time.thread_time()
        read: dict[int, tuple[int, int] | None] = {}
        for pid in pids:
            file = self._pss_files.get(pid)
            if file is None:
                file = self._pss_files[pid] = ProcFile(self.proc_root / str(pid) / "smaps_rollup")
            read[pid] = read_pss(file)
        for pid in [p for p in self._pss_files if p not in read]:
            self._pss_files.pop(pid).close()  # a worker gone
        cost = time.thread_time() - began
        period = min(PSS_MAX_PERIOD, cost / PSS_BUDGET)
        self._next_pss = time.monotonic() + max(period, cost / max(PSS_CEILING, PSS_BUDGET))
        own = read[self.pid][0] if read.get(self.pid) is not None else None  # type: ignore[index]
        workers = [v for p, v in read.items() if p != self.pid]
        children = None if any(v is None for v in workers) else sum(v[0] for v in workers if v is not None)
        self._uss = {p: v[1] for p, v in read.items() if p != self.pid and v is not None}
        self._pss = (own, children)
        return own, children, vmstat_oom_kills(self._vmstat_file), self._limit_left()

    def _limit_left(self) -> int | None:
        """Bytes left under the tightest limit the process has below the host's memory:
        its address-space rlimit (RLIMIT_AS, against the address space it maps: an
        allocation past it fails though the host has memory free) or its cgroup v2's
        memory.max (against memory.current: containers). Read anew each time: a script
        may set its own limit after the profiler started."""
        left = []
        try:
            limit = address_space_limit(self._limits_file.read())
            if limit is not None:
                left.append(limit - int(self._vm_file.head(256).split()[0]) * PAGE_SIZE)
        except (OSError, ValueError, IndexError):
            pass
        if self._cgroup_files is None:
            self._cgroup_files = cgroup_memory_files(self.proc_root, self.pid)
        if self._cgroup_files:
            try:
                limit_text = self._cgroup_files[0].head(64).strip()
                if limit_text != b"max":
                    left.append(int(limit_text) - int(self._cgroup_files[1].head(64)))
            except (OSError, ValueError):
                pass
        return max(0, min(left)) if left else None
