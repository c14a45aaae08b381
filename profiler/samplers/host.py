"""Host readings through psutil: CPU per usable core, the training process tree, memory, disk.

CPU percentages are computed from our own deltas of ``cpu_times`` rather than
``psutil.cpu_percent(interval=None)``: that function keeps its baseline in psutil's
module globals, so any other caller in the process (a progress bar, a logger)
would silently shorten our measuring window.

NOTE [ Short-lived loader workers ]
With ``persistent_workers=False`` PyTorch forks fresh DataLoader workers every
epoch, so a worker may live for only part of an interval. A child seen for the
first time is charged the CPU time it used since it was created (or the share of
it that falls in this interval, if it was created earlier and we missed it), not
a zero "priming" reading. CPU a worker used after our last reading and before it
exited is lost: psutil cannot read a process that is gone.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil

from loadprof.records import HostSample

log = logging.getLogger("loadprof.samplers")

_CGROUP_ROOT = Path("/sys/fs/cgroup")
_PROC_ROOT = Path("/proc")
_BLOCK_ROOT = Path("/sys/block")
_SECTOR = 512  # /proc/diskstats counts 512-byte sectors whatever the device's own size (psutil: DISK_SECTOR_SIZE)
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc/PID/stat's time unit

# NOTE [ Sampling cost ]
# The sampler thread holds the GIL while it parses what it reads, and every file
# read hands the GIL away and back, which a training loop running Python waits on:
# what a tick costs the loop is mostly its system calls. So on Linux a reading
# takes /proc/stat, /proc/meminfo, /proc/diskstats and each worker's stat, statm
# and schedstat through descriptors kept open (``_ProcFile``: one pread each),
# this process's CPU from its CPU clock, and lists the tree through the
# per-thread children files rather than psutil's scan of every process; psutil
# reads the rest, and everything elsewhere. The slow-changing readings are spread
# out: the tree is relisted every ``TREE_EVERY`` readings, memory, swap and disk
# every ``SLOW_EVERY`` (1 s each at 10 Hz, half a second apart), so a new loader
# worker is seen within a second, its CPU since creation still counted (NOTE
# [ Short-lived loader workers ]), and PSS within ``PSS_BUDGET``. Profile takes
# these readings in a helper process (NOTE [ Host readings in a helper process ]
# in hostproc.py). The measured costs behind each choice are in docs/dev/overhead.md.
TREE_EVERY = 10
SLOW_EVERY = 10
#: PSS makes the kernel walk every mapping (3.5 ms of CPU for a process with torch
#: loaded, more with CUDA's): read at most this share of a core on it, and at least
#: every PSS_MAX_PERIOD seconds. Between reads the last figures stand.
PSS_BUDGET = 0.001
PSS_MAX_PERIOD = 5.0
_GONE = (psutil.NoSuchProcess, psutil.AccessDenied)  # ZombieProcess is a NoSuchProcess


class HostSource:
    """CPU, memory and disk of the host and of one process tree (the training run).

    Not thread-safe: one caller at a time (the ``Sampler`` thread, then ``Sampler.stop``
    after joining it). There is deliberately no lock, so that a DataLoader worker
    forked mid-sample cannot inherit a held one.
    """

    def __init__(
        self,
        pid: int | None = None,
        proc_root: Path | None = None,
        block_root: Path | None = None,
        exclude: frozenset[int] = frozenset(),
    ) -> None:
        self.pid = os.getpid() if pid is None else pid
        #: descendants that are not the run's: the helper process that reads this tree (hostproc.py)
        self.exclude = exclude
        #: where /proc is (tests point it elsewhere); unreadable -> psutil for everything
        self.proc_root = _PROC_ROOT if proc_root is None else proc_root
        #: where /sys/block is: its entries are the devices whose reads count
        self.block_root = _BLOCK_ROOT if block_root is None else block_root
        self._own = self.pid == os.getpid()  # this process: its CPU and RSS without psutil
        self._stat_file = _ProcFile(self.proc_root / "stat")
        self._statm_file = _ProcFile(self.proc_root / "self" / "statm")
        self._meminfo_file = _ProcFile(self.proc_root / "meminfo")
        self._diskstats_file = _ProcFile(self.proc_root / "diskstats")
        self._disks: frozenset[str] = frozenset()  # storage device names, listed at start()
        self._proc: psutil.Process | None = None
        self._cores: list[int] = []
        self._started = False
        self._last_wall = 0.0  # time.monotonic() of the previous reading
        self._last_percpu: dict[int, tuple[float, float]] = {}  # cpu id -> (busy, total)
        self._last_all: tuple[float, float, float | None] = (0.0, 0.0, None)  # busy, total, iowait
        self._last_proc_cpu = 0.0
        self._last_children: dict[tuple[int, float], float] = {}  # (pid, create_time) -> cpu s
        self._last_excluded: dict[int, float] = {}  # excluded pid (our helper) -> cpu s
        self._worker_pids: list[int] = []  # the last reading's, shared by readings of the same workers
        self._last_disk_read: int | None = None
        self._last_slow_wall = 0.0
        self._pids: set[int] | None = None
        self._errors: dict[str, int] = {}
        self._children: list[psutil.Process] = []
        self._child_files: dict[int, tuple[_ProcFile, _ProcFile, _ProcFile]] = {}  # pid -> its stat, statm, schedstat
        self._schedstat_file = _ProcFile(self.proc_root / str(self.pid) / "schedstat")
        self._last_delay: dict[tuple[int, float], float] = {}  # (pid, create time) -> run-queue wait, s
        self._last_own_delay: float | None = None
        self._boot_time = 0.0  # seconds since the epoch: a /proc/PID/stat start time is counted from it
        self._n = 0  # readings taken, for the slower cadences (NOTE [ Sampling cost ])
        self._slow: tuple[float, int, int, float] = (0.0, 0, 0, 0.0)  # mem %, available, swap, disk B/s
        self._vmstat_file = _ProcFile(self.proc_root / "vmstat")
        self._pss_files: dict[int, _ProcFile] = {}  # pid -> its smaps_rollup, kept open
        self._limits_file = _ProcFile(self.proc_root / str(self.pid) / "limits")
        self._vm_file = _ProcFile(self.proc_root / str(self.pid) / "statm")
        self._cgroup_files: tuple[_ProcFile, _ProcFile] | tuple[()] | None = None  # memory.max, .current
        #: process PSS, workers' PSS summed, the kernel's OOM kills so far, bytes left
        #: under the process's own memory limit (None: unreadable or no limit)
        self._memory: tuple[int | None, int | None, int | None, int | None] = (None, None, None, None)
        self._next_pss = 0.0  # time.monotonic() from which PSS is read again (PSS_BUDGET)

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> None:
        """Take the baseline readings the first sample is measured against. Idempotent."""
        if self._started:
            return
        self._started = True
        try:
            self._proc = psutil.Process(self.pid)
        except _GONE as exc:
            self._note(f"process {self.pid}: {type(exc).__name__}")
        self._cores = _affinity(self.pid)
        try:
            # psutil's is_storage_device(): the name, '/' written '!', is an entry of /sys/block
            self._disks = frozenset(name.replace("!", "/") for name in os.listdir(self.block_root))
        except OSError:
            self._disks = frozenset()  # psutil reads the disks (and says if there are none)
        try:
            self._boot_time = psutil.boot_time()  # read once; psutil's create_time() counts from it too
        except (OSError, RuntimeError):
            self._boot_time = 0.0
        self._last_wall = self._last_slow_wall = time.monotonic()
        self._last_all, self._last_percpu = self._cpu_times()
        self._read_tree(self._last_wall, 0.0, relist=True)
        self._last_disk_read = self._disk_read()

    def close(self) -> None:
        """Close the /proc files kept open. Idempotent; a later sample opens them again."""
        for file in (self._stat_file, self._statm_file, self._meminfo_file, self._diskstats_file, self._schedstat_file,
                     self._vmstat_file, self._limits_file, self._vm_file, *(self._cgroup_files or ()),
            *self._pss_files.values()):
            file.close()
        for pid in list(self._child_files):
            self._close_child(pid)

    # -- readings ------------------------------------------------------------
    def sample(self, t: float) -> HostSample:
        """One reading since the previous one (or since ``start()``). Never raises."""
        if not self._started:
            self.start()
        now = time.monotonic()
        dt = max(now - self._last_wall, 1e-9)
        s = HostSample(t=t, window=dt)

        (busy, total, iowait), percpu = self._cpu_times()
        last_percpu = self._last_percpu
        s.cpu_per_core = [_percent(percpu[i], last_percpu[i]) for i in self._cores if i in percpu and i in last_percpu]
        self._last_percpu = percpu

        _, last_total, last_iowait = self._last_all
        if iowait is not None and last_iowait is not None and total > last_total:
            # Linux only. The kernel's iowait can go backwards per CPU; clamp.
            s.iowait_percent = _clamp(100.0 * (iowait - last_iowait) / (total - last_total))
        self._last_all = (busy, total, iowait)

        self._n += 1
        (s.process_cpu, s.process_rss, s.children_cpu, s.n_children, s.children_rss,
         s.process_run_delay, s.children_run_delay, s.worker_pids, s.worker_cpu) = self._read_tree(
            now, dt, relist=self._n % TREE_EVERY == 0 or self._n == 1)

        if self._n % SLOW_EVERY == SLOW_EVERY // 2 or self._n == 1:
            mem_percent, available, swap, disk_bps = self._slow
            memory = _proc_meminfo(self._meminfo_file)
            if memory is not None:
                mem_percent, available, swap = memory
            else:
                try:
                    vm = psutil.virtual_memory()
                    mem_percent, available = float(vm.percent), int(vm.available)
                    swap = int(psutil.swap_memory().used)
                except OSError as exc:
                    self._note(f"memory: {exc}")
            read = self._disk_read()
            slow_dt = max(now - self._last_slow_wall, 1e-9)
            if read is not None and self._last_disk_read is not None:
                # A disk detached mid-run makes the system total drop: never negative.
                disk_bps = max(0.0, (read - self._last_disk_read) / slow_dt)
            self._last_disk_read = read
            self._last_slow_wall = now
            self._slow = (mem_percent, available, swap, disk_bps)
            # not in the first reading, which Profile's entry waits for (PSS_BUDGET)
            self._memory = self._read_memory(pss=self._n > 1 and now >= self._next_pss)
        s.memory_percent, s.memory_available, s.swap_used, s.disk_read_bps = self._slow
        s.process_pss, s.children_pss, s.oom_kills, s.memory_limit_left = self._memory
        s.profiler_cpu = self._excluded_cpu(dt)
        self._last_wall = now
        return s

    def pids(self) -> set[int]:
        """The process tree (the process and all its descendants) as of the last reading."""
        if self._pids is None:
            self._read_tree(time.monotonic(), 0.0, relist=True)
        return set(self._pids or ())

    def problems(self) -> list[str]:
        """What could not be read, one line per kind of failure, with counts."""
        return [f"{what} ({n} times)" if n > 1 else what for what, n in self._errors.items()]

    # -- internals -----------------------------------------------------------
    def _cpu_times(self) -> tuple[tuple[float, float, float | None], dict[int, tuple[float, float]]]:
        """((busy, total, iowait) of all CPUs, {cpu id: (busy, total)}), in any one unit."""
        got = _proc_stat(self._stat_file)
        if got is not None:
            return got
        percpu = {i: _busy_total(c) for i, c in enumerate(psutil.cpu_times(percpu=True))}
        return _busy_total_iowait(psutil.cpu_times()), percpu

    def _own_cpu_rss(self) -> tuple[float, int] | None:
        """This process's CPU seconds and RSS bytes without psutil (Linux), or None."""
        try:
            rss = _statm_rss(self._statm_file)
        except (OSError, ValueError, IndexError):
            return None
        return time.process_time(), rss

    def _list_descendants(self, proc: psutil.Process) -> list[psutil.Process]:
        """Every descendant of ``proc``; the Process objects of known ones are reused.

        psutil's ``children(recursive=True)`` reads the stat file of every process
        on the machine. On Linux the kernel lists each thread's children in
        /proc/PID/task/TID/children, so walking our own tree reads one small file
        per thread in it instead: 5 files rather than 118 on the CI VM. Each file
        read gives the GIL away and back, which the training loop pays for (NOTE
        [ Sampling cost ]). Without those files (an old kernel, another OS): psutil.
        """
        pids = _linux_descendants(self.proc_root, proc.pid)
        if pids is None:
            return [c for c in proc.children(recursive=True) if c.pid not in self.exclude]
        known = {c.pid: c for c in self._children}
        found = []
        for pid in pids:
            if pid in self.exclude:
                continue
            child = known.get(pid)
            # The same process as the last reading's when its (pid, create time) was read
            # then (psutil keeps the create time it read first): no system call. Otherwise
            # is_running(), False for a reused pid too (~25 us of psutil per worker).
            if child is None or not (_same_process(child, self._last_children) or child.is_running()):
                try:
                    child = psutil.Process(pid)
                except _GONE:
                    continue  # exited since it was listed
            found.append(child)
        return found

    def _read_tree(self, now: float, dt: float,
                   relist: bool) -> tuple[float, int, float, int, int, float | None, float, list[int], list[float]]:
        """CPU % and RSS of the process and its descendants; updates the baselines.

        ``dt == 0`` only sets baselines. ``relist`` scans for new descendants
        (NOTE [ Sampling cost ]); otherwise the last list is read again. Returns (process_cpu, process_rss,
        children_cpu, n_children, children_rss, process_run_delay, children_run_delay, worker_pids,
        worker_cpu).
        """
        proc = self._proc
        if proc is None:
            self._pids = set()
            return 0.0, 0, 0.0, 0, 0, None, 0.0, [], []
        own_delay: float | None = None
        try:
            own = self._own_cpu_rss() if self._own else None
            if own is not None:
                cpu, rss = own
            elif self._own:
                with proc.oneshot():
                    cpu = _cpu_seconds(proc)
                    rss = int(proc.memory_info().rss)
            else:  # another process (the helper reads the training process): as its workers are read
                got = self._child_reading(proc)
                if got is None:
                    raise psutil.NoSuchProcess(proc.pid)
                _, cpu, rss, own_delay = got  # its schedstat read there too
            if relist:
                self._children = self._list_descendants(proc)
                listed = {c.pid for c in self._children} | {proc.pid}
                for pid in [pid for pid in self._child_files if pid not in listed]:
                    self._close_child(pid)
            children = self._children
        except _GONE as exc:
            self._note(f"process {self.pid}: {type(exc).__name__}")
            self._pids = set()
            return 0.0, 0, 0.0, 0, 0, None, 0.0, [], []
        process_cpu = _clamp_cpu(100.0 * (cpu - self._last_proc_cpu) / dt) if dt else 0.0
        self._last_proc_cpu = cpu
        if self._own:
            own_delay = _run_delay(self._schedstat_file)
        process_delay = None
        if own_delay is not None and self._last_own_delay is not None and dt:
            process_delay = min(1.0, max(0.0, (own_delay - self._last_own_delay) / dt))
        self._last_own_delay = own_delay

        wall_now = time.time()
        seen: dict[tuple[int, float], float] = {}
        delays: dict[tuple[int, float], float] = {}
        used = 0.0
        waited = 0.0
        children_rss = 0
        worker_pids: list[int] = []
        worker_cpu: list[float] = []
        scale = 100.0 / dt if dt else 0.0
        for child in children:
            got = self._child_reading(child)
            if got is None:
                continue  # exited between listing and reading
            key, c_cpu, c_rss, c_delay = got  # key: (pid, create time), which guards pid reuse
            seen[key] = c_cpu
            if c_delay is not None:
                delays[key] = c_delay
                last_delay = self._last_delay.get(key)
                if last_delay is not None:
                    waited += max(0.0, c_delay - last_delay)
            children_rss += c_rss  # RSS counts pages shared with the parent in each worker
            last = self._last_children.get(key)
            c_used = 0.0
            if last is not None:
                c_used = max(0.0, c_cpu - last)
            elif dt:
                # NOTE [ Short-lived loader workers ]
                lifetime = max(wall_now - key[1], 1e-9)
                c_used = c_cpu if lifetime <= dt else c_cpu * dt / lifetime
            used += c_used
            worker_pids.append(key[0])
            worker_cpu.append(round(c_used * scale, 2))  # 0.01% of a core: short JSON, sums within rounding
        self._last_children = seen
        self._last_delay = delays
        self._pids = {proc.pid, *(pid for pid, _ in seen)}
        children_cpu = max(0.0, 100.0 * used / dt) if dt else 0.0
        children_delay = waited / dt if dt else 0.0
        if worker_pids == self._worker_pids:
            worker_pids = self._worker_pids  # the same workers: one list for all their readings (memory)
        self._worker_pids = worker_pids
        return (process_cpu, rss, children_cpu, len(seen), children_rss, process_delay, children_delay,
                worker_pids, worker_cpu)

    def _child_reading(self, child: psutil.Process) -> tuple[tuple[int, float], float, int, float | None] | None:
        """((pid, create time), CPU seconds, RSS bytes, run-queue wait seconds or None) of a
        descendant, or None once it is gone.

        On Linux from its /proc/PID/stat and statm, kept open: two reads, where
        psutil's create_time, cpu_times and memory_info in a oneshot cost ~50 us of
        Python per worker per tick (8 sleeping children: a reading took ~400 us
        warm, ~80 us this way; NOTE [ Sampling cost ]). The figures are psutil's
        own: the create time is the boot time plus the start time in clock ticks,
        the RSS statm's resident pages (the rss field of stat comes from the
        kernel's per-CPU counters, and read ~0.4% under it). An exited worker not
        yet reaped (a zombie) still reads its final CPU time. Elsewhere, or when a
        file cannot be read, psutil.
        """
        files = self._child_files.get(child.pid)
        if files is None:
            where = self.proc_root / str(child.pid)
            files = self._child_files[child.pid] = (
                _ProcFile(where / "stat"), _ProcFile(where / "statm"), _ProcFile(where / "schedstat"))
        try:
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so the
            # fields are counted from the last ")": utime, stime are 14 and 15 and
            # starttime 22 (proc(5)), here at 11, 12 and 19.
            data = files[0].head(1024)
            fields = data[data.rfind(b")") + 2:].split()
            start = int(fields[19]) / _CLOCK_TICKS
            cpu = (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
            return (child.pid, self._boot_time + start), cpu, _statm_rss(files[1]), _run_delay(files[2])
        except (OSError, ValueError, IndexError):
            # Gone (its files read ESRCH once it exits: reopened by pid next time, a
            # reused pid being another process), or no /proc: psutil says which.
            self._close_child(child.pid)
        try:
            with child.oneshot():
                return (child.pid, child.create_time()), _cpu_seconds(child), int(child.memory_info().rss), None
        except _GONE:
            return None

    def _read_memory(self, pss: bool = True) -> tuple[int | None, int | None, int | None, int | None]:
        """PSS of the process and of its workers together (None when ``pss`` is False), and
        the kernel's count of OOM kills so far (Linux). PSS shares each page among the
        processes that map it, so a forked worker's pages shared with its parent are not
        counted once per worker, as RSS counts them. The kernel walks the page tables for
        it: within PSS_BUDGET; without ``pss``, the last PSS figures stand."""
        if not pss:
            return (*self._memory[:2], _vmstat_oom_kills(self._vmstat_file), self._limit_left())
        began = time.thread_time()
        pids = sorted(self._pids or ())
        read: dict[int, int | None] = {}
        for pid in pids:
            file = self._pss_files.get(pid)
            if file is None:
                file = self._pss_files[pid] = _ProcFile(self.proc_root / str(pid) / "smaps_rollup")
            read[pid] = _pss(file)
        for pid in [p for p in self._pss_files if p not in read]:
            self._pss_files.pop(pid).close()  # a worker gone
        cost = time.thread_time() - began
        self._next_pss = time.monotonic() + min(PSS_MAX_PERIOD, cost / PSS_BUDGET)
        own = read.get(self.pid)
        workers = [v for p, v in read.items() if p != self.pid]
        children = None if any(v is None for v in workers) else sum(v for v in workers if v is not None)
        return own, children, _vmstat_oom_kills(self._vmstat_file), self._limit_left()

    def _excluded_cpu(self, dt: float) -> float:
        """% of a core the excluded processes (loadprof's helper) used since the last
        reading: busy cores that are neither the job's nor another process's."""
        used = 0.0
        seen: dict[int, float] = {}
        for pid in self.exclude:
            try:
                seen[pid] = time.process_time() if pid == os.getpid() else _cpu_seconds(psutil.Process(pid))
            except _GONE:
                continue
            # first seen: all of it (the helper starts with the profile, its imports included)
            used += max(0.0, seen[pid] - self._last_excluded.get(pid, 0.0))
        self._last_excluded = seen
        return 100.0 * used / dt

    def _limit_left(self) -> int | None:
        """Bytes left under the tightest limit the process has below the host's memory:
        its address-space rlimit (RLIMIT_AS, against the address space it maps: an
        allocation past it fails though the host has memory free) or its cgroup v2's
        memory.max (against memory.current: containers). Read anew each time: a script
        may set its own limit after the profiler started."""
        left = []
        try:
            limit = _address_space_limit(self._limits_file.read())
            if limit is not None:
                left.append(limit - int(self._vm_file.head(256).split()[0]) * _PAGE_SIZE)
        except (OSError, ValueError, IndexError):
            pass
        if self._cgroup_files is None:
            self._cgroup_files = _cgroup_memory_files(self.proc_root, self.pid)
        if self._cgroup_files:
            try:
                limit_text = self._cgroup_files[0].head(64).strip()
                if limit_text != b"max":
                    left.append(int(limit_text) - int(self._cgroup_files[1].head(64)))
            except (OSError, ValueError):
                pass
        return max(0, min(left)) if left else None

    def _close_child(self, pid: int) -> None:
        for file in self._child_files.pop(pid):
            file.close()

    def _disk_read(self) -> int | None:
        # System-wide block-device reads. Page-cache hits and network filesystems
        # (NFS, FUSE object stores) do not show up here: a warm-cache loader reads 0.
        if self._disks:
            read = _proc_diskstats(self._diskstats_file, self._disks)
            if read is not None:
                return read
        try:
            io = psutil.disk_io_counters(perdisk=False)
        except (OSError, RuntimeError) as exc:
            self._note(f"disk I/O counters: {exc}")
            return None
        if io is None:
            self._note("disk I/O counters: not available on this system")
            return None
        return int(io.read_bytes)

    def _note(self, what: str) -> None:
        n = self._errors.get(what, 0)
        self._errors[what] = n + 1
        if n == 0:
            log.info("loadprof: host sampler: %s", what)


class _ProcFile:
    """A /proc file kept open and read again from offset 0, where the kernel
    regenerates it: one system call per reading instead of open, read and close
    (each ~100 us on the CI VM: NOTE [ Sampling cost ])."""

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


def _address_space_limit(limits: bytes) -> int | None:
    """The soft RLIMIT_AS in bytes from a /proc/PID/limits, or None when unlimited."""
    at = limits.index(b"Max address space")
    soft = limits[at + len(b"Max address space"):].split()[0]
    return None if soft == b"unlimited" else int(soft)


def _cgroup_memory_files(proc_root: Path, pid: int) -> tuple[_ProcFile, _ProcFile] | tuple[()]:
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
    return _ProcFile(folder / "memory.max"), _ProcFile(folder / "memory.current")


def _statm_rss(file: _ProcFile) -> int:
    """RSS bytes from a /proc/PID/statm: its second field, resident pages, as psutil
    reads it. OSError, ValueError or IndexError when it cannot be read."""
    return int(file.head(256).split()[1]) * _PAGE_SIZE


def _proc_stat(file: _ProcFile) -> tuple[tuple[float, float, float | None], dict[int, tuple[float, float]]] | None:
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
        total_all: tuple[float, float, float | None] | None = None
        percpu: dict[int, tuple[float, float]] = {}
        for line in lines:
            if not line.startswith(b"cpu"):
                break
            name, *fields = line.split()
            v = [float(x) for x in fields]
            # user nice system idle iowait irq softirq steal guest guest_nice (older kernels: fewer)
            busy, total, iowait = _account(sum(v), v[3], v[4] if len(v) > 4 else None, sum(v[8:10]))
            if name == b"cpu":
                total_all = (busy, total, iowait)
            else:
                percpu[int(name[3:])] = (busy, total)
    except (OSError, ValueError, IndexError):
        return None
    if total_all is None or not percpu:
        return None
    return total_all, percpu


def _cpu_lines_whole(head: bytes) -> bool:
    """Whether a head of /proc/stat holds every ``cpu`` line: the line after them has begun."""
    lines = head.split(b"\n")
    return lines[-1][:3] not in (b"cpu", b"cp", b"c", b"") or not all(line.startswith(b"cpu") for line in lines[:-1])


def _proc_meminfo(file: _ProcFile) -> tuple[float, int, int] | None:
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


def _proc_diskstats(file: _ProcFile, disks: frozenset[str]) -> int | None:
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
    return sectors * _SECTOR


def _linux_descendants(proc_root: Path, pid: int) -> list[int] | None:
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


def _pss(file: _ProcFile) -> int | None:
    """Proportional set size in bytes from /proc/PID/smaps_rollup (Linux 4.14+), or None."""
    try:
        data = file.read()
        at = data.index(b"\nPss:")
        return int(data[at + 5:].split(None, 1)[0]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        file.close()
        return None


def _vmstat_oom_kills(file: _ProcFile) -> int | None:
    """Processes the kernel's OOM killer has killed since boot (/proc/vmstat, Linux 4.13+)."""
    try:
        data = file.read()
        at = data.index(b"\noom_kill ")
        return int(data[at + 10:].split(None, 1)[0])
    except (OSError, ValueError, IndexError):
        return None


def _run_delay(file: _ProcFile) -> float | None:
    """Seconds a task has spent runnable but waiting for a CPU, from its schedstat
    (proc(5): time on CPU, time on a run queue, timeslices, in ns): the CPU contention
    it met, whoever caused it. None where the kernel has no schedstat."""
    try:
        return int(file.head(128).split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


def _same_process(child: psutil.Process, seen: dict[tuple[int, float], float]) -> bool:
    """Whether ``child`` is the process a reading keyed in ``seen`` by (pid, create time)."""
    try:
        return (child.pid, child.create_time()) in seen
    except _GONE:  # its create time could not be read when the object was made, nor now
        return False


def _cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def _busy_total(times: object) -> tuple[float, float]:
    busy, total, _ = _busy_total_iowait(times)
    return busy, total


def _busy_total_iowait(times: object) -> tuple[float, float, float | None]:
    fields = times._asdict()  # type: ignore[attr-defined]
    return _account(sum(fields.values()), fields.get("idle", 0.0), fields.get("iowait"),
                    fields.get("guest", 0.0) + fields.get("guest_nice", 0.0))


def _account(all_fields: float, idle: float, iowait: float | None, guest: float) -> tuple[float, float, float | None]:
    """(busy, total, iowait) from a CPU time line's sum and parts, psutil's or /proc/stat's."""
    # Same accounting as psutil.cpu_percent (and htop): guest time is already in
    # user/nice on Linux, and iowait is idle time, not busy time.
    total = all_fields - guest
    return total - idle - (iowait or 0.0), total, iowait


def _percent(now: tuple[float, float], last: tuple[float, float]) -> float:
    d_total = now[1] - last[1]
    if d_total <= 0:
        return 0.0
    return _clamp(100.0 * (now[0] - last[0]) / d_total)


def _clamp(pct: float) -> float:
    return min(100.0, max(0.0, pct))


def _clamp_cpu(pct: float) -> float:
    # % of one core: can exceed 100 for a multi-threaded process, never below 0.
    return max(0.0, pct)


def _affinity(pid: int) -> list[int]:
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
