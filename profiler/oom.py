"""Out-of-memory errors recognised from what a training job dies of: pure, no I/O.

Each framework words its own: PyTorch's CUDA and MPS allocators and its CPU
allocator, TensorFlow's ResourceExhaustedError, NumPy's MemoryError, and a
DataLoader worker that died (re-raised in the training process, or gone without
a word when the kernel's OOM killer sent it SIGKILL). ``classify`` reads the
exception's type name and message, as the session records them ("Type: first
line"), so a saved run is classified the same way later.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .units import size_text

__all__ = ["OutOfMemory", "WorkerDeath", "classify", "describe", "parse_size", "record_line", "worker_death"]


@dataclass(frozen=True)
class OutOfMemory:
    #: "cuda", "mps", "cpu-allocator", "tensorflow-gpu", "tensorflow-cpu", "numpy",
    #: "memory" (a bare MemoryError), "worker" (an error re-raised from a loader worker),
    #: "worker-died" (a loader worker that exited without a word), "shared-memory" (a loader
    #: worker that found /dev/shm full: SIGBUS, or "No space left on device" re-raised)
    kind: str
    device: str  # "gpu" or "host"
    requested_bytes: int | None  # the allocation that failed, when the message says
    message: str
    worker: str | None = None  # the worker's index or pid, for the worker kinds


_UNITS = {"": 1, "B": 1, "BYTES": 1, "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "PIB": 2**50, "EIB": 2**60}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGTPE]i?B|B|bytes)\b", re.IGNORECASE)
#: bytes per element of TensorFlow's dtype names, as its OOM message writes them
_TF_DTYPES = {"float": 4, "double": 8, "half": 2, "bfloat16": 2, "int8": 1, "uint8": 1, "int16": 2,
              "uint16": 2, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "bool": 1, "complex64": 8,
              "complex128": 16}


def parse_size(text: str) -> int | None:
    """Bytes of the first size written in ``text`` ("20.00 GiB", "4096 bytes"), or None.
    MB and GB count as powers of two, as PyTorch's MPS message means them."""
    found = _SIZE.search(text)
    if not found:
        return None
    unit = found.group(2).upper()
    scale = _UNITS.get(unit if unit.endswith("IB") or unit in ("B", "BYTES") else unit[0] + "IB")
    return int(float(found.group(1)) * scale) if scale else None


def record_line(exc: BaseException) -> str:
    """How a run records the error it ended with: "Type: first line of its message",
    and its last line after " ... " when it has more (a loader worker's error re-raised
    in the training process ends with the original error's own line)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[0][:300] + (f" ... {lines[-1][:300]}" if len(lines) > 1 else "")
    return f"{type(exc).__name__}: {text}"


def classify(line: str) -> OutOfMemory | None:
    """The out-of-memory error in a recorded line ("Type: message", ``record_line``), or
    None when it is not one."""
    name, sep, message = line.partition(": ")
    if not sep or not name.isidentifier():  # a bare message (runs saved before the type was kept)
        name, message = "", line
    text = message
    low = text.lower()
    if name in ("OutOfMemoryError",) or low.startswith("cuda out of memory"):
        return OutOfMemory("cuda", "gpu", _tried(text), text)
    if "mps backend out of memory" in low:
        return OutOfMemory("mps", "gpu", _tried(text), text)
    if "defaultcpuallocator: can't allocate memory" in low:
        got = re.search(r"allocate (\d+) bytes", text)
        return OutOfMemory("cpu-allocator", "host", int(got.group(1)) if got else None, text)
    if name == "ResourceExhaustedError" or "oom when allocating tensor" in low:
        device = "gpu" if re.search(r"device:GPU", text) else "host"
        return OutOfMemory(f"tensorflow-{'gpu' if device == 'gpu' else 'cpu'}", device, _tf_bytes(text), text)
    caught = re.match(r"Caught (\w+) in DataLoader worker process (\d+)", text)
    shm = _shared_memory(text, low, caught.group(2) if caught else None)
    if shm is not None:
        return shm
    if caught and caught.group(1) in ("MemoryError", "_ArrayMemoryError", "OutOfMemoryError"):
        at = text.find("Unable to allocate")
        return OutOfMemory("worker", "host", parse_size(text[at:]) if at >= 0 else None, text, worker=caught.group(2))
    died = worker_death(text)
    if died is not None and died.could_be_oom:
        return OutOfMemory("worker-died", "host", None, text, worker=died.worker)
    if name in ("MemoryError", "_ArrayMemoryError"):
        kind = "numpy" if "Unable to allocate" in text else "memory"
        return OutOfMemory(kind, "host", parse_size(text) if kind == "numpy" else None, text)
    return None


@dataclass(frozen=True)
class WorkerDeath:
    """A loader worker that died without raising, as torch reports it."""

    worker: str  # its pid, or pids
    exit_code: int | None  # "exited unexpectedly with exit code N"
    signal: str | None  # "is killed by signal: NAME" (strsignal's words, "Segmentation fault")

    @property
    def could_be_oom(self) -> bool:
        """The kernel's OOM killer sends SIGKILL; an exit code or any other signal is a crash
        of another kind. torch's liveness check ("exited unexpectedly") says neither."""
        return self.exit_code is None and self.signal in (None, "Killed")

    def what(self) -> str:
        if self.exit_code is not None:
            return f"loader worker (pid {self.worker}) exited with status {self.exit_code}"
        if self.signal is not None:
            return f"loader worker (pid {self.worker}) was killed by signal {self.signal}"
        return f"loader worker (pid {self.worker}) died without an error"


