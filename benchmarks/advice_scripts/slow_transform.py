"""A job whose loading time is one slow transform of a Compose: images held in
memory as uint8, then a deterministic blur (numpy, standing in for a costly
filter or resize), a random crop and a normalisation, per sample, num_workers=0.

``--cache-blurred`` does what the cache advice says: each image's blur once (before
training), kept in memory, the crop and normalisation every time. ``--vectorised`` does what loadprof's
``slow_stage`` advice says for the blur: the
dataset leaves it out and the collate runs it once on the whole (B, C, H, W) batch
(shifted sums with the same kernel), then crops and normalises the batch;
the batches are the same as without it.

One of the realistic scripts benchmarks/advice_accuracy.py measures the advice on.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, default_collate


class Compose:
    def __init__(self, transforms: list) -> None:
        self.transforms = transforms

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


class Blur:
    """A separable 5-tap blur applied ``passes`` times."""

    def __init__(self, passes: int) -> None:
        self.passes = passes
        self.kernel = np.array([1, 4, 6, 4, 1], dtype=np.float32) / 16

    def __call__(self, img: np.ndarray) -> np.ndarray:
        img = img.astype(np.float32) / 255.0
        for _ in range(self.passes):
            for axis in (0, 1):
                img = np.apply_along_axis(np.convolve, axis, img, self.kernel, mode="same")
        return img

    def __repr__(self) -> str:
        return f"Blur(passes={self.passes})"


class RandomCrop:
    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, img: np.ndarray) -> np.ndarray:
        top, left = np.random.randint(0, img.shape[0] - self.size + 1, size=2)
        return img[top:top + self.size, left:left + self.size]

    def __repr__(self) -> str:
        return f"RandomCrop({self.size})"


class Normalize:
    def __call__(self, img: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(((img - 0.5) / 0.25).transpose(2, 0, 1)))

    def __repr__(self) -> str:
        return "Normalize()"


class BatchBlur:
    """Blur(passes) on a (B, H, W, C) float batch at once: each 1-D pass a weighted sum of
    five shifted views, zero-padded as np.convolve(mode="same") pads (the kernel is
    symmetric, so correlation is convolution). NumPy, not torch: small torch operations
    on two intra-op threads stall on a machine whose cores are shared."""

    def __init__(self, passes: int) -> None:
        self.passes = passes
        self.kernel = np.array([1, 4, 6, 4, 1], dtype=np.float32) / 16

    def __call__(self, x: np.ndarray) -> np.ndarray:
        for _ in range(self.passes):
            for axis in (1, 2):
                pad = [(0, 0)] * x.ndim
                pad[axis] = (2, 2)
                padded = np.pad(x, pad)
                n = x.shape[axis]
                x = sum(w * padded.take(range(i, i + n), axis=axis) for i, w in enumerate(self.kernel))
        return x


class BatchedCollate:
    """The advice's collate: default_collate, then the blur on the whole batch; the crop
    and the normalisation follow it, as in the Compose (crops drawn in the same order)."""

    def __init__(self, passes: int, size: int) -> None:
        self.blur = BatchBlur(passes)
        self.size = size

    def __call__(self, samples: list):
        x, y = default_collate(samples)  # (B, H, W, C) uint8
        imgs = self.blur(x.numpy().astype(np.float32) / 255.0)
        crops = []
        for img in imgs:
            top, left = np.random.randint(0, img.shape[0] - self.size + 1, size=2)
            crops.append(img[top:top + self.size, left:left + self.size])
        batch = (np.stack(crops) - 0.5) / 0.25
        return torch.from_numpy(np.ascontiguousarray(batch.transpose(0, 3, 1, 2))), y


class CachedBlur(Dataset):
    """The cache advice applied: each image's blur once, before training (as a trial's cache
    fix fills its copy first: the measured steps read a filled cache), the crop and
    normalisation every time."""

    def __init__(self, data: InMemoryImages, blur: Blur, rest: Compose) -> None:
        self.data, self.rest = data, rest
        self.cache = [blur(img) for img in data.images]

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        return self.rest(self.cache[i]), int(self.data.labels[i])


class InMemoryImages(Dataset):
    def __init__(self, n: int, size: int, transform) -> None:
        rng = np.random.default_rng(0)
        self.images = rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8)
        self.labels = rng.integers(0, 10, n)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        return self.transform(self.images[i]), int(self.labels[i])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--vectorised", action="store_true",
                        help="blur, crop and normalise whole batches in the collate (the slow_stage advice)")
    parser.add_argument("--cache-blurred", action="store_true",
                        help="blur each image once, crop and normalise every time (the cache advice)")
    args = parser.parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.vectorised:
        data = InMemoryImages(args.samples, 40, Compose([]))
        loader = DataLoader(data, batch_size=32, shuffle=True, num_workers=args.workers,
                            collate_fn=BatchedCollate(2, 32))
    elif args.cache_blurred:
        data = CachedBlur(InMemoryImages(args.samples, 40, Compose([])), Blur(2),
                          Compose([RandomCrop(32), Normalize()]))
        loader = DataLoader(data, batch_size=32, shuffle=True, num_workers=args.workers)
    else:
        data = InMemoryImages(args.samples, 40, Compose([Blur(2), RandomCrop(32), Normalize()]))
        loader = DataLoader(data, batch_size=32, shuffle=True, num_workers=args.workers)
    net = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
                        nn.Flatten(), nn.Linear(64 * 16, 10)).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    for _ in range(args.epochs):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()


if __name__ == "__main__":
    main()
