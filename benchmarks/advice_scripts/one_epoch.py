"""A one-pass job: a single epoch over a large set (as fine-tuning on fresh data, or
a pass that scores or distils a corpus, is), each image put through slow
deterministic preprocessing on the CPU (a repeated blur, standing in for decoding
and resizing) and a cheap random flip, num_workers=0. Every item is read once, so a
cache of the deterministic steps fills and is never read back within the job.

Run with ``--epochs 1`` (the job's one pass); the set is large enough (2048 images,
64 batches) that a bounded run of a few dozen steps stays inside it.

One of the realistic scripts benchmarks/advice_accuracy.py measures the advice on.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class FreshImages(Dataset):
    def __init__(self, n: int, size: int = 48, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.images = rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8)
        self.labels = rng.integers(0, 10, n)
        self.kernel = np.array([1, 4, 6, 4, 1], dtype=np.float32) / 16

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        img = self.images[i].astype(np.float32) / 255.0
        for _ in range(3):  # deterministic: the same output every time the item is read
            for axis in (0, 1):
                img = np.apply_along_axis(np.convolve, axis, img, self.kernel, mode="same")
        if np.random.rand() < 0.5:
            img = img[:, ::-1]
        return torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1))), int(self.labels[i])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--workers", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    loader = DataLoader(FreshImages(args.samples), batch_size=32, shuffle=True, num_workers=args.workers)
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
                        nn.Flatten(), nn.Linear(32 * 16, 10)).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    for _ in range(args.epochs):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()


if __name__ == "__main__":
    main()
