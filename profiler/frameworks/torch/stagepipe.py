"""How stage timings made in loader workers reach the training process, and the
training process's side of stage timing (``StageCollector``).

NOTE [ Stage timing in workers ]
Workers never print or write files (NOTE [ Fork safety ] in torchhooks.py); their stage
figures travel to the training process through one pipe per loader iteration:

- When a DataLoader with workers builds its iterator (which starts the workers),
  ``StageCollector.iterate`` opens a pipe and sets the loader's ``worker_init_fn``
  to a ``WorkerStages`` holding the write end and the user's own init function,
  for the length of that call only (the user's loader is given back as it was).
  Under fork the workers inherit the write end; under spawn and forkserver the
  init function is pickled with the worker's arguments, and multiprocessing sends
  the descriptor along (``reduction.DupFd``). The training process closes its copy
  of the write end once the iterator is built, so the pipe reads end-of-file when
  the last worker is gone.
- In the worker, ``WorkerStages(worker_id)`` installs the stage hooks
  (frameworks/torch/stages.py; inherited ones are reused, not installed twice), starts
  the stack sampler and calls the user's init function.
- Each worker sends its *cumulative* figures, at most every ``SEND_EVERY`` seconds
  after a batch and once more at exit (a multiprocessing finalizer, which both
  fork and spawn children run on a clean exit). Cumulative figures make a lost
  message harmless: the next one carries everything.
- A worker never blocks on the pipe and never corrupts it (profiler/workerpipe.py:
  non-blocking, one atomic write per message of at most ``PIPE_BUF`` bytes, ``marshal``
  data); figures too long for one message go in several, each complete for the stages
  it holds.
- The training process drains the pipes from the batch wrapper (at most every
  ``DRAIN_EVERY`` seconds, a ``poll`` per pipe) and at the end of the session; it
  keeps each worker's latest figures per stage, keyed by (pipe, pid): a pid reused
  by the next epoch's worker is another worker.
- A worker killed (an error, a timeout) loses the figures since its last send.
- With ``num_workers=0`` there is no pipe: the fetcher of the training process's
  own iterator gets a recorder, and the collector reads it at the end.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import weakref
from collections.abc import Callable
from multiprocessing import connection, util
from typing import Any

from ... import workerpipe
from ...patch import Patches
from ...records import LoaderInfo, StageTime, WorkerFetch
from . import stages

#: Seconds between two sends of a worker's figures (after a batch; and at exit).
SEND_EVERY = 0.2
#: Seconds between two drains of the pipes in the training process (on a batch).
DRAIN_EVERY = 0.2
#: Seconds between two summaries of the stages so far onto the loaders' records, for
#: what reads the run while it goes on (the live view's top stage); the last is at the end.
FILL_EVERY = 2.0
#: In-process loading is timed stage by stage only once ``DECIDE_AFTER`` batches after
#: the first (a cold start) showed the loop waiting ``INPUT_SHARE`` of its time or more:
#: the report's data-starved cut-off (thresholds.Thresholds.input_high). Below it the
#: hooks and the stack reader cost a short-step loop 1-3% (benchmarks/overhead.py).
DECIDE_AFTER = 4
INPUT_SHARE = 0.20
#: The user's functions listed apart (the rest of __getitem__ stays one row), and the
#: share of the user's samples one needs to be listed.
TOP_SITES = 3
SITE_SHARE = 0.1
#: Workers whose own timed batches a loader's record keeps (a worker slower than its peers)
MAX_WORKERS_KEPT = 64
#: Fewer stack samples than this split nothing: one sample of two is a coin's toss, and a
#: table that gave each half the time would read as one stage listed twice.
MIN_SPLIT_SAMPLES = 10


# -- the worker's side -----------------------------------------------------------------
class WorkerStages:
    """A loader's ``worker_init_fn`` while stages are timed: sets up the worker's
    recorder and sender, then calls the user's own (NOTE [ Stage timing in workers ])."""

    def __init__(self, user_init: Callable[[int], Any] | None, conn: connection.Connection) -> None:
        self.user_init = user_init
        self.conn = conn

    def __call__(self, worker_id: int) -> None:
        try:
            _start_worker(self.conn)
        except Exception:  # noqa: BLE001 - never break the worker: NOTE [ Never break the run ]
            stages._state.worker = None
        if self.user_init is not None:
            self.user_init(worker_id)


