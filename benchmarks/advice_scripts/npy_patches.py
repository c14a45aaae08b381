"""A patch-based vision job reading one .npy file per sample from a local folder (as a
dataset of preprocessed arrays on disk is), then cutting each image into patches and
normalising every patch on its own in a Python loop (a ViT-style patchify with
per-patch contrast normalisation), num_workers=0. ``--offline`` does what the offline
advice says: every item once into an HDF5 file, the training read from it. The model embeds the patches and
pools them: small beside the per-patch Python work. The files are written to a
temporary folder at start and removed at exit.

One of the realistic scripts benchmarks/advice_accuracy.py measures the advice on.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

PATCH = 8


class NpyPatches(Dataset):
    def __init__(self, folder: str, labels: np.ndarray) -> None:
        self.paths = sorted(os.path.join(folder, f) for f in os.listdir(folder))
        self.labels = labels

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        img = np.load(self.paths[i]).astype(np.float32) / 255.0  # (H, W, C)
        patches = []
        for top in range(0, img.shape[0], PATCH):
            for left in range(0, img.shape[1], PATCH):
                patch = img[top:top + PATCH, left:left + PATCH].reshape(-1)
                patches.append((patch - patch.mean()) / (patch.std() + 1e-6))
        return torch.from_numpy(np.stack(patches)), int(self.labels[i])


def stored(data: Dataset, folder: str) -> Dataset:
    """The offline advice applied: every item preprocessed once into an HDF5 file (as
    `loadprof convert` stores a dataset), then read back from it."""
    from loadprof.converters.conversion import ConvertOptions, convert
    from loadprof.converters.torch import HDF5Dataset

    global DATA
    DATA = data
    path = os.path.join(folder, "preprocessed.h5")  # beside the .npy files, removed with them
    convert("__main__:DATA", path, ConvertOptions(to="hdf5", progress=False))
    return HDF5Dataset(path, transform=lambda s: (torch.from_numpy(s["input"]), int(s["label"])))


class PatchNet(nn.Module):
    def __init__(self, patch_dim: int, width: int = 64) -> None:
        super().__init__()
        self.embed = nn.Linear(patch_dim, width)
        self.mix = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU())
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        h = h + self.mix(h)
        return self.head(h.mean(dim=1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--offline", action="store_true",
                        help="preprocess every item once into an HDF5 file, then train from it (the offline advice)")
    args = parser.parse_args()
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, args.samples)
    with tempfile.TemporaryDirectory() as folder:
        for i in range(args.samples):
            np.save(os.path.join(folder, f"{i:06d}.npy"),
                    rng.integers(0, 256, (args.size, args.size, 3), dtype=np.uint8))
        data: Dataset = NpyPatches(folder, labels)
        if args.offline:
            data = stored(data, folder)
        train(data, args.epochs, args.workers)


def train(data: Dataset, epochs: int, workers: int) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    loader = DataLoader(data, batch_size=32, shuffle=True, num_workers=workers)
    net = PatchNet(PATCH * PATCH * 3).to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    for _ in range(epochs):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()

if __name__ == "__main__":
    main()
