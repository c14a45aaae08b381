"""A torchdata.nodes job whose map waits on storage: each record is fetched with a 3 ms round
trip (remote object storage, a network file system) and parsed in a little Python, in a
ParallelMapper of one thread; the model is a small MLP, so the fetches are the loading time.

``--map-workers N`` does what loadprof's ``map_workers`` advice says: the mapper's
``num_workers`` set to N (threads overlap the waits; they need no core each).

One of the realistic scripts benchmarks/advice_accuracy.py measures the advice on.
"""

from __future__ import annotations

import argparse
import time

import torch
import torchdata.nodes as tn

ITEMS = 4096
FEATURES = 64


class Fetch:
    """One record from storage: a round trip, then its bytes parsed."""

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s

    def __call__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.latency_s)
        record = ",".join(str((i * 7 + j) % 101) for j in range(FEATURES)).encode()
        values = [float(x) / 100.0 for x in record.split(b",")]
        return torch.tensor(values), i % 10


def collate(samples: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.stack([x for x, _ in samples]), torch.tensor([y for _, y in samples])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--map-workers", type=int, default=1)
    parser.add_argument("--latency-ms", type=float, default=3.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    node: tn.BaseNode = tn.SamplerWrapper(torch.utils.data.RandomSampler(range(ITEMS)))
    node = tn.ParallelMapper(node, Fetch(args.latency_ms / 1000), num_workers=args.map_workers, method="thread")
    node = tn.Batcher(node, batch_size=32, drop_last=True)
    node = tn.Mapper(node, collate)
    loader = tn.Loader(tn.Prefetcher(node, prefetch_factor=2))
    for _ in range(args.epochs):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()

if __name__ == "__main__":
    main()
