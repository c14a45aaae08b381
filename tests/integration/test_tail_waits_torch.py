"""A real PyTorch loop whose loader stalls now and then: the stalls located and warned of."""

from __future__ import annotations

import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from loadprof import Profile
from tests import torch_loops as loops

pytestmark = pytest.mark.slow

STALL = 0.2


class EveryTenthSlow(Dataset):
    """In-memory samples; items 5, 15, 25, ... wait ``STALL`` seconds, as a read that
    misses a cache now and then."""

    def __init__(self, n: int) -> None:
        self.x, self.y = torch.randn(n, 32), torch.randint(0, 4, (n,))

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        if i % 10 == 5:
            time.sleep(STALL)
        return self.x[i], self.y[i]


def test_a_slow_batch_in_ten_is_located_with_its_period_and_warned_of():
    loader = DataLoader(EveryTenthSlow(100), batch_size=1, num_workers=0)
    model = loops.small_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    with Profile(interval=0.05, print_report=False) as prof:
        for x, y in loader:
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            time.sleep(0.01)  # the model's time: the stalls' floor is half a step, above a busy host's jitter
            opt.step()
    report = prof.report
    waits = report.waits
    assert waits is not None and waits["steps"] == 95  # 100 steps, 5 warm-up
    assert sorted(st["index"] for st in waits["stalls"]) == list(range(5, 100, 10))
    # a collection on the sampler's thread during a sleep is taken out of that wait, though the
    # sleep went on (NOTE [ Garbage collection in a wait ]): a few milliseconds at most
    assert all(st["wait_s"] >= 0.95 * STALL for st in waits["stalls"]), waits["stalls"]
    assert waits["period_steps"] == 10.0 and waits["max_s"] >= 0.95 * STALL > waits["p50_s"]
    detail = dict((w.id, w.detail) for w in report.warnings).get("input-stalls")
    assert detail is not None and "every 10 steps" in detail
    assert "num_workers=0 makes each batch only when the loop asks for it" in detail


SET_UP = 0.3


class Stream(IterableDataset):
    """A stream split between the workers, each worker's iteration opening it first (``SET_UP``
    seconds, as a connection or a shard index would): a stream says no length."""

    def __init__(self, n: int) -> None:
        self.x, self.y = torch.randn(n, 32), torch.randint(0, 4, (n,))

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        time.sleep(SET_UP)
        rank, size = (info.id, info.num_workers) if info is not None else (0, 1)
        for i in range(rank, len(self.y), size):
            yield self.x[i], self.y[i]


def test_a_streams_epoch_starts_are_located_though_it_has_no_length():
    loader = DataLoader(Stream(48), batch_size=4, num_workers=2)  # 12 batches an epoch
    model = loops.small_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = torch.nn.CrossEntropyLoss()
    with Profile(interval=0.05, print_report=False) as prof:
        for _ in range(3):
            for x, y in loader:
                opt.zero_grad()
                loss_fn(model(x), y).backward()
                time.sleep(0.01)
                opt.step()
    waits = prof.report.waits
    assert waits is not None
    # each epoch's workers start and open the stream before its first batch: steps 12 and 24
    starts = sorted(st["index"] for st in waits["stalls"] if st["at"] == "epoch-start")
    assert starts == [12, 24], waits["stalls"]
    detail = dict((w.id, w.detail) for w in prof.report.warnings).get("input-stalls")
    assert detail is not None and "each epoch's start waits" in detail and "persistent_workers=True" in detail
