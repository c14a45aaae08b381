"""The loaders' items the what-if replays read instead of the dataset (whatif.py): one
batch again and again (the model alone), the items of a few batches held (a cache), and
those items written to an HDF5 file and read back (an offline copy)."""

from __future__ import annotations

from typing import Any

#: batches of items a cache replay reads and holds (it cycles over them)
CACHE_BATCHES = 4
#: the length a cache replay of a stream gives its held items (a replay reads far fewer)
STREAM_LENGTH = 1 << 20


class OneBatch:
    """A loader that gives one batch again and again: the step with no loading at all."""

    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def __iter__(self) -> Any:
        while True:
            yield self.batch


class HeldItems:
    """A cache as the cache fix makes one, for the replay: the items of a few batches
    read once and held; any index reads one of them (a cached read costs the same)."""

    def __init__(self, items: list[Any], length: int) -> None:
        self.items, self.length = items, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Any:
        return self.items[index % len(self.items)]

    @classmethod
    def read(cls, loader: Any) -> HeldItems:
        import itertools

        import torch

        from .fixes.cache import internal

        dataset = loader.dataset
        size = loader.batch_size or 1
        if isinstance(dataset, torch.utils.data.IterableDataset):  # the stream's first items, in order
            with internal():
                held = list(itertools.islice(iter(dataset), CACHE_BATCHES * size))
            return cls(held, STREAM_LENGTH)
        with internal():
            indices = [i for _, i in zip(range(CACHE_BATCHES * size), iter(loader.sampler), strict=False)]
        items = [dataset[i] for i in indices] or [dataset[0]]
        return cls(items, len(dataset))


class StoredItems:
    """An offline copy as ``loadprof convert`` stores one, for the replay: the held items
    written to an HDF5 file and read back through ``HDF5Dataset``, each read checked
    against its stored checksum as a user's would be; any index reads one of them."""

    def __init__(self, dataset: Any, length: int) -> None:
        self.dataset, self.length, self.count = dataset, length, len(dataset)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index % self.count]

    @classmethod
    def write(cls, held: HeldItems, path: str) -> StoredItems:
        from .converters.hdf5 import HDF5Writer
        from .converters.schema import Schema
        from .converters.sources import as_sample
        from .converters.torch import HDF5Dataset

        samples = [as_sample(item, f"held item {i}") for i, item in enumerate(held.items)]
        schema = Schema.infer(samples[0], "held item 0")
        writer = HDF5Writer(path, schema, expected=len(samples))
        try:
            for i, sample in enumerate(samples):
                writer.write(schema.check(sample, f"held item {i}"))
            writer.close({})
        except BaseException:
            writer.abort()
            raise
        return cls(HDF5Dataset(path), held.length)


class Items:
    """The items the cache and offline-copy replays read, made once per measurement (its
    rounds reuse them); the copy's file lives in a temporary folder removed at ``close``."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self._held: HeldItems | None = None
        self._stored: StoredItems | None = None
        self._folder: Any = None
        self.problem = ""

    def held(self) -> HeldItems:
        if self._held is None:
            self._held = HeldItems.read(self.loader)
        return self._held

    def stored(self) -> StoredItems | None:
        if self._stored is None and not self.problem:
            import os
            import tempfile

            from .converters.errors import ConvertError

            self._folder = tempfile.TemporaryDirectory(prefix="loadprof-stored-")
            try:
                self._stored = StoredItems.write(self.held(), os.path.join(self._folder.name, "items.h5"))
            except Exception as err:  # an item HDF5 cannot hold (a str, an object): no copy to read
                self.problem = (f"its items cannot be stored in HDF5 ({err})" if isinstance(err, ConvertError)
                                else f"its items cannot be stored in HDF5 ({type(err).__name__}: {err})")
        return self._stored

    def close(self) -> None:
        self._stored = None
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None
