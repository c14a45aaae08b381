"""Background sampling of GPUs (NVML) and of the host (psutil) during a profiled run.

One thread (``Sampler``) reads several sources (``NvmlSource``, ``HostSource``) at a
fixed interval into bounded buffers of ``profiler.records`` samples; ``HostProcess``
takes the host readings in a helper process and hands them to that thread.
"""

from __future__ import annotations

from profiler.samplers.host import HostSource, cgroup_cpu_limit, usable_cores
from profiler.samplers.hostproc import HostProcess
from profiler.samplers.nvml import PCIE_EVERY, NvmlSource
from profiler.samplers.thread import THREAD_NAME, Sampler

__all__ = [
    "PCIE_EVERY",
    "THREAD_NAME",
    "HostProcess",
    "HostSource",
    "NvmlSource",
    "Sampler",
    "cgroup_cpu_limit",
    "usable_cores",
]
