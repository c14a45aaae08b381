"""A streaming audio job: an IterableDataset over shards of zlib-compressed 16-bit
clips (as WebDataset or a record stream hands them out), each DataLoader worker
taking every num_workers-th shard (get_worker_info), decoding each clip on the CPU
(decompress, pre-emphasis, framed FFT, log-mel features). num_workers=4 on a
2-core machine: more workers than cores. The model is a small 1-D convolution.
``--offline`` does what the offline advice says: every clip decoded once into an HDF5
file (``loadprof convert``), the training read from it (``HDF5Dataset``, shuffled).

One of the realistic scripts benchmarks/advice_accuracy.py measures the advice on.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import zlib

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

RATE = 16000
FRAME, HOP, MELS = 400, 160, 40


def make_shards(shards: int, per_shard: int, seconds: float, seed: int = 0) -> list[list[tuple[bytes, int]]]:
    """Synthetic clips: a tone per class, a noise floor, 16-bit, compressed."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(RATE * seconds)) / RATE
    out = []
    for _ in range(shards):
        shard = []
        for _ in range(per_shard):
            label = int(rng.integers(0, 10))
            wave = 0.3 * np.sin(2 * np.pi * (200 + 80 * label) * t) + 0.05 * rng.standard_normal(len(t))
            shard.append((zlib.compress((wave * 32767).astype(np.int16).tobytes(), 1), label))
        out.append(shard)
    return out


def mel_matrix() -> np.ndarray:
    """Triangular filters, evenly spaced on the mel scale, over the FFT bins."""
    mel = np.linspace(0, 2595 * np.log10(1 + RATE / 2 / 700), MELS + 2)
    edges = np.floor((FRAME + 1) * 700 * (10 ** (mel / 2595) - 1) / RATE).astype(int)
    bank = np.zeros((MELS, FRAME // 2 + 1), dtype=np.float32)
    for m in range(1, MELS + 1):
        lo, mid, hi = edges[m - 1], edges[m], edges[m + 1]
        bank[m - 1, lo:mid] = (np.arange(lo, mid) - lo) / max(mid - lo, 1)
        bank[m - 1, mid:hi] = (hi - np.arange(mid, hi)) / max(hi - mid, 1)
    return bank


class ClipStream(IterableDataset):
    def __init__(self, shards: list[list[tuple[bytes, int]]]) -> None:
        self.shards = shards
        self.window = np.hanning(FRAME).astype(np.float32)
        self.mels = mel_matrix()

    def decode(self, blob: bytes) -> torch.Tensor:
        wave = np.frombuffer(zlib.decompress(blob), dtype=np.int16).astype(np.float32) / 32768
        wave = np.append(wave[0], wave[1:] - 0.97 * wave[:-1])
        n = 1 + (len(wave) - FRAME) // HOP
        frames = np.lib.stride_tricks.as_strided(wave, (n, FRAME), (wave.strides[0] * HOP, wave.strides[0]))
        power = np.abs(np.fft.rfft(frames * self.window, axis=1)) ** 2
        feats = np.log(power @ self.mels.T + 1e-6)
        return torch.from_numpy(((feats - feats.mean(0)) / (feats.std(0) + 1e-5)).T.copy())  # (MELS, frames)

    def __iter__(self):
        info = get_worker_info()
        mine = self.shards if info is None else self.shards[info.id::info.num_workers]
        # a worker's seed is new each epoch; without workers, draw one from torch's generator
        rng = np.random.default_rng(info.seed if info is not None else int(torch.randint(2**31, ())))
        for s in rng.permutation(len(mine)):
            for blob, label in mine[s]:
                yield self.decode(blob), label


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--per-shard", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=0.5)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--offline", action="store_true",
                        help="decode every clip once into an HDF5 file, then train from it (the offline advice)")
    args = parser.parse_args()
    torch.manual_seed(0)
    stream = ClipStream(make_shards(args.shards, args.per_shard, args.seconds))
    with tempfile.TemporaryDirectory() as folder:
        if args.offline:
            loader = DataLoader(stored(stream, folder), batch_size=32, shuffle=True, num_workers=args.workers)
        else:
            loader = DataLoader(stream, batch_size=32, num_workers=args.workers)
        train(loader, args.epochs)


def stored(stream: ClipStream, folder: str):
    """The offline advice applied: every clip decoded once into an HDF5 file (as
    `loadprof convert` stores a dataset), then read back from it."""
    from loadprof.converters.conversion import ConvertOptions, convert
    from loadprof.converters.torch import HDF5Dataset

    global DATA
    DATA = [(stream.decode(blob), label) for shard in stream.shards for blob, label in shard]
    path = os.path.join(folder, "clips.h5")
    convert("__main__:DATA", path, ConvertOptions(to="hdf5", progress=False))
    return HDF5Dataset(path, transform=lambda s: (torch.from_numpy(s["input"]), int(s["label"])))


def train(loader: DataLoader, epochs: int) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    net = nn.Sequential(nn.Conv1d(MELS, 32, 5, stride=2), nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(),
                        nn.Linear(32, 10)).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(epochs):
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()


if __name__ == "__main__":
    main()
