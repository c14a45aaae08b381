"""A PyTorch job that runs out of memory: its batch size ramps up each epoch
(batch-size warm-up) until a step's activations no longer fit.

The model attends over sequences of 512 tokens, so each sample's attention
matrices (512 x 512 floats per layer, kept for backward) dwarf the model's few
thousand parameters: activations grow with the batch, the model state does not.

To stay harmless on a shared machine the script caps its own address space
(RLIMIT_AS) at what it maps once started plus ``--limit-mib``: the allocation that
fails is PyTorch's CPU allocator's, inside this process, and nothing else on the
machine is pressed. Runs unchanged under ``loadprof diagnose
examples/torch_memory.py``; ``examples/torch_memory_fixed.py`` trains the same
batches as micro-batches with gradient accumulation.
"""

from __future__ import annotations

import argparse
import resource
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SEQ, DIM, CLASSES = 512, 32, 4


class Attention(nn.Module):
    """One self-attention layer written out, as the CPU's math path computes it."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        weights = torch.softmax(q @ k.transpose(1, 2) / DIM**0.5, dim=-1)  # batch x SEQ x SEQ
        return x + self.out(weights @ v)


def model() -> nn.Module:
    return nn.Sequential(Attention(DIM), Attention(DIM), nn.Flatten(), nn.Linear(SEQ * DIM, CLASSES))


def data(n: int = 128) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, SEQ, DIM, generator=g), torch.randint(0, CLASSES, (n,), generator=g))


def cap_memory(limit_mib: int) -> None:
    """Limit this process's address space to what it maps now plus ``limit_mib`` (Linux:
    elsewhere the job runs uncapped and, with this machine's memory, may well fit)."""
    if not sys.platform.startswith("linux"):
        print("not Linux: memory not capped")
        return
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (mapped + limit_mib * 2**20, resource.RLIM_INFINITY))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 32, 64, 128],
                        help="the batch size of each epoch")
    parser.add_argument("--limit-mib", type=int, default=512, help="memory this script allows itself")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    net = model()
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    dataset = data()
    cap_memory(args.limit_mib)
    for epoch, batch_size in enumerate(args.batches):
        for x, y in DataLoader(dataset, batch_size=batch_size, shuffle=True,
                               generator=torch.Generator().manual_seed(epoch)):
            opt.zero_grad()
            loss = loss_fn(net(x), y)
            loss.backward()
            opt.step()
        print(f"epoch {epoch}: batch {batch_size}, loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
