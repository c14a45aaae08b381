"""Pure: a loader against its host: shards for its workers, its workers' start each
epoch, its processes against the node's cores, its batches in flight against /dev/shm,
its workers' own memory.

No I/O: the figures were measured by frameworks/torch/loaderfacts.py (NOTE [ Loader
start-up and shards ]) and read at the start by samplers/node.py and
samplers/host.py; diagnosis.py turns them into warnings and evidence, the advice package into
the fixes. Each check returns the measured figures and one line that says them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .records import Environment, HostSample, LoaderInfo
from .units import seconds_text as _secs
from .units import size_text

#: Ours: an epoch restart is worth fixing once the waits it adds reach 1% of the time in steps.
RESTART_SHARE = 0.01


# -- shards -------------------------------------------------------------------
def shards_fewer_than_workers(loader: LoaderInfo | None) -> str | None:
    """Why some workers of an IterableDataset get no data, with the fix; None when
    every worker delivered and the dataset does not say it has fewer shards."""
    workers = (loader.num_workers or 0) if loader else 0
    if loader is None or workers < 2:
        return None
    empty = loader.workers_ended_empty or 0
    shards = loader.shards
    if not empty and (shards is None or shards >= workers):
        return None
    parts = []
    if shards is not None:
        parts.append(f"the dataset has {shards} shard{'s' if shards != 1 else ''} for {workers} workers")
    if empty:
        per = ", ".join(str(n) for n in loader.worker_batches)
        parts.append(f"{empty} of the {workers} workers ended their share without a batch"
                     + (f" (batches per worker: {per})" if per else ""))
    busy = workers - empty if empty else min(workers, shards or workers)
    return ("; ".join(parts) + f": the loader runs on {busy} worker{'s' if busy != 1 else ''}, not {workers}. "
            f"Write the data in at least {workers} shards (a multiple of workers x ranks; Hugging Face "
            "datasets starts at most n_shards workers: to_iterable_dataset(num_shards=...)), "
            f"or set num_workers={max(1, busy)}")


# -- start-up each epoch ----------------------------------------------------------
@dataclass
class StartUp:
    """A training loader's start-up: its first batch, and what each epoch's start cost."""

    first_batch: float  # seconds from iter(loader) to the first batch of the first epoch
    later_first_batch: float | None  # median of the later epochs'
    epochs: int  # training iterations with a measured start
    start_batches: int  # batches counted as each epoch's start (one per worker)
    steady_wait: float  # seconds the loop waits for a batch once started (judged steps)
    #: seconds each epoch after the first waited for its first batches beyond steady ones
    restart_extra: list[float]

    @property
    def extra_per_epoch(self) -> float | None:
        return statistics.median(self.restart_extra) if self.restart_extra else None

    def line(self) -> str:
        text = f"{_secs(self.first_batch)} (first epoch)"
        if self.later_first_batch is not None:
            text += f"; {_secs(self.later_first_batch)} later epochs (median of {self.epochs - 1})"
        extra = self.extra_per_epoch
        if extra is not None:
            text += (f"; each epoch's first {self.start_batches} batch(es) waited {_secs(extra)} more than "
                     f"steady ones ({_secs(self.steady_wait)} a batch)")
        return text


def start_up(loader: LoaderInfo | None, steady_wait: float) -> StartUp | None:
    """The start-up of ``loader`` from its records, ``steady_wait`` the loop's wait per
    batch once started; None where no first batch was timed."""
    if loader is None or not loader.first_batch_s:
        return None
    firsts = loader.first_batch_s
    k = max(1, loader.start_batches)
    extra = [max(0.0, w - k * steady_wait) for w in loader.start_wait_s[1:]]
    if not extra and len(firsts) > 1:
        # the later epochs' starts ended before their first batches all came (the run's
        # end): their first batch alone, a lower bound of what the restart cost
        k = 1
        extra = [max(0.0, f - steady_wait) for f in firsts[1:]]
    return StartUp(firsts[0], statistics.median(firsts[1:]) if len(firsts) > 1 else None, len(firsts),
                   k, steady_wait, extra)


@dataclass(frozen=True)
class RestartCost:
    """What restarting the workers each epoch added to the loop's waits."""

    start: float  # seconds each later epoch's first batches waited beyond steady ones (median)
    stop: float  # seconds the last epoch's workers took to stop before it (median; 0: none timed)
    total: float  # both, over the run
    batches: int  # the first batches of an epoch counted in ``start``

    @property
    def per_epoch(self) -> float:
        return self.start + self.stop


