"""A torchdata.nodes pipeline read from its root: its nodes, what each is called in the
report, and the settings the advice needs (the mapper's workers, method and order, the
prefetch depth, the batch size).

Imported by the hooks (hooks.py) only; it reads attributes and imports nothing of torchdata.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...callables import callable_name as _callable_name

#: nodes whose ``next()`` takes what another thread (or process) made from a queue: the
#: time in it is the wait for that thread, not work of the node's own
HANDOFF = ("Prefetcher", "PinMemory", "ParallelMapper")
#: a walk stops here: a graph this large is no pipeline anyone writes by hand
MAX_NODES = 256


@dataclass
class MapNode:
    """One ``ParallelMapper`` (``Mapper`` is one with no workers) and its settings."""

    node: Any
    fn: Any  # the map function as the mapper calls it (a ``MapOverBatch`` under prebatch)
    name: str  # the user's function: "parse (train.py:12)"
    workers: int
    method: str  # "thread" or "process"
    in_order: bool
    max_concurrent: int | None
    prebatch: int | None
    #: calls of ``fn`` per batch the loop gets: a Batcher after it of B items makes B
    #: calls (B / prebatch under prebatch); none after it, one (it maps batches)
    calls_per_batch: float = 1.0


@dataclass
class Pipeline:
    """What the walk found, the loop's end first."""

    nodes: list[Any] = field(default_factory=list)
    maps: list[MapNode] = field(default_factory=list)
    batch_size: int | None = None
    prefetch_factor: int | None = None  # the Prefetcher nearest the loop
    pin_memory: bool = False
    length: int | None = None  # items an epoch reads, where its one source says
    chain: str = ""  # "SamplerWrapper -> ParallelMapper(parse) -> Batcher -> Prefetcher"


def callable_name(fn: Any) -> str:
    """The name of the user's function, inside a ``MapOverBatch`` where prebatched (``callables.py``)."""
    inner = getattr(fn, "map_fn", None)
    if inner is not None and type(fn).__name__ == "MapOverBatch":
        fn = inner
    return _callable_name(fn)


def upstream(node: Any, base: type) -> list[Any]:
    """The nodes ``node`` reads from: its public attributes that are nodes, or mappings
    and sequences of them (``MultiNodeWeightedSampler.source_nodes``). Private ones are
    the node's own machinery (a mapper's ``_it``), which the walk leaves inside it."""
    found: list[Any] = []
    for attr, value in vars(node).items():
        if attr.startswith("_"):
            continue
        if isinstance(value, base):
            found.append(value)
        elif isinstance(value, Mapping):
            found.extend(v for v in value.values() if isinstance(v, base))
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, base))
    return found


def stage_name(node: Any) -> str:
    """What a node is called in the stage table, after its class."""
    cls = type(node).__name__
    if cls == "ParallelMapper":
        return callable_name(getattr(node, "map_fn", None))
    if cls == "Batcher":
        return f"batch_size={getattr(node, 'batch_size', '?')}"
    if cls == "SamplerWrapper":
        return type(getattr(node, "sampler", None)).__name__
    if cls == "IterableWrapper":
        return type(getattr(node, "iterable", None)).__name__
    if cls == "MultiNodeWeightedSampler":
        return f"{len(getattr(node, 'source_nodes', {}) or {})} sources"
    return "its own next()"


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and value > 0 else None


def walk(root: Any, base: type) -> Pipeline:
    """The pipeline under ``root``, each node once, the root first."""
    out = Pipeline()
    seen: set[int] = set()
    batched: dict[int, int | None] = {}  # node -> the batch size of the nearest Batcher between it and the loop
    todo: list[tuple[Any, int | None]] = [(root, None)]
    while todo and len(out.nodes) < MAX_NODES:
        node, size = todo.pop(0)
        if id(node) in seen:
            continue
        seen.add(id(node))
        out.nodes.append(node)
        batched[id(node)] = size
        if type(node).__name__ == "Batcher" and size is None:
            size = _positive(getattr(node, "batch_size", None))
        todo.extend((n, size) for n in upstream(node, base))
    links = []
    for node in out.nodes:
        cls = type(node).__name__
        if cls == "ParallelMapper":
            fn = getattr(node, "map_fn", None)
            prebatch = getattr(node, "prebatch", None)
            size = batched[id(node)]
            m = MapNode(node, fn, callable_name(fn), int(getattr(node, "num_workers", 0) or 0),
                        str(getattr(node, "method", "thread")), bool(getattr(node, "in_order", True)),
                        getattr(node, "max_concurrent", None), prebatch,
                        size / (_positive(prebatch) or 1) if size else 1.0)
            out.maps.append(m)
            links.append(f"ParallelMapper({m.name.split(' (')[0]}, num_workers={m.workers}"
                         + (f", method={m.method!r}" if m.workers else "") + ")")
        elif cls == "Batcher":
            out.batch_size = out.batch_size or getattr(node, "batch_size", None)
            links.append(cls)
        elif cls == "Prefetcher":
            out.prefetch_factor = out.prefetch_factor or getattr(node, "prefetch_factor", None)
            links.append(f"Prefetcher({getattr(node, 'prefetch_factor', '?')})")
        else:
            out.pin_memory = out.pin_memory or cls == "PinMemory"
            links.append(cls)
    out.chain = " -> ".join(reversed(links))
    sources = [n for n in out.nodes if type(n).__name__ in ("SamplerWrapper", "IterableWrapper")]
    if len(sources) == 1:
        held = getattr(sources[0], "sampler", None) or getattr(sources[0], "iterable", None)
        try:
            out.length = len(held)  # type: ignore[arg-type]
        except TypeError:
            out.length = None
    return out
