"""Write throughput: our TFRecord writer vs tf.io.TFRecordWriter on the same records.

Both write the same serialised payloads (100 B, 3 KB and 100 KB records, 20-100 MB
per case) to a fresh file on the same disk and are timed until the data is durable
(our close() fsyncs and writes the .idx; TF's file is fsynced after its close),
alternating ours and TF's, best of --repeat; the two files are checked to be
byte-identical. Then the whole path from arrays: our encode_example + writer vs
tf.train.Example + SerializeToString + TF's writer, for 30,000 image-like Examples.

Prints, per payload size, MB/s for each writer and the ratio ours/TF (target:
>= 1.0x), then records/s for the whole path. Not a test: nothing is asserted
about speed.

    python benchmarks/convert_write.py [--repeat 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from loadprof.converters.example_proto import encode_example  # noqa: E402
from loadprof.converters.tfrecord import TFRecordFileWriter  # noqa: E402


def best_of(n: int, ours: Callable[[], None], theirs: Callable[[], None]) -> tuple[float, float]:
    """Best time of each over ``n`` alternating runs, so drift in machine speed hits both."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(n):
        for fn, out in ((ours, times[0]), (theirs, times[1])):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
    return min(times[0]), min(times[1])


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_ours(path: Path, payloads: list[bytes]) -> None:
    with TFRecordFileWriter(path) as w:  # close() fsyncs
        for p in payloads:
            w.write(p)


def write_tf(tf: Any, path: Path, payloads: list[bytes]) -> None:
    with tf.io.TFRecordWriter(str(path)) as w:
        for p in payloads:
            w.write(p)
    fsync_path(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    args = parser.parse_args()
    import tensorflow as tf

    rng = np.random.default_rng(0)
    # (payload bytes, records): ~20-100 MB per case.
    cases = [(100, 200_000), (3_000, 30_000), (100_000, 1_000)]
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        ours_path, theirs_path = Path(tmp) / "ours.tfrecord", Path(tmp) / "tf.tfrecord"
        print(f"{'payload':>9} {'records':>8} {'MB':>6} | {'ours MB/s':>9} {'TF MB/s':>8} {'ratio':>6}")
        for size, count in cases:
            payloads = [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in range(count)]
            total_mb = (size + 16) * count / 1e6

            t_ours, t_tf = best_of(
                args.repeat, partial(write_ours, ours_path, payloads), partial(write_tf, tf, theirs_path, payloads)
            )
            assert ours_path.read_bytes() == theirs_path.read_bytes()  # same bytes on disk
            print(f"{size:>9} {count:>8} {total_mb:>6.0f} | {total_mb / t_ours:>9.0f} "
                  f"{total_mb / t_tf:>8.0f} {t_tf / t_ours:>5.2f}x")

        # The whole path: an image-like Example (encoded bytes + int64 label) per record.
        count = 30_000
        blobs = [rng.integers(0, 256, 3_000, dtype=np.uint8).tobytes() for _ in range(count)]
        labels = rng.integers(0, 1000, count)

        def ours_full() -> None:
            with TFRecordFileWriter(ours_path) as w:
                for blob, label in zip(blobs, labels.tolist(), strict=True):
                    w.write(encode_example({"image": blob, "label": np.array([label])}))

        def tf_full() -> None:
            with tf.io.TFRecordWriter(str(theirs_path)) as w:
                for blob, label in zip(blobs, labels.tolist(), strict=True):
                    ex = tf.train.Example(features=tf.train.Features(feature={
                        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[blob])),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                    }))
                    w.write(ex.SerializeToString())
            fsync_path(theirs_path)

        t_ours, t_tf = best_of(args.repeat, ours_full, tf_full)
        print(f"encode+write, {count} Examples of a 3 KB image + label: ours {count / t_ours:,.0f} rec/s, "
              f"TF {count / t_tf:,.0f} rec/s, {t_tf / t_ours:.2f}x")


if __name__ == "__main__":
    main()
