"""Pure: the facts of a Hugging Face ``datasets`` stream (an ``IterableDataset`` read through a
torch ``DataLoader``) that ``LoaderInfo`` has no field for, as ``key=value`` notes: its shuffle
buffer, its map and filter functions. Its shards are ``LoaderInfo.shards`` (the torch hooks
read ``n_shards``). The hooks write them; the words and advice read them. No datasets import.
"""

from __future__ import annotations

import dataclasses

from ...records import LoaderInfo, StageTime

#: the framework name the hooks give the ``LoaderInfo`` of a loader over an ``IterableDataset``
FRAMEWORK = "hfstream"

#: ``StageTime.kind`` of the hooks' stages: a ``.map`` or ``.filter`` function, and the stream's
#: source (the builder's generator reading its files)
MAP, FILTER, SOURCE = "map", "filter", "read"

SHUFFLE_BUFFER = "shuffle_buffer"  # buffer_size of .shuffle(); absent: not shuffled
#: one note per map: "name|batched|batch_size" (batch_size 0 where per example)
MAPS = "maps"


def note(loader: LoaderInfo, key: str) -> str | None:
    prefix = key + "="
    return next((n[len(prefix):] for n in loader.notes if n.startswith(prefix)), None)


def set_note(loader: LoaderInfo, key: str, value: object) -> None:
    prefix = key + "="
    loader.notes[:] = [n for n in loader.notes if not n.startswith(prefix)] + [f"{prefix}{value}"]


def shuffle_buffer(loader: LoaderInfo) -> int | None:
    value = note(loader, SHUFFLE_BUFFER)
    return int(value) if value is not None and value.isdigit() else None


def stage_name(fn_name: str, batched: bool, batch_size: int | None) -> str:
    """How the stage table names a map: "tokenize (train.py:12), per example" or ", batched 1000"."""
    return f"{fn_name}, batched {batch_size}" if batched else f"{fn_name}, per example"


def per_example_maps(loader: LoaderInfo) -> list[StageTime]:
    return [s for s in loader.stages if s.kind == MAP and s.calls and s.name.endswith(", per example")]


#: the fetch's time no hook claimed, where its stages were timed: the library's own code
#: (the torch hooks' "rest of __iter__"), named so in the table once they are filled
OWN_KIND, OWN_NAME = "datasets", "its own per-example work: rows to Python, formatting, the shard threads' hand-offs (rest of __iter__)"


def name_own_rows(loader: LoaderInfo) -> None:
    """The library's own row by its name (the torch hooks fill the stages when they stop,
    before these hooks do where the script imported torch first)."""
    for i, s in enumerate(loader.stages):
        if s.kind == "user" and s.name == "rest of __iter__":
            loader.stages[i] = dataclasses.replace(s, kind=OWN_KIND, name=OWN_NAME)
