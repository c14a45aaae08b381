"""NVML through a fake pynvml: what the NVML source reads, retries, reports and leaves
(the real module and hardware are in tests/integration/test_samplers.py)."""

from __future__ import annotations

import importlib
import inspect
import os
from pathlib import Path

import pytest

from loadprof.records import GpuSample
from loadprof.samplers import NvmlSource
from tests.conftest import started, two_gpus
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
