"""The data-starved example with loadprof's advice applied.

Same data, model and training as examples/torch_starved.py, but:
- the expensive deterministic preprocessing (the blur standing in for decoding)
  runs once, before training, and its result is kept in memory
  (loadprof's `offline_preprocessing` / `cache` advice);
- only the cheap random augmentation runs per sample;
- loading runs in a worker process (`num_workers` advice), kept alive between
  epochs (`persistent_workers`).
Run it with `loadprof diagnose examples/torch_fixed.py` and compare.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_starved import SyntheticImages, model  # noqa: E402


class Preprocessed(Dataset):
    """The deterministic part done once; random flip and brightness stay per sample."""

    def __init__(self, source: SyntheticImages) -> None:
        kernel = np.array([1, 4, 6, 4, 1], dtype=np.float32) / 16
        imgs = source.images.astype(np.float32) / 255.0
        for _ in range(6):  # the same blur, vectorised over the whole set at once
            imgs = np.apply_along_axis(lambda r: np.convolve(r, kernel, mode="same"), 1, imgs)
        self.images = np.ascontiguousarray(imgs.transpose(0, 3, 1, 2))
        self.labels = source.labels

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        img = self.images[i]
        rng = np.random.default_rng(i)
        if rng.random() < 0.5:
            img = img[:, :, ::-1]
        img = img * np.float32(rng.uniform(0.8, 1.2))
        return torch.from_numpy(np.ascontiguousarray(img)), int(self.labels[i])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=1536)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    data = Preprocessed(SyntheticImages(args.samples))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                        persistent_workers=args.workers > 0, pin_memory=device == "cuda")
    net = model().to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        total = 0.0
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            opt.zero_grad()
            loss = loss_fn(net(x), y)
            loss.backward()
            opt.step()
            total += loss.item()
        print(f"epoch {epoch}: mean loss {total / len(loader):.4f}")


if __name__ == "__main__":
    main()
