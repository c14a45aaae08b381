"""Background sampling of GPUs (NVML) and of the host (psutil) during a profiled run.

One thread (``Sampler``) reads several sources (``NvmlSource``, ``HostSource``) at a
fixed interval into bounded buffers of ``loadprof.records`` samples; ``HostProcess``
takes the host readings in a helper process and hands them to that thread.

The names below are imported on first use (PEP 562), as in ``profiler/__init__.py``:
the helper process (``python -m loadprof.samplers.hostproc``) then loads only what
it reads the host with, not the thread and NVML modules, and its module is not
imported twice (once by this package, once as ``__main__``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loadprof.lazy import lazy_names

if TYPE_CHECKING:
    from loadprof.samplers.cores import cgroup_cpu_limit, usable_cores
    from loadprof.samplers.host import HostSource
    from loadprof.samplers.hostproc import HostProcess
    from loadprof.samplers.neighbours import Neighbours
    from loadprof.samplers.nvml import PCIE_EVERY, NvmlSource
    from loadprof.samplers.thread import THREAD_NAME, Sampler

#: public name -> the submodule that defines it
_WHERE = {
    "HostSource": "host", "cgroup_cpu_limit": "cores", "usable_cores": "cores",
    "HostProcess": "hostproc", "Neighbours": "neighbours",
    "PCIE_EVERY": "nvml", "NvmlSource": "nvml",
    "THREAD_NAME": "thread", "Sampler": "thread",
}

__all__ = [
    "PCIE_EVERY",
    "THREAD_NAME",
    "HostProcess",
    "HostSource",
    "Neighbours",
    "NvmlSource",
    "Sampler",
    "cgroup_cpu_limit",
    "usable_cores",
]


__getattr__, __dir__ = lazy_names(__name__, _WHERE, __all__)
