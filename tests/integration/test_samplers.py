"""Samplers: NVML through a fake pynvml (and the real one), psutil on this host, the thread."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
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

from loadprof.records import GpuSample, HostSample
from loadprof.samplers import (
    THREAD_NAME,
    HostProcess,
    HostSource,
    NvmlSource,
    Sampler,
    usable_cores,
)
from loadprof.samplers.hostproc import DRAIN_EVERY
from tests.fake_pynvml import (
    ERROR_CLASSES,
    ERROR_CODES,
    FakeGpu,
    FakeNvml,
    FakeProcess,
    NVMLError_DriverNotLoaded,
    NVMLError_LibraryNotFound,
    NVMLError_Timeout,
    uninstall_pynvml,
)

GiB = 2**30
MiB = 2**20
# Linux pid_max is at most 2**22, so this pid never exists.
NO_SUCH_PID = 2**22 + 4321


def two_gpus(**second: object) -> list[FakeGpu]:
    return [
        FakeGpu(
            name="NVIDIA H100 80GB HBM3",
            memory_total=80 * GiB,
            cc=(9, 0),
            util=lambda t: 90 if t < 5 else 15,
            mem_util=40,
            mem_used=lambda t: int((10 + t) * GiB),
            power_mw=350_000,
            sm_clock=1980,
            pcie_rx=12_000,
            pcie_tx=3_000,
        ),
        dataclasses.replace(
            FakeGpu(
                name=b"Tesla T4",
                memory_total=16 * GiB,
                cc=(7, 5),
                util=55,
                mem_util=20,
                mem_used=3 * GiB,
                power_mw=70_000,
                sm_clock=1590,
            ),
            **second,
        ),
    ]


def started(fake: FakeNvml, monkeypatch: pytest.MonkeyPatch, **kw: int) -> NvmlSource:
    fake.install(monkeypatch)
    nv = NvmlSource(**kw)
    nv.start()
    return nv


@pytest.fixture
def closing() -> Iterator[list[NvmlSource]]:
    sources: list[NvmlSource] = []
    yield sources
    for nv in sources:
        nv.close()


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


# -- the fake itself ------------------------------------------------------------------


def test_fake_pynvml_mirrors_real_names_codes_messages_and_signatures() -> None:
    real = importlib.import_module("pynvml")
    assert Path(real.__file__).name == "pynvml.py"  # nvidia-ml-py's, not the fake
    # Every code and class the fake has is the real one's; a release adding codes is fine.
    real_codes = {k: v for k, v in vars(real).items() if k.startswith("NVML_ERROR_")}
    assert ERROR_CODES.items() <= real_codes.items()
    real_classes = {
        k: v for k, v in vars(real).items() if k.startswith("NVMLError_") and isinstance(v, type)
    }
    assert set(ERROR_CLASSES) <= set(real_classes)
    for name, cls in ERROR_CLASSES.items():
        assert cls().value == real_classes[name]().value, name
    # Same messages where pynvml has its own table (the rest come from the C library).
    for code, message in real.NVMLError._errcode_to_string.items():
        name = type(real.NVMLError(code)).__name__
        if name in ERROR_CLASSES:
            assert str(ERROR_CLASSES[name]()) == message
    fake = FakeNvml()
    for name in ("NVML_CLOCK_SM", "NVML_PCIE_UTIL_RX_BYTES", "NVML_PCIE_UTIL_TX_BYTES"):
        assert getattr(fake.module, name) == getattr(real, name)
    for name, fn in vars(fake.module).items():
        if name.startswith("nvml") and callable(fn):
            real_params = list(inspect.signature(getattr(real, name)).parameters)
            assert list(inspect.signature(fn).parameters) == real_params, name


def test_fake_error_classes_behave_like_pynvml() -> None:
    fake = FakeNvml()
    err = fake.module.NVMLError(ERROR_CODES["NVML_ERROR_GPU_IS_LOST"])
    assert type(err).__name__ == "NVMLError_GpuIsLost"
    assert isinstance(err, fake.module.NVMLError)
    assert str(err) == "GPU is lost"


# -- NvmlSource with the fake ------------------------------------------------------------


def test_two_gpus_static_facts_and_scripted_values(monkeypatch: pytest.MonkeyPatch, closing: list[NvmlSource]) -> None:
    fake = FakeNvml(gpus=two_gpus())
    nv = started(fake, monkeypatch)
    closing.append(nv)

    assert nv.status == "available"
    assert [(g.index, g.name, g.memory_total, g.compute_capability) for g in nv.gpus] == [
        (0, "NVIDIA H100 80GB HBM3", 80 * GiB, (9, 0)),
        (1, "Tesla T4", 16 * GiB, (7, 5)),  # bytes from old bindings decoded
    ]
    fake.now = 2.0
    h100, t4 = nv.sample(2.0, {os.getpid()})
    assert h100 == GpuSample(
        t=2.0,
        index=0,
        util_gpu=90.0,
        util_memory=40.0,
        memory_used=12 * GiB,
        memory_total=80 * GiB,
        process_memory_used=0,  # visible process list, none of it ours
        power_w=350.0,  # NVML gives milliwatts
        sm_clock_mhz=1980,
        pcie_rx_kbs=12_000.0,
        pcie_tx_kbs=3_000.0,
        energy_mj=700_000,  # the energy counter: 350 W for 2 s
    )
    assert (t4.index, t4.util_gpu, t4.memory_used, t4.power_w, t4.sm_clock_mhz) == (1, 55.0, 3 * GiB, 70.0, 1590)
    assert nv.problems() == []


def test_values_that_change_over_time_are_followed(monkeypatch: pytest.MonkeyPatch, closing: list[NvmlSource]) -> None:
    fake = FakeNvml(gpus=two_gpus())
    nv = started(fake, monkeypatch)
    closing.append(nv)
    readings = []
    for t in (0.0, 4.0, 6.0):
        fake.now = t
        readings.append(nv.sample(t)[0])
    assert [s.util_gpu for s in readings] == [90.0, 90.0, 15.0]
    assert [s.memory_used for s in readings] == [10 * GiB, 14 * GiB, 16 * GiB]


@pytest.mark.parametrize(
    ("error", "reason"),
    [(NVMLError_LibraryNotFound, "NVML Shared Library Not Found"), (NVMLError_DriverNotLoaded, "Driver Not Loaded")],
)
def test_init_failure_makes_nvml_unavailable(monkeypatch: pytest.MonkeyPatch, error: type, reason: str) -> None:
    fake = FakeNvml(gpus=two_gpus(), init_error=error)
    nv = started(fake, monkeypatch)
    assert nv.status == f"unavailable ({reason})"
    assert nv.gpus == []
    assert nv.sample(0.0, {os.getpid()}) == []
    nv.close()
    assert fake.shutdown_calls == 0  # never shut down what we did not init


def test_pynvml_not_installed_makes_nvml_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    uninstall_pynvml(monkeypatch)
    nv = NvmlSource()
    nv.start()
    assert nv.status == "unavailable (pynvml not installed)"
    assert nv.sample(0.0) == []
    nv.close()


def test_no_gpu_is_unavailable_and_nvml_is_shut_down(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(gpus=[])
    nv = started(fake, monkeypatch)
    assert nv.status == "unavailable (no GPU)"
    assert nv.sample(0.0) == []
    assert fake.refcount == 0


def test_close_shuts_down_once_and_stops_sampling(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(gpus=two_gpus())
    nv = started(fake, monkeypatch)
    nv.start()  # a second start neither re-inits nor leaks a reference
    assert fake.init_calls == 1
    nv.close()
    nv.close()
    assert (fake.shutdown_calls, fake.refcount) == (1, 0)
    assert nv.sample(1.0) == []


def test_not_supported_power_is_none_reported_once_and_not_retried(
    monkeypatch: pytest.MonkeyPatch, closing: list[NvmlSource]
) -> None:
    fake = FakeNvml(gpus=two_gpus(not_supported={"power"}))
    nv = started(fake, monkeypatch)
    closing.append(nv)
    for i in range(5):
        h100, t4 = nv.sample(float(i))
        assert h100.power_w == 350.0
        assert t4.power_w is None
        assert t4.util_gpu == 55.0  # the rest of that GPU still sampled
    assert nv.problems() == ["power: Not Supported on GPU 1"]
    assert fake.calls["nvmlDeviceGetPowerUsage", 1] == 1
    assert fake.calls["nvmlDeviceGetPowerUsage", 0] == 5


def test_transient_error_is_retried_and_counted(monkeypatch: pytest.MonkeyPatch, closing: list[NvmlSource]) -> None:
    fake = FakeNvml(gpus=[FakeGpu(errors={"util": NVMLError_Timeout})])
    nv = started(fake, monkeypatch)
    closing.append(nv)
    samples = [nv.sample(float(i))[0] for i in range(3)]
    assert [s.util_gpu for s in samples] == [None, None, None]
    assert fake.calls["nvmlDeviceGetUtilizationRates", 0] == 3
    assert nv.problems() == ["utilization: Timeout on GPU 0 (3 times)"]


def test_gpu_lost_mid_run_stops_that_gpu_only(monkeypatch: pytest.MonkeyPatch, closing: list[NvmlSource]) -> None:
    fake = FakeNvml(gpus=two_gpus(lost_at=3.0))
    nv = started(fake, monkeypatch)
    closing.append(nv)
    seen = []
    for i in range(6):
        fake.now = t = 1.1 * i
        seen.append(sorted(s.index for s in nv.sample(t)))
    assert seen == [[0, 1], [0, 1], [0, 1], [0], [0], [0]]
    calls_after_loss = sum(n for (_, gpu), n in fake.calls.items() if gpu == 1)
    nv.sample(9.0)
    assert sum(n for (_, gpu), n in fake.calls.items() if gpu == 1) == calls_after_loss
    assert nv.problems() == ["GPU 1 lost at t=3.3s: GPU is lost"]


def test_gpu_lost_after_n_calls(monkeypatch: pytest.MonkeyPatch, closing: list[NvmlSource]) -> None:
    fake = FakeNvml(gpus=[FakeGpu(), FakeGpu(lost_after=2)])  # lost during start()'s static reads
    nv = started(fake, monkeypatch)
    closing.append(nv)
    assert nv.status == "available"
    assert [g.index for g in nv.gpus] == [0]
    assert [s.index for s in nv.sample(0.0)] == [0]
    assert nv.problems() == ["GPU 1 lost at start: GPU is lost"]


def test_pcie_is_read_every_nth_sample_only(monkeypatch: pytest.MonkeyPatch, closing: list[NvmlSource]) -> None:
    fake = FakeNvml(gpus=[FakeGpu(pcie_rx=5_000, pcie_tx=1_000)])
    nv = started(fake, monkeypatch, pcie_every=3)
    closing.append(nv)
    rx = [nv.sample(float(i))[0].pcie_rx_kbs for i in range(7)]
    assert rx == [5_000.0, None, None, 5_000.0, None, None, 5_000.0]
    assert fake.calls["nvmlDeviceGetPcieThroughput", 0] == 6  # RX and TX, 3 times


def test_process_memory_counts_our_pids_only(monkeypatch: pytest.MonkeyPatch, closing: list[NvmlSource]) -> None:
    me, worker, stranger = os.getpid(), os.getppid(), 1
    gpu = FakeGpu(
        processes=[(me, 2 * GiB), FakeProcess(worker, 512 * MiB), (stranger, 30 * GiB)],
        graphics_processes=[(me, 64 * MiB), (worker, None)],  # None: not attributable
    )
    fake = FakeNvml(gpus=[gpu, FakeGpu(processes=[(stranger, GiB)])])
    nv = started(fake, monkeypatch)
    closing.append(nv)
    ours, other_gpu = nv.sample(0.0, {me, worker})
    assert ours.process_memory_used == 2 * GiB + 512 * MiB + 64 * MiB
    assert other_gpu.process_memory_used == 0
    assert nv.sample(0.0, set())[0].process_memory_used is None  # no pids given: not asked


@pytest.mark.skipif(not Path("/proc/1").exists(), reason="needs Linux /proc")
def test_process_memory_unknown_when_nvml_pids_are_from_another_namespace(
    monkeypatch: pytest.MonkeyPatch, closing: list[NvmlSource]
) -> None:
    fake = FakeNvml(gpus=[FakeGpu(processes=[(NO_SUCH_PID, GiB)])])
    nv = started(fake, monkeypatch)
    closing.append(nv)
    assert nv.sample(0.0, {os.getpid()})[0].process_memory_used is None
    assert nv.problems() == ["process_memory: pids from NVML are not in this PID namespace on GPU 0"]


def test_process_memory_none_when_process_queries_not_supported(
    monkeypatch: pytest.MonkeyPatch, closing: list[NvmlSource]
) -> None:
    fake = FakeNvml(gpus=[FakeGpu(not_supported={"processes", "graphics_processes"})])
    nv = started(fake, monkeypatch)
    closing.append(nv)
    assert nv.sample(0.0, {os.getpid()})[0].process_memory_used is None


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
    time.sleep(0.5)
    s = host.sample(1.0)
    assert sorted(s.worker_pids) == sorted(host.pids() - {os.getpid()}) and len(s.worker_pids) == s.n_children
    cpu = dict(zip(s.worker_pids, s.worker_cpu, strict=True))
    (burner,) = [c.pid for c in psutil.Process(burner_tree.pid).children()]
    # the grandchild burns, its parent waits (how much the burner gets depends on the host's load)
    assert cpu[burner] > 5.0 and cpu[burner_tree.pid] < cpu[burner] / 3
    assert abs(sum(s.worker_cpu) - s.children_cpu) <= 0.005 * len(s.worker_cpu) + 1e-9  # rounded to 0.01
    again = host.sample(1.1)
    assert again.worker_pids is s.worker_pids  # the same workers: their readings share one list


def test_the_helper_sends_each_workers_cpu(burner_tree: subprocess.Popen[bytes]) -> None:
    # the burner's own child, not any two: other tests' processes may still be this one's children
    assert wait_until(lambda: len(psutil.Process(burner_tree.pid).children()) >= 1)
    (burner,) = [c.pid for c in psutil.Process(burner_tree.pid).children()]
    host = HostProcess()
    host.start(interval=0.02)
    try:
        got: list[HostSample] = []
        deadline = time.monotonic() + 10
        while len(got) < 6 and time.monotonic() < deadline:
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
    assert statistics.median(dict(zip(h.worker_pids, h.worker_cpu, strict=True))[burner] for h in late) > 20.0
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


def _proc_stat_text(ticks: dict[int, tuple[int, int]]) -> str:
    """A /proc/stat with the given per-CPU (busy, idle) ticks, and an aggregate line."""
    lines = []
    for cpu, (busy, idle) in ticks.items():
        # user nice system idle iowait irq softirq steal guest guest_nice
        lines.append(f"cpu{cpu} {busy} 0 0 {idle} 0 0 0 0 7 0")
    total_busy, total_idle = sum(b for b, _ in ticks.values()), sum(i for _, i in ticks.values())
    head = f"cpu  {total_busy} 0 0 {total_idle} 5 0 0 0 0 0"
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
    s = Sampler(interval=0.02, sources=(host,))
    began = time.perf_counter()
    s.start()
    try:
        assert wait_until(lambda: host.serving or host.problems() != [])
        assert host.problems() == []
        (helper,) = helper_pids()
        served_from = time.perf_counter() - began
        burn(0.4)  # this thread's CPU, read by the helper from outside
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
    assert statistics.median(h.process_cpu for h in late[:10]) > 50.0  # the burn, seen from the helper
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

    monkeypatch.setattr(host_module, "PSS_BUDGET", budget)
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
