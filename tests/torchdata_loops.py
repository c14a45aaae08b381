"""Real torchdata.nodes training loops for the tests and docs/torchdata.md: records parsed by
a CPU-bound Python function in a ParallelMapper, batched, prefetched, fed to a small model."""

from __future__ import annotations

import sys
import time
from typing import Any

import torch
import torchdata.nodes as tn

FEATURES = 64


class Records(torch.utils.data.Dataset[bytes]):
    """Text records of comma-separated numbers, as a file of them would hold."""

    def __init__(self, n: int) -> None:
        self.rows = [",".join(str((i * 7 + j) % 101) for j in range(FEATURES)).encode() for i in range(n)]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> bytes:
        return self.rows[i]


class Parse:
    """Parses a record in Python, ``rounds`` times over: the per-sample work the GIL holds;
    after a wait of ``wait_s`` where given (a remote read's latency: no CPU, no GIL)."""

    def __init__(self, rounds: int, wait_s: float = 0.0) -> None:
        self.rounds = rounds
        self.wait_s = wait_s

    def __call__(self, record: bytes) -> tuple[list[float], int]:
        # plain Python out: a process mapper pickles it, where a tensor would go through
        # shared memory one item at a time
        if self.wait_s:
            time.sleep(self.wait_s)
        values: list[float] = []
        for _ in range(max(1, self.rounds)):
            values = [float(x) / 100.0 for x in record.split(b",")]
        return values, int(values[0] * 100) % 4


def collate(samples: list[tuple[list[float], int]]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([x for x, _ in samples]), torch.tensor([y for _, y in samples])


def pipeline(n: int, batch: int, rounds: int, workers: int, method: str = "thread",
             in_order: bool = True, prefetch: int | None = 2, wait_s: float = 0.0) -> tn.Loader[Any]:
    node: tn.BaseNode[Any] = tn.SamplerWrapper(torch.utils.data.SequentialSampler(range(n)))
    records = Records(n)
    node = tn.ParallelMapper(node, records.__getitem__, num_workers=0)
    node = tn.ParallelMapper(node, Parse(rounds, wait_s), num_workers=workers, method=method,  # type: ignore[arg-type]
                             in_order=in_order)
    node = tn.Batcher(node, batch_size=batch, drop_last=True)
    node = tn.Mapper(node, collate)
    if prefetch:
        node = tn.Prefetcher(node, prefetch_factor=prefetch)
    return tn.Loader(node)


def train(loader: tn.Loader[Any], epochs: int, width: int, depth: int = 3) -> None:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    size = FEATURES
    for _ in range(depth):
        layers += [torch.nn.Linear(size, width), torch.nn.ReLU()]
        size = width
    model = torch.nn.Sequential(*layers, torch.nn.Linear(size, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(epochs):
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()


def main(argv: list[str]) -> None:
    """``python torchdata_loops.py n batch rounds workers method width [in_order] [prefetch] [epochs] [wait_ms]``"""
    torch.set_num_threads(1)
    n, batch, rounds, workers = (int(a) for a in argv[:4])
    method, width = argv[4], int(argv[5])
    in_order = argv[6] != "0" if len(argv) > 6 else True
    prefetch = int(argv[7]) if len(argv) > 7 else 2
    epochs = int(argv[8]) if len(argv) > 8 else 1
    wait_s = float(argv[9]) / 1000 if len(argv) > 9 else 0.0
    train(pipeline(n, batch, rounds, workers, method, in_order, prefetch or None, wait_s), epochs, width)


if __name__ == "__main__":
    main(sys.argv[1:])
