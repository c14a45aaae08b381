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
a zero "priming" reading; the rest, what it used between its start and the window
(workers fill their prefetch at once, before the next listing finds them), is the
job's too, kept with the reaped CPU below. A process that is gone cannot be read, but once its parent
has reaped it (a DataLoader joins its workers), the kernel adds its CPU time to the
parent's cutime and cstime (proc(5)): what those grew by in an interval, less the CPU
last read of the children that left in it, is the CPU they used after our last reading,
and all of it for a worker that lived between two listings and was never seen; it is kept
apart (``HostSample.reaped_cpu``: the job's, in no worker's figure). Without
it, an epoch's workers shorter than the listing period read as another process's load
(a quiet host called contended, 0.9 of 2 cores, with no process to name).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import psutil

from loadprof.heap import minor_faults
from loadprof.records import HostSample

from .cores import affinity
from .descendants import Descendants
from .procfs import (
    GONE,
    CpuTimes,
    ProcFile,
    busy_total,
    clamp,
    clamp_cpu,
    cpu_seconds,
    cpu_times_of,
    percent,
    proc_diskstats,
    proc_meminfo,
    proc_stat,
    run_delay,
    statm_rss,
)
from .threads import ThreadQueues
from .treememory import TreeMemory

log = logging.getLogger("loadprof.samplers")

_PROC_ROOT = Path("/proc")
_BLOCK_ROOT = Path("/sys/block")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc/PID/stat's time unit

