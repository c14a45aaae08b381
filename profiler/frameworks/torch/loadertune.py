"""``loadprof.tune_loader(loader)``: a DataLoader's workers, prefetch and pinning
measured in this process on a few batches, and a loader like it with the fastest
settings returned (the in-process counterpart of ``loadprof tune``)."""

from __future__ import annotations

import sys
import time
from typing import Any

#: DataLoader arguments copied unchanged into the tuned loader.
_KEEP = ("collate_fn", "worker_init_fn", "generator", "timeout", "multiprocessing_context",
         "pin_memory_device", "in_order")


def _loader_like(loader: Any, dataset: Any = None, **settings: Any) -> Any:
    """A DataLoader over the same dataset (or ``dataset``, indexed alike), sampler and
    collation as ``loader`` with ``settings``."""
    import inspect

    import torch.utils.data as tud

    accepted = inspect.signature(tud.DataLoader.__init__).parameters
    kwargs: dict[str, Any] = {k: getattr(loader, k) for k in _KEEP if k in accepted and hasattr(loader, k)}
    if kwargs.get("pin_memory_device") == "":
        kwargs.pop("pin_memory_device")
    if isinstance(loader.dataset, tud.IterableDataset):
        kwargs.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif loader.batch_size is not None:  # auto-batching: the same sampler, so the same order
        kwargs.update(sampler=loader.sampler, batch_size=loader.batch_size, drop_last=loader.drop_last)
    else:
        kwargs.update(batch_sampler=loader.batch_sampler)
    current = {k: getattr(loader, k) for k in ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")}
    current.update(settings)
    if not current["num_workers"]:
        current.update(persistent_workers=False, prefetch_factor=None)
    elif current.get("prefetch_factor") is None:
        current["prefetch_factor"] = 2
    return tud.DataLoader(loader.dataset if dataset is None else dataset, **kwargs, **current)


def _batches_per_s(loader: Any, batches: int, budget: float) -> float:
    """Batches per second after the first (worker start-up) batch, from raw iteration."""
    from ...fixes.cache import raw_batches

    it: Any = raw_batches(loader)
    try:
        next(it)
        t0 = time.perf_counter()
        n = 0
        for _ in it:
            n += 1
            if n >= batches or time.perf_counter() - t0 > budget:
                break
        return n / max(time.perf_counter() - t0, 1e-9)
    except StopIteration:
        return 0.0
    finally:
        it.close()


def tune_loader(loader: Any, batches: int = 20, budget: float = 30.0, verbose: bool = False) -> Any:
    """Return an equivalent DataLoader (same dataset, sampler, batch size and collation,
    so the same items in the same order for the same sampler state) with the settings
    that fetched batches fastest here: ``num_workers`` from 0 up to the usable cores,
    ``persistent_workers`` and ``prefetch_factor`` with workers, ``pin_memory`` when
    CUDA is available. Each candidate reads up to ``batches`` batches (within
    ``budget`` seconds in all, shared evenly); nothing is trained. A candidate must
    beat the loader's own settings by 10% to be chosen, otherwise the settings stay.
    """
    import torch
    import torch.utils.data as tud

    from ...samplers.cores import usable_cores

    if not isinstance(loader, tud.DataLoader):
        raise TypeError(f"tune_loader: loader must be a torch DataLoader, got {type(loader).__name__}")
    if batches < 1 or budget <= 0:
        raise ValueError(f"tune_loader: batches must be >= 1 and budget > 0, got {batches} and {budget}")
    cores = usable_cores()
    counts = sorted({0, 1, 2, max(1, cores // 2), max(1, cores - 1), cores} - {loader.num_workers})
    per = budget / (len(counts) + 1)
    base = _batches_per_s(_loader_like(loader), batches, per)
    best: dict[str, Any] = {}
    best_rate = base
    for w in counts:
        settings: dict[str, Any] = {"num_workers": w}
        if w:
            settings.update(persistent_workers=True, prefetch_factor=4 if w >= 2 else 2)
        try:
            rate = _batches_per_s(_loader_like(loader, **settings), batches, per)
        except Exception as exc:  # a dataset that cannot live in a worker: keep what works
            if verbose:
                print(f"tune_loader: num_workers={w} failed ({type(exc).__name__}: {exc})", file=sys.stderr)
            continue
        if verbose:
            print(f"tune_loader: num_workers={w}: {rate:.1f} batches/s (as written {base:.1f})", file=sys.stderr)
        if rate > best_rate and rate >= 1.10 * base:
            best, best_rate = settings, rate
    if torch.cuda.is_available():
        best["pin_memory"] = True
    return _loader_like(loader, **best)