class _Sender:
    def __init__(self, writer: workerpipe.Writer) -> None:
        self.writer = writer
        self.next = 0.0
        self.pid = os.getpid()

    def after_batch(self, rec: stages.StageRecorder) -> None:
        now = time.perf_counter()
        if now >= self.next:
            self.next = now + SEND_EVERY
            self.send(rec)

    def send(self, rec: stages.StageRecorder | None) -> None:
        if rec is None:
            return
        head = ("h", self.pid, rec.batches, rec.fetch_wall, rec.fetch_cpu, rec.user_samples,
                tuple(sorted(rec.sites.items(), key=lambda kv: -kv[1])[:8]))
        rows = [(k, n, *v) for (k, n), v in rec.totals.items()]
        messages: list[tuple[Any, ...]] = [head]
        chunk: list[Any] = []
        for row in rows:
            chunk.append(row)
            if not workerpipe.fits(("s", self.pid, tuple(chunk))):
                chunk.pop()
                if chunk:
                    messages.append(("s", self.pid, tuple(chunk)))
                chunk = [row]
        if chunk:
            messages.append(("s", self.pid, tuple(chunk)))
        self.writer.write(messages)  # one stage alone too long is skipped (cannot be: names are short)


def _start_worker(conn: connection.Connection) -> None:
    writer = workerpipe.Writer(conn)
    stages._state.current = None
    stages._state.sampler = None  # a forked worker inherits the record of a thread it does not have
    stages._state.fetching = threading.Event()  # and maybe a lock that thread held at the fork
    stages.install()
    rec = stages.StageRecorder("workers")
    stages._state.worker = rec
    sender = _Sender(writer)
    stages._after_fetch = sender.after_batch
    stages.start_sampler()
    # multiprocessing runs finalizers with a priority when a child exits cleanly
    util.Finalize(None, sender.send, args=(rec,), exitpriority=10)


# -- the training process's side -------------------------------------------------------
class _Producer:
    """One producing process's latest figures."""

    def __init__(self) -> None:
        self.head: tuple[Any, ...] | None = None
        self.rows: dict[tuple[str, str], tuple[Any, ...]] = {}


class _Loader:
    def __init__(self, info: LoaderInfo) -> None:
        self.info = info
        self.pipes: list[tuple[int, connection.Connection]] = []
        self.producers: dict[tuple[int, int], _Producer] = {}
        self.main: stages.StageRecorder | None = None


