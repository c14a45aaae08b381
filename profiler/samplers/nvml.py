"""GPU readings through NVML: the only module in loadprof that imports ``pynvml``.

``pynvml`` comes from NVIDIA's ``nvidia-ml-py`` package. It is imported lazily,
on ``NvmlSource.start()``, so that importing loadprof never loads the NVML shared
library, and a machine without a GPU, driver or the package just reports
``status == "unavailable (<reason>)"``.

Every NVML call goes through ``NvmlSource._call``, which turns the library's own
errors (``pynvml.NVMLError`` and its per-code subclasses) into ``None`` readings,
counts them, and logs each (call, GPU, error) once. Nothing here raises into the
training run.

NOTE [ NVML and fork ]
DataLoader workers are forked from the training process and inherit this object
(but not the sampler thread). NVML state does not survive ``fork()`` in any
documented way, and ``nvmlInit``/``nvmlShutdown`` are reference counted per
process, so a child must neither read through the parent's handles nor call
``nvmlShutdown`` on the parent's behalf. We record the pid at ``start()``; in any
other process ``sample()`` returns ``[]`` and ``close()`` does nothing. The lock is
never taken in a child either: a fork that happened while the sampler thread held
it would leave it locked forever in the child.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Callable, Collection
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

from loadprof.records import GpuInfo, GpuSample

log = logging.getLogger("loadprof.samplers")

T = TypeVar("T")

#: ``nvmlDeviceGetPcieThroughput`` counts bytes over a 20 ms window and blocks for it,
#: so one RX + TX pair costs ~40 ms per GPU: at the default 0.1 s interval that would
#: be 40% of the sampler's time per GPU. PCIe traffic moves slowly compared with
#: utilisation, so we read it on every Nth sample only (the first sample included).
PCIE_EVERY = 10

# Errors after which a call is not retried on that GPU: the answer will not change
# during the run (per-process accounting needs root; MIG and consumer boards return
# NotSupported for several queries; older drivers lack some functions).
_PERMANENT = ("NVMLError_NotSupported", "NVMLError_FunctionNotFound", "NVMLError_NoPermission")
# Errors that mean the device itself is gone: stop sampling it, keep the others.
_LOST = ("NVMLError_GpuIsLost", "NVMLError_GpuNotFound", "NVMLError_ResetRequired")


class _Lost(Exception):
    """Raised inside ``NvmlSource`` when a GPU fell off the bus; carries NVML's message."""


