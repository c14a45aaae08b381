"""Run a parse of a file we did not write in a child process that can be stopped.

NOTE [ Parsing HDF5 in a child process ]
libhdf5 parses a file's metadata in C. A corrupt object header can make it loop
for ever or crash the process: of 3,000 byte-flipped copies of two small files of
ours, one hung reading a root attribute (plain h5py hangs too) and one died of
SIGSEGV there. Python cannot interrupt C code, so ``loadprof inspect`` runs the
parse in a child process (``run_watched``): the child reports progress on a pipe
as it reads; the parent kills it when no report comes for ``stall`` seconds and
turns a crash (the child ended by a signal) into one line. The child's data
segment is limited (RLIMIT_DATA, Linux), so an allocation libhdf5 sizes from a
corrupt field fails as MemoryError instead of taking the machine's memory.

The child is a fork (about 10 ms) when this process runs no other Python thread:
only Python code takes the locks the child needs (h5py's, the import lock), and
threads of native pools (BLAS) take none of them. Otherwise it is a fresh
interpreter (about 0.5 s, numpy and h5py imported anew), since a fork taken while
another thread holds such a lock would deadlock the child and read as a corrupt
file. multiprocessing's spawn and forkserver are not used: they re-run the
caller's main script in the child. Without POSIX pipes and fork (Windows) the
target runs in this process, unwatched.

The readers used in training (HDF5Reader and the datasets on it) do the same for
their metadata parse when they open a file: see NOTE [ Reading HDF5 without
trusting libhdf5 ] in hdf5read.py. A ``run_watched`` inside a watched child runs its
target in place: the outer child is already one that can be stopped.

``stall`` defaults to ``LOADPROF_HDF5_STALL`` seconds when set (tests use 1-2 s),
else DEFAULT_STALL.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any, BinaryIO

from ..quietchild import quiet_child
from .errors import ConvertError

__all__ = ["run_watched", "DEFAULT_STALL", "default_stall", "memory_budget"]

# Seconds without a progress report before the child is taken for hung. A report
# comes after each block of at most 16 MiB read (hdf5read._BLOCK_BYTES): 30 s is under
# 1 MB/s, far below any disk, while a looping libhdf5 never reports again.
DEFAULT_STALL = 30.0
STALL_ENV = "LOADPROF_HDF5_STALL"
#: prctl(2): the signal a process gets when its parent ends (linux/prctl.h)
PR_SET_PDEATHSIG = 1

# Set in a watched child: its progress callback, which nested run_watched calls share.
_in_child: Callable[[int], None] | None = None


def default_stall() -> float:
    """``LOADPROF_HDF5_STALL`` seconds when set to a positive number, else DEFAULT_STALL."""
    try:
        value = float(os.environ.get(STALL_ENV, ""))
    except ValueError:
        return DEFAULT_STALL
    return value if value > 0 else DEFAULT_STALL

_LENGTH = struct.Struct("<Q")


def memory_budget(file_size: int) -> int:
    """Bytes the child may allocate beyond what it started with: 2 GiB plus twice the file.

    Reading needs at most the offsets (8 bytes a record, stored in the file) and a few
    16 MiB blocks, so a legitimate file of any size fits; sizes libhdf5 takes from a
    corrupt header do not.
    """
    return (2 << 30) + 2 * file_size


def _limit_memory(budget: int | None) -> None:
    if budget is None or not sys.platform.startswith("linux"):
        return
    import resource

    try:
        with open("/proc/self/status", encoding="ascii") as f:
            data = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmData:"))
        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        limit = data + budget
        if hard != resource.RLIM_INFINITY:
            limit = min(limit, hard)
        if soft == resource.RLIM_INFINITY or limit < soft:
            resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    except (OSError, ValueError, StopIteration):
        pass  # no /proc or no such limit here: run without one


def _send(out: BinaryIO, message: tuple[str, Any]) -> None:
    data = pickle.dumps(message)
    out.write(_LENGTH.pack(len(data)) + data)
    out.flush()


def _die_with(parent: int) -> None:
    """Have Linux SIGKILL this child when ``parent`` ends, however it ends: a parent killed
    with SIGKILL runs no handler, and a libhdf5 that loops would spin on alone."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # it ended before the request was made
        os._exit(1)


def _work(fd: int, target: Callable[..., Any], args: tuple[Any, ...], budget: int | None, parent: int) -> None:
    """The child's side: run ``target``, send progress and the outcome on ``fd``."""
    _die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # The parent's one line is the whole report: nothing of a crash dump or a library's
    # message goes to the terminal from here; nor does a collection here reach the heap a
    # fork inherited (a training process's, where the readers open their files).
    quiet_child()
    _limit_memory(budget)
    with open(fd, "wb", closefd=True) as out:

        def progress(done: int) -> None:
            _send(out, ("progress", done))

        global _in_child
        _in_child = progress
        try:
            result = target(*args, progress=progress)
        except ConvertError as exc:
            message: tuple[str, Any] = ("error", exc)
        except MemoryError:
            message = ("memory", None)
        except BaseException:  # a bug of ours: shown whole in the parent, not dressed as bad input
            message = ("bug", traceback.format_exc())
        else:
            message = ("ok", result)
        try:
            _send(out, message)
        except (pickle.PicklingError, TypeError, AttributeError):
            _send(out, ("bug", traceback.format_exc()))