def restart_cost(loader: LoaderInfo | None, steady_wait: float, steps_seconds: float) -> RestartCost | None:
    """What restarting the workers each epoch added to the waits: each later epoch's start
    beyond steady waits, and stopping the last epoch's workers before it
    (``LoaderInfo.stop_s``), where that reaches ``RESTART_SHARE`` of the time in steps;
    None for persistent workers, one epoch, or too little to matter."""
    if loader is None or not loader.num_workers or loader.persistent_workers:
        return None
    s = start_up(loader, steady_wait)
    if s is None or not s.restart_extra:
        return None
    stops = loader.stops_between_epochs()
    total = sum(s.restart_extra) + sum(stops)
    if steps_seconds <= 0 or total < RESTART_SHARE * steps_seconds:
        return None
    return RestartCost(s.extra_per_epoch or 0.0, statistics.median(stops) if stops else 0.0, total,
                       s.start_batches)


# -- cores ------------------------------------------------------------------------
def oversubscribed(env: Environment, loader: LoaderInfo | None, fix: Callable[[int], str | None] | None = None) -> str | None:
    """Loader workers and ranks beyond the node's usable cores, or None; ``fix(fit)`` words what
    fits in the loader's own knobs (the DataLoader's ``num_workers=fit`` otherwise)."""
    ranks = env.local_world_size or 1
    workers = (loader.num_workers or 0) if loader else 0
    busy = ranks * (workers + 1)
    cores = env.usable_cores
    if busy <= cores:
        return None
    fit = max(0, cores // ranks - 1)
    who = f"{ranks} ranks on this node x ({workers} loader workers + the rank)" if ranks > 1 else \
        f"{workers} loader workers + the training process"
    fits = (fix(fit) if fix is not None else None) or f"num_workers={fit}{' per rank' if ranks > 1 else ''} fits"
    return (f"{who} = {busy} processes for {cores} usable cores (affinity, cgroup quota, SLURM_CPUS_PER_TASK): "
            f"they queue for the cores and each gets a share of one; {fits}")


def cores_per_rank(env: Environment) -> int:
    """The usable cores a rank has to itself where the node's ranks share them (torchrun's LOCAL_WORLD_SIZE)."""
    return max(1, env.usable_cores // (env.local_world_size or 1))


# -- /dev/shm -----------------------------------------------------------------------
@dataclass
class ShmFit:
    """The batches in flight through /dev/shm against its free space."""

    batch_bytes: int
    workers: int
    prefetch: int
    ranks: int
    free: int
    total: int | None

    @property
    def in_flight(self) -> int:
        return self.batch_bytes * self.workers * self.prefetch * self.ranks

    @property
    def suggested(self) -> int:
        """A --shm-size that holds twice the batches in flight, in whole GiB (at least 1)."""
        return max(1, math.ceil(2 * self.in_flight / 2**30))

    def line(self) -> str:
        ranks = f" x {self.ranks} ranks" if self.ranks > 1 else ""
        total = f" of {size_text(self.total)}" if self.total else ""
        return (f"{self.workers} workers x prefetch_factor {self.prefetch}{ranks} x {size_text(self.batch_bytes)} "
                f"batches = {size_text(self.in_flight)} in flight through /dev/shm; {size_text(self.free)} free{total}")


def shm_fit(env: Environment, loader: LoaderInfo | None) -> ShmFit | None:
    """The batches in flight against /dev/shm, where both are known and the loader has workers."""
    if loader is None or not loader.num_workers or env.shm_free is None:
        return None
    if not loader.sample_nbytes or not loader.batch_size:
        return None
    return ShmFit(loader.sample_nbytes * loader.batch_size, loader.num_workers, loader.prefetch_factor or 2,
                  env.local_world_size or 1, env.shm_free, env.shm_total)


def shm_small(env: Environment, loader: LoaderInfo | None) -> str | None:
    """The ``shm-small`` warning: more batches in flight than /dev/shm has room for, with the fix."""
    fit = shm_fit(env, loader)
    if fit is None or fit.in_flight <= fit.free:
        return None
    return (f"{fit.line()}: a worker that finds it full dies (bus error, or 'No space left on device'). "
            f"Give the container more (docker run --shm-size={fit.suggested}g, or --ipc=host), or share "
            "through files: torch.multiprocessing.set_sharing_strategy('file_system')")


#: A worker's own memory (USS) beyond what it makes, from which its copies of the training
#: process's pages are worth a warning: a worker of a small dataset held 12 MiB on the 2-core
#: VM (interpreter and torch pages it wrote after the fork); one over a 1.5-million-tuple
#: index 86 MiB after 800 batches, its pages copied as it read the index.
COPIED_PER_WORKER = 64 * 2**20
#: What a worker is allowed beyond its batches in flight before the excess counts as copies.
WORKER_OWN = 32 * 2**20


@dataclass
class Copies:
    """Loader workers holding copies of the dataset's Python objects, from their USS."""

    workers: int  # the loader's workers read
    uss: list[int]  # the copying workers' USS at the last reading, the largest first
    copied: int  # bytes they hold beyond their batches, at most the dataset's objects each: what the fix saves
    grew: int  # the most one of them grew during the run

    def line(self) -> str:
        shown = ", ".join(size_text(u) for u in self.uss[:4]) + (f" and {len(self.uss) - 4} more"
                                                               if len(self.uss) > 4 else "")
        return (f"{len(self.uss)} of {self.workers} loader workers hold {shown} of their own (USS), "
                f"{size_text(self.copied)} more than their batches need"
                + (f"; it grew by up to {size_text(self.grew)} a worker during the run" if self.grew >= 2**20 else ""))


def worker_copies(loader: LoaderInfo | None, samples: Sequence[HostSample]) -> Copies | None:
    """Most of the loader's workers holding memory of their own far beyond the batches they
    make (their USS), the dataset's objects being that large (NOTE [ Copies in loader
    workers ] in frameworks/torch/pyobjects.py); None where they do not."""
    if loader is None or not loader.num_workers:
        return None
    # its own workers where their pids were kept: spawn's resource tracker and another
    # loader's workers are in the process tree too
    own = set(loader.worker_pids)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for h in samples:
        for pid, uss in zip(h.worker_pids, h.worker_uss, strict=False):
            if not own or pid in own:
                first.setdefault(pid, uss)
                last[pid] = uss
    if not last:
        return None
    batch = (loader.sample_nbytes or 0) * (loader.batch_size or 1) * (loader.prefetch_factor or 2)
    allowed = WORKER_OWN + batch
    # beyond what the dataset's objects weigh, a worker's memory is its interpreter (a spawned
    # one imports torch anew) or its own allocations, not copies
    most = loader.dataset_object_bytes if loader.dataset_object_bytes is not None else math.inf
    copied = {pid: int(min(uss - allowed, most)) for pid, uss in last.items()}
    copied = {pid: c for pid, c in copied.items() if c >= COPIED_PER_WORKER}
    if not copied or (len(last) > 1 and len(copied) * 2 <= len(last)):
        return None  # not most workers: one large batch, or another loader's, not the dataset's pages
    return Copies(len(last), sorted((last[p] for p in copied), reverse=True), sum(copied.values()),
                  max(last[p] - first[p] for p in copied))


def copy_on_read(loader: LoaderInfo | None, samples: Sequence[HostSample], limit: str = "") -> str | None:
    """The ``workers-copy-on-read`` warning: loader workers holding copies of the dataset's
    Python objects: the pages the fork shared, copied one by one as each worker touched them
    (reference counts and the garbage collector write into every object it reads), or,
    under spawn, unpickled whole. With the memory it saves, ``limit`` (what the copies did
    to the host's memory, where they ran it short), and the fix."""
    c = worker_copies(loader, samples)
    if c is None:
        return None
    return (c.line() + ": the dataset's Python objects (lists, dicts, tuples of an index) copied into each worker "
            "(after a fork, page by page as it reads them: reference counts and the garbage collector "
            "write into every object; under spawn, whole, unpickled)" + (f"; {limit}" if limit else "")
            + ". Hold the index as NumPy arrays or "
            "in one buffer (strings in an Arrow array), call gc.freeze() before the loader starts its "
            f"workers (fork), or use fewer workers: about {size_text(c.copied)} saved")


#: A worker is slow among its peers from twice their median time a batch, over at least
#: this many timed batches of its own: one slow shard or file, or a core it shares.
SLOW_WORKER_RATIO = 2.0
SLOW_WORKER_BATCHES = 3


def slow_worker(loader: LoaderInfo | None) -> str | None:
    """The ``slow-worker`` warning: a loader worker whose own batches took twice its peers'
    (its timed batches, frameworks/torch/stages.py), named with its slowest stage."""
    if loader is None:
        return None
    timed = [f for f in loader.worker_fetch if f.batches >= SLOW_WORKER_BATCHES and f.seconds > 0]
    if len(timed) < 2:
        return None
    per = {f.pid: f.seconds / f.batches for f in timed}
    worst = max(timed, key=lambda f: per[f.pid])
    others = statistics.median(per[f.pid] for f in timed if f is not worst)
    if others <= 0 or per[worst.pid] < SLOW_WORKER_RATIO * others:
        return None
    where = f", most of it in {worst.top}" if worst.top else ""
    fix = ("its shard holds slower items or files: spread them over the shards, or give the shards "
           "equal work" if loader.iterable else
           "a map-style loader deals indices to its workers in turn, so its items are the others' kind: "
           "its process is slowed (a core it shares, memory it swaps) or a few of its items are slow")
    return (f"loader worker pid {worst.pid} took {per[worst.pid] * 1000:.1f} ms a batch over {worst.batches} timed "
            f"batches{where}, against {others * 1000:.1f} ms for the other {len(timed) - 1}: {fix}; the loop waits "
            "for each batch in turn, so the slowest worker sets its pace")
