"""A decode-bound PyTorch training job: PNG files decoded with Pillow in every epoch.

Runs unchanged under `loadprof diagnose examples/torch_decode_bound.py`. It writes
its own image folder (PNGs of noise, which compress badly and decode slowly) to a
temporary directory, then trains a small CNN on it: decode, resize, random flip.
The stage table shows where a batch's time goes; the advice caches the
deterministic part (decode, resize) and keeps the flip online. A GPU is used when
there is one. On a 2-core CPU machine it takes about half a minute.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Compose:
    """Transforms applied in turn (torchvision's Compose does the same)."""

    def __init__(self, transforms: list) -> None:
        self.transforms = transforms

    def __call__(self, x):
        for t in self.transforms:
            x = t(x)
        return x


class Resize:
    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, img: Image.Image) -> Image.Image:
        return img.resize((self.size, self.size), Image.BILINEAR)

    def __repr__(self) -> str:
        return f"Resize({self.size})"


class ToTensor:
    def __call__(self, img: Image.Image) -> torch.Tensor:
        return torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1)

    def __repr__(self) -> str:
        return "ToTensor()"


class RandomHorizontalFlip:
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.flip(-1) if torch.rand(()) < 0.5 else x

    def __repr__(self) -> str:
        return "RandomHorizontalFlip()"


class PngFolder(Dataset):
    def __init__(self, folder: str, transform) -> None:
        self.paths = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".png"))
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        img = Image.open(self.paths[i]).convert("RGB")
        return self.transform(img), i % 10


class CachedPrefix(PngFolder):
    """loadprof's advice applied: the deterministic steps once per item, the flip every time."""

    def __init__(self, folder: str, deterministic, augment) -> None:
        super().__init__(folder, deterministic)
        self.augment = augment
        self.cache: dict[int, torch.Tensor] = {}

    def __getitem__(self, i: int):
        if i not in self.cache:
            self.cache[i] = super().__getitem__(i)[0]
        return self.augment(self.cache[i]), i % 10


def write_folder(folder: str, n: int, size: int) -> None:
    rng = np.random.default_rng(0)
    for i in range(n):
        pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(os.path.join(folder, f"{i:05d}.png"), compress_level=1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--images", type=int, default=256)
    parser.add_argument("--size", type=int, default=384)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--cache-decoded", action="store_true",
                        help="keep each decoded, resized image in memory; flip it every epoch")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory() as folder:
        write_folder(folder, args.images, args.size)
        deterministic = Compose([Resize(64), ToTensor()])
        if args.cache_decoded:
            data: Dataset = CachedPrefix(folder, deterministic, RandomHorizontalFlip())
        else:
            data = PngFolder(folder, Compose([*deterministic.transforms, RandomHorizontalFlip()]))
        loader = DataLoader(data, batch_size=32, shuffle=True, num_workers=args.workers)
        model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                              nn.Linear(256, 10)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(args.epochs):
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                opt.zero_grad()
                nn.functional.cross_entropy(model(x), y).backward()
                opt.step()


if __name__ == "__main__":
    main()
