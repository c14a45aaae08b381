"""An FSDP job in which one rank's data path is slower: every rank waits for it.

Runs on CPU with gloo (torch 2.13: both ``fully_shard``, the default, and
``FullyShardedDataParallel`` with ``--api fsdp1``), with any number of ranks:

    torchrun --standalone --nproc-per-node=2 --no-python loadprof diagnose --json job.json examples/fsdp_starved.py

The slow rank (the last one, or ``--slow-rank R``) reads its shard from storage that
answers 4x slower. Under FSDP the others wait for it in the first all-gather of their
forward (under DDP they wait in backward's all-reduce); loadprof times that wait
(gloo's ``Work.wait`` blocks until the collective is done), names the rank, the cause
(input) and what the others lose per step. With NCCL the wait is not timed: its
``Work.wait`` returns at once and the host blocks later.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Shard(Dataset):
    """Synthetic samples; reading one waits ``latency`` seconds, like a read from storage."""

    def __init__(self, n: int, latency: float) -> None:
        self.n, self.latency = n, latency

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.latency)
        g = torch.Generator().manual_seed(i)
        return torch.randn(64, generator=g), torch.randint(0, 10, (), generator=g)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--slow-rank", type=int, default=None, help="default: the last rank")
    parser.add_argument("--api", choices=("fsdp2", "fsdp1"), default="fsdp2",
                        help="fully_shard (fsdp2) or FullyShardedDataParallel (fsdp1)")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    slow = world - 1 if args.slow_rank is None else args.slow_rank
    torch.set_num_threads(1)

    latency = 0.008 if rank == slow else 0.002  # seconds per sample
    data = Shard(args.steps * args.batch_size * world, latency)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=DistributedSampler(data, shuffle=False))
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    if args.api == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel

        model: torch.nn.Module = FullyShardedDataParallel(net, device_id=torch.device("cpu"))
    else:
        from torch.distributed.fsdp import fully_shard

        for layer in (net[0], net[2]):
            fully_shard(layer)  # one unit per layer: gathered just before it runs
        model = fully_shard(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, (x, y) in enumerate(loader):
        if step == args.steps:
            break
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
