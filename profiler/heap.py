"""The C allocator under the training process: which one it is, what a page fault costs
here, and the glibc settings that keep freed memory in the process.

glibc's malloc hands a large block (128 KiB at first, up to 32 MiB as it adapts) its own
mapping and unmaps it when freed, and returns the free top of its heap to the OS past a
threshold. A step that frees and allocates tens of MB (gradients set to None, a batch
built in the process) then takes a page fault for every 4 KiB it touches again, each
one a trip into the kernel that zeroes the page (docs/memory.md measures it). Fixed
thresholds keep those pages: both are needed, since setting either one stops glibc
adapting the other.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import time

#: glibc's largest mmap threshold on a 64-bit system (DEFAULT_MMAP_THRESHOLD_MAX)
MMAP_THRESHOLD = 32 * 2**20
#: the least freed memory the advice keeps in the process
MIN_TRIM = 256 * 2**20
#: allocators a user preloads in glibc's place
PRELOADED = ("jemalloc", "tcmalloc", "mimalloc")
#: the environment that already sets glibc's malloc thresholds
SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
#: pages the fault-cost measurement touches in all (16 MiB)
PROBE_PAGES = 4096
#: bytes a page fault maps (4 KiB on x86-64 and most ARM hosts)
PAGE = 4096

#: page faults a step (1 MiB) beyond which two stretches of one step ran in different
#: states of glibc's heap (the one faulting in again what its step freed, the other not)
HEAP_STATE_FAULTS = 256

# mallopt's parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def two_states(a: float, b: float) -> bool:
    """Two stretches' page faults a step that part as glibc's two heap states do: apart by
    ``HEAP_STATE_FAULTS`` at least, and by more than the smaller of them."""
    return abs(a - b) >= max(HEAP_STATE_FAULTS, min(a, b))


def allocator() -> str:
    """The process's C allocator: "glibc", "glibc, tuned" (its thresholds set in the
    environment), a preloaded one's name, or "" (another libc, or not known)."""
    preload = os.environ.get("LD_PRELOAD", "")
    for name in PRELOADED:
        if name in preload:
            return name
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, ValueError, OSError):
        libc = ""
    if not libc.startswith("glibc"):
        return ""
    tuned = any(k in os.environ for k in SETTINGS) or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "")
    return "glibc, tuned" if tuned else "glibc"


def fault_seconds(tries: int = 3) -> float | None:
    """Seconds one minor page fault costs this process: the least of ``tries`` measurements
    (a probe the scheduler preempted in its faults reads high). None where it cannot be
    measured."""
    got = [c for c in (_probe(PROBE_PAGES // tries) for _ in range(tries)) if c is not None]
    return min(got) if got else None


def _probe(pages: int) -> float | None:
    """A fresh anonymous mapping touched page by page (huge pages off: the heap's faults are
    4 KiB ones), less the same loop over the pages once resident, a fault. None where it
    cannot be measured (no ``resource``, a mapping refused)."""
    if minor_faults() is None:
        return None
    page = mmap.PAGESIZE
    size = pages * page
    try:
        m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, ValueError):
        return None
    try:
        if hasattr(mmap, "MADV_NOHUGEPAGE"):
            try:
                m.madvise(mmap.MADV_NOHUGEPAGE)
            except OSError:
                pass
        offsets = range(0, size, page)
        before = minor_faults() or 0
        t0 = time.perf_counter()
        for at in offsets:
            m[at] = 1
        t1 = time.perf_counter()
        faults = (minor_faults() or 0) - before
        # the least of three resident passes: one preempted would read the faults cheap
        resident = float("inf")
        for _ in range(3):
            t2 = time.perf_counter()
            for at in offsets:
                m[at] = 2
            resident = min(resident, time.perf_counter() - t2)
    finally:
        m.close()
    if faults < pages // 2:
        return None  # huge pages despite the advice: not the cost of a 4 KiB fault
    if (t1 - t0) <= resident:
        return None  # no fault cost measurable over the loop itself: no reading
    return ((t1 - t0) - resident) / faults


def state_seconds(run_faults: float | None, replay_faults: float | None, cost: float | None = None) -> float:
    """Seconds a step that the run's page faults beyond a replay's took, at this host's
    price of a fault (``cost``; measured here where not given): where the run's heap faulted
    in again what the replay's did not (two states of one heap, the replay's allocations
    having moved it), that time is no code of the run's loop for the replays to stand in
    for. 0 where either count, or the price, is not known."""
    if run_faults is None or replay_faults is None or run_faults <= replay_faults:
        return 0.0
    if cost is None:
        cost = fault_seconds()
    return (run_faults - replay_faults) * cost if cost else 0.0


def minor_faults() -> int | None:
    """This process's minor page faults so far (None without ``resource``: Windows)."""
    try:
        import resource
    except ImportError:
        return None
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_minflt)


def trim_threshold(churn_bytes: float) -> int:
    """The freed memory to keep in the process for a step that churns ``churn_bytes``: four
    steps' worth, at least ``MIN_TRIM``, rounded up to a power of two."""
    want = max(MIN_TRIM, int(4 * churn_bytes))
    return 1 << (want - 1).bit_length()


def keep_freed_memory(trim: int) -> str | None:
    """Set glibc's thresholds in this process (``mallopt``), as the environment would at
    start: None once done, else why not."""
    kind = allocator()
    if not kind.startswith("glibc"):
        return f"the C allocator is {kind or 'not glibc'}"
    try:
        libc = ctypes.CDLL(None)
        done = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and libc.mallopt(_M_TRIM_THRESHOLD, trim)
    except (OSError, AttributeError) as exc:
        return f"mallopt is not available ({exc})"
    return None if done else "mallopt refused the thresholds"


def environment_line(trim: int) -> str:
    """The variables to set before the process starts."""
    return f"MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD} MALLOC_TRIM_THRESHOLD_={trim}"