def _serve() -> None:
    """Entry point of a fresh interpreter: ``python -c '...; _serve()' FD``, the job on stdin."""
    fd = int(sys.argv[1])
    path, budget, parent = pickle.load(sys.stdin.buffer)
    sys.path[:] = path
    target, args = pickle.load(sys.stdin.buffer)
    _work(fd, target, args, budget, parent)


class _Child:
    """A started child: its pid, or its Popen when it is a fresh interpreter."""

    def __init__(
        self, target: Callable[..., Any], args: tuple[Any, ...], budget: int | None, read: int, write: int
    ) -> None:
        self.popen: subprocess.Popen[bytes] | None = None
        self.pid = 0
        self.code: int | None = None  # once reaped
        parent = os.getpid()
        if threading.active_count() == 1 and sys.platform != "darwin":
            with warnings.catch_warnings():
                # Python 3.12+ warns about forking with native threads; see the NOTE for why it is safe here.
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:  # the child: never returns into the caller's code
                code = 0
                try:
                    os.close(read)
                    _work(write, target, args, budget, parent)
                except BaseException:
                    code = 1
                finally:
                    os._exit(code)
            self.pid = pid
            return
        command = [sys.executable, "-c", "from loadprof.converters.watchdog import _serve; _serve()", str(write)]
        self.popen = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(write,)
        )
        self.pid = self.popen.pid
        assert self.popen.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.popen.stdin.write(pickle.dumps((list(sys.path), budget, parent)) + pickle.dumps((target, args)))
            self.popen.stdin.close()

    def wait(self, timeout: float) -> int | None:
        """The exit status (negative: the signal that ended it), None if still running after ``timeout`` s."""
        if self.popen is not None:
            try:
                return self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                return None
        deadline = time.monotonic() + timeout
        while self.code is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.code = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.01)
        return self.code

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.wait(10)


def _read_exactly(fd: int, n: int, stall: float) -> bytes | None:
    """``n`` bytes from ``fd``; None at end of file; TimeoutError after ``stall`` s without any."""
    chunks = []
    while n:
        ready, _, _ = select.select([fd], [], [], stall)
        if not ready:
            raise TimeoutError
        chunk = os.read(fd, n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def run_watched(
    target: Callable[..., Any],
    args: tuple[Any, ...],
    *,
    path: str | os.PathLike[str],
    stall: float | None = None,
    memory: int | None = None,
) -> Any:
    """``target(*args, progress=callback)`` in a child process; its result or its ConvertError.

    See NOTE [ Parsing HDF5 in a child process ]. ``target`` calls ``progress(n)`` as it
    works; ``stall`` seconds without a call end the child and raise ConvertError naming
    ``path``, as do a crash and running out of ``memory`` bytes (beyond the child's start).
    ``target``, ``args`` and the result must pickle; ``target`` must be importable by name.
    ``stall`` None: ``default_stall()``.
    """
    if _in_child is not None:
        return target(*args, progress=_in_child)
    if os.name != "posix":
        return target(*args, progress=lambda done: None)
    if stall is None:
        stall = default_stall()
    name = os.fspath(path)
    read, write = os.pipe()
    try:
        child = _Child(target, args, memory, read, write)
    except BaseException:
        os.close(read)
        raise
    finally:
        os.close(write)
    outcome = False
    try:
        while True:
            try:
                head = _read_exactly(read, _LENGTH.size, stall)
                body = None if head is None else _read_exactly(read, _LENGTH.unpack(head)[0], stall)
            except TimeoutError:
                raise ConvertError(
                    f"{name}: libhdf5 made no progress for {stall:g} s and was stopped: a corrupt file can "
                    "make it loop for ever (or the storage stalled)"
                ) from None
            if body is None:
                break  # the child ended without an outcome: see its exit status below
            kind, value = pickle.loads(body)
            if kind == "progress":
                continue
            outcome = True
            if kind == "ok":
                return value
            if kind == "error":
                raise value
            if kind == "memory":
                raise ConvertError(
                    f"{name}: reading it needed more than {_gib(memory)} of memory: the file claims sizes "
                    "it does not hold"
                )
            raise RuntimeError(f"checking {name} failed in the child process:\n{value}")
        code = child.wait(10)
        if code is not None and code < 0:
            try:
                signame = signal.Signals(-code).name
            except ValueError:
                signame = f"signal {-code}"
            raise ConvertError(f"{name}: libhdf5 crashed reading it ({signame}): the file is corrupt")
        raise ConvertError(f"{name}: the process reading it ended early (exit status {code})")
    finally:
        os.close(read)
        if child.wait(5 if outcome else 0) is None:
            child.kill()


def _gib(nbytes: int | None) -> str:
    return "the memory available" if nbytes is None else f"{nbytes / (1 << 30):.1f} GiB"
