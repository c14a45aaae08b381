"""A job fed by Ray Data whose loading is a slow, CPU-bound Python ``map_batches`` (a feature
computed row by row), on a Ray cluster started with one CPU: its read and map tasks take
turns on that CPU while the host's other cores idle, and a small linear model waits.

``--all-cpus`` does what loadprof's ``ray_cluster_cpus`` advice says: ``ray.init(num_cpus=N)``
with N the host's usable cores; the batches are the same.

One of the realistic scripts benchmarks/advice_accuracy.py measures the advice on, and the
starved scenario of tests/integration/test_raydata.py.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import ray
import torch

WIDTH = 32


def featurize(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Python per row: CPU work that holds the GIL, as a parser or a tokenizer in Python does."""
    ids = batch["id"]
    out = np.empty((len(ids), WIDTH), dtype=np.float32)
    for i, v in enumerate(ids.tolist()):
        acc = 0
        for k in range(4000):
            acc += (v * k) % 7
        out[i] = acc / 4000.0
    return {"x": out, "y": (ids % 2).astype(np.int64)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--prefetch-batches", type=int, default=1,
                        help="the iteration's prefetch_batches (loadprof's ray_prefetch_batches advice)")
    parser.add_argument("--all-cpus", action="store_true", help="ray.init(num_cpus=<the host's usable cores>)")
    args = parser.parse_args()
    cpus = len(os.sched_getaffinity(0)) if args.all_cpus else 1
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    ray.data.DataContext.get_current().enable_progress_bars = False
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ds = ray.data.range(args.rows, override_num_blocks=args.rows // 512).map_batches(
        featurize, batch_size=args.batch_size)
    for _ in range(args.epochs):
        for batch in ds.iter_torch_batches(batch_size=args.batch_size, prefetch_batches=args.prefetch_batches):
            loss = torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"])
            opt.zero_grad()
            loss.backward()
            opt.step()
    ray.shutdown()


if __name__ == "__main__":
    main()
