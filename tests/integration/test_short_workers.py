"""Loader workers that live less than the sampler's listing period (an epoch of a fraction of a
second, fresh workers each epoch): their CPU is the job's, recovered from what the training
process reaped (NOTE [ Short-lived loader workers ] in samplers/host.py), not left to read as
another process's load."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest

torch = pytest.importorskip("torch")

from loadprof import Profile  # noqa: E402


class Burn(torch.utils.data.Dataset):
    """Each of ``items`` items burns ``seconds`` of CPU and says how much CPU its worker has used so far."""

    def __init__(self, items: int = 48, seconds: float = 0.002) -> None:
        self.items, self.seconds = items, seconds

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, i: int):
        end = time.process_time() + self.seconds
        while time.process_time() < end:
            pass
        return torch.zeros(4), time.process_time()


@pytest.mark.slow
def test_workers_shorter_than_a_listing_are_counted_as_the_jobs() -> None:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    workers_cpu = 0.0
    ctx = mp.get_context("fork")
    with Profile(output=None, what_if=0) as prof:
        for _ in range(12):  # epochs of ~50 ms of loading each, 2 fresh workers every epoch
            loader = torch.utils.data.DataLoader(Burn(), batch_size=8, num_workers=2, multiprocessing_context=ctx)
            per_epoch: list[float] = []
            for x, cpu in loader:
                model(x).sum().backward()
                opt.step()
                opt.zero_grad()
                per_epoch.extend(cpu.tolist())
            # each worker's last item: its CPU up to then (the two workers' figures interleave;
            # the two largest are the two workers' last readings at most)
            workers_cpu += sum(sorted(per_epoch)[-2:])
    host = prof.run.host_samples
    counted = sum((h.children_cpu + h.reaped_cpu) / 100.0 * h.window for h in host)
    # the workers' own CPU (less the tail after their last item) must reach the job's tree
    assert counted >= 0.75 * workers_cpu, (counted, workers_cpu, len(host))


@pytest.mark.slow
def test_workers_first_listed_after_their_prefetch_burst_are_counted_whole() -> None:
    # fresh workers fill their prefetch at once, then wait for a loop slower than they are:
    # most of their CPU falls before the listing (once a second) first finds them
    model = torch.nn.Linear(4, 1)
    workers_cpu = 0.0
    ctx = mp.get_context("fork")
    with Profile(output=None, what_if=0) as prof:
        for _ in range(5):  # epochs of ~0.6 s, 2 fresh workers each
            loader = torch.utils.data.DataLoader(Burn(12, 0.015), batch_size=1, num_workers=2, prefetch_factor=6,
                                                 multiprocessing_context=ctx)
            per_epoch: list[float] = []
            for x, cpu in loader:
                model(x).sum().backward()
                time.sleep(0.05)  # the loop's step, slower than the workers
                per_epoch.extend(cpu.tolist())
            workers_cpu += sum(sorted(per_epoch)[-2:])
    host = prof.run.host_samples
    counted = sum((h.children_cpu + h.reaped_cpu) / 100.0 * h.window for h in host)
    assert counted >= 0.85 * workers_cpu, (counted, workers_cpu, len(host))
