"""Read throughput: 10,000 small images as files vs our HDF5 and TFRecord conversions.

Makes 10,000 PNGs of about 3 KB (32x32 RGB, one folder per class), converts them
with ``loadprof.converters.convert`` to one HDF5 file and to TFRecord shards of 8 MiB, then
reads every image's bytes (no decoding, one process) six ways:

* the image folder, file by file (open + read, as ImageFolder's loader does
  before decoding), in random order as a shuffling DataLoader asks, and sorted;
* the HDF5 file through ``loadprof.converters.torch.HDF5Dataset``, in random order, each
  record checked against its stored CRC-32C (the default) and unchecked (``verify=False``):
  the cost of the check is printed below the table, with the same for --arrays decoded
  224x224x3 uint8 images (150 KB records, where the CRC's own speed shows);
* the shards through ``loadprof.converters.torch.TFRecordDataset``, in order and shuffled
  (CRCs checked, Examples decoded to ``{"image": bytes, "label": array}``).

Each is timed cold, then warm, in --rounds rounds over all six; medians printed. "Cold" drops each file's pages from the page cache
first: os.sync() then os.posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) per file,
which Linux honours for clean pages without root; the cold/warm gap printed shows
whether it took. The dentry and inode caches are not dropped, which favours the
image folder. Prints images/s and the ratio to the image folder in random order
(target: >= 5x cold for HDF5 and TFRecord). Not a test: nothing is asserted.

    python benchmarks/convert_read.py [--n 10000] [--arrays 1000] [--rounds 3] [--dir DIR]

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
    parser.add_argument("--arrays", type=int, default=1000, help="decoded 224x224x3 records for the check's cost")
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

        def read_h5(verify: bool) -> Callable[[], int]:
            def run() -> int:
                ds = HDF5Dataset(h5, verify=verify)
                return sum(len(ds[i]["image"]) > 0 for i in order)
            return run

        def read_tf(shuffle: bool) -> Callable[[], int]:
            def run() -> int:
                return sum(len(item["image"]) > 0 for item in TFRecordDataset(root / "tf", shuffle=shuffle))
            return run

        cases: list[tuple[str, list[Path], Callable[[], int]]] = [
            ("image folder, file by file, random order", files, read_files(random_files)),
            ("image folder, file by file, sorted order", files, read_files(files)),
            ("HDF5Dataset, random order", [h5], read_h5(True)),
            ("HDF5Dataset, random order, verify=False", [h5], read_h5(False)),
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
        print("\nper-record CRC-32C checks in HDF5Dataset (verify=True against verify=False), random order")
        print_cost("3 KB PNG + label", medians["HDF5Dataset, random order"],
                   medians["HDF5Dataset, random order, verify=False"])
        if args.arrays:
            print_cost("224x224x3 uint8 + label", *check_cost(root, args.arrays, args.rounds))


def print_cost(what: str, checked: tuple[float, float], unchecked: tuple[float, float]) -> None:
    (cold, warm), (cold_raw, warm_raw) = checked, unchecked
    print(f"  {what:24} cold {cold:>9,.0f} vs {cold_raw:>9,.0f} items/s ({cold / cold_raw - 1:+.0%}), "
          f"warm {warm:>9,.0f} vs {warm_raw:>9,.0f} ({warm / warm_raw - 1:+.0%}, "
          f"{1e6 / warm - 1e6 / warm_raw:+.2f} us an item)")


def check_cost(root: Path, n: int, rounds: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """Medians (cold, warm) of HDF5Dataset in random order over decoded images, checked and unchecked."""
    pixels = np.random.default_rng(2).integers(0, 256, (n, 224, 224, 3), dtype=np.uint8)
    np.savez(root / "pixels.npz", image=pixels, label=np.arange(n) % 10)
    del pixels
    h5 = root / "pixels.h5"
    convert(root / "pixels.npz", h5, ConvertOptions(to="hdf5"))
    (root / "pixels.npz").unlink()
    order = np.random.default_rng(3).permutation(n).tolist()

    def read(verify: bool) -> Callable[[], int]:
        def run() -> int:
            ds = HDF5Dataset(h5, verify=verify)
            return sum(ds[i]["image"].size > 0 for i in order)
        return run

    runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for _ in range(rounds):
        for verify in (True, False):
            drop_cache([h5])
            runs[verify].append((timed(n, read(verify)), timed(n, read(verify))))
    c, u = ([statistics.median(x[k] for x in runs[v]) for k in (0, 1)] for v in (True, False))
    return (c[0], c[1]), (u[0], u[1])


if __name__ == "__main__":
    main()
