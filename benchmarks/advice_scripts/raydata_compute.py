"""A job fed by Ray Data whose model is the limit: a cheap vectorised ``map_batches`` (NumPy
over the batch) on a cluster with the host's CPUs, feeding a wide MLP; the loop barely
waits. loadprof must call it compute-bound and leave Ray's knobs alone.

One of the realistic scripts benchmarks/advice_accuracy.py measures the advice on, and the
compute-bound scenario of tests/integration/test_raydata.py.
"""

from __future__ import annotations

import argparse

import numpy as np
import ray
import torch

WIDTH = 256


def normalise(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    ids = batch["id"].astype(np.float32)
    x = np.sin(ids[:, None] * np.arange(1, WIDTH + 1, dtype=np.float32)[None, :] / 1000.0)
    return {"x": x.astype(np.float32), "y": (batch["id"] % 2).astype(np.int64)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--prefetch-batches", type=int, default=4,
                        help="the iteration's prefetch_batches (loadprof's ray_prefetch_batches advice)")
    parser.add_argument("--hidden", type=int, default=2048)
    args = parser.parse_args()
    ray.init(include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    ray.data.DataContext.get_current().enable_progress_bars = False
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ds = ray.data.range(args.rows, override_num_blocks=max(1, args.rows // 1024)).map_batches(
        normalise, batch_size=args.batch_size)
    for _ in range(args.epochs):
        for batch in ds.iter_torch_batches(batch_size=args.batch_size, prefetch_batches=args.prefetch_batches):
            loss = torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"])
            opt.zero_grad()
            loss.backward()
            opt.step()
    ray.shutdown()


if __name__ == "__main__":
    main()
