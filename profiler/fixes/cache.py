"""The in-memory cache of a torch dataset, and whether one is safe.

``check_cacheable`` reads a few items twice or more: a dataset whose items differ
between reads (random augmentation) must not be cached, since a cache would
freeze one draw of it; nor one that would not fit. ``CachedDataset`` holds every
item read once. ``raw_batches`` iterates a DataLoader as loadprof's own reads do
(the cache fill, ``tune_loader``'s timings): outside the profiler's hooks and
the fixes, with the random state put back afterwards.
"""

from __future__ import annotations

import dataclasses
import pickle
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psutil

#: as the cache advice in advice/loader.py: leave room for the model, workers and the OS).
CACHE_MEMORY_SHARE = 0.25
#: Items read twice by the cache safety probe (first, middle, last index).
PROBE_ITEMS = 3
#: Reads of an index before its item counts as repeatable: a random flip reads the same
#: twice half the time, ten times in one case of 512...
MAX_READS = 10
#: ...while the reads after the first two fit in this time.
EXTRA_READS_S = 0.5


# -- item comparison and size ---------------------------------------------
def same_item(a: Any, b: Any, depth: int = 0) -> bool:
    """True when two reads of one dataset index gave identical data (NaN equals NaN)."""
    if depth > 20:
        return False
    if type(a) is not type(b):
        return False
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(a, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.is_floating_point() or a.is_complex():
            return bool(((a == b) | (a.isnan() & b.isnan())).all())
        return bool(torch.equal(a, b))
    np = sys.modules.get("numpy")
    if np is not None and isinstance(a, np.ndarray):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, float):
        return a == b or (a != a and b != b)
    if isinstance(a, (int, str, bytes, bool)) or a is None:
        return bool(a == b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_item(x, y, depth + 1) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_item(a[k], b[k], depth + 1) for k in a)
    if np is not None and isinstance(a, np.generic):
        return same_item(a.item(), b.item(), depth + 1)
    if hasattr(a, "tobytes") and hasattr(a, "size") and hasattr(a, "mode"):  # PIL images
        return bool(a.mode == b.mode and a.size == b.size and a.tobytes() == b.tobytes())
    try:  # anything else: equal pickles are equal data (unequal pickles may still be equal: stay safe)
        return pickle.dumps(a) == pickle.dumps(b)
    except Exception:  # an unpicklable item: we cannot tell, so we do not cache it
        return False


