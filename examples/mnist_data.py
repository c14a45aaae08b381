"""MNIST-shaped data for the examples: made locally, or real MNIST from IDX files.

Framework-free (numpy only), so the Keras and PyTorch examples share it:

    from mnist_data import load_mnist
    x_train, y_train, x_test, y_test = load_mnist()            # made here, deterministic
    x_train, y_train, x_test, y_test = load_mnist("~/mnist")   # real MNIST IDX files

Images are ``uint8`` arrays of shape (n, 28, 28), labels ``uint8`` of shape (n,),
10 classes. The made-up digits are seven-segment glyphs drawn with random stroke
width, position, slant and brightness, plus pixel noise: a small CNN learns them
to well above chance within an epoch, as with MNIST, and the same seed always
gives the same arrays.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

from loadprof.converters import read_idx  # validated: sizes checked before reading

N_TRAIN = 20_000
N_TEST = 5_000
SIDE = 28

#: IDX file names, as published with MNIST (``.gz`` or not; "-idx" or ".idx").
FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}

# Seven segments (a..g) of a digit: (row0, col0, row1, col1) in a 20 x 12 box.
_SEGMENTS = {
    "a": (0, 0, 0, 12), "b": (0, 12, 10, 12), "c": (10, 12, 20, 12), "d": (20, 0, 20, 12),
    "e": (10, 0, 20, 0), "f": (0, 0, 10, 0), "g": (10, 0, 10, 12),
}
_DIGITS = ["abcdef", "bc", "abdeg", "abcdg", "bcfg", "acdfg", "acdefg", "abc", "abcdefg", "abcdfg"]


def load_mnist(
    mnist_dir: str | os.PathLike[str] | None = None,
    n_train: int | None = N_TRAIN,
    n_test: int | None = N_TEST,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): real MNIST from ``mnist_dir``, else made here.

    ``n_train``/``n_test`` cut real MNIST (60,000/10,000) to its first n images; None
    keeps all. Made-up data needs both counts.
    """
    if mnist_dir is not None:
        return _load_idx_dir(Path(mnist_dir).expanduser(), n_train, n_test)
    if n_train is None or n_test is None:
        raise ValueError("made-up data needs n_train and n_test (None only cuts real MNIST)")
    rng = np.random.default_rng(seed)
    x_train, y_train = make_digits(n_train, rng)
    x_test, y_test = make_digits(n_test, rng)
    return x_train, y_train, x_test, y_test


def make_digits(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` seven-segment digit images (uint8, n x 28 x 28) and their labels, balanced-ish."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    labels = rng.integers(0, 10, size=n).astype(np.uint8)
    rows = np.arange(SIDE, dtype=np.float32)[:, None]
    cols = np.arange(SIDE, dtype=np.float32)[None, :]
    images = np.empty((n, SIDE, SIDE), dtype=np.uint8)
    for i, label in enumerate(labels):
        top, left = rng.uniform(2.0, 6.0), rng.uniform(5.0, 11.0)
        scale = rng.uniform(0.85, 1.1)
        slant = rng.uniform(-0.25, 0.25)  # columns shift with height, like handwriting
        width = rng.uniform(1.0, 1.8)
        ink = np.zeros((SIDE, SIDE), dtype=np.float32)
        for seg in _DIGITS[label]:
            r0, c0, r1, c1 = _SEGMENTS[seg]
            r0, r1 = top + scale * r0, top + scale * r1
            c0 = left + scale * c0 + slant * (10 - r0 + top)
            c1 = left + scale * c1 + slant * (10 - r1 + top)
            ink = np.maximum(ink, _stroke(rows, cols, r0, c0, r1, c1, width))
        noise = rng.normal(0.0, 0.08, size=(SIDE, SIDE)).astype(np.float32)
        img = np.clip(ink * rng.uniform(0.7, 1.0) + noise, 0.0, 1.0)
        images[i] = (img * 255).astype(np.uint8)
    return images, labels


def _stroke(rows: np.ndarray, cols: np.ndarray, r0: float, c0: float, r1: float, c1: float,
            width: float) -> np.ndarray:
    """Anti-aliased line segment of half-width ``width`` pixels."""
    dr, dc = r1 - r0, c1 - c0
    length2 = dr * dr + dc * dc or 1.0
    t = np.clip(((rows - r0) * dr + (cols - c0) * dc) / length2, 0.0, 1.0)
    dist = np.hypot(rows - (r0 + t * dr), cols - (c0 + t * dc))
    return np.clip(width + 0.5 - dist, 0.0, 1.0)


# -- real MNIST ------------------------------------------------------------------
def _find(folder: Path, stem: str) -> Path:
    names = [stem, stem.replace("-idx", ".idx")]
    for name in names:
        for candidate in (folder / name, folder / f"{name}.gz"):
            if candidate.is_file():
                return candidate
    raise FileNotFoundError(f"{folder}: no {stem} or {stem}.gz (expected the four MNIST IDX files)")


def _load_idx_dir(
    folder: Path, n_train: int | None, n_test: int | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: not a directory")
    arrays = {key: read_idx(_find(folder, stem)) for key, stem in FILES.items()}
    for split, n in (("train", n_train), ("test", n_test)):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if x.ndim != 3 or x.shape[1:] != (SIDE, SIDE) or y.shape != (x.shape[0],):
            raise ValueError(f"{folder}: {split} images {x.shape} and labels {y.shape} are not MNIST-shaped")
        if n is not None:
            arrays[f"x_{split}"], arrays[f"y_{split}"] = x[:n], y[:n]
    return arrays["x_train"], arrays["y_train"], arrays["x_test"], arrays["y_test"]


def write_idx(path: str | os.PathLike[str], array: np.ndarray) -> None:
    """Write ``array`` (uint8) as an IDX file, gzipped when the name ends in .gz (for tests)."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(header + array.tobytes())
