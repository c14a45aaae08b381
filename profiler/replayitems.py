"""The loaders' items the what-if replays read instead of the dataset (whatif.py): one
batch again and again (the model alone), the items of a few batches held (a cache), their
deterministic steps alone held (a cache of those), and the items written to an HDF5 file
(or as their framework's adapter stores them: LitData's chunks) and read back (an offline copy)."""

from __future__ import annotations

from functools import partial
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


class HeldStages:
    """A cache of the deterministic steps alone, for the replay: for the items of a few
    batches, the output of the first ``n`` transforms of the dataset's Compose made once
    and held. Each read runs the dataset's own ``__getitem__`` with those transforms
    standing in by the held output: the random transforms and the user's own code run
    as they do. The Compose is left as it was after every read. With ``reads``, the
    item's read and decode before the Compose are held too: ``__getitem__`` is not
    called again; the held output runs through the rest of the Compose and takes the
    place of the Compose's output in the item as it was made."""

    def __init__(self, dataset: Any, compose: Any, n: int, indices: list[int], held: dict[int, Any],
                 reads: bool = False) -> None:
        self.dataset, self.compose, self.n, self.indices, self.held = dataset, compose, n, indices, held
        self.reads = reads

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        i = self.indices[index % len(self.indices)]
        if not self.reads:
            return _with_transforms(self.compose, lambda ts: [_Held(self.held[i]), *ts[self.n:]],
                                    lambda: self.dataset[i])
        x, item, place = self.held[i]
        for t in list(self.compose.transforms)[self.n:]:
            x = t(x)
        if place is None:
            return x
        out = list(item)
        out[place] = x
        return tuple(out) if isinstance(item, tuple) else out

    @classmethod
    def read(cls, loader: Any, n: int, reads: bool = False) -> HeldStages | str:
        """The held outputs, or why none can be held."""
        import torch

        from .fixes.cache import internal
        from .frameworks.torch.composes import composes

        dataset = loader.dataset
        if isinstance(dataset, torch.utils.data.IterableDataset):
            return "a stream's items cannot be read by index"
        found = composes(dataset)
        if not found or len(found[0].transforms) < n or not reads and len(found[0].transforms) == n:
            return "its Compose was not found as the stage table timed it"
        compose = found[0]
        size = loader.batch_size or 1
        with internal():
            indices = [i for _, i in zip(range(CACHE_BATCHES * size), iter(loader.sampler), strict=False)] or [0]
        held: dict[int, Any] = {}
        for i in indices:
            got: list[Any] = []
            out: list[Any] = []

            def keep(x: Any, into: list[Any]) -> Any:
                into.append(x)
                return x

            keeps = [partial(keep, into=got), partial(keep, into=out)]
            item = _with_transforms(compose, lambda ts, k=keeps: [*ts[:n], k[0], *ts[n:], k[1]],
                                    lambda i=i: dataset[i])
            if len(got) != 1 or len(out) != 1:
                return "its Compose did not run once per item"
            if not reads:
                held[i] = got[0]
            elif item is out[0]:
                held[i] = (got[0], item, None)
            elif type(item) in (tuple, list) and any(v is out[0] for v in item):
                held[i] = (got[0], item, next(j for j, v in enumerate(item) if v is out[0]))
            else:
                return "its items do not hold the Compose's output as the Compose gave it"
        return cls(dataset, compose, n, indices, held, reads)


class _Held:
    """A transform that gives the held output whatever it is given."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __call__(self, _: Any) -> Any:
        return self.value


def _with_transforms(compose: Any, change: Any, call: Any) -> Any:
    """``call()`` with the Compose's transforms set to ``change(transforms)``, then put back
    (a list in place: whatever holds the Compose sees its own list)."""
    from .frameworks.torch.composes import set_transforms

    before = set_transforms(compose, change(list(compose.transforms)))
    try:
        return call()
    finally:
        set_transforms(compose, before)


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
        self._stored: Any = None
        self._stages: dict[tuple[int, bool], HeldStages | str] = {}
        self._folder: Any = None
        self.problem = ""

    def held(self) -> HeldItems:
        if self._held is None:
            self._held = HeldItems.read(self.loader)
        return self._held

    def stages(self, n: int, reads: bool = False) -> HeldStages | None:
        """The items with their first ``n`` transforms held, their reads too (None: they cannot be)."""
        key = (n, reads)
        if key not in self._stages:
            try:
                self._stages[key] = HeldStages.read(self.loader, n, reads)
            except Exception as err:  # the user's dataset failed with its Compose changed: not measured
                self._stages[key] = f"{type(err).__name__}: {err}"
        got = self._stages[key]
        return got if isinstance(got, HeldStages) else None

    def stored(self) -> Any:
        """The offline copy, as the advice would store it: in the format of the adapter whose
        dataset it is, where one has a ``stored_copy`` (LitData's chunks), else in HDF5 (None:
        its items cannot be stored, ``problem`` says why)."""
        if self._stored is None and not self.problem:
            import os
            import sys
            import tempfile

            from .converters.errors import ConvertError
            from .frameworks import adapters

            self._folder = tempfile.TemporaryDirectory(prefix="loadprof-stored-")
            copies = [a for a in adapters() if a.stored_copy and any(m in sys.modules for m in a.imports)]
            where = "HDF5"
            try:
                held = self.held()
                for adapter in copies:
                    where = f"{adapter.name}'s format"
                    self._stored = adapter.part("stored_copy")(self.loader.dataset, held.items,
                                                               os.path.join(self._folder.name, adapter.name), held.length)
                    if self._stored is not None:
                        break
                else:
                    where = "HDF5"
                    self._stored = StoredItems.write(held, os.path.join(self._folder.name, "items.h5"))
            except Exception as err:  # an item the copy cannot hold (a str, an object): no copy to read
                self.problem = (f"its items cannot be stored in {where} ({err})" if isinstance(err, ConvertError)
                                else f"its items cannot be stored in {where} ({type(err).__name__}: {err})")
        return self._stored

    def close(self) -> None:
        self._stored = None
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None
