"""Pure: the facts of a LitData loader that ``LoaderInfo`` has no field for, as ``key=value``
notes (as torchdata's and tf.data's are): the ``StreamingDataset``'s cache, pre-download and
shuffle, and the chunks ``optimize`` wrote. The hooks write them; the words and advice read
them. No litdata import.
"""

from __future__ import annotations

import dataclasses

from ...records import LoaderInfo, StageTime

#: the framework name the hooks give the ``LoaderInfo`` of a loader over a ``StreamingDataset``
FRAMEWORK = "litdata"

#: ``StageTime.kind`` of the hooks' stages: ``BinaryReader.read`` (waiting for the item's chunk,
#: its download or copy included, and finding the item in it), the serializers' ``deserialize``,
#: and the user's own code (a ``__getitem__`` of a ``StreamingDataset`` subclass, ``transform=``)
CHUNKS, DESERIALIZE, TRANSFORM = "chunks", "deserialize", "transform"

MAX_CACHE = "max_cache_size"  # bytes; "None": litdata's default (a share of the free disk)
PRE_DOWNLOAD = "max_pre_download"
SHUFFLE = "shuffle"
REMOTE = "remote"  # the input_dir is a URL (s3://, gs://, ...), its chunks downloaded
CHUNK_COUNT = "chunks"
CHUNK_BYTES = "chunk_bytes"  # optimize's chunk_bytes (the largest a chunk may be)
DATA_BYTES = "dataset_bytes"  # the chunks' bytes, all of them
INPUT_DIR = "input_dir"


def note(loader: LoaderInfo, key: str) -> str | None:
    prefix = key + "="
    return next((n[len(prefix):] for n in loader.notes if n.startswith(prefix)), None)


def set_note(loader: LoaderInfo, key: str, value: object) -> None:
    prefix = key + "="
    loader.notes[:] = [n for n in loader.notes if not n.startswith(prefix)] + [f"{prefix}{value}"]


def number(loader: LoaderInfo, key: str) -> int | None:
    value = note(loader, key)
    return int(value) if value is not None and value.isdigit() else None


def remote(loader: LoaderInfo) -> bool:
    return note(loader, REMOTE) == "True"


def stages_of(loader: LoaderInfo, kind: str) -> list[StageTime]:
    return [s for s in loader.stages if s.kind == kind and s.calls]


#: the fetch's time no hook claimed, where its stages were timed: the library's own code
#: (the torch hooks' "rest of __iter__"), named so in the table once they are filled
OWN_KIND, OWN_NAME = "litdata", "its own iteration (rest of __iter__)"


def name_own_rows(loader: LoaderInfo) -> None:
    """The library's own row by its name (the torch hooks fill the stages when they stop,
    before these hooks do where the script imported torch first)."""
    for i, s in enumerate(loader.stages):
        if s.kind == "user" and s.name == "rest of __iter__":
            loader.stages[i] = dataclasses.replace(s, kind=OWN_KIND, name=OWN_NAME)
