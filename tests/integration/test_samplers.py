"""Samplers: NVML through a fake pynvml (and the real one), psutil on this host, the thread."""

from __future__ import annotations

import itertools
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from loadprof.records import HostSample
from loadprof.samplers import (
    THREAD_NAME,
    HostProcess,
    HostSource,
    NvmlSource,
    Sampler,
    usable_cores,
)
from loadprof.samplers.hostproc import DRAIN_EVERY
from tests.conftest import started, two_gpus
from tests.fake_pynvml import (
    FakeGpu,
    FakeNvml,
)

GiB = 2**30
MiB = 2**20
# Linux pid_max is at most 2**22, so this pid never exists.
NO_SUCH_PID = 2**22 + 4321


def wait_until(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def in_forked_child(body: Callable[[], bool]) -> int:
    """Run ``body`` in a forked child; its exit status is 0 when body returned True."""
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            code = 0 if body() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_neither_samples_nor_shuts_down_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(gpus=two_gpus())
    nv = started(fake, monkeypatch)

    def child() -> bool:
        nv.close()
        return nv.sample(1.0) == [] and fake.shutdown_calls == 0

    assert in_forked_child(child) == 0
    assert len(nv.sample(1.0)) == 2  # the parent is unaffected
    nv.close()
    assert fake.shutdown_calls == 1


# -- NvmlSource with the real pynvml --------------------------------------------------


def test_real_pynvml_never_raises_and_reports_its_status() -> None:
    nv = NvmlSource()
    nv.start()
    try:
        samples = nv.sample(0.0, {os.getpid()})
        if nv.status == "available":
            assert len(samples) == len(nv.gpus) > 0
        else:  # this machine: no driver, no GPU
            assert nv.status.startswith("unavailable (")
            assert samples == []
            assert nv.gpus == []
    finally:
        nv.close()
        nv.close()


@pytest.mark.gpu
def test_real_gpu_samples_have_utilization_and_memory() -> None:
    nv = NvmlSource()
    nv.start()
    try:
        if nv.status != "available":
            pytest.skip(f"NVML {nv.status}")
        assert all(g.name and g.memory_total > 0 for g in nv.gpus)
        samples = nv.sample(0.0, {os.getpid()})
        assert [s.index for s in samples] == [g.index for g in nv.gpus]
        for s in samples:
            assert s.util_gpu is not None and 0 <= s.util_gpu <= 100
            assert s.memory_total is not None and s.memory_total > 0
            assert s.memory_used is not None and 0 <= s.memory_used <= s.memory_total
    finally:
        nv.close()


# -- HostSource -------------------------------------------------------------------------

# A parent that starts a CPU-burning grandchild and waits for it: DataLoader workers
# are children of the training process; this checks the tree is walked recursively.
# Both exit on their own after a few seconds even if the test is killed.
BURN = "import time\nend = time.time() + {secs}\nwhile time.time() < end: pass\n"
PARENT_OF_BURNER = (
    "import subprocess, sys\n"
    f"subprocess.run([sys.executable, '-c', {BURN.format(secs=6)!r}])\n"
)


@pytest.fixture
def burner_tree() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", PARENT_OF_BURNER])
    try:
        yield proc
    finally:
        try:
            grandchildren = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            grandchildren = []
        for p in grandchildren:  # processes this test started, by pid
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        proc.kill()
        proc.wait()


def test_children_cpu_counts_a_busy_grandchild(burner_tree: subprocess.Popen[bytes]) -> None:
    host = HostSource(pid=os.getpid())
    host.start()  # before the burner is seen: its first reading must not be a zero
    assert wait_until(lambda: len(psutil.Process(burner_tree.pid).children()) >= 1)
    time.sleep(0.5)
    s = host.sample(1.0)
    assert s.n_children >= 2
    assert s.children_cpu > 5.0  # one busy core reads ~100 alone; counted, not zero, on a shared box
    assert s.children_rss > 0
    assert burner_tree.pid in host.pids()
    assert os.getpid() in host.pids()


def test_each_workers_cpu_is_its_own_and_they_sum_to_the_workers_total(burner_tree: subprocess.Popen[bytes]) -> None:
    host = HostSource(pid=os.getpid())
    host.start()
    assert wait_until(lambda: len(psutil.Process(burner_tree.pid).children()) >= 1)
    host.sample(0.5)  # the parent's own start-up (its imports) is not what this test weighs
    time.sleep(1.0)
    s = host.sample(1.5)
    assert sorted(s.worker_pids) == sorted(host.pids() - {os.getpid()}) and len(s.worker_pids) == s.n_children
    cpu = dict(zip(s.worker_pids, s.worker_cpu, strict=True))
    (burner,) = [c.pid for c in psutil.Process(burner_tree.pid).children()]
    # the grandchild burns, its parent waits (how much the burner gets depends on the host's load)
    assert cpu[burner] > 5.0 and cpu[burner_tree.pid] < cpu[burner] / 3
    assert abs(sum(s.worker_cpu) - s.children_cpu) <= 0.005 * len(s.worker_cpu) + 1e-9  # rounded to 0.01
    again = host.sample(1.6)
    assert again.worker_pids is s.worker_pids  # the same workers: their readings share one list


def test_the_helper_sends_each_workers_cpu(burner_tree: subprocess.Popen[bytes]) -> None:
    # the burner's own child, not any two: other tests' processes may still be this one's children
    assert wait_until(lambda: len(psutil.Process(burner_tree.pid).children()) >= 1)
    (burner,) = [c.pid for c in psutil.Process(burner_tree.pid).children()]
    burner_cpu, began = psutil.Process(burner).cpu_times(), time.monotonic()
    host = HostProcess()
    host.start(interval=0.02)
    try:
        got: list[HostSample] = []
        deadline = time.monotonic() + 10
        while (len(got) < 6 or sum(h.window for h in got) < 0.5) and time.monotonic() < deadline:
            time.sleep(0.02)
            taken = host.sample(time.monotonic())  # the helper's readings, every DRAIN_EVERY intervals
            if host.serving:
                got += taken
        assert host.serving
        got += host.finish(time.monotonic())
    finally:
        host.close()
    assert host.problems() == []
    late = got[-5:]
    for h in late:
        assert {burner, burner_tree.pid} <= set(h.worker_pids) and len(h.worker_pids) == len(h.worker_cpu)
        assert abs(sum(h.worker_cpu) - h.children_cpu) <= 0.005 * len(h.worker_cpu) + 1e-9
    # /proc counts CPU in 10 ms ticks: over a 20 ms window a burner that gets part of a core on a
    # busy host reads 0% or 50%, so its CPU seconds over all the windows are what is held,
    # against what the burner got meanwhile as read here
    after, span = psutil.Process(burner).cpu_times(), time.monotonic() - began
    got_s = after.user + after.system - burner_cpu.user - burner_cpu.system
    seen_s = sum((dict(zip(h.worker_pids, h.worker_cpu, strict=True)).get(burner) or 0.0) / 100 * h.window
                 for h in got)
    # the windows cover part of the span: at that share of what the burner got, give or take
    # its ups and downs and two ticks
    covered = sum(h.window for h in got) / span
    assert got_s * covered / 2 - 0.02 <= seen_s <= got_s + 0.03, (seen_s, got_s, covered)
    assert late[1].worker_pids is late[0].worker_pids  # parsed from its lines, still one list for the same workers


def _own_statm(proc_root: Path) -> None:
    """A crafted /proc's self/statm: 50 resident pages."""
    (proc_root / "self").mkdir()
    (proc_root / "self" / "statm").write_text("9000 50 10 1 0 20 0\n")


def _pid_stat_text(pid: int, ppid: int, utime: int, stime: int, start: int, rss_pages: int) -> str:
    """A /proc/PID/stat line (proc(5)); the command name holds spaces and parentheses."""
    after = ["S", str(ppid), *["0"] * 9, str(utime), str(stime), *["0"] * 6, str(start), "1000000", str(rss_pages)]
    return f"{pid} (py (worker) 1) " + " ".join(after + ["0"] * 28) + "\n"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc as on Linux")
def test_host_reads_each_worker_from_its_proc_stat_file(tmp_path: Path) -> None:
    # NOTE [ Sampling cost ]: a worker's CPU, start time and RSS come from its
    # /proc/PID/stat and statm, not psutil's three calls. A real child (psutil lists
    # it) whose files under a crafted /proc say what it used.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        me = os.getpid()
        _own_statm(tmp_path)
        task = tmp_path / str(me) / "task" / str(me)
        task.mkdir(parents=True)
        (task / "children").write_text(f"{child.pid} ")
        (tmp_path / str(child.pid)).mkdir()
        stat, statm = tmp_path / str(child.pid) / "stat", tmp_path / str(child.pid) / "statm"
        ticks = os.sysconf("SC_CLK_TCK")
        stat.write_text(_pid_stat_text(child.pid, me, utime=300, stime=100, start=5 * ticks, rss_pages=1000))
        statm.write_text("9000 1000 10 1 0 20 0\n")
        host = HostSource(proc_root=tmp_path)
        before = time.monotonic()
        host.start()
        started = time.monotonic()
        # 0.2 s more CPU (utime and stime), more memory
        stat.write_text(_pid_stat_text(child.pid, me, utime=310 + ticks // 10, stime=110 + ticks // 10 - 20,
                                       start=5 * ticks, rss_pages=1490))
        statm.write_text("9000 1500 10 1 0 20 0\n")  # resident pages: statm's, as psutil's
        time.sleep(0.05)
        s0 = time.monotonic()
        s = host.sample(0.1)
        s1 = time.monotonic()
        host.close()
        assert (s.n_children, s.children_rss) == (1, 1500 * os.sysconf("SC_PAGE_SIZE"))
        assert 100 * 0.2 / (s1 - before) <= s.children_cpu <= 100 * 0.2 / (s0 - started)
        assert host.pids() == {me, child.pid}
        assert host.problems() == []
    finally:
        child.kill()
        child.wait()


# A parent of two sleeping children, which says "ready" once both have imported
# everything they will (their RSS no longer moves). All exit on their own.
PARENT_OF_SLEEPERS = (
    "import subprocess, sys\n"
    "kids = [subprocess.Popen([sys.executable, '-c', 'import time; print(1, flush=True); time.sleep(30)'],"
    " stdout=subprocess.PIPE) for _ in range(2)]\n"
    "for k in kids: k.stdout.readline()\n"
    "print('ready', flush=True)\n"
    "for k in kids: k.wait()\n"
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc as on Linux")
def test_host_worker_readings_agree_with_psutil() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT_OF_SLEEPERS], stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None and parent.stdout.readline() == b"ready\n"
        kids = psutil.Process(parent.pid).children()

        def rss() -> int:
            return sum(k.memory_info().rss for k in kids)

        host = HostSource(pid=parent.pid)
        host.start()
        low = rss()
        s = host.sample(0.1)
        high = rss()
        host.close()
        assert s.n_children == 2
        assert min(low, high) <= s.children_rss <= max(low, high)
        assert host.pids() == {parent.pid, *(k.pid for k in kids)}
        assert 0.0 <= s.children_cpu < 50.0  # asleep
    finally:
        try:
            for k in psutil.Process(parent.pid).children():  # processes this test started
                k.kill()
        except psutil.NoSuchProcess:
            pass
        parent.kill()
        parent.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc as on Linux")
def test_multiprocessings_resource_tracker_is_no_loader_worker() -> None:
    # a spawned worker or shared memory starts it; it lives as long as the process
    script = ("from multiprocessing import resource_tracker\nresource_tracker.ensure_running()\n"
              + PARENT_OF_SLEEPERS)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None and parent.stdout.readline() == b"ready\n"
        kids = psutil.Process(parent.pid).children()
        tracker = [k.pid for k in kids if "resource_tracker" in " ".join(k.cmdline())]
        assert len(kids) == 3 and len(tracker) == 1
        host = HostSource(pid=parent.pid)
        host.start()
        s = host.sample(0.1)
        host.close()
        assert s.n_children == 2 and tracker[0] not in s.worker_pids
        assert host.pids() == {parent.pid, *(k.pid for k in kids)} - set(tracker)
    finally:
        try:
            for k in psutil.Process(parent.pid).children():  # processes this test started
                k.kill()
        except psutil.NoSuchProcess:
            pass
        parent.kill()
        parent.wait()


def test_host_sample_fields_are_plausible() -> None:
    host = HostSource()
    host.start()
    # Burn CPU in this process for several scheduler ticks: with every core busy the
    # kernel counts CPU time only at ticks, and a shorter window can read no time at all.
    end = time.thread_time() + 0.05
    while time.thread_time() < end:
        pass
    s = host.sample(0.5)
    assert s.t == 0.5
    assert len(s.cpu_per_core) == affinity_count()
    assert all(0.0 <= c <= 100.0 for c in s.cpu_per_core)
    assert s.process_cpu > 0.0
    assert s.process_rss > 0
    assert 0.0 < s.memory_percent < 100.0 and s.memory_available > 0
    assert s.swap_used >= 0 and s.disk_read_bps >= 0.0
    if sys.platform.startswith("linux"):
        assert s.iowait_percent is not None and 0.0 <= s.iowait_percent <= 100.0
    assert host.problems() == []


def _proc_stat_text(ticks: dict[int, tuple[int, int]], steal: int = 0) -> str:
    """A /proc/stat with the given per-CPU (busy, idle) ticks, ``steal`` ticks on each, and an
    aggregate line."""
    lines = []
    for cpu, (busy, idle) in ticks.items():
        # user nice system idle iowait irq softirq steal guest guest_nice
        lines.append(f"cpu{cpu} {busy} 0 0 {idle} 0 0 0 {steal} 7 0")
    total_busy, total_idle = sum(b for b, _ in ticks.values()), sum(i for _, i in ticks.values())
    head = f"cpu  {total_busy} 0 0 {total_idle} 5 0 0 {steal * len(ticks)} 0 0"
    return "\n".join([head, *lines, "intr 1 2 3", "ctxt 4", ""])


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs CPU affinity")
def test_host_reads_proc_stat_and_statm_itself(tmp_path: Path) -> None:
    # NOTE [ Sampling cost ]: on Linux the hot readings come from /proc, read by hand.
    cores = sorted(os.sched_getaffinity(0))
    _own_statm(tmp_path)
    stat = tmp_path / "stat"
    stat.write_text(_proc_stat_text({c: (1000, 5000) for c in cores}))
    host = HostSource(proc_root=tmp_path)
    host.start()
    # 100 ticks pass on each usable core; core number k was busy for 10 * (k + 1) % 100 of them.
    # Guest time (the 7) is already in user time and is not counted twice.
    want = [10 * (k + 1) % 100 for k in range(len(cores))]
    stat.write_text(_proc_stat_text({c: (1000 + w, 5000 + 100 - w) for c, w in zip(cores, want, strict=True)}))
    s = host.sample(0.1)
    host.close()
    assert s.cpu_per_core == pytest.approx([float(w) for w in want])
    assert s.iowait_percent == 0.0
    assert s.process_rss == 50 * os.sysconf("SC_PAGE_SIZE")
    assert host.problems() == []


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs CPU affinity")
def test_the_hypervisors_steal_is_read_apart_and_is_no_ones_busy_core(tmp_path: Path) -> None:
    cores = sorted(os.sched_getaffinity(0))
    _own_statm(tmp_path)
    stat = tmp_path / "stat"
    stat.write_text(_proc_stat_text({c: (1000, 5000) for c in cores}, steal=400))
    host = HostSource(proc_root=tmp_path)
    host.start()
    # 100 ticks on each core: 50 this system's processes ran, 30 the hypervisor took, 20 idle
    stat.write_text(_proc_stat_text({c: (1050, 5020) for c in cores}, steal=430))
    s = host.sample(0.1)
    host.close()
    assert s.cpu_per_core == pytest.approx([50.0] * len(cores))
    assert s.steal_percent == pytest.approx(30.0)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs CPU affinity")
def test_host_reads_a_proc_stat_whose_cpu_lines_outgrow_the_first_read(tmp_path: Path) -> None:
    # 128 CPUs' lines and a long intr line: far past the first read's size, which is
    # sized for this machine's CPUs; the read grows until the cpu lines are whole.
    cores = sorted(os.sched_getaffinity(0))
    _own_statm(tmp_path)
    stat = tmp_path / "stat"

    def text(busy: int, idle: int) -> str:
        lines = _proc_stat_text({c: (1000 + busy, 5000 + idle) for c in range(128)})
        return lines.replace("intr 1 2 3", "intr " + " 0" * 20000)

    stat.write_text(text(0, 0))
    host = HostSource(proc_root=tmp_path)
    host.start()
    stat.write_text(text(30, 70))  # 100 ticks on every CPU, 30 of them busy
    s = host.sample(0.1)
    host.close()
    assert s.cpu_per_core == pytest.approx([30.0] * len(cores))
    assert host.problems() == []


_MEMINFO = """MemTotal:       16000000 kB
MemFree:         1000000 kB
MemAvailable:    4000000 kB
Buffers:          100000 kB
SwapCached:            0 kB
SwapTotal:       2000000 kB
SwapFree:        1500000 kB
"""


def _diskstats(sda: int, sda1: int, loop0: int) -> str:
    """A /proc/diskstats with the given sectors read: a disk, its partition, a loop device."""
    return (f"   8       0 sda 100 0 {sda} 50 7 0 8 9 0 60 60 0 0 0 0 0 0\n"
            f"   8       1 sda1 90 0 {sda1} 40 7 0 8 9 0 50 50 0 0 0 0 0 0\n"
            f"   7       0 loop0 5 0 {loop0} 1 0 0 0 0 0 1 1 0 0 0 0\n")


def test_host_reads_memory_and_disk_from_proc_itself(tmp_path: Path) -> None:
    # NOTE [ Sampling cost ]: /proc/meminfo and /proc/diskstats kept open; the reads of
    # the devices under /sys/block count (a partition's are already in its disk's).
    (tmp_path / "meminfo").write_text(_MEMINFO)
    (tmp_path / "diskstats").write_text(_diskstats(sda=1000, sda1=900, loop0=10))
    block = tmp_path / "block"
    (block / "sda").mkdir(parents=True)
    (block / "loop0").mkdir()
    host = HostSource(proc_root=tmp_path, block_root=block)
    host.start()
    (tmp_path / "diskstats").write_text(_diskstats(sda=1000 + 2048, sda1=900 + 2048, loop0=10 + 8))
    s = host.sample(0.1)  # the first sample reads the slow readings too
    host.close()
    assert s.memory_percent == pytest.approx(75.0)
    assert s.memory_available == 4_000_000 * 1024
    assert s.swap_used == 500_000 * 1024
    # (2048 + 8) sectors of 512 bytes since start(), over the few ms since then
    assert s.disk_read_bps > 0
    assert host._last_disk_read == (1000 + 2048 + 10 + 8) * 512
    assert host.problems() == []


@pytest.mark.skipif(not os.path.exists("/proc/diskstats"), reason="Linux /proc")
def test_host_disk_and_memory_readings_agree_with_psutil() -> None:
    host = HostSource()
    host.start()
    before = psutil.disk_io_counters(perdisk=False)
    ours = host._disk_read()
    after = psutil.disk_io_counters(perdisk=False)
    s = host.sample(0.1)
    vm = psutil.virtual_memory()
    host.close()
    if before is not None and after is not None:
        assert before.read_bytes <= ours <= after.read_bytes
    assert s.memory_percent == pytest.approx(vm.percent, abs=2.0)
    assert s.memory_available == pytest.approx(vm.available, rel=0.05)


def test_host_falls_back_to_psutil_without_proc(tmp_path: Path) -> None:
    host = HostSource(proc_root=tmp_path / "nothing-here")
    host.start()
    s = host.sample(0.1)
    host.close()
    assert len(s.cpu_per_core) == affinity_count()
    assert s.process_rss > 0 and s.memory_available > 0
    assert host.problems() == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="zombie status as on Linux")
