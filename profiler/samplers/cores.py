"""The CPUs this process may use: its affinity, a cgroup quota, Slurm's share."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from pathlib import Path

import psutil

_CGROUP_ROOT = Path("/sys/fs/cgroup")


def affinity(pid: int) -> list[int]:
    sched_getaffinity = getattr(os, "sched_getaffinity", None)
    if sched_getaffinity is not None:
        try:
            return sorted(sched_getaffinity(pid))
        except OSError:
            pass
    return list(range(psutil.cpu_count() or 1))


def usable_cores(cgroup_root: Path | None = None) -> int:
    """CPUs this process may use: its affinity, limited by a cgroup CPU quota and by
    Slurm's ``SLURM_CPUS_PER_TASK``, at least 1.

    A container given ``--cpus=1.5`` still sees every host core in its affinity
    mask; only the CFS quota says it gets 1.5 CPUs of time, which rounds up to 2.
    A Slurm step without task affinity (``TaskPlugin=task/none``, no cgroup) sees
    every core too; its allocation is the task's ``--cpus-per-task``.
    ``cgroup_root`` is the cgroup filesystem mount (``/sys/fs/cgroup``); pass a
    directory holding ``cpu.max`` (v2) or ``cpu.cfs_quota_us`` + ``cpu.cfs_period_us``
    (v1, also looked for under ``cpu/`` and ``cpu,cpuacct/``) to test.
    """
    sched_getaffinity = getattr(os, "sched_getaffinity", None)
    n = len(sched_getaffinity(0)) if sched_getaffinity is not None else (os.cpu_count() or 1)
    quota = cgroup_cpu_limit(cgroup_root)
    if quota is not None:
        n = min(n, math.ceil(quota))
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if slurm.strip().isdigit() and int(slurm) > 0:
        n = min(n, int(slurm))
    return max(1, n)


def cgroup_cpu_limit(cgroup_root: Path | None = None) -> float | None:
    """The tightest cgroup CPU quota over this process's cgroup and its ancestors, in CPUs.

    ``None`` when there is no quota ("max" / -1) or nothing can be read.
    """
    root = _CGROUP_ROOT if cgroup_root is None else cgroup_root
    limits = [
        limit
        for d in _cgroup_dirs(root, _own_cgroup_paths())
        if (limit := _read_cpu_limit(d)) is not None
    ]
    return min(limits) if limits else None


def _own_cgroup_paths() -> list[str]:
    """This process's cgroup path(s) for the cpu controller, from /proc/self/cgroup."""
    paths = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return ["/"]
    for line in lines:
        parts = line.split(":", 2)  # "hierarchy-id:controllers:path"
        if len(parts) == 3 and (parts[1] == "" or "cpu" in parts[1].split(",")):
            paths.append(parts[2])
    return paths or ["/"]


def _cgroup_dirs(root: Path, own: Iterable[str]) -> list[Path]:
    # v2 mounts everything at the root; v1 mounts the cpu controller in a subdirectory.
    # Inside a container with a cgroup namespace the own path is "/", and without one
    # it is a host path that does not exist in our mount: the mount root then is ours.
    dirs: list[Path] = []
    for base in (root, root / "cpu", root / "cpu,cpuacct", root / "cpuacct,cpu"):
        for path in own:
            d = base / path.strip("/")
            while True:
                if d not in dirs:
                    dirs.append(d)
                if d == base:
                    break
                d = d.parent
    return dirs


def _read_cpu_limit(d: Path) -> float | None:
    try:
        fields = (d / "cpu.max").read_text().split()  # v2: "quota period" or "max period"
        if len(fields) == 2 and fields[0] != "max" and int(fields[1]) > 0:
            return int(fields[0]) / int(fields[1])
        return None
    except (OSError, ValueError):
        pass
    try:
        quota = int((d / "cpu.cfs_quota_us").read_text())  # v1: -1 means no limit
        period = int((d / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None