_DIED = re.compile(r"DataLoader worker \(pids?(?:\(s\))? ([\d, ]+)\) (?:exited unexpectedly"
                   r"(?: with exit code (-?\d+))?|is killed by signal: ([A-Za-z][\w ]*?)\s*(?:\.|\(|$))")


def worker_death(text: str) -> WorkerDeath | None:
    """The worker death in a line of torch's (``RuntimeError: DataLoader worker (pid 12) is
    killed by signal: Segmentation fault.``), or None. A SIGBUS is /dev/shm's
    (``_shared_memory``)."""
    found = _DIED.search(text)
    if found is None:
        return None
    code = found.group(2)
    return WorkerDeath(found.group(1).strip(), int(code) if code is not None else None, found.group(3))


def _shared_memory(text: str, low: str, worker: str | None) -> OutOfMemory | None:
    """A loader worker that ran out of /dev/shm: killed by SIGBUS touching a shared-memory
    page that tmpfs could not back (PyTorch's C++ worker watchdog), or its allocation of a
    shared-memory file refused (torch's "unable to allocate shared memory(shm) for file
    </torch_...>: No space left on device", re-raised in the training process)."""
    died = re.match(r"DataLoader worker \(pids?(?:\(s\))? ([\d, ]+)\) is killed by signal: Bus error", text)
    if died:
        return OutOfMemory("shared-memory", "host", None, text, worker=died.group(1).strip())
    if worker is not None and ("shared memory" in low or "/torch_" in text) and "no space left on device" in low:
        return OutOfMemory("shared-memory", "host", None, text, worker=worker)
    return None


def describe(oom: OutOfMemory) -> str:
    """One line for the report: what ran out, and the allocation that failed."""
    what = {
        "cuda": "CUDA out of memory", "mps": "MPS out of memory",
        "cpu-allocator": "PyTorch's CPU allocator could not allocate",
        "tensorflow-gpu": "TensorFlow ran out of GPU memory", "tensorflow-cpu": "TensorFlow ran out of host memory",
        "numpy": "NumPy could not allocate", "memory": "Python ran out of memory",
        "worker": f"loader worker {oom.worker} ran out of memory",
        "worker-died": f"loader worker (pid {oom.worker}) died without an error",
        "shared-memory": (f"loader worker (pid {oom.worker}) was killed by SIGBUS" if "Bus error" in oom.message
                          else f"loader worker {oom.worker} could not allocate shared memory (/dev/shm full)"),
    }[oom.kind]
    if oom.requested_bytes:
        what += f": {size_text(oom.requested_bytes)} requested"
    return what


def _tried(text: str) -> int | None:
    got = re.search(r"[Tt]ried to allocate ([\d.]+\s*\w+)", text)
    return parse_size(got.group(1)) if got else None


def _tf_bytes(text: str) -> int | None:
    got = re.search(r"shape\[([\d,\s]*)\] and type (\w+)", text)
    if not got:
        return None
    dims = [int(d) for d in got.group(1).replace(" ", "").split(",") if d]
    size = _TF_DTYPES.get(got.group(2))
    return math.prod(dims) * size if size else None


