"""Small real input pipelines for the stage-timing tests: each stage in turn made
the slow one (tests/integration/test_stages_torch.py). Module-level classes, so that spawned
workers can unpickle them."""

from __future__ import annotations

import os
import time

import numpy as np
import torch

# At import, not in __getitem__: a spawned worker imports this module to unpickle the
# dataset, so PIL's import does not land in its first items' time.
from PIL import Image
from torch.utils.data import Dataset, IterableDataset


def busy(seconds: float) -> None:
    """Pure CPU work for ``seconds`` of this thread's CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class Compose:
    """A user's own Compose: a list of callables applied in turn."""

    def __init__(self, transforms: list) -> None:
        self.transforms = transforms

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


class ToArray:
    def __call__(self, img):
        return np.asarray(img, dtype=np.float32)

    def __repr__(self) -> str:
        return "ToArray()"


class Resize:
    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, img):
        return img.resize((self.size, self.size))

    def __repr__(self) -> str:
        return f"Resize({self.size})"


class RandomFlip:
    def __call__(self, x):
        return x[:, ::-1].copy() if np.random.rand() < 0.5 else x

    def __repr__(self) -> str:
        return "RandomFlip()"


class SlowBlur:
    """A deterministic transform that costs ``cost`` seconds of CPU."""

    def __init__(self, cost: float) -> None:
        self.cost = cost

    def __call__(self, x):
        busy(self.cost)
        return x

    def __repr__(self) -> str:
        return f"SlowBlur({self.cost})"


def write_pngs(folder: str, n: int, size: int, seed: int = 0) -> list[str]:
    """``n`` PNGs of noise (noise compresses badly: decoding them is real work)."""
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        path = os.path.join(folder, f"{i:04d}.png")
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(path, compress_level=1)
        paths.append(path)
    return paths


def write_blobs(folder: str, n: int, nbytes: int) -> list[str]:
    paths = []
    for i in range(n):
        path = os.path.join(folder, f"{i:04d}.bin")
        with open(path, "wb") as f:
            f.write(os.urandom(nbytes))
        paths.append(path)
    return paths


class ImageFolder(Dataset):
    """PNG files -> PIL decode -> the Compose's transforms -> a tensor; optional extra
    work in __getitem__ (``extra``: seconds of CPU in ``slow_part``)."""

    def __init__(self, paths: list[str], transform=None, extra: float = 0.0, blob_paths=None) -> None:
        self.paths, self.transform, self.extra, self.blob_paths = paths, transform, extra, blob_paths
        self._buffer: bytearray | None = None  # the blobs are read into it (no allocation per item)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        if self.blob_paths:
            if self._buffer is None:
                self._buffer = bytearray(os.path.getsize(self.blob_paths[i]))
            with open(self.blob_paths[i], "rb") as f:
                f.readinto(self._buffer)
        img = Image.open(self.paths[i]).convert("RGB")
        x = self.transform(img) if self.transform else np.asarray(img)
        if self.extra:
            slow_part(self.extra)
        return torch.as_tensor(np.ascontiguousarray(x)).flatten()[:32].float(), i % 4


def slow_part(cost: float) -> None:
    end = time.thread_time() + cost
    while time.thread_time() < end:
        pass


class ImageStream(IterableDataset):
    """The same pipeline as an iterable dataset (sharded by worker)."""

    def __init__(self, paths: list[str], transform=None) -> None:
        self.paths, self.transform = paths, transform

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        mine = self.paths if info is None else self.paths[info.id::info.num_workers]
        for i, p in enumerate(mine):
            img = Image.open(p).convert("RGB")
            x = self.transform(img) if self.transform else np.asarray(img, dtype=np.float32)
            yield torch.as_tensor(np.ascontiguousarray(x)).flatten()[:32], i % 4


class SlowCollate:
    """default_collate after ``cost`` seconds of CPU per batch."""

    def __init__(self, cost: float) -> None:
        self.cost = cost

    def __call__(self, batch):
        busy(self.cost)
        return torch.utils.data.default_collate(batch)
