"""A ``datasets`` stream read from its ``IterableDataset``: the chain of examples iterables
under it, what each map and filter calls, its shuffle buffer, its source's generator.

Imported by the hooks (hooks.py) only; it reads attributes and imports nothing of datasets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: a walk stops here: no stream anyone writes is this deep
MAX_NODES = 256
#: where an examples iterable holds the function it calls, by its class name
FUNCTIONS = {"MappedExamplesIterable": "function", "FilteredExamplesIterable": "function",
             "ExamplesIterable": "generate_examples_fn", "ArrowExamplesIterable": "generate_tables_fn"}


@dataclass
class Call:
    """A function one node of the stream calls: a map's, a filter's, the source's reader."""

    node: Any
    attr: str
    fn: Any
    kind: str  # "map", "filter", "source"
    batched: bool = False
    batch_size: int | None = None


@dataclass
class Stream:
    calls: list[Call] = field(default_factory=list)  # the loop's end first
    shuffle_buffer: int | None = None  # the buffer nearest the loop
    chain: str = ""  # "ExamplesIterable -> MappedExamplesIterable -> BufferShuffledExamplesIterable"


def _upstream(node: Any) -> list[Any]:
    one = getattr(node, "ex_iterable", None)
    many = getattr(node, "ex_iterables", None)
    return ([one] if one is not None else []) + (list(many) if isinstance(many, (list, tuple)) else [])


def walk(dataset: Any) -> Stream:
    """The stream under ``dataset`` (its ``_ex_iterable``), each node once."""
    out = Stream()
    root = getattr(dataset, "_ex_iterable", None)
    todo = [root] if root is not None else []
    seen: set[int] = set()
    names: list[str] = []
    while todo and len(seen) < MAX_NODES:
        node = todo.pop(0)
        if id(node) in seen:
            continue
        seen.add(id(node))
        cls = type(node).__name__
        names.append(cls)
        attr = FUNCTIONS.get(cls)
        fn = getattr(node, attr, None) if attr else None
        if attr and callable(fn):
            kind = "filter" if cls.startswith("Filtered") else "map" if cls.startswith("Mapped") else "source"
            batched = bool(getattr(node, "batched", False))
            size = getattr(node, "batch_size", None)
            out.calls.append(Call(node, attr, fn, kind, batched, size if isinstance(size, int) else None))
        if cls == "BufferShuffledExamplesIterable" and out.shuffle_buffer is None:
            size = getattr(node, "buffer_size", None)
            out.shuffle_buffer = size if isinstance(size, int) else None
        todo.extend(_upstream(node))
    out.chain = " -> ".join(reversed(names))
    return out