def item_nbytes(item: Any, depth: int = 0) -> int:
    """Approximate bytes one loaded item holds in memory."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(item, torch.Tensor):
        return int(item.element_size() * item.nelement()) + 80
    if hasattr(item, "nbytes") and isinstance(getattr(item, "nbytes", None), int):
        return int(item.nbytes) + 100
    if isinstance(item, (bytes, str)):
        return len(item) + 50
    if depth < 10 and isinstance(item, (list, tuple)):
        return 56 + sum(item_nbytes(x, depth + 1) for x in item)
    if depth < 10 and isinstance(item, dict):
        return 232 + sum(item_nbytes(v, depth + 1) for v in item.values())
    if hasattr(item, "size") and hasattr(item, "mode") and isinstance(getattr(item, "size", None), tuple):
        w, h = item.size
        return int(w * h * max(1, len(item.getbands())))
    return sys.getsizeof(item)


@dataclass
class CacheCheck:
    """Whether a dataset can be cached in memory without changing what the model sees."""

    cacheable: bool
    reason: str
    items: int = 0
    estimated_bytes: int = 0
    item_seconds: float = 0.0  # measured cost of one read, from the probe

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def more_reads_differ(dataset: Any, firsts: dict[int, Any]) -> int | None:
    """After two reads of each index gave the same item (``firsts``), read them again, up
    to ``MAX_READS`` each while it takes under ``EXTRA_READS_S``: the first index whose
    item changes, or None. Two reads alone miss a coin-flip augmentation half the time."""
    deadline = time.perf_counter() + EXTRA_READS_S
    for _ in range(MAX_READS - 2):
        for i, first in firsts.items():
            if time.perf_counter() > deadline:
                return None
            if not same_item(first, dataset[i]):
                return i
    return None


def check_cacheable(dataset: Any, memory_available: int | None = None) -> CacheCheck:
    """Read a few indices twice: a dataset whose items differ between reads (random
    augmentation) must not be cached, since a cache would freeze one draw of it."""
    torch_data = sys.modules.get("torch.utils.data")
    if torch_data is not None and isinstance(dataset, torch_data.IterableDataset):
        return CacheCheck(False, "an IterableDataset has no indices to cache")
    if not hasattr(dataset, "__getitem__"):
        return CacheCheck(False, f"{type(dataset).__name__} has no __getitem__")
    try:
        n = len(dataset)
    except TypeError:
        return CacheCheck(False, f"{type(dataset).__name__} has no length")
    if n == 0:
        return CacheCheck(False, "the dataset is empty")
    indices = sorted({0, n // 2, n - 1})[:PROBE_ITEMS]
    total = 0
    t0 = time.perf_counter()
    firsts: dict[int, Any] = {}
    for i in indices:
        first = dataset[i]
        second = dataset[i]
        if not same_item(first, second):
            return CacheCheck(False, f"item {i} differs between two reads (random augmentation?): "
                                     "a cache would freeze one draw of it", n)
        total += item_nbytes(first)
        firsts[i] = first
    per_item = (time.perf_counter() - t0) / (2 * len(indices))
    changed = more_reads_differ(dataset, firsts)
    if changed is not None:
        return CacheCheck(False, f"item {changed} differs between reads (random augmentation?): "
                                 "a cache would freeze one draw of it", n)
    estimate = total * n // len(indices)
    avail = psutil.virtual_memory().available if memory_available is None else memory_available
    if estimate > CACHE_MEMORY_SHARE * avail:
        return CacheCheck(False, f"about {estimate / 2**20:.0f} MiB, more than {CACHE_MEMORY_SHARE:.0%} of the "
                                 f"{avail / 2**20:.0f} MiB available", n, estimate, per_item)
    return CacheCheck(True, f"{n} items, about {estimate / 2**20:.1f} MiB; reads are repeatable",
                      n, estimate, per_item)


def _pickled_batch(items: list[Any]) -> bytes:
    # Runs in a fill worker: bytes cross the pipe, not one shared-memory segment per tensor
    # (thousands of those would exhaust file descriptors).
    return pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL)


class CachedDataset:
    """A map-style dataset held in memory: ``items[i]`` is ``dataset[i]`` read once.

    Attribute access falls through to the original dataset (``.classes``, ...).
    Build it with ``CachedDataset.fill(dataset)``.
    """

    def __init__(self, dataset: Any, items: list[Any]) -> None:
        self.dataset = dataset
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> Any:
        return self.items[index]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("dataset", "items"):
            raise AttributeError(name)
        return getattr(self.dataset, name)

    @classmethod
    def fill(cls, dataset: Any, workers: int = 0, worker_init_fn: Any = None) -> CachedDataset:
        """Read every item once, in ``workers`` processes when > 0 (falls back to in-process)."""
        n = len(dataset)
        items: list[Any] | None = None
        if workers > 0 and n >= 64:
            try:
                items = _parallel_read(dataset, n, workers, worker_init_fn)
            except Exception:  # a dataset that cannot be read in workers: read it here instead
                items = None
        if items is None:
            items = [dataset[i] for i in range(n)]
        return cls(dataset, items)


def _parallel_read(dataset: Any, n: int, workers: int, worker_init_fn: Any) -> list[Any]:
    import torch.utils.data as tud

    with internal():
        loader = tud.DataLoader(dataset, batch_size=32, shuffle=False, num_workers=workers,
                                collate_fn=_pickled_batch, worker_init_fn=worker_init_fn)
        items: list[Any] = []
        for blob in raw_batches(loader):
            items.extend(pickle.loads(blob))
    if len(items) != n:
        raise RuntimeError(f"read {len(items)} of {n} items")
    return items


def raw_batches(loader: Any) -> Iterator[Any]:
    """Iterate a DataLoader without the profiler's timing hooks (internal reads: cache
    fill, tune_loader's measurements) so they never count as the training loop's waits.

    The random number generators it draws from (torch's global one: the workers' base
    seed and a shuffle's seed; the loader's and its sampler's generators) are put back
    afterwards, so the script's own shuffles come out as if this read never happened."""
    import torch

    generators = {id(g): g for g in (getattr(loader, "generator", None), getattr(loader.sampler, "generator", None))
                  if g is not None}
    saved = [(g, g.get_state()) for g in generators.values()]
    global_state = torch.get_rng_state()
    with internal():
        it = loader._get_iterator()
    try:
        while True:
            try:
                yield it._next_data()
            except StopIteration:
                return
    finally:
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
        torch.set_rng_state(global_state)
        for g, state in saved:
            g.set_state(state)


_local = threading.local()


class internal:
    """Marks loadprof's own DataLoader use, which the patches pass straight through."""

    def __enter__(self) -> None:
        _local.depth = getattr(_local, "depth", 0) + 1

    def __exit__(self, *exc: object) -> None:
        _local.depth -= 1


def in_internal() -> bool:
    return getattr(_local, "depth", 0) > 0