# NOTE [ Sampling cost ]
# The sampler thread holds the GIL while it parses what it reads, and every file
# read hands the GIL away and back, which a training loop running Python waits on:
# what a tick costs the loop is mostly its system calls. So on Linux a reading
# takes /proc/stat, /proc/meminfo, /proc/diskstats and each worker's stat, statm
# and schedstat through descriptors kept open (``ProcFile``: one pread each),
# this process's CPU from its CPU clock, and lists the tree through the
# per-thread children files rather than psutil's scan of every process; psutil
# reads the rest, and everything elsewhere. The slow-changing readings are spread
# out: the tree is relisted every ``TREE_EVERY`` readings, memory, swap and disk
# every ``SLOW_EVERY`` (1 s each at 10 Hz, half a second apart), so a new loader
# worker is seen within a second, its CPU since creation still counted (NOTE
# [ Short-lived loader workers ]), and PSS within ``PSS_BUDGET`` (treememory.py). Profile takes
# these readings in a helper process (NOTE [ Host readings in a helper process ]
# in hostproc.py). The measured costs behind each choice are in docs/dev/overhead.md.
TREE_EVERY = 10
SLOW_EVERY = 10
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
        self._services: set[int] = set()  # the listed descendants that are a tracker's service
        #: where /proc is (tests point it elsewhere); unreadable -> psutil for everything
        self.proc_root = _PROC_ROOT if proc_root is None else proc_root
        self._descendants = Descendants(self.proc_root, exclude)
        #: where /sys/block is: its entries are the devices whose reads count
        self.block_root = _BLOCK_ROOT if block_root is None else block_root
        self._own = self.pid == os.getpid()  # this process: its CPU and RSS without psutil
        self._stat_file = ProcFile(self.proc_root / "stat")
        self._statm_file = ProcFile(self.proc_root / "self" / "statm")
        self._meminfo_file = ProcFile(self.proc_root / "meminfo")
        self._diskstats_file = ProcFile(self.proc_root / "diskstats")
        self._disks: frozenset[str] = frozenset()  # storage device names, listed at start()
        self._proc: psutil.Process | None = None
        self._cores: list[int] = []
        self._started = False
        self._last_wall = 0.0  # time.monotonic() of the previous reading
        self._last_percpu: dict[int, tuple[float, float]] = {}  # cpu id -> (busy, total)
        self._last_all = CpuTimes(0.0, 0.0, None, None)
        self._last_proc_cpu = 0.0
        self._last_children: dict[tuple[int, float], float] = {}  # (pid, create_time) -> cpu s
        # the process's reaped children's CPU seconds (cutime + cstime): NOTE [ Short-lived loader workers ]
        self._reaped: float | None = None
        self._last_reaped: float | None = None
        self._reaped_cpu = 0.0  # % of a core over the last window: HostSample.reaped_cpu
        self._faults: int | None = None  # the process's minor page faults so far
        self._last_faults: int | None = None
        self._last_excluded: dict[int, float] = {}  # excluded pid (our helper) -> cpu s
        self._worker_pids: list[int] = []  # the last reading's, shared by readings of the same workers
        self._last_disk_read: int | None = None
        self._last_slow_wall = 0.0
        self._pids: set[int] | None = None
        self._errors: dict[str, int] = {}
        self._children: list[psutil.Process] = []
        self._child_files: dict[int, tuple[ProcFile, ProcFile, ProcFile]] = {}  # pid -> its stat, statm, schedstat
        self._schedstat_file = ProcFile(self.proc_root / str(self.pid) / "schedstat")
        self._threads = ThreadQueues(self.proc_root, self.pid)  # its other threads' schedstat
        self._last_delay: dict[tuple[int, float], float] = {}  # (pid, create time) -> run-queue wait, s
        self._last_own_delay: float | None = None
        self._boot_time = 0.0  # seconds since the epoch: a /proc/PID/stat start time is counted from it
        self._n = 0  # readings taken, for the slower cadences (NOTE [ Sampling cost ])
        self._slow: tuple[float, int, int, float] = (0.0, 0, 0, 0.0)  # mem %, available, swap, disk B/s
        self._mem = TreeMemory(self.proc_root, self.pid)
        #: process PSS, workers' PSS summed, the kernel's OOM kills so far, bytes left
        #: under the process's own memory limit (None: unreadable or no limit)
        self._memory: tuple[int | None, int | None, int | None, int | None] = (None, None, None, None)

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> None:
        """Take the baseline readings the first sample is measured against. Idempotent."""
        if self._started:
            return
        self._started = True
        try:
            self._proc = psutil.Process(self.pid)
        except GONE as exc:
            self._note(f"process {self.pid}: {type(exc).__name__}")
        self._cores = affinity(self.pid)
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
        self._last_faults = self._faults
        self._threads.read(self._last_wall)
        self._last_disk_read = self._disk_read()

    def close(self) -> None:
        """Close the /proc files kept open. Idempotent; a later sample opens them again."""
        for file in (self._stat_file, self._statm_file, self._meminfo_file, self._diskstats_file, self._schedstat_file):
            file.close()
        self._mem.close()
        for pid in list(self._child_files):
            self._close_child(pid)
        self._threads.close()

    # -- readings ------------------------------------------------------------
    def sample(self, t: float, final: bool = False, listing: bool = False) -> HostSample:
        """One reading since the previous one (or since ``start()``). Never raises. The
        ``final`` one, at the run's end, reads memory and PSS whatever their cadence: what
        the workers copied by then (a run of seconds may have had one PSS read, early).
        ``listing``: the tree listed now whatever the cadence (a reading asked for between
        ticks: the workers alive then charged their CPU in it)."""
        if not self._started:
            self.start()
        now = time.monotonic()
        dt = max(now - self._last_wall, 1e-9)
        s = HostSample(t=t, window=dt)

        every, percpu = self._cpu_times()
        last_percpu = self._last_percpu
        s.cpu_per_core = [percent(percpu[i], last_percpu[i]) for i in self._cores if i in percpu and i in last_percpu]
        self._last_percpu = percpu

        last = self._last_all
        if every.total > last.total:
            # Linux only. The kernel's iowait can go backwards per CPU; clamp.
            if every.iowait is not None and last.iowait is not None:
                s.iowait_percent = clamp(100.0 * (every.iowait - last.iowait) / (every.total - last.total))
            if every.steal is not None and last.steal is not None:
                s.steal_percent = clamp(100.0 * (every.steal - last.steal) / (every.total - last.total))
        self._last_all = every

        self._n += 1
        relist = self._n % TREE_EVERY == 0 or self._n == 1 or listing
        (s.process_cpu, s.process_rss, s.children_cpu, s.n_children, s.children_rss,
         s.process_run_delay, s.children_run_delay, s.worker_pids, s.worker_cpu) = self._read_tree(
            now, dt, relist=relist)
        if relist or final:
            threads = self._threads.read(now)
            if threads is not None:
                s.threads_cpu, s.threads_run_delay = round(threads[0], 4), round(threads[1], 4)

        if self._n % SLOW_EVERY == SLOW_EVERY // 2 or self._n == 1 or final:
            mem_percent, available, swap, disk_bps = self._slow
            memory = proc_meminfo(self._meminfo_file)
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
            self._memory = self._mem.read(sorted(self._pids or ()), self._n > 1 and (final or self._mem.due(now)))
        s.memory_percent, s.memory_available, s.swap_used, s.disk_read_bps = self._slow
        s.process_pss, s.children_pss, s.oom_kills, s.memory_limit_left = self._memory
        s.worker_uss = self._mem.uss_of(s.worker_pids)
        if self._faults is not None and self._last_faults is not None:
            s.process_faults = max(0, self._faults - self._last_faults)
        self._last_faults = self._faults
        s.profiler_cpu = self._excluded_cpu(dt)
        s.reaped_cpu = self._reaped_cpu
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
    def _cpu_times(self) -> tuple[CpuTimes, dict[int, tuple[float, float]]]:
        """(all CPUs' times, {cpu id: (busy, total)}), in any one unit."""
        got = proc_stat(self._stat_file)
        if got is not None:
            return got
        percpu = {i: busy_total(c) for i, c in enumerate(psutil.cpu_times(percpu=True))}
        return cpu_times_of(psutil.cpu_times()), percpu

    def _own_cpu_rss(self) -> tuple[float, int] | None:
        """This process's CPU seconds and RSS bytes without psutil (Linux), or None."""
        try:
            rss = statm_rss(self._statm_file)
        except (OSError, ValueError, IndexError):
            return None
        times = os.times()
        self._reaped = times.children_user + times.children_system
        self._faults = minor_faults()
        return time.process_time(), rss

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
                    cpu = cpu_seconds(proc)
                    rss = int(proc.memory_info().rss)
            else:  # another process (the helper reads the training process): as its workers are read
                got = self._child_reading(proc)
                if got is None:
                    raise psutil.NoSuchProcess(proc.pid)
                _, cpu, rss, own_delay = got  # its schedstat read there too
            if relist:
                self._children = self._descendants.list(proc, self._children, self._last_children)
                self._services = {c.pid for c in self._children if self._descendants.kind(c) == "service"}
                listed = {c.pid for c in self._children} | {proc.pid}
                for pid in [pid for pid in self._child_files if pid not in listed]:
                    self._close_child(pid)
            children = self._children
        except GONE as exc:
            self._note(f"process {self.pid}: {type(exc).__name__}")
            self._pids = set()
            return 0.0, 0, 0.0, 0, 0, None, 0.0, [], []
        process_cpu = clamp_cpu(100.0 * (cpu - self._last_proc_cpu) / dt) if dt else 0.0
        self._last_proc_cpu = cpu
        if self._own:
            own_delay = run_delay(self._schedstat_file)
        process_delay = None
        if own_delay is not None and self._last_own_delay is not None and dt:
            process_delay = min(1.0, max(0.0, (own_delay - self._last_own_delay) / dt))
        self._last_own_delay = own_delay

        wall_now = time.time()
        last_reaped = self._last_reaped
        seen: dict[tuple[int, float], float] = {}
        delays: dict[tuple[int, float], float] = {}
        used = 0.0
        missed = 0.0  # first-seen children's CPU before this window (NOTE [ Short-lived loader workers ])
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
                missed += c_cpu - c_used
            used += c_used
            if key[0] in self._services:
                continue  # the job's CPU and memory, and no loader worker's
            worker_pids.append(key[0])
            worker_cpu.append(round(c_used * scale, 2))  # 0.01% of a core: short JSON, sums within rounding
        reaped, self._last_reaped = self._reaped, self._reaped
        if reaped is not None and last_reaped is not None and dt:
            # NOTE [ Short-lived loader workers ]: what reaped children used beyond our readings
            read = sum(c for key, c in self._last_children.items() if key not in seen)
            self._reaped_cpu = max(0.0, 100.0 * (reaped - last_reaped - read) / dt)
        else:
            self._reaped_cpu = 0.0
        if dt:
            self._reaped_cpu += 100.0 * missed / dt
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
        psutil's create_time, cpu_times and memory_info in a oneshot cost several
        times as much Python per worker per tick (NOTE [ Sampling cost ]; the figures
        in docs/dev/overhead.md). The values are psutil's
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
                ProcFile(where / "stat"), ProcFile(where / "statm"), ProcFile(where / "schedstat"))
        try:
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so the
            # fields are counted from the last ")": utime, stime are 14 and 15 and
            # starttime 22 (proc(5)), here at 11, 12 and 19.
            data = files[0].head(1024)
            fields = data[data.rfind(b")") + 2:].split()
            start = int(fields[19]) / _CLOCK_TICKS
            cpu = (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS
            if child.pid == self.pid:  # the training process read from the helper: its reaped children too
                self._reaped = (int(fields[13]) + int(fields[14])) / _CLOCK_TICKS
                self._faults = int(fields[7])  # minflt, field 10
            return (child.pid, self._boot_time + start), cpu, statm_rss(files[1]), run_delay(files[2])
        except (OSError, ValueError, IndexError):
            # Gone (its files read ESRCH once it exits: reopened by pid next time, a
            # reused pid being another process), or no /proc: psutil says which.
            self._close_child(child.pid)
        try:
            with child.oneshot():
                return (child.pid, child.create_time()), cpu_seconds(child), int(child.memory_info().rss), None
        except GONE:
            return None

    def _excluded_cpu(self, dt: float) -> float:
        """% of a core the excluded processes (loadprof's helper) used since the last
        reading: busy cores that are neither the job's nor another process's."""
        used = 0.0
        seen: dict[int, float] = {}
        for pid in self.exclude:
            try:
                seen[pid] = time.process_time() if pid == os.getpid() else cpu_seconds(psutil.Process(pid))
            except GONE:
                continue
            # first seen: all of it (the helper starts with the profile, its imports included)
            used += max(0.0, seen[pid] - self._last_excluded.get(pid, 0.0))
        self._last_excluded = seen
        return 100.0 * used / dt

    def _close_child(self, pid: int) -> None:
        for file in self._child_files.pop(pid):
            file.close()

    def _disk_read(self) -> int | None:
        # System-wide block-device reads. Page-cache hits and network filesystems
        # (NFS, FUSE object stores) do not show up here: a warm-cache loader reads 0.
        if self._disks:
            read = proc_diskstats(self._diskstats_file, self._disks)
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