class StageCollector:
    """Stage timing for the loaders of one session, from the training process."""

    def __init__(self) -> None:
        self._loaders: dict[int, _Loader] = {}
        self._serial = itertools.count()
        self._next_drain = 0.0
        self._next_fill = 0.0
        self._in_process = False
        # In-process loaders wait for the loop's input share (NOTE [ Timing a sample of the batches ])
        self._pending: list[tuple[Any, _Loader]] = []  # (weak ref to a fetcher, its loader)
        self._decided = False
        self._waits = 0.0
        self._first: float | None = None
        self._seen = 0
        self._pin = [0.0, 0]  # seconds and batches in pin_memory (the pin thread, or the loop)
        self.limitations: list[str] = []

    def install_pin(self, patches: Patches) -> None:
        """Time ``pin_memory`` (called by the loader's pin thread, or in the loop with
        ``num_workers=0``), in this process only."""
        from torch.utils.data._utils import pin_memory as module

        acc, pid = self._pin, os.getpid()

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def pin_memory(data: Any, device: Any = None) -> Any:
                if os.getpid() != pid:
                    return original(data, device)
                t0 = time.perf_counter()
                try:
                    return original(data, device)
                finally:
                    acc[0] += time.perf_counter() - t0
                    acc[1] += 1
            return pin_memory

        patches.wrap(module, "pin_memory", make)

    def _of(self, info: LoaderInfo) -> _Loader:
        entry = self._loaders.get(id(info))
        if entry is None:
            entry = self._loaders[id(info)] = _Loader(info)
        return entry

    def iterate(self, loader: Any, info: LoaderInfo, original: Callable[[Any], Any]) -> Any:
        """``original(loader)`` (``DataLoader.__iter__``) with its batches' stages timed."""
        workers = int(getattr(loader, "num_workers", 0) or 0)
        entry = self._of(info)
        if not workers:
            it = original(loader)
            fetcher = getattr(it, "_dataset_fetcher", None)
            if fetcher is not None:
                if self._in_process:
                    self._attach(fetcher, entry)
                elif not self._decided:
                    self._pending.append((weakref.ref(fetcher), entry))
            return it
        if getattr(loader, "persistent_workers", False) and getattr(loader, "_iterator", None) is not None:
            return original(loader)  # its workers run already, with their pipe
        read, write = workerpipe.open_pipe()
        user_init = loader.worker_init_fn
        loader.worker_init_fn = WorkerStages(user_init, write)
        try:
            it = original(loader)
        finally:
            loader.worker_init_fn = user_init
            write.close()  # the workers hold theirs: the pipe ends when they do
        entry.pipes.append((next(self._serial), read))
        return it

    def _attach(self, fetcher: Any, entry: _Loader) -> None:
        if entry.main is None:
            entry.main = stages.StageRecorder("main")
        fetcher._loadprof_stages = entry.main

    def _decide(self, t0: float, t1: float) -> None:
        """Time in-process loading stage by stage only once the loop has been seen to
        wait for it: loading that takes under ``INPUT_SHARE`` of the loop needs no table,
        and the hooks would cost the loop more than it is worth."""
        self._seen += 1
        if self._seen == 1:
            return  # the first batch: imports, cold caches, a worker's start
        if self._first is None:
            self._first = t0
        self._waits += t1 - t0
        if self._seen <= DECIDE_AFTER or t1 <= self._first:
            return
        self._decided = True
        pending, self._pending = self._pending, []
        if self._waits / (t1 - self._first) < INPUT_SHARE:
            return
        self._in_process = True
        stages.install()
        stages.start_sampler()
        for ref, entry in pending:
            fetcher = ref()
            if fetcher is not None:
                self._attach(fetcher, entry)

    def maybe_drain(self, t0: float, now: float) -> None:
        if not self._decided:
            self._decide(t0, now)
        if now >= self._next_drain:
            self._next_drain = now + DRAIN_EVERY
            self.drain()
            if now >= self._next_fill:
                self._next_fill = now + FILL_EVERY
                for entry in self._loaders.values():
                    _fill(entry)

    def drain(self) -> None:
        for entry in self._loaders.values():
            keep = []
            for serial, conn in entry.pipes:
                if self._read(entry, serial, conn):
                    keep.append((serial, conn))
                else:
                    conn.close()
            entry.pipes = keep

    def _read(self, entry: _Loader, serial: int, conn: connection.Connection) -> bool:
        """Read what the pipe holds; False once it ended (every worker gone)."""

        def handle(msg: Any) -> None:
            producer = entry.producers.setdefault((serial, msg[1]), _Producer())
            if msg[0] == "h":
                producer.head = msg
            else:
                for row in msg[2]:
                    producer.rows[(row[0], row[1])] = row

        try:
            return workerpipe.receive(conn, handle)
        except (ValueError, TypeError, IndexError) as exc:  # not what a worker of ours sends
            self.limitations.append(f"stage timing: a worker's message could not be read ({type(exc).__name__})")
            return False

    def fill(self) -> None:
        """Each loader's stages on its ``LoaderInfo`` as far as they go now."""
        self.drain()
        for entry in self._loaders.values():
            _fill(entry)

    def finish(self, infos: list[LoaderInfo]) -> None:
        """Drain the pipes a last time and put each loader's stages on its ``LoaderInfo``;
        the pinning goes to the most iterated loader that pins."""
        self.drain()
        for entry in self._loaders.values():
            for _, conn in entry.pipes:
                conn.close()
            entry.pipes = []
            _fill(entry)
        pinning = [i for i in infos if i.pin_memory and i.stages]
        if self._pin[1] and pinning:
            info = max(pinning, key=lambda i: i.iterations)
            info.stages.append(StageTime("pin", "pin_memory", self._pin[0], None, int(self._pin[1]), "main", False))
        if self._in_process:
            self.limitations.extend(f"stage timing: {p}" for p in stages.uninstall())
            self._in_process = False
        self.limitations.extend(f"stage timing: {line}" for line in stages._state.limitations)


