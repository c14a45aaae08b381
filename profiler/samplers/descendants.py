"""The training process's descendants as the host sampler reads them: listed through the
kernel's per-thread children files, the Process objects of known ones reused, and each
one's kind read once from its command (multiprocessing's helpers left out, a tracker's
services kept apart from the loader's workers)."""

from __future__ import annotations

from pathlib import Path

import psutil

from .procfs import GONE, linux_descendants, same_process

#: the commands of multiprocessing's own helper processes (Python's ``-c`` lines)
MP_HELPERS = ("multiprocessing.resource_tracker import main", "multiprocessing.forkserver import main",
              "multiprocessing.semaphore_tracker import main")
#: the commands of a tracker's service processes, which ``wandb.init`` starts beside the training
#: loop (its core and system monitor; older releases' ``wandb service``): the job's own CPU, no worker
SERVICES = ("wandb-core", "wandb-symon", "wandb service")
#: the kinds remembered at most: pids come and go over a long run
MAX_KINDS = 256


class Descendants:
    """Lists one process's descendants, ``exclude`` left out (loadprof's own helper)."""

    def __init__(self, proc_root: Path, exclude: frozenset[int]) -> None:
        self.proc_root = proc_root
        self.exclude = exclude
        #: (pid, create time) -> "helper", "service" or "" (``kind``)
        self._kinds: dict[tuple[int, float], str] = {}

    def list(self, proc: psutil.Process, known: list[psutil.Process],
             last: dict[tuple[int, float], float]) -> list[psutil.Process]:
        """Every descendant of ``proc`` but multiprocessing's helpers; the Process objects
        of ``known`` (the last listing's) reused where ``last`` (their (pid, create time)
        as last read) says they are the same processes.

        psutil's ``children(recursive=True)`` reads the stat file of every process
        on the machine. On Linux the kernel lists each thread's children in
        /proc/PID/task/TID/children, so walking our own tree reads one small file
        per thread in it instead: 5 files rather than 118 on the CI VM. Each file
        read gives the GIL away and back, which the training loop pays for (NOTE
        [ Sampling cost ] in host.py). Without those files (an old kernel, another OS): psutil.
        """
        pids = linux_descendants(self.proc_root, proc.pid)
        if pids is None:
            return [c for c in proc.children(recursive=True) if c.pid not in self.exclude and not self.helper(c)]
        by_pid = {c.pid: c for c in known}
        found = []
        for pid in pids:
            if pid in self.exclude:
                continue
            child = by_pid.get(pid)
            # The same process as the last reading's when its (pid, create time) was read
            # then (psutil keeps the create time it read first): no system call. Otherwise
            # is_running(), False for a reused pid too (psutil's own system calls).
            if child is None or not (same_process(child, last) or child.is_running()):
                try:
                    child = psutil.Process(pid)
                except GONE:
                    continue  # exited since it was listed
                if self.helper(child):
                    continue
            found.append(child)
        return found

    def helper(self, child: psutil.Process) -> bool:
        """Whether ``child`` is one of multiprocessing's own helpers (its resource tracker,
        started by the first spawned worker or shared memory and alive until the process
        ends; a forkserver), never a loader worker and left out of the tree."""
        return self.kind(child) == "helper"

    def kind(self, child: psutil.Process) -> str:
        """"helper" (``helper``), "service" (a tracker's: the job's CPU, no loader worker's)
        or "": read once a process, by its command."""
        key = (child.pid, _create_time(child))
        if key not in self._kinds:
            if len(self._kinds) > MAX_KINDS:
                self._kinds.clear()
            try:
                command = " ".join(child.cmdline()[:4])
            except (psutil.Error, OSError):
                command = ""
            self._kinds[key] = ("helper" if any(m in command for m in MP_HELPERS) else
                                "service" if any(m in command for m in SERVICES) else "")
        return self._kinds[key]


def _create_time(proc: psutil.Process) -> float:
    try:
        return proc.create_time()
    except (psutil.Error, OSError):
        return 0.0
