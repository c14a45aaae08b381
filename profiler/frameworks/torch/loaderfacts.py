"""A DataLoader's start-up and its workers' shares, measured from the training process.

Called by the torch hooks (torchhooks.py), which install the wraps through their one
``Patches``: nothing here patches by itself.

NOTE [ Loader start-up and shards ]
- Start-up: each training iteration of a loader (an epoch) is timed from the call of
  ``iter(loader)``, where workers are started, to its first batch
  (``LoaderInfo.first_batch_s``), and the loop's waits for its first batches, one per
  worker (each worker's first batch pays for its start), are added up
  (``start_wait_s``). The report sets them against the steady waits of the steps
  (loaderhost.py): what a loader without ``persistent_workers`` pays again each epoch.
  Only the first ``START_BATCHES_MAX`` batches of an iteration pass through here; the
  batch path pays one truth test of a dict once they did.
- Shards: an IterableDataset is copied into every worker, and each copy must pick its
  share (``get_worker_info()``); WebDataset splits the shards across workers, and
  Hugging Face datasets starts at most ``n_shards`` workers. With fewer shards than
  workers some workers get nothing: they end their share at once and the loader runs
  on fewer workers than it was given. ``_MultiProcessingDataLoaderIter._process_data``
  is where a batch arrives from its worker (counted per worker), and
  ``_mark_worker_as_unavailable`` (``shutdown=False``) where a worker says it has
  ended its share; with ``persistent_workers`` torch marks the worker in
  ``_workers_status`` instead, read before the next epoch resets it and at the end.
  A worker that ended with no batch ended empty. A loop that leaves early shuts its
  workers down with ``shutdown=True``: not an end, not counted. Where the dataset says
  how many shards it has (``n_shards``, ``num_shards``, its ``urls`` or ``shards``,
  WebDataset's shard list stage), that count is kept too (``LoaderInfo.shards``).
- Both wraps are private torch API: where they are missing, the shares are not read
  (the fields stay empty) and nothing else changes.
- Workers: each iteration's worker processes are kept by pid (``LoaderInfo.worker_pids``,
  from the iterator's ``_workers``), so that the host sampler's readings of the tree are
  read for the loader's own workers, not for multiprocessing's resource tracker that
  spawn starts beside them, nor another loader's. Before a loader first starts its
  workers, its dataset's Python objects are weighed (``dataset_object_bytes``: NOTE
  [ Copies in loader workers ] in pyobjects.py).
- A worker killed by SIGBUS (a /dev/shm page tmpfs could not back) is reported by torch
  as "is killed by signal: Bus error" or, when its own liveness check sees it first,
  as "exited unexpectedly", which says nothing of why. At the end the last iterators
  with workers still alive (the failed loop's frame holds its iterator) are asked for
  their workers' exit codes, and each death is recorded in torch's own words
  (``finish``'s lines, for ``Run.oom_errors``; oom.py reads them): a SIGBUS is /dev/shm,
  an exit code or a signal other than SIGKILL is no out-of-memory.
"""

from __future__ import annotations

import signal
import sys
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from ...instrument import ThisProcess
from ...records import MAX_NOTED_ITERATIONS, LoaderInfo
from .pyobjects import python_object_bytes

#: The most batches of an iteration counted as its start-up (one per worker, up to this).
START_BATCHES_MAX = 64
#: Iterators with workers whose workers' exit codes are read at the end (the latest ones).
EXITS_READ = 8
#: Worker pids kept per loader: 32 epochs of 8 workers restarted each epoch.
MAX_PIDS = 256
#: Loaders whose dataset's weight is held until their first iteration begins.
MAX_WEIGHED = 64


class _Start:
    """One iteration's start-up, until its first ``want`` batches arrived."""

    __slots__ = ("ref", "info", "t_iter", "want", "got", "wait")

    def __init__(self, ref: Callable[[], Any], info: LoaderInfo, t_iter: float, want: int) -> None:
        self.ref, self.info, self.t_iter, self.want = ref, info, t_iter, want
        self.got = 0
        self.wait = 0.0


class _Share:
    """One iteration's batches per worker, and the workers that ended their share empty."""

    __slots__ = ("ref", "info", "counts", "empty")

    def __init__(self, ref: Callable[[], Any], info: LoaderInfo, workers: int) -> None:
        self.ref, self.info = ref, info
        self.counts = [0] * workers
        self.empty: set[int] = set()


