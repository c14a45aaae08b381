"""A data-starved PyTorch training job: heavy CPU augmentation, num_workers=0.

Runs unchanged under `loadprof diagnose examples/torch_starved.py`. It makes its
own data (synthetic 3x64x64 images, 10 classes), trains a small CNN, and uses a
GPU when there is one. On a 2-core CPU machine it takes about half a minute.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SyntheticImages(Dataset):
    """Deterministic uint8 images; each sample is 'decoded' and augmented on the CPU."""

    def __init__(self, n: int, size: int = 64, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.images = rng.integers(0, 256, size=(n, size, size, 3), dtype=np.uint8)
        self.labels = rng.integers(0, 10, size=n)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        img = self.images[i].astype(np.float32) / 255.0
        # Expensive deterministic preprocessing: a separable blur applied several times,
        # standing in for JPEG decoding and resizing.
        kernel = np.array([1, 4, 6, 4, 1], dtype=np.float32) / 16
        for _ in range(6):
            img = np.apply_along_axis(lambda r: np.convolve(r, kernel, mode="same"), 0, img)
        # Cheap random augmentation: flip and brightness.
        rng = np.random.default_rng(i)
        if rng.random() < 0.5:
            img = img[:, ::-1]
        img = img * rng.uniform(0.8, 1.2)
        x = torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))
        return x, int(self.labels[i])


#: the dataset `loadprof convert __main__:DATA` stores (its items are the same at every read)
DATA: Dataset | None = None
_FOLDER = None


def stored(data: Dataset) -> Dataset:
    """The dataset's items, preprocessed once into an HDF5 file and read back from it."""
    import os
    import tempfile

    from loadprof.converters.conversion import ConvertOptions, convert
    from loadprof.converters.torch import HDF5Dataset

    global DATA, _FOLDER
    DATA = data
    _FOLDER = tempfile.TemporaryDirectory(prefix="torch_starved-")  # removed when the script ends
    path = os.path.join(_FOLDER.name, "preprocessed.h5")
    convert("__main__:DATA", path, ConvertOptions(to="hdf5", progress=False))
    return HDF5Dataset(path, transform=lambda s: (torch.from_numpy(s["input"]), int(s["label"])))


def model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
        nn.Flatten(), nn.Linear(32 * 16, 10),
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=1536)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--offline", action="store_true",
                        help="preprocess every item once into an HDF5 file (as `loadprof convert` stores a "
                             "dataset), then train from it: the offline advice, applied")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    data: Dataset = SyntheticImages(args.samples)
    if args.offline:
        data = stored(data)
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)
    net = model().to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        total = 0.0
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            loss = loss_fn(net(x), y)
            loss.backward()
            opt.step()
            total += loss.item()
        print(f"epoch {epoch}: mean loss {total / len(loader):.4f}")


if __name__ == "__main__":
    main()
