"""A LitData copy of a stream's items, for the what-if replay of ``optimize(fn=...)``: the
items a cache replay holds (the dataset's own output, its per-item work done) written with
litdata's chunk writer, as ``optimize`` stores them, and read back through a
``StreamingDataset``: each read finds its chunk and deserialises its item, as the optimised
job's would. An HDF5 copy would stand for a reader other than the one the job keeps.

Read by index (``StreamingDataset[i]``) and cycled, so the replay's loader never ends an
epoch among the few items held; each worker opens the copy on its first read, as a
``StreamingDataset`` does. Imported only where litdata is.
"""

from __future__ import annotations

from typing import Any

#: the chunk size the copy is written with: the one the advice's code names
CHUNK_BYTES = "64MB"


def stored_copy(dataset: Any, items: list[Any], folder: str, length: int) -> LitDataCopy | None:
    """The adapter's ``stored_copy``: ``items`` in LitData's chunks where ``dataset`` is a
    ``StreamingDataset`` (litdata imported by the user), else None."""
    import sys

    module = sys.modules.get("litdata.streaming.dataset")
    cls = getattr(module, "StreamingDataset", None)
    if not (isinstance(cls, type) and isinstance(dataset, cls)):
        return None
    return write(items, folder, length)


class LitDataCopy:
    """The copy as a map-style dataset: any index reads one of its items."""

    def __init__(self, dataset: Any, count: int, length: int) -> None:
        self.dataset, self.count, self.length = dataset, count, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index % self.count]


def write(items: list[Any], folder: str, length: int) -> LitDataCopy:
    """``items`` written into ``folder`` in LitData's chunks and opened for reading."""
    from litdata import StreamingDataset
    from litdata.streaming.cache import Cache

    cache = Cache(folder, chunk_bytes=CHUNK_BYTES)
    for i, item in enumerate(items):
        cache[i] = item
    cache.done()
    cache.merge()
    return LitDataCopy(StreamingDataset(folder), len(items), length)
