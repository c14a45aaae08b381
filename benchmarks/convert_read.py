"""Read throughput: 10,000 small images as files vs our HDF5 and TFRecord conversions.

Makes 10,000 PNGs of about 3 KB (32x32 RGB, one folder per class), converts them
with ``loadprof.converters.convert`` to one HDF5 file and to TFRecord shards of 8 MiB, then
reads every image's bytes (no decoding, one process) five ways:

* the image folder, file by file (open + read, as ImageFolder's loader does
  before decoding), in random order as a shuffling DataLoader asks, and sorted;
* the HDF5 file through ``loadprof.converters.torch.HDF5Dataset``, in random order;
* the shards through ``loadprof.converters.torch.TFRecordDataset``, in order and shuffled
  (CRCs checked, Examples decoded to ``{"image": bytes, "label": array}``).

Each is timed cold, then warm, in --rounds rounds over all five; medians printed. "Cold" drops each file's pages from the page cache
first: os.sync() then os.posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) per file,
which Linux honours for clean pages without root; the cold/warm gap printed shows
whether it took. The dentry and inode caches are not dropped, which favours the
image folder. Prints images/s and the ratio to the image folder in random order
(target: >= 5x cold for HDF5 and TFRecord). Not a test: nothing is asserted.

    python benchmarks/convert_read.py [--n 10000] [--rounds 3] [--dir DIR]

Use --dir on the disk your data lives on: the default temp dir may be tmpfs,
where "cold" means nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from loadprof.converters import ConvertOptions, convert
from loadprof.converters.torch import HDF5Dataset, TFRecordDataset


def drop_cache(paths: Iterable[Path]) -> None:
    os.sync()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def make_images(root: Path, n: int, classes: int = 10) -> list[Path]:
    from PIL import Image

    rng = np.random.default_rng(0)
    paths = []
    for i in range(n):
        folder = root / f"class{i % classes:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        # Blocks plus noise: PNGs of ~2.8 KB, like CIFAR-sized dataset images.
        small = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
        pixels = np.kron(small, np.ones((4, 4, 1), np.uint8)) ^ rng.integers(0, 64, (32, 32, 3), dtype=np.uint8)
        path = folder / f"{i:05d}.png"
        Image.fromarray(pixels).save(path)
        paths.append(path)
    return paths


def timed(n: int, fn: Callable[[], int]) -> float:
    t = time.perf_counter()
    got = fn()
    elapsed = time.perf_counter() - t
    assert got == n, (got, n)
    return n / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3, help="rounds over all cases; medians are printed")
    parser.add_argument("--dir", default=None, help="where to put the data (default: a temp dir; use a real disk)")
    args = parser.parse_args()
    n = args.n
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        t = time.perf_counter()
        files = make_images(root / "imgs", n)
        print(f"{n} PNGs, mean {np.mean([p.stat().st_size for p in files]):.0f} B, made in {time.perf_counter() - t:.1f} s")
        for to, out in (("hdf5", root / "imgs.h5"), ("tfrecord", root / "tf")):
            r = convert(root / "imgs", out, ConvertOptions(to=to, shard_size=8 << 20))
            print(f"convert --to {to}: {r.records / r.seconds:,.0f} images/s (every image decoded to check it), "
                  f"{r.bytes / 1e6:.1f} MB")
        h5 = root / "imgs.h5"
        shards = sorted((root / "tf").glob("*.tfrecord"))
        order = np.random.default_rng(1).permutation(n).tolist()
        random_files = [files[i] for i in order]

        def read_files(paths: list[Path]) -> Callable[[], int]:
            def run() -> int:
                total = 0
                for p in paths:
                    with open(p, "rb") as f:
                        total += len(f.read()) > 0
                return total
            return run

        def read_h5() -> int:
            ds = HDF5Dataset(h5)
            return sum(len(ds[i]["image"]) > 0 for i in order)

        def read_tf(shuffle: bool) -> Callable[[], int]:
            def run() -> int:
                return sum(len(item["image"]) > 0 for item in TFRecordDataset(root / "tf", shuffle=shuffle))
            return run

        cases: list[tuple[str, list[Path], Callable[[], int]]] = [
            ("image folder, file by file, random order", files, read_files(random_files)),
            ("image folder, file by file, sorted order", files, read_files(files)),
            ("HDF5Dataset, random order", [h5], read_h5),
            ("TFRecordDataset, in order", shards, read_tf(False)),
            ("TFRecordDataset, shuffled", shards, read_tf(True)),
        ]
        # Rounds over all cases, medians reported: on a shared VM one case's timing
        # can swing 2x with whatever the disk was doing just before.
        results: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in cases}
        for _ in range(args.rounds):
            for name, paths, fn in cases:
                drop_cache(paths)
                cold = timed(n, fn)
                warm = timed(n, fn)
                results[name].append((cold, warm))
        medians = {
            name: (statistics.median(c for c, _ in runs), statistics.median(w for _, w in runs))
            for name, runs in results.items()
        }
        base_cold, base_warm = medians[cases[0][0]]
        print(f"\nmedian of {args.rounds} rounds")
        print(f"{'':44} {'cold img/s':>11} {'x':>6} {'warm img/s':>11} {'x':>6}")
        for name, (cold, warm) in medians.items():
            print(f"{name:44} {cold:>11,.0f} {cold / base_cold:>5.1f}x {warm:>11,.0f} {warm / base_warm:>5.1f}x")
        print("x: relative to the image folder read file by file in random order")


if __name__ == "__main__":
    main()
