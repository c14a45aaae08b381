"""The out-of-memory example with loadprof's advice applied: gradient accumulation.

Same data, model, batch-size ramp and memory cap as examples/torch_memory.py, but
each batch is trained as micro-batches of at most ``--micro`` samples whose
gradients add up before one optimizer step (loadprof's `gradient_accumulation`
advice): the effective batch, and so the optimizer's steps, stay those of the
ramp, while a step's activations are those of a micro-batch.
Run it with `loadprof diagnose examples/torch_memory_fixed.py` and compare.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_memory import cap_memory, data, model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 32, 64, 128],
                        help="the (effective) batch size of each epoch")
    parser.add_argument("--micro", type=int, default=64, help="the largest micro-batch (loadprof's advice)")
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
        micro = min(batch_size, args.micro)
        accumulate = batch_size // micro
        loader = DataLoader(dataset, batch_size=micro, shuffle=True, generator=torch.Generator().manual_seed(epoch))
        for i, (x, y) in enumerate(loader):
            loss = loss_fn(net(x), y) / accumulate  # the mean over the whole effective batch
            loss.backward()
            if i % accumulate == accumulate - 1:
                opt.step()
                opt.zero_grad()
        print(f"epoch {epoch}: batch {batch_size} as {accumulate} x {micro}, loss {accumulate * loss.item():.4f}")


if __name__ == "__main__":
    main()
