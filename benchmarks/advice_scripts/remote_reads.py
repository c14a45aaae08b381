"""A job reading one small file per sample from slow storage: each read waits a
few milliseconds (``--latency-ms``, as an object store or a network file system
answers) before its bytes come back; decoding is cheap and so is the model. The
loop waits on reads, not on the CPU.

One of the realistic scripts benchmarks/advice_accuracy.py measures the advice on.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class RemoteFiles(Dataset):
    def __init__(self, folder: str, latency_s: float) -> None:
        self.paths = sorted(os.path.join(folder, f) for f in os.listdir(folder))
        self.latency_s = latency_s

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int):
        time.sleep(self.latency_s)  # the storage's round trip
        with open(self.paths[i], "rb") as f:
            raw = f.read()
        x = torch.from_numpy(np.frombuffer(raw, dtype=np.float32).copy())
        return x, i % 10


#: the dataset `loadprof convert __main__:FILES` packs
FILES: Dataset | None = None


def packed(data: Dataset, folder: str) -> Dataset:
    """The files' samples packed into one HDF5 file (read once, from the slow storage)."""
    from loadprof.converters.conversion import ConvertOptions, convert
    from loadprof.converters.torch import HDF5Dataset

    global FILES
    FILES = data
    path = os.path.join(folder, "packed.h5")  # removed with the folder
    convert("__main__:FILES", path, ConvertOptions(to="hdf5", progress=False))
    return HDF5Dataset(path, transform=lambda s: (torch.from_numpy(s["input"]), int(s["label"])))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument("--latency-ms", type=float, default=2.0)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--packed", action="store_true",
                        help="pack the files into one HDF5 file first (`loadprof convert`), then read from it")
    args = parser.parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory() as folder:
        rng = np.random.default_rng(0)
        for i in range(args.samples):
            rng.standard_normal(256, dtype=np.float32).tofile(os.path.join(folder, f"{i:06d}.bin"))
        data: Dataset = RemoteFiles(folder, args.latency_ms / 1000)
        if args.packed:
            data = packed(data, folder)
        loader = DataLoader(data, batch_size=16, shuffle=True, num_workers=args.workers)
        net = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        for _ in range(args.epochs):
            for x, y in loader:
                x, y = x.to(device), y.to(device)
                opt.zero_grad()
                nn.functional.cross_entropy(net(x), y).backward()
                opt.step()


if __name__ == "__main__":
    main()