class LoaderFacts:
    """Start-up times and worker shares of the loaders one TorchHooks sees."""

    def __init__(self, pid: int, t0: float = 0.0) -> None:
        self.pid = pid  # set to -1 by finish(): the wraps are inert from then on
        self.t0 = t0  # the clock's reading at the run's start: the steps' zero
        #: id(iterator) -> its start-up so far; empty once every iteration has its first batches
        self.starting: dict[int, _Start] = {}
        self._shares: dict[int, _Share] = {}  # id(LoaderInfo) -> its current iteration's share
        self._pools: deque[Callable[[], Any]] = deque(maxlen=EXITS_READ)  # iterators with workers
        #: id(loader) -> (its ref, its dataset's Python objects in bytes), weighed before its workers
        self._weighed: dict[int, tuple[Callable[[], Any], int | None]] = {}

    # -- from the __iter__ / __next__ wrappers -----------------------------------
    def before_iter(self, loader: Any) -> None:
        """A loader is about to start an iteration: a persistent iterator's ended
        workers are read before ``_reset`` marks them all active again."""
        it = getattr(loader, "_iterator", None)
        share = getattr(it, "_loadprof_share", None)
        if isinstance(share, _Share):
            _read_status(it, share)
        if it is None and int(getattr(loader, "num_workers", 0) or 0) > 0:
            self._weigh(loader)

    def _weigh(self, loader: Any) -> None:
        """Weigh the dataset's Python objects once per loader, before its workers exist
        (NOTE [ Copies in loader workers ])."""
        held = self._weighed.get(id(loader))
        if held is not None and held[0]() is loader:
            return
        for key in [k for k, (ref, _) in self._weighed.items() if ref() is None]:
            del self._weighed[key]
        if len(self._weighed) >= MAX_WEIGHED:
            return
        dataset = getattr(loader, "dataset", None)
        self._weighed[id(loader)] = (_ref(loader), python_object_bytes(dataset) if dataset is not None else None)

    def on_iter(self, loader: Any, it: Any, info: LoaderInfo, t_iter: float, training: bool) -> None:
        workers = int(getattr(it, "_num_workers", 0) or 0)
        for key in [k for k, s in self.starting.items() if s.ref() is None]:
            del self.starting[key]
        if training and len(info.first_batch_s) < MAX_NOTED_ITERATIONS:
            self.starting[id(it)] = _Start(_ref(it), info, t_iter, min(max(1, workers), START_BATCHES_MAX))
        if workers and not any(ref() is it for ref in self._pools):
            self._pools.append(_ref(it))
        held = self._weighed.get(id(loader))
        if held is not None and held[0]() is loader and info.dataset_object_bytes is None:
            info.dataset_object_bytes = held[1]
        started = getattr(it, "_workers", None) if workers else None
        for worker in started or ():
            pid = getattr(worker, "pid", None)
            if isinstance(pid, int) and pid > 0 and pid not in info.worker_pids and len(info.worker_pids) < MAX_PIDS:
                info.worker_pids.append(pid)
        dataset = getattr(loader, "dataset", None)
        if not workers or not iterable_dataset(dataset):
            return
        if info.shards is None:
            info.shards = dataset_shards(dataset)
        old = self._shares.pop(id(info), None)
        if old is not None:
            _fold(old)
        share = _Share(_ref(it), info, workers)
        self._shares[id(info)] = share
        try:
            it._loadprof_share = share
        except AttributeError:  # an iterator with __slots__: shares stay unread
            pass

    def batch(self, it: Any, t0: float, t1: float) -> None:
        """A batch arrived after the loop waited from ``t0`` to ``t1``."""
        start = self.starting.get(id(it))
        if start is None or start.ref() is not it:
            return
        if start.got == 0:
            start.info.first_batch_s.append(t1 - start.t_iter)
            start.info.iteration_starts_s.append(t1 - self.t0)
            start.wait = t1 - start.t_iter  # iter() and the wait: the workers' start
        else:
            start.wait += t1 - t0
        start.got += 1
        if start.got >= start.want:
            start.info.start_wait_s.append(start.wait)
            start.info.start_batches = start.want
            del self.starting[id(it)]

    def finish(self) -> list[str]:
        """The run is over: every share read and folded into its loader's record. Returns
        a line for each worker found dead of a signal or an exit status, in torch's words."""
        self.pid = -1
        self.starting.clear()
        for share in self._shares.values():
            it = share.ref()
            if it is not None:
                _read_status(it, share)
            _fold(share)
        self._shares.clear()
        killed = []
        for ref in self._pools:
            for worker in getattr(ref(), "_workers", None) or ():
                line = _died(worker.pid, getattr(worker, "exitcode", None))  # polls without waiting
                if line:
                    killed.append(line)
        self._pools.clear()
        return killed

    # -- wraps of _MultiProcessingDataLoaderIter (installed by torchhooks.py) ---------
    def wrap_process_data(self, original: Callable[..., Any]) -> Callable[..., Any]:
        facts = self

        def _process_data(it: Any, data: Any, worker_idx: int, *args: Any, **kwargs: Any) -> Any:
            if ThisProcess.pid == facts.pid:
                share = getattr(it, "_loadprof_share", None)
                if share is not None and 0 <= worker_idx < len(share.counts):
                    share.counts[worker_idx] += 1
            return original(it, data, worker_idx, *args, **kwargs)

        return _process_data

    def wrap_mark_unavailable(self, original: Callable[..., Any]) -> Callable[..., Any]:
        facts = self

        def _mark_worker_as_unavailable(it: Any, worker_id: int, shutdown: bool = False) -> Any:
            if not shutdown and ThisProcess.pid == facts.pid:
                share = getattr(it, "_loadprof_share", None)
                if share is not None and 0 <= worker_id < len(share.counts) and not share.counts[worker_id]:
                    share.empty.add(worker_id)
            return original(it, worker_id, shutdown)

        return _mark_worker_as_unavailable


