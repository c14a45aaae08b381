"""A fake ``pynvml`` module for tests: scripted GPUs, injectable NVML errors.

Modelled on gpustat's tests: build a module object that answers the NVML calls
loadprof makes, and install it with ``monkeypatch.setitem(sys.modules, "pynvml", m)``
so that ``import pynvml`` inside the code under test gets it. Names, error codes,
error classes and messages mirror NVIDIA's ``nvidia-ml-py`` (``pynvml.py``);
``tests/integration/test_samplers.py`` checks that against the real module.

    from tests.fake_pynvml import FakeGpu, FakeNvml, NVMLError_NotSupported

    fake = FakeNvml(gpus=[
        FakeGpu(name="NVIDIA H100 80GB HBM3", memory_total=80 * 2**30, cc=(9, 0),
                util=lambda t: 90 if t < 5 else 10, mem_used=lambda t: int(t * 2**30),
                processes=[(os.getpid(), 2 * 2**30)]),
        FakeGpu(name=b"Tesla T4", memory_total=16 * 2**30, cc=(7, 5),
                not_supported={"power"}, lost_after=20),
    ])
    fake.install(monkeypatch)     # or FakeNvml(init_error=NVMLError_DriverNotLoaded)
    fake.now = 3.0                # the "t" passed to value callables (manual clock) ...
    FakeNvml(gpus=..., clock=time.monotonic)   # ... or real time since install()
    fake.calls["nvmlDeviceGetPowerUsage", 1]   # how often a call reached GPU 1
    uninstall_pynvml(monkeypatch)  # "pynvml not installed": import pynvml raises ImportError

Any value may be a constant or a callable of the fake time; a callable may raise
(an ``NVMLError_*`` or anything else) to script an error at a given moment.
"""

from __future__ import annotations

import math
import string
import sys
import types
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

NVML_SUCCESS = 0

#: ``NVML_ERROR_*`` codes, as in nvidia-ml-py's pynvml.py (and nvml.h).
ERROR_CODES: dict[str, int] = {
    "NVML_ERROR_UNINITIALIZED": 1,
    "NVML_ERROR_INVALID_ARGUMENT": 2,
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_NO_PERMISSION": 4,
    "NVML_ERROR_ALREADY_INITIALIZED": 5,
    "NVML_ERROR_NOT_FOUND": 6,
    "NVML_ERROR_INSUFFICIENT_SIZE": 7,
    "NVML_ERROR_INSUFFICIENT_POWER": 8,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9,
    "NVML_ERROR_TIMEOUT": 10,
    "NVML_ERROR_IRQ_ISSUE": 11,
    "NVML_ERROR_LIBRARY_NOT_FOUND": 12,
    "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
    "NVML_ERROR_CORRUPTED_INFOROM": 14,
    "NVML_ERROR_GPU_IS_LOST": 15,
    "NVML_ERROR_RESET_REQUIRED": 16,
    "NVML_ERROR_OPERATING_SYSTEM": 17,
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": 18,
    "NVML_ERROR_IN_USE": 19,
    "NVML_ERROR_MEMORY": 20,
    "NVML_ERROR_NO_DATA": 21,
    "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED": 22,
    "NVML_ERROR_INSUFFICIENT_RESOURCES": 23,
    "NVML_ERROR_FREQ_NOT_SUPPORTED": 24,
    "NVML_ERROR_ARGUMENT_VERSION_MISMATCH": 25,
    "NVML_ERROR_DEPRECATED": 26,
    "NVML_ERROR_NOT_READY": 27,
    "NVML_ERROR_GPU_NOT_FOUND": 28,
    "NVML_ERROR_INVALID_STATE": 29,
    "NVML_ERROR_RESET_TYPE_NOT_SUPPORTED": 30,
    "NVML_ERROR_UNKNOWN": 999,
}
globals().update(ERROR_CODES)

# Messages: pynvml's own table where it has one (checked against it in the tests);
# the real module asks the C library (nvmlErrorString) for the rest.
_MESSAGES: dict[int, str] = {
    1: "Uninitialized",
    2: "Invalid Argument",
    3: "Not Supported",
    4: "Insufficient Permissions",
    5: "Already Initialized",
    6: "Not Found",
    7: "Insufficient Size",
    8: "Insufficient External Power",
    9: "Driver Not Loaded",
    10: "Timeout",
    11: "Interrupt Request Issue",
    12: "NVML Shared Library Not Found",
    13: "Function Not Found",
    14: "Corrupted infoROM",
    15: "GPU is lost",
    16: "GPU requires restart",
    17: "The operating system has blocked the request.",
    18: "RM has detected an NVML/RM version mismatch.",
    20: "Insufficient Memory",
    999: "Unknown Error",
}

NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_CLOCK_VIDEO = 3
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1


class NVMLError(Exception):
    """Same shape as pynvml's: ``NVMLError(code)`` returns the per-code subclass."""

    _valClassMapping: dict[int, type[NVMLError]] = {}
    value: int

    def __new__(cls, value: int = ERROR_CODES["NVML_ERROR_UNKNOWN"]) -> NVMLError:
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML Error with code {self.value}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    __hash__ = Exception.__hash__


def _make_error_classes() -> dict[str, type[NVMLError]]:
    # Same naming rule as pynvml._extractNVMLErrorsAsClasses:
    # NVML_ERROR_GPU_IS_LOST -> NVMLError_GpuIsLost.
    classes = {}
    for err_name, code in ERROR_CODES.items():
        words = string.capwords(err_name.replace("NVML_ERROR_", ""), "_").replace("_", "")
        cls_name = "NVMLError_" + words

        def new(cls: type[NVMLError], *args: object, _code: int = code) -> NVMLError:
            return NVMLError.__new__(cls, _code)

        cls = type(cls_name, (NVMLError,), {"__new__": new, "__module__": __name__})
        NVMLError._valClassMapping[code] = cls
        classes[cls_name] = cls
    return classes


ERROR_CLASSES = _make_error_classes()
globals().update(ERROR_CLASSES)


def nvmlErrorString(result: int) -> str:
    return _MESSAGES.get(result, f"NVML Error with code {result}")


def nvmlExceptionClass(nvmlErrorCode: int) -> type[NVMLError]:
    return NVMLError._valClassMapping[nvmlErrorCode]


def nvml_error(code: int) -> NVMLError:
    """The error pynvml raises for ``code``, e.g. ``nvml_error(15)`` is a GpuIsLost."""
    return NVMLError(code)


# Short names for the device calls, usable in ``not_supported`` and ``errors``.
ALIASES: dict[str, str] = {
    "name": "nvmlDeviceGetName",
    "memory": "nvmlDeviceGetMemoryInfo",
    "utilization": "nvmlDeviceGetUtilizationRates",
    "util": "nvmlDeviceGetUtilizationRates",
    "power": "nvmlDeviceGetPowerUsage",
    "clock": "nvmlDeviceGetClockInfo",
    "pcie": "nvmlDeviceGetPcieThroughput",
    "processes": "nvmlDeviceGetComputeRunningProcesses",
    "graphics_processes": "nvmlDeviceGetGraphicsRunningProcesses",
    "cc": "nvmlDeviceGetCudaComputeCapability",
    "energy": "nvmlDeviceGetTotalEnergyConsumption",
}

Value = Any  # a constant, or a callable of the fake time returning one


@dataclass
class FakeProcess:
    """What ``nvmlDeviceGet*RunningProcesses`` returns: ``.pid`` and ``.usedGpuMemory``."""

    pid: int
    usedGpuMemory: int | None  # None where the driver cannot attribute memory (WDDM)
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass
class FakeGpu:
    """One scripted GPU. Values are constants or ``callable(t)``; units as NVML gives them."""

    name: str | bytes = "NVIDIA H100 80GB HBM3"  # bytes to mimic old bindings
    memory_total: int = 80 * 2**30  # bytes
    cc: tuple[int, int] = (9, 0)
    util: Value = 0  # % (utilization.gpu)
    mem_util: Value = 0  # % (utilization.memory)
    mem_used: Value = 0  # bytes
    power_mw: Value = 300_000  # milliwatts, as nvmlDeviceGetPowerUsage returns
    #: millijoules since the driver loaded (nvmlDeviceGetTotalEnergyConsumption); None: the
    #: integral of ``power_mw`` over the fake time, moving every ``energy_period`` seconds
    #: (an H100 measured: about every 100 ms). Pre-Volta boards: ``not_supported={"energy"}``.
    energy_mj: Value = None
    energy_period: float = 0.1
    sm_clock: Value = 1980  # MHz
    mem_clock: Value = 2619  # MHz
    pcie_rx: Value = 0  # KB/s
    pcie_tx: Value = 0  # KB/s
    #: compute processes: FakeProcess or (pid, used bytes), or a callable of t returning them
    processes: Value = ()
    graphics_processes: Value = ()
    #: calls (real names or ALIASES keys) that raise NVMLError_NotSupported
    not_supported: Collection[str] = ()
    #: call -> error (class or instance) raised on every call
    errors: Mapping[str, Any] = field(default_factory=dict)
    #: after this many device calls on this GPU, every call raises NVMLError_GpuIsLost
    lost_after: int | None = None
    #: from this fake time on, every call raises NVMLError_GpuIsLost
    lost_at: float | None = None


