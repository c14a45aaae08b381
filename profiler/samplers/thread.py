"""The one background thread that reads every source at a fixed interval.

NOTE [ Sampler lifecycle and fork ]
``start()`` records the pid, takes the first tick's host reading (NOTE [ First
reading before the loop ]) and starts one daemon thread named
``loadprof-sampler``, which completes that tick and then takes one per interval:
``while not done.wait(interval - spent)``, so the time spent sampling is taken off
the sleep and the ticks do not drift. ``stop()`` sets the event (the wait returns
at once), joins, then takes a final sample from the calling thread, so a run
shorter than one interval still has a reading at its end.

DataLoader workers are forked from the training process. A forked child has no
sampler thread (fork copies only the calling thread) but does inherit this
object, its buffers and its lock, possibly held by the thread at the moment of
the fork. So in any process other than the one that called ``start()``:
``start()``/``stop()`` do nothing and the buffers are read without the lock. The
sources follow the same rule (see NOTE [ NVML and fork ] in ``nvml.py``).

NOTE [ First reading before the loop ]
The thread's first tick would otherwise run beside the first steps of the
training loop, and the host part of it is Python that holds the GIL: the first
reading builds psutil's process object and opens the /proc files, and the loop's
first steps, already slow with cold caches, would wait on it (docs/dev/overhead.md
has the figures). So ``start()`` takes the first tick's host reading itself,
before the loop (the sources' baselines are read there already, so a /proc that
hangs would hang it anyway), and stores it at once; the thread then takes that
tick's GPU part, which blocks in the driver with the GIL released (PCIe
readings, nvml.py), and adds it to the same tick. With a ``HostProcess`` source that first
reading is taken here too, and so are the next ones until its helper process
has taken its own baseline (NOTE [ Host readings in a helper process ] in
hostproc.py); from then on a tick's host part is a non-blocking read of the
helper's pipe every ``DRAIN_EVERY`` intervals.

NOTE [ A tick a second ]
Once a helper process serves the host readings and no GPU is read through NVML
(none, NVML unavailable, or ``gpu=False``), nothing in this process needs
reading at every interval: the thread's work is the fold of hook events and the
helper's pipe, which it reads every ``DRAIN_EVERY`` intervals anyway. Each wake
costs the loop more than its work (the GIL handed over and back, cold caches).
So the thread then
waits ``DRAIN_EVERY`` intervals between ticks, folding ten intervals' events at
a time; the helper still reads the host at every interval. It goes back to
every interval from the wake at which anything needs it: the helper not yet
serving, or gone (seen at the drain after it died, up to ``DRAIN_EVERY``
intervals later; its readings are then taken here), or a GPU being read. Memory stays bounded
the same way: when either buffer (this thread's ticks, the helper's readings)
is full, both are halved and the interval doubles, the helper's too.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from loadprof.records import GpuSample, HostSample
from loadprof.samplers.host import HostSource
from loadprof.samplers.hostproc import DRAIN_EVERY, HostProcess
from loadprof.samplers.nvml import NvmlSource
from loadprof.settings import Settings

log = logging.getLogger("loadprof.samplers")

THREAD_NAME = "loadprof-sampler"

T = TypeVar("T")

#: How long ``stop()`` waits for a sample in progress. One NVML sample with PCIe
#: reads costs ~40 ms per GPU; anything near this bound is a hung driver call, and
#: we would rather lose the final sample than hang the end of a training run.
JOIN_TIMEOUT = 5.0

Source = NvmlSource | HostSource | HostProcess

#: What ``_read_hosts`` hands ``_read_gpus``: (perf_counter at the tick's start, its
#: time t, the process tree's pids, the tick's GPU list to fill)
_HostPart = tuple[float, float, set[int], list[GpuSample]]


class Sampler:
    """Samples ``sources`` every ``interval`` seconds into bounded buffers.

    ``on_tick``, if given, is called on the sampling thread after each sample:
    the profiler folds the timeline's raw events there, off the training loop
    (NOTE [ Events now, steps on read ] in timeline.py).

    ``clock`` and ``t0`` define sample times: ``t = clock() - t0`` (seconds since
    the run started). When a buffer reaches ``max_samples`` ticks, every other tick
    is dropped and the interval doubles, so memory stays bounded for any run length
    while the samples stay evenly spaced.
    """

    def __init__(
        self,
        interval: float = Settings.interval,
        sources: Iterable[Source] = (),
        max_samples: int = Settings.max_samples,
        clock: Callable[[], float] = time.perf_counter,
        t0: float | None = None,
        on_tick: Callable[[], object] | None = None,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval!r}")
        if max_samples < 2:
            raise ValueError(f"max_samples must be >= 2, got {max_samples!r}")
        self.sources = tuple(sources)
        for src in self.sources:
            if not isinstance(src, NvmlSource | HostSource | HostProcess):
                raise TypeError(f"sources must be NvmlSource, HostSource or HostProcess, got {type(src).__name__}")
        self.interval = float(interval)
        self.max_samples = max_samples
        self.on_tick = on_tick
        self._clock = clock
        self._t0 = clock() if t0 is None else t0
        self._effective = self.interval
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._pid: int | None = None
        self._stopped = False
        # One entry per tick, so decimation drops whole ticks, never one GPU of a tick.
        self._ticks: list[tuple[HostSample | None, list[GpuSample]]] = []
        # A HostProcess's readings: none, one or a batch per tick, decimated apart
        # (NOTE [ Host readings in a helper process ] in hostproc.py).
        self._pushed: list[HostSample] = []
        self._taken = 0
        self._dropped = 0
        self._spent_total = 0.0
        self._errors: dict[str, int] = {}

    # -- lifecycle -----------------------------------------------------------
    def start(self) -> None:
        """Start the sources (idempotent) and the sampling thread. No-op if already started."""
        if self._thread is not None or self._stopped:
            return
        self._pid = os.getpid()
        for src in self.sources:
            if isinstance(src, HostProcess):  # the sources never raise from start()
                src.start(self._effective, self._clock, self._t0)
            else:
                src.start()
        first = self._read_hosts()  # here, not on the thread: NOTE [ First reading before the loop ]
        self._thread = threading.Thread(target=self._run, args=(first,), name=THREAD_NAME, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread promptly and take a final sample. Idempotent; no-op in a fork."""
        if self._pid is None or os.getpid() != self._pid or self._stopped:
            return  # never started, a forked child (NOTE [ Sampler lifecycle and fork ]), or done
        self._stopped = True
        self._done.set()
        assert self._thread is not None
        self._thread.join(JOIN_TIMEOUT)
        if self._thread.is_alive():
            # Sources are not safe to read from two threads at once; skip the last sample.
            self._record_error(f"sampler thread still busy after {JOIN_TIMEOUT:.0f} s; final sample skipped")
            return
        self._sample_once(final=True)

    def __enter__(self) -> Sampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self, first: _HostPart) -> None:
        # The first tick's GPU part is taken on the thread: with PCIe readings it
        # blocks ~20 ms per GPU in the driver (nvml.py), which must not delay the caller.
        spent = self._read_gpus(first)
        while not self._done.wait(max(0.0, self.period - spent)):
            spent = self._sample_once()

    @property
    def period(self) -> float:
        """Seconds from one tick's start to the next, as things stand now: NOTE [ A tick a second ]."""
        helper = False
        for src in self.sources:
            if isinstance(src, HostProcess):
                if not src.serving:
                    return self._effective
                helper = True
            elif isinstance(src, HostSource) or src.reading:
                return self._effective
        return self._effective * DRAIN_EVERY if helper else self._effective

    # -- one tick --------------------------------------------------------------
    def _sample_once(self, final: bool = False) -> float:
        return self._read_gpus(self._read_hosts(final))

    def _read_hosts(self, final: bool = False) -> _HostPart:
        """A tick's host reading, stored at once with an empty list its GPU readings will fill."""
        begin = time.perf_counter()
        t = self._clock() - self._t0
        host_sample: HostSample | None = None
        gpu_samples: list[GpuSample] = []
        pids: set[int] = {os.getpid()}
        # Host first: it lists the process tree that NVML's per-process memory needs.
        for host in self.sources:
            if isinstance(host, HostSource):
                got = self._guarded(host, host.sample, t)
                if got is not None:
                    host_sample = got
                    pids = host.pids() or pids
            elif isinstance(host, HostProcess):
                pushed = self._guarded(host, host.finish if final else host.sample, t)
                if pushed:
                    with self._lock:
                        self._pushed.extend(pushed)
                        if len(self._pushed) >= self.max_samples:
                            self._decimate()
                pids = host.pids() or pids
        # Decimation keeps the newest tick, so the list filled by _read_gpus is always still kept.
        with self._lock:
            self._ticks.append((host_sample, gpu_samples))
            if len(self._ticks) >= self.max_samples:
                self._decimate()
        return begin, t, pids, gpu_samples

    def _read_gpus(self, host_part: _HostPart) -> float:
        """The rest of the tick begun by ``_read_hosts``: GPUs, then ``on_tick``. Returns its seconds."""
        begin, t, pids, gpu_samples = host_part
        gpus = [s for s in self.sources if isinstance(s, NvmlSource)]
        got_gpus: list[GpuSample] = []
        for nv in gpus:
            got_gpus.extend(self._guarded(nv, nv.sample, t, pids) or [])
        if got_gpus:
            with self._lock:
                gpu_samples.extend(got_gpus)
        if self.on_tick is not None:
            self._guarded(self, self.on_tick)
        spent = time.perf_counter() - begin
        with self._lock:
            self._taken += 1
            self._spent_total += spent
        return spent

    def _guarded(self, source: object, read: Callable[..., T], *args: object) -> T | None:
        # The sources handle the errors they expect (NVMLError, psutil.NoSuchProcess...)
        # themselves. This one broad catch is the last line of defence: the thread runs
        # inside someone's training job, and an unexpected error in a reading (a
        # binding bug, an odd /proc) must cost that reading, not the thread or the run.
        # Each distinct error is recorded once and shown in problems().
        try:
            return read(*args)
        except Exception as exc:
            self._record_error(f"{type(source).__name__}: {type(exc).__name__}: {exc}")
            return None

    def _record_error(self, what: str) -> None:
        with self._lock:
            n = self._errors.get(what, 0)
            self._errors[what] = n + 1
        if n == 0:
            log.warning("loadprof: sampler error (reported once): %s", what)

    def _decimate(self) -> None:
        # Keep the ticks (and the helper's readings) with the same parity as the newest,
        # so the newest stays and the next, one doubled interval later, continues an
        # even spacing. Both at once: NOTE [ A tick a second ].
        keep = _halved(self._ticks)
        pushed = _halved(self._pushed)
        self._dropped += len(self._ticks) - len(keep) + len(self._pushed) - len(pushed)
        self._ticks, self._pushed = keep, pushed
        self._effective *= 2
        for src in self.sources:
            if isinstance(src, HostProcess):
                src.set_interval(self._effective)

    # -- results -----------------------------------------------------------------
    def _locked(self) -> threading.Lock | _NoLock:
        # In a forked child the lock may have been copied while held: read without it.
        return self._lock if self._pid is None or os.getpid() == self._pid else _NoLock()

    @property
    def host_samples(self) -> list[HostSample]:
        """A copy of the host samples kept so far, oldest first."""
        with self._locked():
            read = [h for h, _ in self._ticks if h is not None]
            pushed = list(self._pushed)
        return sorted(read + pushed, key=lambda h: h.t) if read and pushed else read or pushed

    @property
    def gpu_samples(self) -> list[GpuSample]:
        """A copy of the GPU samples kept so far (one per GPU per tick), oldest first."""
        with self._locked():
            return [g for _, gs in self._ticks for g in gs]

    def recent(self, n: int) -> tuple[list[HostSample], list[GpuSample]]:
        """Copies of the newest ``n`` host readings and of the newest ``n`` ticks' GPU
        readings, without copying the whole buffers (the live view, report/liveview.py)."""
        with self._locked():
            ticks = self._ticks[-n:]
            pushed = self._pushed[-n:]
            gpus = [g for _, gs in ticks for g in gs]
        hosts = sorted([h for h, _ in ticks if h is not None] + pushed, key=lambda h: h.t)[-n:]
        return [dataclasses.replace(h) for h in hosts], [dataclasses.replace(g) for g in gpus]

    @property
    def stats(self) -> dict[str, float]:
        """Sampling figures for ``Run.sampling``."""
        with self._locked():
            return {
                "interval": self.interval,
                "samples": self._taken,
                "kept": len(self._ticks),
                "dropped": self._dropped,
                "effective_interval": self._effective,
                "mean_sample_seconds": self._spent_total / self._taken if self._taken else 0.0,
                "errors": sum(self._errors.values()),
            }

    def problems(self) -> list[str]:
        """Problems from every source, then the sampler's own (errors with counts)."""
        lines = [line for src in self.sources for line in src.problems()]
        with self._locked():
            errors = list(self._errors.items())
        lines.extend(f"{what} ({n} times)" if n > 1 else what for what, n in errors)
        return lines

    @property
    def running(self) -> bool:
        """Whether the sampling thread is alive (always False in a forked child)."""
        return self._thread is not None and self._thread.is_alive() and os.getpid() == self._pid


def _halved(items: list[T]) -> list[T]:
    """Every other item, keeping the newest: the next one, one doubled interval
    later, continues an even spacing."""
    return items[(len(items) - 1) % 2 :: 2]


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
