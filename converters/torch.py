"""PyTorch datasets over converted data: ``HDF5Dataset`` (map-style) and ``TFRecordDataset``.

Items are ``dict``s keyed by field name: NumPy arrays (a 0-d array for a label)
and ``bytes`` for encoded fields; ``default_collate`` batches them into tensors
and lists of bytes. Pass ``transform`` to decode images in the workers.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch.distributed as dist
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from . import samplecodec, tfrecord, tfrecordindex
from .errors import ConvertError
from .example_proto import ExampleDecodeError
from .files import open_regular
from .hdf5read import HDF5Reader
from .manifest import dataset_files
from .schema import Schema

__all__ = ["HDF5Dataset", "TFRecordDataset"]

Transform = Callable[[dict[str, Any]], Any]


class HDF5Dataset(Dataset[Any]):
    """Map-style dataset over an HDF5 file: ``len()`` and ``[i]``.

    Picklable and safe with ``num_workers > 0`` under fork and spawn: see
    NOTE [ HDF5 handles and worker processes ] in converters/hdf5read.py. Each value is
    checked against the CRC-32C stored for its record at conversion; a damaged record
    raises ConvertError naming the file and record (``verify=False`` skips the check:
    NOTE [ Per-record checksums ]).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        fields: Sequence[str] | None = None,
        transform: Transform | None = None,
        *,
        verify: bool = True,
    ) -> None:
        self.reader = HDF5Reader(path, fields, verify=verify)
        self.transform = transform

    @property
    def schema(self) -> Schema:
        return self.reader.schema

    @property
    def class_names(self) -> list[str] | None:
        return self.reader.class_names

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, index: int) -> Any:
        sample = self.reader[index]
        return self.transform(sample) if self.transform is not None else sample


class TFRecordDataset(IterableDataset[Any]):
    """Iterable over the records of one or more TFRecord shards (files or a directory).

    NOTE [ Splitting TFRecords across workers and ranks ]
    The shards' indexes (``.idx`` beside each shard, or built by scanning) give the
    global record count T. Reader p of P = world_size x num_workers (p = rank x
    num_workers + worker id) takes records [p*T//P, (p+1)*T//P) of the global order:
    every record exactly once, no duplicates, and contiguous ranges so reads stay
    sequential. The popular ``tfrecord`` package without an index reads every file
    in every worker, duplicating data (vahidk/tfrecord#78, #70, #90). With
    ``shuffle=True`` the global order is a permutation seeded by ``seed + epoch``
    (call ``set_epoch`` before each epoch; with persistent workers it has no effect
    after the first). Ranks' shares differ by at most one record.

    Each shard's ``.idx`` is used only when it covers the shard's bytes exactly and lists
    the count ``<split>.info.json`` gives; otherwise the shard is scanned, with a
    RuntimeWarning (``tfrecordindex.load_index``). CRCs are checked by default
    (``verify=False`` skips them). The schema comes from
    ``<split>.info.json`` beside our shards; for other files, items hold the raw
    Feature values (bytes, or 1-D int64/float32 arrays).
    """

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        verify: bool = True,
        shuffle: bool = False,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        transform: Transform | None = None,
    ) -> None:
        # Checked against their info file: NOTE [ The info file is the manifest ].
        self.paths, info = dataset_files(paths)
        self.verify = verify
        self.shuffle = shuffle
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.transform = transform
        self.epoch = 0
        # Each .idx is checked against its shard and the counts taken at conversion:
        # a stale one is set aside and the shard scanned (tfrecordindex.load_index).
        counts = tfrecord.expected_counts(info)
        self.indexes = [
            tfrecordindex.load_index(p, verify=verify, expected=counts.get(p.name) if p.parent == self.paths[0].parent else None)
            for p in self.paths
        ]
        self._starts = np.concatenate(([0], np.cumsum([len(i) for i in self.indexes]))).astype(np.int64)
        self.schema: Schema | None = tfrecord.schema_from_info(info)
        self.class_names: list[str] | None = info.get("class_names") if info else None
        if rank is not None or world_size is not None:
            if rank is None or world_size is None or not 0 <= rank < world_size:
                raise ValueError(f"need 0 <= rank < world_size, got rank={rank} world_size={world_size}")

    @property
    def total(self) -> int:
        return int(self._starts[-1])

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _rank_world(self) -> tuple[int, int]:
        if self.rank is not None and self.world_size is not None:
            return self.rank, self.world_size
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1

    def __len__(self) -> int:
        """Records this rank yields, over all of its workers."""
        rank, world = self._rank_world()
        return (rank + 1) * self.total // world - rank * self.total // world

    def __iter__(self) -> Iterator[Any]:
        worker = get_worker_info()
        wid, workers = (worker.id, worker.num_workers) if worker is not None else (0, 1)
        rank, world = self._rank_world()
        parts, part = world * workers, rank * workers + wid
        lo, hi = part * self.total // parts, (part + 1) * self.total // parts
        if self.shuffle:
            order = np.random.default_rng(self.seed + self.epoch).permutation(self.total)[lo:hi]
            records = self._random(order)
        else:
            records = self._sequential(lo, hi)
        decode = samplecodec.SampleDecoder(self.schema)
        for path, offset, data in records:
            try:
                sample = decode(data)
            except ExampleDecodeError as exc:
                raise ConvertError(f"{path}: record at byte offset {offset} does not decode: {exc}") from exc
            yield self.transform(sample) if self.transform is not None else sample

    def _sequential(self, lo: int, hi: int) -> Iterator[tuple[Path, int, bytes]]:
        for s, path in enumerate(self.paths):
            first, last = max(lo, int(self._starts[s])), min(hi, int(self._starts[s + 1]))
            if first >= last:
                continue
            index = self.indexes[s]
            a, b = first - int(self._starts[s]), last - int(self._starts[s])
            start, stop = int(index[a, 0]), int(index[b - 1, 0]) + 1
            n = 0
            for offset, data in tfrecord.iter_records(path, start=start, stop=stop, verify=self.verify):
                yield path, offset, data
                n += 1
            if n != b - a:
                raise ConvertError(f"{path}: found {n} records between byte offsets {start} and {stop}, "
                                   f"the index lists {b - a}: stale index?")

    def _random(self, order: np.ndarray) -> Iterator[tuple[Path, int, bytes]]:
        # Shards are mapped, not read: on a cold page the kernel reads around the
        # fault (128 KiB by default), so scattered small records do not each cost
        # a disk round trip, and the read-ahead stays bounded however large the
        # shards. The index is checked against the file size before each slice.
        files: dict[int, tuple[BinaryIO | mmap.mmap, int]] = {}
        try:
            shard_of = np.searchsorted(self._starts, order, side="right") - 1
            for g, s in zip(order.tolist(), shard_of.tolist(), strict=True):
                if s not in files:
                    with open_regular(self.paths[s], "a TFRecord file") as handle:
                        size = os.fstat(handle.fileno()).st_size
                        source: BinaryIO | mmap.mmap = (
                            mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) if size
                            else open_regular(self.paths[s], "a TFRecord file")
                        )
                    files[s] = (source, size)
                f, size = files[s]
                offset, length = (int(v) for v in self.indexes[s][g - int(self._starts[s])])
                data = tfrecord.read_record_at(f, self.paths[s], offset, length, size, self.verify)
                yield self.paths[s], offset, data
        finally:
            for source, _ in files.values():
                source.close()
