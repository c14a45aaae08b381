"""A compute-bound job: batches already in memory (a TensorDataset), a wide
multilayer perceptron whose matrix products take the step. Nothing in loading to
fix; the advice is about the compute (precision, compilation, threads).

One of the realistic scripts benchmarks/advice_accuracy.py measures the advice on.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=8192)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    data = TensorDataset(torch.randn(args.samples, 512), torch.randint(0, 10, (args.samples,)))
    loader = DataLoader(data, batch_size=128, shuffle=True)
    w = args.width
    net = nn.Sequential(nn.Linear(512, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(),
                        nn.Linear(w, 10)).to(device)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    for _ in range(args.epochs):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()


if __name__ == "__main__":
    main()
