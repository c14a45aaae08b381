"""Pure: the facts of a torchdata.nodes pipeline that ``LoaderInfo`` has no field for, as
``key=value`` notes (the way tf.data's facts are notes): the main mapper's method, order
and concurrency, and its map function's name. The hooks write them; the adapter, its
words and its advice read them. No torchdata import.

The main mapper is the one whose map function took the most time (the first from the
loop where none was timed); ``LoaderInfo.num_workers`` is its workers, and
``prefetch_factor`` the depth of the ``Prefetcher`` nearest the loop (None: none).
"""

from __future__ import annotations

import math

from ...records import LoaderInfo, StageTime

#: the framework name the hooks give their ``LoaderInfo``s
FRAMEWORK = "torchdata.nodes"
#: ``StageTime.kind`` of a map function's stage: the node class that calls it
MAPPER = "ParallelMapper"

METHOD, IN_ORDER, MAX_CONCURRENT, MAP = "map_method", "map_in_order", "map_max_concurrent", "map"
#: the main map function's spread of times per item: standard deviation over the mean
SPREAD = "map_spread"
#: the main map function's calls per batch the loop gets (graph.py)
CALLS = "map_calls_per_batch"


def note(loader: LoaderInfo, key: str) -> str | None:
    prefix = key + "="
    return next((n[len(prefix):] for n in loader.notes if n.startswith(prefix)), None)


def set_note(loader: LoaderInfo, key: str, value: object) -> None:
    prefix = key + "="
    loader.notes[:] = [n for n in loader.notes if not n.startswith(prefix)] + [f"{prefix}{value}"]


def method(loader: LoaderInfo | None) -> str | None:
    """"thread" or "process": where the main mapper's workers run; None: no workers (or no mapper)."""
    if loader is None or not loader.num_workers:
        return None
    return note(loader, METHOD)


def in_order(loader: LoaderInfo) -> bool:
    return note(loader, IN_ORDER) != "False"


def max_concurrent(loader: LoaderInfo) -> int | None:
    value = note(loader, MAX_CONCURRENT)
    return int(value) if value and value.isdigit() else None


def calls_per_batch(loader: LoaderInfo) -> float:
    """Calls of the main map function per batch: noted by the hooks, else (a run saved
    before they noted it) the batch size."""
    try:
        value = float(note(loader, CALLS) or "nan")
    except ValueError:
        value = float("nan")
    most = float(max(1, loader.batch_size or 1))  # one call an item at most
    return min(value, most) if math.isfinite(value) and value > 0 else most


def map_stage(loader: LoaderInfo) -> StageTime | None:
    """The main mapper's map function as timed (None: not timed, in worker processes)."""
    name = note(loader, MAP)
    return next((s for s in loader.stages if s.kind == MAPPER and s.name == name and s.calls), None)
