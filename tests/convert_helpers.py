"""Builders of small real datasets for the converter tests (no fakes of our own code)."""

from __future__ import annotations

import gzip
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def make_image_folder(
    root: Path,
    counts: dict[str, int] | None = None,
    size: tuple[int, int] = (8, 8),
    fmt: str = "PNG",
    seed: int = 0,
) -> list[tuple[Path, int, np.ndarray]]:
    """Write random RGB images, one subfolder per class; return (path, label, pixels) in order."""
    from PIL import Image

    counts = counts or {"cat": 3, "dog": 2}
    rng = np.random.default_rng(seed)
    out = []
    ext = {"PNG": ".png", "JPEG": ".jpg", "BMP": ".bmp"}[fmt]
    for label, name in enumerate(sorted(counts)):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(counts[name]):
            pixels = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
            path = root / name / f"{i:03d}{ext}"
            Image.fromarray(pixels).save(path, format=fmt)
            out.append((path, label, pixels))
    return out


def write_idx(path: Path, array: np.ndarray, compress: bool = False) -> None:
    """An IDX file as on yann.lecun.com/exdb/mnist: magic, big-endian dims, big-endian data."""
    codes = {np.dtype(np.uint8): 0x08, np.dtype(np.int16): 0x0B, np.dtype(np.float32): 0x0D}
    header = bytes([0, 0, codes[array.dtype], array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    data = header + array.astype(array.dtype.newbyteorder(">")).tobytes()
    path.write_bytes(gzip.compress(data) if compress else data)


def loadprof(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m loadprof ARGS`` as a user would."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "loadprof", *args],
        capture_output=True, text=True, cwd=cwd, env=env, timeout=120,
    )


def leftovers(directory: Path) -> list[str]:
    """Hidden temporary outputs left in ``directory`` (there should be none)."""
    return sorted(p.name for p in directory.iterdir() if ".tmp-" in p.name or ".old-" in p.name)
