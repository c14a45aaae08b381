"""A DDP job in which one rank's data path is slower: every rank waits for it.

Launch with any number of ranks (CPU and gloo here; NCCL on GPUs when there are):

    torchrun --standalone --nproc-per-node=2 --no-python loadprof diagnose --json job.json examples/ddp_starved.py

The slow rank (the last one, or ``--slow-rank R``) reads its shard from storage that
answers 4x slower, as a rank on a node with a cold cache or a remote filesystem does.
Its step is no longer than the others': DDP's all-reduce makes every rank wait for it,
so each rank on its own looks the same. loadprof names the rank, the cause (input)
and what the others lose per step.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
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


#: the samples ``--packed`` converts (``loadprof convert`` reads "__main__:SAMPLES")
SAMPLES: Dataset | None = None


def packed(n: int, folder: str) -> Dataset:
    """The samples packed into one HDF5 file (``loadprof convert``), as the convert_format
    advice says: one file read instead of a storage read a sample. Packed once, outside
    the training time, as a job converts its data before it trains."""
    from loadprof.converters.conversion import ConvertOptions, convert
    from loadprof.converters.torch import HDF5Dataset

    global SAMPLES
    SAMPLES = Shard(n, 0.0)
    path = os.path.join(folder, "packed.h5")
    convert("__main__:SAMPLES", path, ConvertOptions(to="hdf5", progress=False))
    return HDF5Dataset(path, transform=lambda s: (torch.from_numpy(s["input"]), int(s["label"])))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--slow-rank", type=int, default=None, help="default: the last rank")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers per rank")
    parser.add_argument("--packed", action="store_true", help="read the samples from one packed HDF5 file")
    args = parser.parse_args()

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    slow = world - 1 if args.slow_rank is None else args.slow_rank
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if backend == "nccl" else "cpu")
    torch.set_num_threads(1)

    latency = 0.008 if rank == slow else 0.002  # seconds per sample
    data: Dataset = Shard(args.steps * args.batch_size * world, latency)
    folder = tempfile.TemporaryDirectory() if args.packed else None
    if folder is not None:
        data = packed(len(data), folder.name)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=DistributedSampler(data, shuffle=False),
                        num_workers=args.workers)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)).to(device)
    model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, (x, y) in enumerate(loader):
        if step == args.steps:
            break
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()
    if folder is not None:
        folder.cleanup()


if __name__ == "__main__":
    main()
