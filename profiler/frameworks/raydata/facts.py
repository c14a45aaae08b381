"""Pure: the facts of a Ray Data pipeline that ``LoaderInfo`` has no field for, as
``key=value`` notes (as torchdata's and tf.data's facts are): the iteration's
``prefetch_batches``, the Ray cluster's CPUs, and the slowest operator with the knobs its
``map_batches`` (or ``map``, ``flat_map``, ``filter``) call was given. The hooks write them;
the adapter, its words and its advice read them. No Ray import.

``LoaderInfo.num_workers`` is the tasks (or actors) the slowest operator can run at once:
its ``concurrency``, capped by the cluster's CPUs over its ``num_cpus`` per task; its
worker processes are Ray's, which the host sampler reads as the training process's
descendants.
"""

from __future__ import annotations

import math

from ...records import LoaderInfo, StageTime

#: the framework name the hooks give their ``LoaderInfo``s
FRAMEWORK = "ray.data"
#: ``StageTime.kind`` of an operator's row
OPERATOR = "operator"
#: ``LoaderInfo.stage_source``: the stages are Ray's own figures (``Dataset.stats()``)
SOURCE = "ray.stats"

PREFETCH, CLUSTER_CPUS, SLOWEST = "prefetch_batches", "cluster_cpus", "slowest_operator"
#: the slowest operator's call: its function, batch_size, concurrency, num_cpus, and
#: whether it runs on actors (a callable class)
FN, BATCH, CONCURRENCY, NUM_CPUS, ACTORS = "op_fn", "op_batch_size", "op_concurrency", "op_num_cpus", "op_actors"
#: the loop's method that reads the batches (``iter_torch_batches``)
METHOD = "iter_method"
#: Ray's default: a task asks for one CPU
DEFAULT_NUM_CPUS = 1.0
#: the Dataset methods whose calls become operators, and the names Ray's stats give those
MAPS = {"map_batches": "MapBatches", "map": "Map", "flat_map": "FlatMap", "filter": "Filter"}


def note(loader: LoaderInfo, key: str) -> str | None:
    prefix = key + "="
    return next((n[len(prefix):] for n in loader.notes if n.startswith(prefix)), None)


def set_note(loader: LoaderInfo, key: str, value: object) -> None:
    prefix = key + "="
    loader.notes[:] = [n for n in loader.notes if not n.startswith(prefix)] + [f"{prefix}{value}"]


def number(loader: LoaderInfo, key: str) -> float | None:
    """A note's value as a positive number; None where absent, ``None`` or not a number."""
    value = note(loader, key)
    try:
        found = float(value) if value is not None else None
    except ValueError:
        return None
    return found if found is not None and math.isfinite(found) and found > 0 else None


def cluster_cpus(loader: LoaderInfo) -> float | None:
    return number(loader, CLUSTER_CPUS)


def prefetch_batches(loader: LoaderInfo) -> int:
    found = number(loader, PREFETCH)
    return int(found) if found else 1


def num_cpus(loader: LoaderInfo) -> float:
    """CPUs each task of the slowest operator asks for (Ray's default where not given)."""
    return number(loader, NUM_CPUS) or DEFAULT_NUM_CPUS


def concurrency(loader: LoaderInfo) -> int | None:
    """The slowest operator's most tasks or actors at once, where its call set one."""
    found = number(loader, CONCURRENCY)
    return int(found) if found else None


def slots(cpus: float | None, per_task: float, cap: int | None) -> int:
    """Tasks that run at once: the cluster's CPUs over each task's, under ``cap``."""
    fit = math.floor(cpus / per_task + 1e-9) if cpus else 1
    return max(1, min(fit, cap) if cap else fit)


def slowest(loader: LoaderInfo) -> StageTime | None:
    name = note(loader, SLOWEST)
    return next((s for s in loader.stages if s.kind == OPERATOR and s.name == name and s.calls), None)


def fn_name(loader: LoaderInfo) -> str:
    """The slowest operator's function as the script names it ("fn" where not known)."""
    return note(loader, FN) or "fn"


def map_method(loader: LoaderInfo) -> str:
    """The Dataset method that made the slowest operator (of a fused one, its last part)."""
    last = (note(loader, SLOWEST) or "").split("->")[-1].split("(")[0]
    return next((method for method, op in MAPS.items() if op == last), "map_batches")
