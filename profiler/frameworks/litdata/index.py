"""What ``litdata.optimize`` wrote, read from the dataset's ``index.json`` (plain JSON, read
in the training process once per dataset): its chunks, their bytes, the chunk size asked for.

For a remote ``input_dir`` the index sits in the local cache once litdata fetched it; where
no index can be read, the facts it gives stay unknown.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

INDEX = "index.json"
#: an index larger than this is not read in the training process (millions of chunks)
MAX_INDEX_BYTES = 64 << 20


@dataclass(frozen=True)
class Chunks:
    count: int
    nbytes: int  # all of them
    chunk_bytes: int | None  # optimize's chunk_bytes, where it was given one


def _dirs(dataset: Any) -> list[str]:
    out = []
    for attr in ("input_dir", "cache_dir"):
        path = getattr(getattr(dataset, attr, None), "path", None)
        if isinstance(path, str) and path:
            out.append(path)
    return out


def read_chunks(dataset: Any) -> Chunks | None:
    """The chunks of ``dataset``'s index; the subsample litdata kept where it kept one."""
    for folder in _dirs(dataset):
        path = os.path.join(folder, INDEX)
        try:
            if os.path.getsize(path) > MAX_INDEX_BYTES:
                return None
            with open(path, encoding="utf-8") as f:
                index = json.load(f)
        except (OSError, ValueError):
            continue
        chunks = index.get("chunks") if isinstance(index, dict) else None
        if not isinstance(chunks, list):
            continue
        kept = getattr(dataset, "subsampled_files", None)
        names = set(kept) if isinstance(kept, list) and kept else None
        chosen = [c for c in chunks if isinstance(c, dict) and (names is None or c.get("filename") in names)]
        config = index.get("config") if isinstance(index.get("config"), dict) else {}
        size = config.get("chunk_bytes")
        return Chunks(len(chosen), sum(int(c.get("chunk_bytes") or 0) for c in chosen),
                      int(size) if isinstance(size, (int, float)) and size else None)
    return None