class NvmlSource:
    """Static facts and periodic readings of every GPU NVML can see.

    GPU indices are NVML's, which enumerate all devices regardless of
    ``CUDA_VISIBLE_DEVICES``; ``process_memory_used`` tells which ones this
    process tree actually uses.
    """

    def __init__(self, *, pcie_every: int = PCIE_EVERY) -> None:
        if pcie_every < 1:
            raise ValueError(f"pcie_every must be >= 1, got {pcie_every}")
        self._pcie_every = pcie_every
        self._lock = threading.Lock()
        self._nv: ModuleType | None = None  # the pynvml module, once initialised
        self._pid: int | None = None  # process that called nvmlInit
        self._started = False
        self._closed = False
        self._status = "unavailable (not started)"
        self._gpus: list[GpuInfo] = []
        self._handles: dict[int, Any] = {}  # GPU index -> handle, for GPUs still sampled
        self._disabled: set[tuple[int, str]] = set()  # (GPU, call) not retried
        self._errors: dict[tuple[int, str, str], int] = {}  # (GPU, call, error) -> count
        self._lost: dict[int, str] = {}  # GPU index -> problem line
        self._n_samples = 0

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> None:
        """Import and initialise NVML and read static GPU facts. Never raises; idempotent."""
        with self._lock:
            if self._started or self._closed:
                return
            self._started = True
            self._pid = os.getpid()
            try:
                import pynvml
            except ImportError:
                # Also what ``sys.modules["pynvml"] = None`` produces.
                self._status = "unavailable (pynvml not installed)"
                return
            try:
                pynvml.nvmlInit()
            except pynvml.NVMLError as exc:
                # LibraryNotFound (no driver installed), DriverNotLoaded, NoPermission...
                self._status = f"unavailable ({exc})"
                return
            self._nv = pynvml
            atexit.register(self.close)
            try:
                count = pynvml.nvmlDeviceGetCount()
            except pynvml.NVMLError as exc:
                self._status = f"unavailable ({exc})"
                self._shutdown()
                return
            for index in range(count):
                self._open_gpu(pynvml, index)
            if not self._handles:
                self._status = "unavailable (no GPU)"
                self._shutdown()
                return
            self._status = "available"

    def _open_gpu(self, nv: ModuleType, index: int) -> None:
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
        except nv.NVMLError as exc:
            # e.g. NoPermission for a device hidden from this container by cgroups.
            self._note(index, "handle", exc)
            return
        try:
            name = self._call(index, "name", nv.nvmlDeviceGetName, handle)
            mem = self._call(index, "memory", nv.nvmlDeviceGetMemoryInfo, handle)
            cc = self._call(index, "compute_capability", nv.nvmlDeviceGetCudaComputeCapability, handle)
        except _Lost as lost:
            self._lost[index] = f"GPU {index} lost at start: {lost}"
            return
        if isinstance(name, bytes):  # older bindings return bytes, newer str
            name = name.decode("utf-8", "replace")
        self._gpus.append(
            GpuInfo(
                index=index,
                name=name if name is not None else f"GPU {index}",
                memory_total=int(mem.total) if mem is not None else 0,
                compute_capability=(int(cc[0]), int(cc[1])) if cc is not None else None,
            )
        )
        self._handles[index] = handle

    def close(self) -> None:
        """``nvmlShutdown`` if this process initialised NVML. Idempotent; no-op in a fork."""
        if self._pid is not None and os.getpid() != self._pid:
            return  # NOTE [ NVML and fork ]
        with self._lock:
            self._closed = True
            self._shutdown()

    def _shutdown(self) -> None:
        nv, self._nv = self._nv, None
        self._handles.clear()
        atexit.unregister(self.close)
        if nv is None:
            return
        try:
            nv.nvmlShutdown()
        except nv.NVMLError as exc:
            log.debug("nvmlShutdown failed: %s", exc)

    # -- readings ------------------------------------------------------------
    @property
    def status(self) -> str:
        """``"available"`` or ``"unavailable (<reason>)"``."""
        return self._status

    @property
    def reading(self) -> bool:
        """Whether a ``sample()`` now would read any GPU (NVML up, a GPU still present)."""
        return self._nv is not None and not self._closed and bool(self._handles) and os.getpid() == self._pid

    @property
    def gpus(self) -> list[GpuInfo]:
        """Static facts of each GPU opened at ``start()``."""
        return list(self._gpus)

    def sample(self, t: float, pids: Collection[int] = ()) -> list[GpuSample]:
        """One ``GpuSample`` per GPU still present. Never raises.

        ``pids`` is this process tree; the memory NVML attributes to those pids is
        summed into ``process_memory_used``.
        """
        if self._pid is None or os.getpid() != self._pid:
            return []  # not started, or in a forked child: NOTE [ NVML and fork ]
        with self._lock:
            nv = self._nv
            if nv is None or self._closed:
                return []
            with_pcie = self._n_samples % self._pcie_every == 0
            self._n_samples += 1
            out = []
            for index, handle in list(self._handles.items()):
                try:
                    out.append(self._sample_gpu(nv, index, handle, t, pids, with_pcie))
                except _Lost as lost:
                    del self._handles[index]
                    self._lost[index] = f"GPU {index} lost at t={t:.1f}s: {lost}"
                    log.warning("loadprof: %s; still sampling the others", self._lost[index])
            return out

    def _sample_gpu(
        self, nv: ModuleType, index: int, handle: Any, t: float, pids: Collection[int], with_pcie: bool
    ) -> GpuSample:
        s = GpuSample(t=t, index=index)
        util = self._call(index, "utilization", nv.nvmlDeviceGetUtilizationRates, handle)
        if util is not None:
            s.util_gpu = float(util.gpu)
            s.util_memory = float(util.memory)
        mem = self._call(index, "memory", nv.nvmlDeviceGetMemoryInfo, handle)
        if mem is not None:
            s.memory_used = int(mem.used)
            s.memory_total = int(mem.total)
        power = self._call(index, "power", nv.nvmlDeviceGetPowerUsage, handle)
        if power is not None:
            s.power_w = power / 1000.0  # NVML reports milliwatts
        energy = self._call(index, "energy", nv.nvmlDeviceGetTotalEnergyConsumption, handle)
        if energy is not None:
            s.energy_mj = int(energy)  # NotSupported before Volta: cost.py integrates power_w instead
        clock = self._call(index, "sm_clock", nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_SM)
        if clock is not None:
            s.sm_clock_mhz = int(clock)
        if with_pcie:
            rx = self._call(index, "pcie_rx", nv.nvmlDeviceGetPcieThroughput, handle, nv.NVML_PCIE_UTIL_RX_BYTES)
            tx = self._call(index, "pcie_tx", nv.nvmlDeviceGetPcieThroughput, handle, nv.NVML_PCIE_UTIL_TX_BYTES)
            s.pcie_rx_kbs = float(rx) if rx is not None else None
            s.pcie_tx_kbs = float(tx) if tx is not None else None
        if pids:
            s.process_memory_used = self._process_memory(nv, index, handle, pids)
        return s

    def _process_memory(self, nv: ModuleType, index: int, handle: Any, pids: Collection[int]) -> int | None:
        procs: list[Any] = []
        visible = False
        for call, fn in (
            ("compute_processes", nv.nvmlDeviceGetComputeRunningProcesses),
            ("graphics_processes", nv.nvmlDeviceGetGraphicsRunningProcesses),
        ):
            got = self._call(index, call, fn, handle)
            if got is not None:
                visible = True
                procs.extend(got)
        if not visible:
            return None
        ours = [p for p in procs if p.pid in pids]
        if not ours and procs and _none_in_our_pid_namespace(p.pid for p in procs):
            # Inside a container NVML reports host pids, which never match ours: we
            # cannot tell our usage from anyone else's, so say "unknown" rather than 0.
            self._note(index, "process_memory", "pids from NVML are not in this PID namespace")
            return None
        # usedGpuMemory is None where the driver cannot attribute memory (Windows WDDM).
        used = [p.usedGpuMemory for p in ours if p.usedGpuMemory is not None]
        if ours and not used:
            return None
        return int(sum(used))

    # -- errors --------------------------------------------------------------
    def _call(self, index: int, call: str, fn: Callable[..., T], *args: Any) -> T | None:
        """Run one NVML query; ``None`` when it failed. Raises ``_Lost`` if the GPU is gone."""
        if (index, call) in self._disabled:
            return None
        nv = self._nv
        assert nv is not None, "_call is only used between nvmlInit and nvmlShutdown"
        try:
            return fn(*args)
        except nv.NVMLError as exc:
            # Only the library's own errors are handled here; anything else (a bug, a
            # broken binding) goes up to the sampler thread, which records it.
            kind = type(exc).__name__
            if kind in _LOST:
                raise _Lost(str(exc)) from exc
            if kind in _PERMANENT:
                self._disabled.add((index, call))
            self._note(index, call, exc)
            return None

    def _note(self, index: int, call: str, error: object) -> None:
        key = (index, call, str(error))
        n = self._errors.get(key, 0)
        self._errors[key] = n + 1
        if n == 0:
            log.info("loadprof: NVML %s: %s on GPU %d", call, error, index)

    def problems(self) -> list[str]:
        """What NVML could not tell us: one line per (GPU, call, error) with counts, and lost GPUs."""
        if self._pid is not None and os.getpid() != self._pid:
            return self._problem_lines()  # never take the lock in a fork
        with self._lock:
            return self._problem_lines()

    def _problem_lines(self) -> list[str]:
        # Why NVML as a whole is unavailable is ``status``, not repeated here.
        lines = []
        for (index, call, error), n in sorted(self._errors.items()):
            times = f" ({n} times)" if n > 1 else ""
            lines.append(f"{call}: {error} on GPU {index}{times}")
        lines.extend(line for _, line in sorted(self._lost.items()))
        return lines


def _none_in_our_pid_namespace(pids: Any) -> bool:
    proc = Path("/proc")
    if not proc.is_dir():
        return False  # cannot tell off Linux; trust NVML's pids
    return not any((proc / str(pid)).exists() for pid in pids)