def _read_status(it: Any, share: _Share) -> None:
    """Workers a live iterator marked as ended (persistent workers) without a batch."""
    status = getattr(it, "_workers_status", None)
    if getattr(it, "_shutdown", True) or not isinstance(status, list) or len(status) != len(share.counts):
        return
    share.empty.update(w for w, (alive, n) in enumerate(zip(status, share.counts, strict=True)) if not alive and not n)


def _fold(share: _Share) -> None:
    info = share.info
    counts = share.counts
    if len(info.worker_batches) < len(counts):
        info.worker_batches.extend([0] * (len(counts) - len(info.worker_batches)))
    for w, n in enumerate(counts):
        info.worker_batches[w] += n
    if sum(counts) or share.empty:  # an iteration that delivered something, or ended some workers
        info.workers_ended_empty = max(info.workers_ended_empty or 0, len(share.empty))


def iterable_dataset(dataset: Any) -> bool:
    """Whether ``dataset`` is a torch IterableDataset (a stream: no index)."""
    # not imported here: a dataset of a torch class has loaded torch (a forked item check
    # that imported it would spend its time limit on the import)
    data = sys.modules.get("torch.utils.data")
    return data is not None and isinstance(dataset, data.IterableDataset)


#: Attributes that count a dataset's shards (Hugging Face datasets, Mosaic Streaming) ...
_COUNTS = ("n_shards", "num_shards")
#: ... and that list them (WebDataset's shard list, hand-written datasets).
_LISTS = ("urls", "shards", "shard_urls", "shard_files")


def dataset_shards(dataset: Any) -> int | None:
    """The shards an IterableDataset says it has, or None where it does not say.
    Looks at the dataset and, for a WebDataset pipeline, at its stages."""
    for obj in (dataset, *_stages(dataset)):
        for name in _COUNTS:
            value = _attribute(obj, name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        for name in _LISTS:
            value = _attribute(obj, name)
            if isinstance(value, (list, tuple)) and value:
                return len(value)
    return None


def _stages(dataset: Any) -> list[Any]:
    stages = _attribute(dataset, "pipeline")  # webdataset.DataPipeline
    return list(stages[:4]) if isinstance(stages, list) else []


def _attribute(obj: Any, name: str) -> Any:
    # A dataset's property runs its own code: whatever it raises, the count is unknown.
    try:
        return getattr(obj, name, None)
    except Exception:  # noqa: BLE001 - the user's property, not ours
        return None


def _ref(obj: Any) -> Callable[[], Any]:
    try:
        return weakref.ref(obj)
    except TypeError:  # no weak references: held only for identity checks
        return lambda: obj


def _died(pid: int, code: int | None) -> str | None:
    """A dead worker's exit status in the words torch's own SIGCHLD handler uses, or None
    for a worker that is running or ended cleanly. SIGTERM is left out: it is how torch
    itself stops a worker that did not exit in time at shutdown."""
    if code is None or code == 0 or code == -signal.SIGTERM:
        return None
    if code > 0:
        return f"DataLoader worker (pid {pid}) exited unexpectedly with exit code {code} (read by loadprof)"
    try:
        name = signal.strsignal(-code) or f"signal {-code}"
    except ValueError:
        name = f"signal {-code}"
    return f"DataLoader worker (pid {pid}) is killed by signal: {name} (its exit status, read by loadprof)"
