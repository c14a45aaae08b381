"""A LitData job: items written by litdata's chunk writer, read through a StreamingDataLoader by a
``StreamingDataset`` subclass whose ``__getitem__`` runs a costly deterministic NumPy transform
per item; the model is a small MLP, so the transform is the loading time.

``--optimized`` does what loadprof's ``litdata_optimize`` advice says: the transform runs once,
when the chunks are written (a second folder), and ``__getitem__`` keeps nothing of it; the
items are the same.

One of the realistic scripts benchmarks/advice_accuracy.py measures the advice on.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import litdata as ld
import numpy as np
import torch
from litdata.streaming.cache import Cache

ITEMS = 2048
ROUNDS = 60


def transform(x: np.ndarray) -> np.ndarray:
    for _ in range(ROUNDS):
        x = np.tanh(x * 1.01 + 0.1)
    return x


def write(folder: str, transformed: bool) -> None:
    if os.path.exists(os.path.join(folder, "index.json")):
        return
    cache = Cache(folder, chunk_bytes="64KB")
    for i in range(ITEMS):
        x = np.random.default_rng(i).standard_normal(64).astype(np.float32)
        cache[i] = {"x": transform(x) if transformed else x, "y": i % 10}
    cache.done()
    cache.merge()


class Items(ld.StreamingDataset):
    def __init__(self, *args, transformed: bool, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.transformed = transformed

    def __getitem__(self, index):
        item = super().__getitem__(index)
        x = item["x"] if self.transformed else transform(item["x"])
        return torch.from_numpy(np.ascontiguousarray(x)), item["y"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--optimized", action="store_true")
    args = parser.parse_args()
    folder = os.path.join(tempfile.gettempdir(), f"loadprof-litdata-{'optimized' if args.optimized else 'raw'}")
    write(folder, args.optimized)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    loader = ld.StreamingDataLoader(Items(folder, shuffle=True, transformed=args.optimized), batch_size=32,
                                    num_workers=args.workers)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(args.epochs):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()


if __name__ == "__main__":
    main()