@dataclass(frozen=True)
class FakeHandle:
    fake_id: int
    index: int


class _Struct(types.SimpleNamespace):
    """Stands in for pynvml's ctypes structs (c_nvmlMemory_t, c_nvmlUtilization_t)."""


class FakeNvml:
    """A scripted NVML. ``module`` is the fake ``pynvml``; ``install`` puts it in place."""

    def __init__(
        self,
        gpus: Iterable[FakeGpu] = (),
        init_error: Any = None,
        clock: Callable[[], float] | None = None,
        driver_version: str = "550.54.15",
    ) -> None:
        self.gpus = list(gpus)
        self.init_error = init_error  # error class, instance or code raised by nvmlInit
        self.clock = clock
        self.driver_version = driver_version
        self.now = 0.0  # fake time when no clock is given
        self._t_start = clock() if clock is not None else 0.0
        self.refcount = 0  # NVML reference-counts init/shutdown per process
        self.init_calls = 0
        self.shutdown_calls = 0
        self.calls: Counter[tuple[str, int]] = Counter()  # (function, GPU) -> calls
        self._device_calls: Counter[int] = Counter()
        self._energy: dict[int, tuple[float, float]] = {}  # GPU -> (fake time, mJ) of the counter
        self.module = self._build_module()

    # -- installing --------------------------------------------------------------
    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
        """Make ``import pynvml`` return the fake for the rest of the test."""
        if self.clock is not None:
            self._t_start = self.clock()
        monkeypatch.setitem(sys.modules, "pynvml", self.module)
        return self

    def time(self) -> float:
        """The fake time that value callables receive."""
        return self.clock() - self._t_start if self.clock is not None else self.now

    def advance(self, dt: float) -> None:
        self.now += dt

    # -- the module ----------------------------------------------------------------
    def _build_module(self) -> types.ModuleType:
        m = types.ModuleType("pynvml")
        m.__file__ = __file__
        m.NVML_SUCCESS = NVML_SUCCESS
        for name, code in ERROR_CODES.items():
            setattr(m, name, code)
        m.NVMLError = NVMLError
        for name, cls in ERROR_CLASSES.items():
            setattr(m, name, cls)
        m.NVML_CLOCK_GRAPHICS = NVML_CLOCK_GRAPHICS
        m.NVML_CLOCK_SM = NVML_CLOCK_SM
        m.NVML_CLOCK_MEM = NVML_CLOCK_MEM
        m.NVML_CLOCK_VIDEO = NVML_CLOCK_VIDEO
        m.NVML_PCIE_UTIL_TX_BYTES = NVML_PCIE_UTIL_TX_BYTES
        m.NVML_PCIE_UTIL_RX_BYTES = NVML_PCIE_UTIL_RX_BYTES
        m.nvmlErrorString = nvmlErrorString
        m.nvmlExceptionClass = nvmlExceptionClass
        for fn in (
            self.nvmlInit,
            self.nvmlInitWithFlags,
            self.nvmlShutdown,
            self.nvmlSystemGetDriverVersion,
            self.nvmlDeviceGetCount,
            self.nvmlDeviceGetHandleByIndex,
            self.nvmlDeviceGetName,
            self.nvmlDeviceGetMemoryInfo,
            self.nvmlDeviceGetUtilizationRates,
            self.nvmlDeviceGetPowerUsage,
            self.nvmlDeviceGetClockInfo,
            self.nvmlDeviceGetPcieThroughput,
            self.nvmlDeviceGetComputeRunningProcesses,
            self.nvmlDeviceGetGraphicsRunningProcesses,
            self.nvmlDeviceGetCudaComputeCapability,
            self.nvmlDeviceGetTotalEnergyConsumption,
        ):
            setattr(m, fn.__name__, fn)
        return m

    # -- library calls -----------------------------------------------------------------
    def nvmlInitWithFlags(self, flags: int) -> None:
        self.init_calls += 1
        if self.init_error is not None:
            err = self.init_error
            raise NVMLError(err) if isinstance(err, int) else err
        self.refcount += 1

    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)

    def nvmlShutdown(self) -> None:
        self.shutdown_calls += 1
        self._check_init()
        self.refcount -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_init()
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._check_init()
        if not 0 <= index < len(self.gpus):
            raise NVMLError(ERROR_CODES["NVML_ERROR_INVALID_ARGUMENT"])
        return FakeHandle(id(self), index)

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str | bytes:
        return self._device(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: int | None = None) -> _Struct:
        gpu = self._device(handle, "nvmlDeviceGetMemoryInfo")
        used = int(self._value(gpu.mem_used))
        return _Struct(total=gpu.memory_total, used=used, free=gpu.memory_total - used)

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> _Struct:
        gpu = self._device(handle, "nvmlDeviceGetUtilizationRates")
        return _Struct(gpu=int(self._value(gpu.util)), memory=int(self._value(gpu.mem_util)))

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        return int(self._value(self._device(handle, "nvmlDeviceGetPowerUsage").power_mw))

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, type: int) -> int:
        gpu = self._device(handle, "nvmlDeviceGetClockInfo")
        if type in (NVML_CLOCK_SM, NVML_CLOCK_GRAPHICS):
            return int(self._value(gpu.sm_clock))
        if type == NVML_CLOCK_MEM:
            return int(self._value(gpu.mem_clock))
        raise NVMLError(ERROR_CODES["NVML_ERROR_INVALID_ARGUMENT"])

    def nvmlDeviceGetPcieThroughput(self, device: FakeHandle, counter: int) -> int:
        gpu = self._device(device, "nvmlDeviceGetPcieThroughput")
        if counter == NVML_PCIE_UTIL_RX_BYTES:
            return int(self._value(gpu.pcie_rx))
        if counter == NVML_PCIE_UTIL_TX_BYTES:
            return int(self._value(gpu.pcie_tx))
        raise NVMLError(ERROR_CODES["NVML_ERROR_INVALID_ARGUMENT"])

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[FakeProcess]:
        gpu = self._device(handle, "nvmlDeviceGetComputeRunningProcesses")
        return _processes(self._value(gpu.processes))

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: FakeHandle) -> list[FakeProcess]:
        gpu = self._device(handle, "nvmlDeviceGetGraphicsRunningProcesses")
        return _processes(self._value(gpu.graphics_processes))

    def nvmlDeviceGetCudaComputeCapability(self, handle: FakeHandle) -> tuple[int, int]:
        return self._device(handle, "nvmlDeviceGetCudaComputeCapability").cc

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeHandle) -> int:
        gpu = self._device(handle, "nvmlDeviceGetTotalEnergyConsumption")
        if gpu.energy_mj is not None:
            return int(self._value(gpu.energy_mj))
        # The power integral (trapezoids between calls), read at the counter's last update.
        period = gpu.energy_period
        t = self.time() if period <= 0 else period * math.floor(self.time() / period + 1e-9)
        last_t, energy = self._energy.get(handle.index, (0.0, 0.0))
        if t > last_t:
            power = (self._value_at(gpu.power_mw, last_t) + self._value_at(gpu.power_mw, t)) / 2
            energy += power * (t - last_t)  # mW x s = mJ
            self._energy[handle.index] = (t, energy)
        return int(energy)

    # -- behaviour shared by every device call ----------------------------------------
    def _check_init(self) -> None:
        if self.refcount <= 0:
            raise NVMLError(ERROR_CODES["NVML_ERROR_UNINITIALIZED"])

    def _device(self, handle: FakeHandle, fn: str) -> FakeGpu:
        self._check_init()
        if not isinstance(handle, FakeHandle) or handle.fake_id != id(self):
            raise NVMLError(ERROR_CODES["NVML_ERROR_INVALID_ARGUMENT"])
        gpu = self.gpus[handle.index]
        self.calls[fn, handle.index] += 1
        self._device_calls[handle.index] += 1
        lost = (gpu.lost_after is not None and self._device_calls[handle.index] > gpu.lost_after) or (
            gpu.lost_at is not None and self.time() >= gpu.lost_at
        )
        if lost:
            raise NVMLError(ERROR_CODES["NVML_ERROR_GPU_IS_LOST"])
        names = {ALIASES.get(n, n) for n in gpu.not_supported}
        if fn in names:
            raise NVMLError(ERROR_CODES["NVML_ERROR_NOT_SUPPORTED"])
        for key, err in gpu.errors.items():
            if ALIASES.get(key, key) == fn:
                raise err
        return gpu

    def _value(self, v: Value) -> Any:
        return v(self.time()) if callable(v) else v

    @staticmethod
    def _value_at(v: Value, t: float) -> float:
        return float(v(t) if callable(v) else v)


def _processes(items: Iterable[Any]) -> list[FakeProcess]:
    return [p if isinstance(p, FakeProcess) else FakeProcess(*p) for p in items]


def uninstall_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import pynvml`` raise ImportError, as when nvidia-ml-py is not installed."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
