"""A small CNN on MNIST in PyTorch, its DataLoader as first written.

    python examples/mnist_torch.py                        # MNIST-shaped data made here, 5 epochs
    python examples/mnist_torch.py --mnist ~/mnist        # real MNIST IDX files (or LOADPROF_MNIST=~/mnist)
    loadprof compare examples/mnist_torch.py --variants baseline,cache,amp,accum --png compare.png

The job: 20,000 training and 5,000 test images, 28x28, 10 classes, 5 epochs, to
be timed as written and with caching + prefetching, mixed precision and gradient
accumulation. It is written the way a first version usually is: each item is converted and normalised when it is read
(uint8 -> float32, / 255, per-image standardisation), ``num_workers=0``, no cache.
``loadprof compare`` applies each variant from outside; the script never changes.
The same model as examples/keras_mnist.py (its Keras twin, also run by
examples/mnist_keras.py). Runs on the CPU, or on a GPU when PyTorch sees one.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # mnist_data, also under -m / runpy

import numpy as np  # noqa: E402
import torch  # noqa: E402
from mnist_data import N_TEST, N_TRAIN, load_mnist  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402

MNIST_ENV = "LOADPROF_MNIST"


class Digits(Dataset):
    """uint8 images converted and normalised one at a time, as a decoding dataset would."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        x = torch.from_numpy(self.images[i].astype(np.float32) / 255.0)
        x = (x - x.mean()) / (x.std() + 1e-6)
        return x.unsqueeze(0), int(self.labels[i])


def model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 5 * 5, 128), nn.ReLU(), nn.Linear(128, 10),
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5, help="training epochs (default 5)")
    parser.add_argument("--batch-size", type=int, default=128, help="batch size (default 128)")
    parser.add_argument("--mnist", default=os.environ.get(MNIST_ENV) or None, metavar="DIR",
                        help=f"a folder with the MNIST IDX files (default: ${MNIST_ENV}, else made here)")
    parser.add_argument("--n-train", type=int, default=N_TRAIN, help=f"training images (default {N_TRAIN})")
    parser.add_argument("--n-test", type=int, default=N_TEST, help=f"test images (default {N_TEST})")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        x_train, y_train, x_test, y_test = load_mnist(args.mnist, args.n_train, args.n_test, seed=args.seed)
    except (OSError, ValueError) as exc:
        print(f"mnist_torch: {exc}", file=sys.stderr)
        return 2
    source = f"real MNIST from {args.mnist}" if args.mnist else "MNIST-shaped data made here"
    print(f"{source}: {len(x_train)} training, {len(x_test)} test images", flush=True)

    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    train = DataLoader(Digits(x_train, y_train), batch_size=args.batch_size, shuffle=True)
    test = DataLoader(Digits(x_test, y_test), batch_size=args.batch_size)
    net = model().to(device)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()

    start = time.perf_counter()
    accuracy = 0.0
    for epoch in range(args.epochs):
        net.train()
        total, n = 0.0, 0
        for x, y in train:
            x, y = x.to(device), y.to(device)
            loss = loss_fn(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(y)
            n += len(y)
        net.eval()
        correct = 0
        with torch.no_grad():
            for x, y in test:
                correct += int((net(x.to(device)).argmax(1) == y.to(device)).sum())
        accuracy = correct / max(1, len(test.dataset))
        print(f"epoch {epoch + 1}/{args.epochs}: loss {total / max(1, n):.4f}, test accuracy {accuracy:.4f}",
              flush=True)
    seconds = time.perf_counter() - start
    print(f"{args.epochs} epochs in {seconds:.1f} s; test accuracy {accuracy:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