def test_zombie_child_does_not_break_sampling() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        assert wait_until(lambda: psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE)
        host = HostSource()
        host.start()
        s = host.sample(0.1)  # the exited, unreaped child is skipped or read, never raised
        assert s.process_rss > 0
    finally:
        proc.wait()


def test_vanished_process_gives_empty_tree_and_a_problem() -> None:
    host = HostSource(pid=NO_SUCH_PID)
    host.start()
    s = host.sample(0.1)
    assert (s.process_cpu, s.n_children, s.process_rss) == (0.0, 0, 0)
    assert s.memory_available > 0  # system-wide fields still read
    assert host.pids() == set()
    assert host.problems() == [f"process {NO_SUCH_PID}: NoSuchProcess"]


# -- usable_cores -------------------------------------------------------------------------


def affinity_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@pytest.mark.parametrize(
    ("files", "limit"),
    [
        ({"cpu.max": "150000 100000\n"}, 2),  # v2, 1.5 CPUs rounds up
        ({"cpu.max": "50000 100000\n"}, 1),  # half a CPU is still at least one
        ({"cpu.max": "max 100000\n"}, None),  # v2, no quota
        ({}, None),  # nothing to read
        ({"cpu.cfs_quota_us": "150000\n", "cpu.cfs_period_us": "100000\n"}, 2),  # v1
        ({"cpu/cpu.cfs_quota_us": "100000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 1),  # v1 mount
        ({"cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n"}, None),  # v1, no quota
        ({"cpu.max": "garbage\n"}, None),
    ],
)
def test_usable_cores_honours_cgroup_quota(tmp_path: Path, files: dict[str, str], limit: int | None) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    expected = affinity_count() if limit is None else min(affinity_count(), limit)
    assert usable_cores(cgroup_root=tmp_path) == expected


def test_usable_cores_on_this_machine_is_within_affinity() -> None:
    assert 1 <= usable_cores() <= affinity_count()


# -- Sampler ---------------------------------------------------------------------------


def sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


def test_sampler_samples_at_once_and_stops_promptly(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(gpus=two_gpus())
    fake.install(monkeypatch)
    nv, host = NvmlSource(), HostSource()
    s = Sampler(interval=30.0, sources=(nv, host))  # far longer than the test
    s.start()
    try:
        assert wait_until(lambda: len(s.host_samples) >= 1)  # the immediate sample
        assert [t.daemon for t in sampler_threads()] == [True]
        began = time.monotonic()
        s.stop()
        assert time.monotonic() - began < 2.0
        assert sampler_threads() == []
        s.stop()  # harmless
        assert len(s.host_samples) == 2  # the immediate one and the final one
        assert len(s.gpu_samples) == 4
        assert s.stats["samples"] == 2 and s.stats["interval"] == 30.0
        assert s.stats["mean_sample_seconds"] > 0.0
    finally:
        s.stop()
        nv.close()


def test_a_host_reading_records_the_time_its_cpu_figures_cover() -> None:
    host = HostSource()
    before = time.monotonic()
    host.start()
    started = time.monotonic()
    time.sleep(0.05)
    s0 = time.monotonic()
    first = host.sample(0.0)
    s1 = time.monotonic()
    second = host.sample(0.1)
    s2 = time.monotonic()
    host.close()
    assert s0 - started <= first.window <= s1 - before  # since the baselines
    assert 0 < second.window <= s2 - s0  # since the first reading


def test_start_takes_the_first_host_reading_but_does_not_wait_for_the_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    # NOTE [ First reading before the loop ] in thread.py: the host part of the first
    # tick is done when start() returns; a GPU stuck in the driver does not hold it up.
    release = threading.Event()

    def stuck_in_driver(t: float) -> int:
        release.wait(10.0)
        return 40

    fake = FakeNvml(gpus=[FakeGpu(util=stuck_in_driver)])
    fake.install(monkeypatch)
    nv = NvmlSource()
    s = Sampler(interval=30.0, sources=(nv, HostSource()))
    began = time.monotonic()
    s.start()
    try:
        assert time.monotonic() - began < 5.0
        assert len(s.host_samples) == 1  # no waiting: it was taken before start() returned
        assert s.gpu_samples == []
        release.set()
        assert wait_until(lambda: len(s.gpu_samples) == 1)  # added to the same tick
        assert s.gpu_samples[0].t == s.host_samples[0].t and s.gpu_samples[0].util_gpu == 40
    finally:
        release.set()
        s.stop()
        nv.close()


def test_sampler_times_come_from_the_given_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = iter(range(100, 1000))
    s = Sampler(interval=0.001, sources=(HostSource(),), clock=lambda: float(next(ticks)), t0=100.0)
    s.start()
    assert wait_until(lambda: len(s.host_samples) >= 3)
    s.stop()
    times = [h.t for h in s.host_samples]
    assert times[:3] == [0.0, 1.0, 2.0]


def test_stop_before_start_is_harmless() -> None:
    s = Sampler(sources=(HostSource(),))
    s.stop()
    assert s.host_samples == [] and sampler_threads() == []


def test_a_source_that_raises_does_not_kill_the_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_binding(t: float) -> int:
        raise RuntimeError("binding exploded")

    fake = FakeNvml(gpus=[FakeGpu(util=broken_binding)])
    fake.install(monkeypatch)
    nv = NvmlSource()
    s = Sampler(interval=0.005, sources=(nv, HostSource()))
    s.start()
    try:
        assert wait_until(lambda: len(s.host_samples) >= 5)
        assert s.running
    finally:
        s.stop()
        nv.close()
    errors = s.stats["errors"]
    assert errors >= 5
    assert s.problems() == [f"NvmlSource: RuntimeError: binding exploded ({errors} times)"]
    assert s.gpu_samples == []  # the GPU reading was lost, the host ones were not


def test_decimation_keeps_memory_bounded_and_ticks_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(gpus=two_gpus())
    fake.install(monkeypatch)
    nv = NvmlSource()
    s = Sampler(interval=0.001, sources=(nv, HostSource()), max_samples=8)
    s.start()
    sizes = []
    try:
        while s.stats["samples"] < 24:
            sizes.append(len(s.host_samples))
            time.sleep(0.001)
    finally:
        s.stop()
        nv.close()
    assert max(sizes) < 8
    stats = s.stats
    assert stats["kept"] == len(s.host_samples) < 8
    assert stats["dropped"] == stats["samples"] - stats["kept"]
    assert stats["effective_interval"] >= 0.001 * 2**4  # one doubling per 4 new ticks
    gpu = s.gpu_samples
    assert len(gpu) == 2 * len(s.host_samples)  # whole ticks dropped, never one GPU of a tick
    assert [g.t for g in gpu[::2]] == [g.t for g in gpu[1::2]] == [h.t for h in s.host_samples]


def test_sampler_passes_the_process_tree_to_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(gpus=[FakeGpu(processes=[(os.getpid(), 3 * GiB), (1, 40 * GiB)])])
    fake.install(monkeypatch)
    nv = NvmlSource()
    with Sampler(interval=10.0, sources=(nv, HostSource())) as s:
        assert wait_until(lambda: len(s.gpu_samples) >= 1)
    nv.close()
    assert {g.process_memory_used for g in s.gpu_samples} == {3 * GiB}


def test_sampler_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="interval"):
        Sampler(interval=0)
    with pytest.raises(ValueError, match="max_samples"):
        Sampler(max_samples=1)
    with pytest.raises(TypeError, match="NvmlSource, HostSource or HostProcess"):
        Sampler(sources=(object(),))  # type: ignore[arg-type]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_stop_in_a_forked_child_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(gpus=two_gpus())
    fake.install(monkeypatch)
    nv = NvmlSource()
    s = Sampler(interval=0.01, sources=(nv, HostSource()))
    s.start()
    try:
        assert wait_until(lambda: len(s.host_samples) >= 2)

        def child() -> bool:
            before = len(s.host_samples)  # readable without the parent's lock
            began = time.monotonic()
            s.stop()
            nv.close()
            return (
                not s.running
                and time.monotonic() - began < 1.0
                and len(s.host_samples) == before  # no final sample taken in the child
                and fake.shutdown_calls == 0
            )

        assert in_forked_child(child) == 0
        n = len(s.host_samples)
        assert wait_until(lambda: len(s.host_samples) > n)  # the parent's thread goes on
        assert s.running
    finally:
        s.stop()
        nv.close()
    assert fake.shutdown_calls == 1


def test_on_tick_runs_on_the_sampler_thread_and_its_errors_cost_nothing_else() -> None:
    # Profile folds the timeline there (NOTE [ Events now, steps on read ] in timeline.py).
    seen: list[str] = []

    def on_tick() -> None:
        seen.append(threading.current_thread().name)
        if len(seen) == 2:
            raise RuntimeError("fold exploded")

    s = Sampler(interval=0.005, sources=(HostSource(),), on_tick=on_tick)
    s.start()
    try:
        assert wait_until(lambda: len(seen) >= 5)
        assert s.running
    finally:
        s.stop()
    assert THREAD_NAME in seen
    assert len(s.host_samples) >= 5
    assert s.problems() == ["Sampler: RuntimeError: fold exploded"]


# -- HostProcess: host readings in a helper process (NOTE [ Host readings in a helper process ]) --


def helper_pids() -> list[int]:
    """This process's helper processes that read the host, by their command line."""
    found = []
    for child in psutil.Process().children():
        try:
            if any("loadprof.samplers.hostproc" in part for part in child.cmdline()):
                found.append(child.pid)
        except psutil.Error:
            continue
    return found


def burn(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_host_readings_come_from_a_helper_process_that_is_no_worker_and_ends_with_the_run() -> None:
    host = HostProcess()
    began = time.perf_counter()
    s = Sampler(interval=0.02, sources=(host,), t0=began)  # a sample's t: perf_counter() - began
    s.start()
    try:
        assert wait_until(lambda: host.serving or host.problems() != [])
        assert host.problems() == []
        (helper,) = helper_pids()
        served_from = time.perf_counter() - began
        burn_from, cpu = time.perf_counter() - began, time.thread_time()
        burn(0.4)  # this thread's CPU, read by the helper from outside
        burn_to = time.perf_counter() - began
        share = 100 * (time.thread_time() - cpu) / (burn_to - burn_from)
        n = len(s.host_samples)
        assert wait_until(lambda: len(s.host_samples) > n + 3)  # handed over every DRAIN_EVERY intervals
        tree = host.pids()  # as the helper listed it
        assert os.getpid() in tree and helper not in tree  # it is no loader worker
    finally:
        s.stop()
    elapsed = time.perf_counter() - began
    samples = s.host_samples
    assert helper_pids() == []  # asked to stop, and gone
    assert s.problems() == []
    times = [h.t for h in samples]
    assert times == sorted(times) and 0.0 <= times[0] and times[-1] <= elapsed  # on the sampler's clock
    late = [h for h in samples if h.t > served_from + 0.05]
    assert len(late) >= 10
    # the burn, seen from the helper in the readings whose windows lie inside it: on a busy
    # host the thread gets less than a core, and the helper reads what it got (the
    # process's CPU, at least this thread's)
    inside = [h for h in samples if h.t - h.window >= burn_from and h.t <= burn_to]
    assert len(inside) >= 3, [(h.t, h.window) for h in samples]
    # in 10 ms ticks, a 20 ms window reads 0% or 50% of a thread that gets part of a core: the
    # windows' CPU seconds over their span, not a typical window, hold the share
    seen = sum(h.process_cpu * h.window for h in inside) / sum(h.window for h in inside)
    assert seen > share / 2, (share, [h.process_cpu for h in inside])
    assert all(h.window > 0 for h in late)


def test_a_helper_killed_mid_run_is_reported_and_the_thread_reads_the_host_instead() -> None:
    host = HostProcess()
    s = Sampler(interval=0.01, sources=(host,))
    s.start()
    try:
        assert wait_until(lambda: host.serving)
        (pid,) = helper_pids()
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: not host.serving)
        n = len(s.host_samples)
        assert wait_until(lambda: len(s.host_samples) >= n + 5)  # one per tick again, from this process
    finally:
        s.stop()
    assert s.problems() == ["host sampler process ended mid-run (exit code -9); "
                            "host readings taken in the training process instead"]
    assert helper_pids() == []


@pytest.mark.parametrize(("executable", "problem"), [
    ("/nonexistent/python3", "could not be started (FileNotFoundError: "),
    ("/bin/false", "ended before its first reading (exit code 1)"),
])
def test_a_helper_that_cannot_start_costs_no_reading(
    monkeypatch: pytest.MonkeyPatch, executable: str, problem: str
) -> None:
    monkeypatch.setattr(sys, "executable", executable)
    host = HostProcess()
    s = Sampler(interval=0.01, sources=(host,))
    s.start()
    try:
        assert wait_until(lambda: len(s.host_samples) >= 10)
    finally:
        s.stop()
    (line,) = s.problems()
    assert line.startswith(f"host sampler process {problem}")
    assert line.endswith("host readings taken in the training process instead")
    times = [h.t for h in s.host_samples]
    assert times == sorted(times) and len(times) >= 10


def test_without_the_helper_every_reading_is_taken_on_the_thread() -> None:
    host = HostProcess(helper=False)
    s = Sampler(interval=0.01, sources=(host,))
    s.start()
    try:
        assert wait_until(lambda: len(s.host_samples) >= 5)
        assert helper_pids() == [] and not host.serving
    finally:
        s.stop()
    assert s.problems() == []


def test_the_helper_follows_a_doubled_interval_and_its_readings_stay_bounded() -> None:
    host = HostProcess()
    s = Sampler(interval=0.005, sources=(host,), max_samples=16)
    s.start()
    try:
        assert wait_until(lambda: host.serving)
        assert wait_until(lambda: s.stats["effective_interval"] >= 0.04)  # decimated three times
        time.sleep(0.5)
        recent = [h.t for h in s.host_samples if h.t > s.host_samples[-1].t - 0.3]
    finally:
        s.stop()
    assert len(s.host_samples) < 2 * 16
    gaps = [b - a for a, b in itertools.pairwise(recent)]
    assert gaps and statistics.median(gaps) >= 0.03  # the helper slowed down with the thread


def test_the_helper_leaves_when_the_training_process_dies_without_stopping_it(tmp_path: Path) -> None:
    script = tmp_path / "dies.py"
    script.write_text(
        "import os, sys, time\n"
        "from loadprof.samplers import HostProcess, Sampler\n"
        "host = HostProcess()\n"
        "s = Sampler(interval=0.01, sources=(host,))\n"
        "s.start()\n"
        "while not host.serving:\n"
        "    time.sleep(0.01)\n"
        "print(host._proc.pid, flush=True)\n"
        "os._exit(0)  # no stop(), no atexit\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(root)}, check=True)
    pid = int(out.stdout.split()[-1])
    assert wait_until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)


def test_with_the_helper_serving_and_no_gpu_read_the_thread_waits_a_drain_between_ticks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # NOTE [ A tick a second ] in samplers/thread.py: the helper reads at every interval,
    # the thread waits DRAIN_EVERY intervals between ticks, and one again once the
    # helper is gone or a GPU is read. Judged by the period the thread waits, not by
    # counting wakes against the clock.
    host = HostProcess()
    s = Sampler(interval=0.01, sources=(host,))
    assert s.period == pytest.approx(0.01)  # the helper not serving yet: the thread reads the host
    s.start()
    try:
        assert wait_until(lambda: host.serving)
        assert s.period == pytest.approx(0.01 * DRAIN_EVERY)
        assert wait_until(lambda: len(s.host_samples) > 3)  # the helper's readings arrive
        (pid,) = helper_pids()
        os.kill(pid, signal.SIGKILL)
        assert wait_until(lambda: not host.serving)
        assert s.period == pytest.approx(0.01)
    finally:
        s.stop()

    fake = FakeNvml(gpus=two_gpus())
    fake.install(monkeypatch)
    nv = NvmlSource()
    host = HostProcess()
    s = Sampler(interval=0.01, sources=(nv, host))
    s.start()
    try:
        assert wait_until(lambda: host.serving)
        assert s.period == pytest.approx(0.01)  # a GPU is read at every interval
    finally:
        s.stop()
        nv.close()


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="PSS needs Linux's smaps_rollup")
@pytest.mark.parametrize("budget, rereads", [(1e9, True), (1e-9, False)])
def test_pss_is_read_again_only_within_its_cpu_budget(monkeypatch, budget, rereads):
    # A budget nothing exceeds: read at every slow reading; one any read exceeds: the
    # figures stand for PSS_MAX_PERIOD, while RSS, read every time, follows the memory.
    from loadprof.samplers import host as host_module
    from loadprof.samplers import treememory

    monkeypatch.setattr(treememory, "PSS_BUDGET", budget)
    src = HostSource()
    src.start()
    before = [src.sample(float(i)) for i in range(host_module.SLOW_EVERY)][-1]
    assert before.process_pss
    block = b"x" * (256 * 2**20)  # written, so resident
    after = [src.sample(float(i)) for i in range(host_module.SLOW_EVERY)][-1]
    src.close()
    assert after.process_rss - before.process_rss > 200 * 2**20
    assert (after.process_pss - before.process_pss > 200 * 2**20) is rereads
    del block


def test_the_processs_other_threads_are_read_on_a_cpu_and_queued() -> None:
    """A loader working on the process's own threads (tf.data's) is read from each thread's
    schedstat, the main thread left out: here one thread spinning while the main one sleeps."""
    host = HostSource(pid=os.getpid())
    host.start()
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    time.sleep(0.6)
    s = host.sample(1.0, final=True)
    stop.set()
    spinner.join()
    assert s.threads_cpu is not None and s.threads_run_delay is not None, s
    assert s.threads_cpu > 0.05  # one busy thread reads ~1 core alone; counted, not zero, on a loaded box
    assert s.threads_run_delay >= 0.0
    between = host.sample(1.1)  # a reading between two of the threads' reads carries none
    assert between.threads_cpu is None and between.threads_run_delay is None
