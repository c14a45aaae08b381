"""Linux /proc (and psutil) readings as numbers, for the host sampler (host.py).

Each parser takes the bytes of one file (or a process handle) and returns figures,
so it is tested on fixtures; ``ProcFile`` keeps a /proc file open and reads it again
in one system call (NOTE [ Sampling cost ] in host.py).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import psutil

SECTOR = 512  # /proc/diskstats counts 512-byte sectors whatever the device's own size (psutil: DISK_SECTOR_SIZE)
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
GONE = (psutil.NoSuchProcess, psutil.AccessDenied)  # ZombieProcess is a NoSuchProcess


class ProcFile:
    """A /proc file kept open and read again from offset 0, where the kernel
    regenerates it: one system call per reading instead of three (open, read and
    close: NOTE [ Sampling cost ] in host.py)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        #: bytes the last complete reading needed (``read``): the next one reads
        #: that much at once, without working it out again
        self.size = 0

    def head(self, size: int) -> bytes:
        """Up to ``size`` bytes from the start of the file; OSError if it cannot be read."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        return os.pread(self._fd, size, 0)

    def read(self, enough: Callable[[bytes], bool] | None = None) -> bytes:
        """The file from its start: all of it, or a head that ``enough`` accepts. Read
        larger until then, and in one read next time (the size is kept in ``size``)."""
        size = self.size or 4096
        while True:
            data = self.head(size)
            if len(data) < size or (enough is not None and enough(data)):
                self.size = size
                return data
            size *= 4

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __del__(self) -> None:
        try:
            self.close()
        except OSError:
            pass


def own_rss() -> int | None:
    """Bytes resident in this process now (psutil: statm on Linux), or None."""
    try:
        return int(psutil.Process().memory_info().rss)
    except (psutil.Error, OSError):
        return None


def own_peak_rss() -> int | None:
    """This process's peak resident bytes since it started, or None where there is no
    ``resource`` module (Windows). On Linux VmHWM, since getrusage's ru_maxrss keeps the
    peak of the parent a process was forked from across exec (a script started by a
    large launcher would read the launcher's). macOS counts bytes."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


def address_space_limit(limits: bytes) -> int | None:
    """The soft RLIMIT_AS in bytes from a /proc/PID/limits, or None when unlimited."""
    at = limits.index(b"Max address space")
    soft = limits[at + len(b"Max address space"):].split()[0]
    return None if soft == b"unlimited" else int(soft)


def cgroup_memory_files(proc_root: Path, pid: int) -> tuple[ProcFile, ProcFile] | tuple[()]:
    """memory.max and memory.current of the process's cgroup v2, or () (v1, or none)."""
    try:
        lines = (proc_root / str(pid) / "cgroup").read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ()
    path = next((line[3:] for line in lines if line.startswith("0::")), None)
    if path is None:
        return ()
    folder = Path("/sys/fs/cgroup") / path.lstrip("/")
    if not (folder / "memory.max").exists():
        return ()
    return ProcFile(folder / "memory.max"), ProcFile(folder / "memory.current")


def statm_rss(file: ProcFile) -> int:
    """RSS bytes from a /proc/PID/statm: its second field, resident pages, as psutil
    reads it. OSError, ValueError or IndexError when it cannot be read."""
    return int(file.head(256).split()[1]) * PAGE_SIZE


class CpuTimes(NamedTuple):
    """All CPUs' time, in any one unit: ``busy`` is what this system's processes ran (not
    idle, not iowait, not steal), ``total`` all of it; ``iowait`` and ``steal`` None where
    the system does not count them."""

    busy: float
    total: float
    iowait: float | None
    #: time the hypervisor ran something else while this VM's CPUs had work (Linux steal)
    steal: float | None


def proc_stat(file: ProcFile) -> tuple[CpuTimes, dict[int, tuple[float, float]]] | None:
    """The aggregate and per-CPU lines of Linux's /proc/stat, in clock ticks, or None.

    The ``cpu`` lines come first; the ``intr`` line after them can be tens of KB on
    a big machine, so only the head is read, and read again larger if it did not
    reach past the last ``cpu`` line. The size that sufficed is kept on ``file``:
    ``os.cpu_count()`` reads /sys (open, read, close: three system calls, as many as
    the rest of a tick, NOTE [ Sampling cost ]), so it is asked once. Accounting as
    psutil's (``_account``).
    """
    if not file.size:
        file.size = 256 * ((os.cpu_count() or 1) + 2)
    try:
        lines = file.read(_cpu_lines_whole).split(b"\n")
        total_all: CpuTimes | None = None
        percpu: dict[int, tuple[float, float]] = {}
        for line in lines:
            if not line.startswith(b"cpu"):
                break
            name, *fields = line.split()
            v = [float(x) for x in fields]
            # user nice system idle iowait irq softirq steal guest guest_nice (older kernels: fewer)
            times = _account(sum(v), v[3], v[4] if len(v) > 4 else None, v[7] if len(v) > 7 else None,
                             sum(v[8:10]))
            if name == b"cpu":
                total_all = times
            else:
                percpu[int(name[3:])] = (times.busy, times.total)
    except (OSError, ValueError, IndexError):
        return None
    if total_all is None or not percpu:
        return None
    return total_all, percpu


def _cpu_lines_whole(head: bytes) -> bool:
    """Whether a head of /proc/stat holds every ``cpu`` line: the line after them has begun."""
    lines = head.split(b"\n")
    return lines[-1][:3] not in (b"cpu", b"cp", b"c", b"") or not all(line.startswith(b"cpu") for line in lines[:-1])


def proc_meminfo(file: ProcFile) -> tuple[float, int, int] | None:
    """(memory % used, bytes available, swap bytes used) from Linux's /proc/meminfo, or None.

    As psutil computes them: used % = (MemTotal - MemAvailable) / MemTotal, swap used
    = SwapTotal - SwapFree. None without MemAvailable (kernels before 3.14, where
    psutil estimates it): psutil is asked then.
    """
    try:
        fields = {}
        for line in file.read().split(b"\n"):
            name, _, rest = line.partition(b":")
            if name in (b"MemTotal", b"MemAvailable", b"SwapTotal", b"SwapFree"):
                fields[name] = int(rest.split()[0]) * 1024  # kB
        total, available = fields[b"MemTotal"], fields[b"MemAvailable"]
        swap = max(0, fields.get(b"SwapTotal", 0) - fields.get(b"SwapFree", 0))
    except (OSError, ValueError, IndexError, KeyError):
        return None
    if total <= 0:
        return None
    return 100.0 * (total - available) / total, available, swap


def proc_diskstats(file: ProcFile, disks: frozenset[str]) -> int | None:
    """Bytes read so far by the block devices in ``disks``, from Linux's /proc/diskstats, or None.

    A line is ``major minor name`` then counters; sectors read is the third counter
    (the second on the 7-field partition lines of old kernels), as psutil reads it.
    """
    try:
        sectors = 0
        for line in file.read().split(b"\n"):
            fields = line.split()
            n = len(fields)
            if n >= 14:
                counter = fields[5]
            elif n == 7:
                counter = fields[4]
            else:
                continue
            if fields[2].decode(errors="replace") in disks:
                sectors += int(counter)
    except (OSError, ValueError):
        return None
    return sectors * SECTOR


def linux_descendants(proc_root: Path, pid: int) -> list[int] | None:
    """Pids of every descendant of ``pid`` from /proc/PID/task/TID/children, or None
    when the kernel does not provide those files (CONFIG_PROC_CHILDREN)."""
    found: list[int] = []
    stack = [pid]
    while stack:
        parent = stack.pop()
        try:
            tids = os.listdir(proc_root / str(parent) / "task")
        except OSError:
            if parent == pid:
                return None
            continue  # a descendant that exited meanwhile
        for tid in tids:
            try:
                fd = os.open(proc_root / str(parent) / "task" / tid / "children", os.O_RDONLY)
            except FileNotFoundError:
                if parent == pid and not os.path.exists(proc_root / str(parent) / "task" / tid):
                    continue  # the thread ended
                if parent == pid:
                    return None  # the kernel has no children files
                continue
            except OSError:
                continue
            try:
                data = os.read(fd, 65536)
            except OSError:
                data = b""
            finally:
                os.close(fd)
            kids = [int(k) for k in data.split()]
            found.extend(kids)
            stack.extend(kids)
    return found


def read_pss(file: ProcFile) -> tuple[int, int] | None:
    """Proportional and unique set sizes in bytes from /proc/PID/smaps_rollup (Linux
    4.14+), or None. USS is the private pages, clean and dirty: what the process alone
    holds (a forked worker's pages it copied on write, say)."""
    try:
        data = file.read()
        return _kib(data, b"\nPss:"), _kib(data, b"\nPrivate_Clean:") + _kib(data, b"\nPrivate_Dirty:")
    except (OSError, ValueError, IndexError):
        file.close()
        return None


def _kib(data: bytes, key: bytes) -> int:
    at = data.index(key)
    return int(data[at + len(key):].split(None, 1)[0]) * 1024


def vmstat_oom_kills(file: ProcFile) -> int | None:
    """Processes the kernel's OOM killer has killed since boot (/proc/vmstat, Linux 4.13+)."""
    try:
        data = file.read()
        at = data.index(b"\noom_kill ")
        return int(data[at + 10:].split(None, 1)[0])
    except (OSError, ValueError, IndexError):
        return None


def run_delay(file: ProcFile) -> float | None:
    """Seconds a task has spent runnable but waiting for a CPU, from its schedstat
    (proc(5): time on CPU, time on a run queue, timeslices, in ns): the CPU contention
    it met, whoever caused it. None where the kernel has no schedstat."""
    try:
        return int(file.head(128).split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def same_process(child: psutil.Process, seen: dict[tuple[int, float], float]) -> bool:
    """Whether ``child`` is the process a reading keyed in ``seen`` by (pid, create time)."""
    try:
        return (child.pid, child.create_time()) in seen
    except GONE:  # its create time could not be read when the object was made, nor now
        return False


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def busy_total(times: object) -> tuple[float, float]:
    busy, total, _, _ = cpu_times_of(times)
    return busy, total


def cpu_times_of(times: object) -> CpuTimes:
    """psutil's ``cpu_times()`` as ``CpuTimes``."""
    fields = times._asdict()  # type: ignore[attr-defined]
    return _account(sum(fields.values()), fields.get("idle", 0.0), fields.get("iowait"), fields.get("steal"),
                    fields.get("guest", 0.0) + fields.get("guest_nice", 0.0))


def _account(all_fields: float, idle: float, iowait: float | None, steal: float | None, guest: float) -> CpuTimes:
    """``CpuTimes`` from a CPU time line's sum and parts, psutil's or /proc/stat's."""
    # As psutil.cpu_percent (and htop) but for steal: guest time is already in user/nice
    # on Linux, and iowait is idle time, not busy time. Steal is neither: no process of
    # this system ran then, and counted busy it would read as another process's CPU.
    total = all_fields - guest
    return CpuTimes(total - idle - (iowait or 0.0) - (steal or 0.0), total, iowait, steal)


def percent(now: tuple[float, float], last: tuple[float, float]) -> float:
    d_total = now[1] - last[1]
    if d_total <= 0:
        return 0.0
    return clamp(100.0 * (now[0] - last[0]) / d_total)


def clamp(pct: float) -> float:
    return min(100.0, max(0.0, pct))


def clamp_cpu(pct: float) -> float:
    # % of one core: can exceed 100 for a multi-threaded process, never below 0.
    return max(0.0, pct)