def _fill(entry: _Loader) -> None:
    """Sum the producers' figures into the loader's stage records."""
    totals: dict[tuple[str, str], list[Any]] = {}
    batches = 0
    fetch_wall = 0.0
    samples = 0
    sites: dict[str, int] = {}
    where = ""
    producers: list[tuple[tuple[Any, ...] | None, dict[tuple[str, str], tuple[Any, ...]]]] = []
    fetches: list[WorkerFetch] = []
    for p in entry.producers.values():
        producers.append((p.head, p.rows))
        where = "workers"
        if p.head is not None and p.head[2]:
            slowest = max(p.rows.values(), key=lambda row: row[2], default=None)
            fetches.append(WorkerFetch(int(p.head[1]), int(p.head[2]), float(p.head[3]),
                                       f"{slowest[0]}: {slowest[1]}" if slowest is not None else ""))
    if entry.main is not None and entry.main.batches:
        rec = entry.main
        mine: tuple[Any, ...] = ("h", 0, rec.batches, rec.fetch_wall, rec.fetch_cpu, rec.user_samples,
                                 tuple(rec.sites.items()))
        producers.append((mine, {k: (k[0], k[1], *v) for k, v in rec.totals.items()}))
        where = "main" if not where else "workers and main"
    for head, rows in producers:
        if head is not None:
            batches += head[2]
            fetch_wall += head[3]
            samples += head[5]
            for site, count in head[6]:
                sites[site] = sites.get(site, 0) + count
        for (kind, name), row in rows.items():
            wall, cpu, calls, nbytes, files, order, random = row[2:9]
            acc = totals.setdefault((kind, name), [0.0, 0.0, 0, 0, 0, order, random])
            acc[0] += wall
            acc[1] += cpu
            acc[2] += calls
            acc[3] = max(acc[3], nbytes) if kind == "transform" else acc[3] + nbytes  # an input's size, or bytes read
            acc[4] += files
    if not batches:
        return
    info = entry.info
    info.worker_fetch = sorted(fetches, key=lambda f: f.pid)[:MAX_WORKERS_KEPT]
    info.stage_batches = batches
    info.stage_seconds = fetch_wall
    out: list[StageTime] = []
    for (kind, name), (wall, cpu, calls, nbytes, files, order, random) in totals.items():
        measured_cpu = None if name == stages.READ_SLOT else max(0.0, cpu)
        if kind == "user" and samples >= MIN_SPLIT_SAMPLES:
            # the user's own time, split over the functions the sampler saw most
            listed = [(s, c) for s, c in sorted(sites.items(), key=lambda kv: -kv[1])[:TOP_SITES]
                      if c >= SITE_SHARE * samples]
            for site, count in listed:
                share = count / samples
                out.append(StageTime("user", site, wall * share, max(0.0, cpu) * share, calls, where, None, order,
                                     samples=count))
            left = 1.0 - sum(c for _, c in listed) / samples
            out.append(StageTime("user", name, wall * left, max(0.0, cpu) * left, calls, where, None, order,
                                 samples=samples - sum(c for _, c in listed)))
            continue
        if kind in ("read", "decode", "collate"):
            random = False
        out.append(StageTime(kind, name, max(0.0, wall), measured_cpu, calls, where, random, order, nbytes, files))
    info.stages = out
