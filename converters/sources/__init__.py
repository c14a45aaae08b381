"""What can be converted: image folders, NumPy files, MNIST IDX files, CSV, PyTorch datasets.

Every source yields ``(where, sample)`` pairs: ``where`` names the file and record
for error messages ("photos/cat/1.png", "data.csv: line 17", "mod:ds: index 5"),
and ``sample`` is ``{field name: array-like or bytes}``. Sources raise ConvertError
for bad input; they never unpickle (``np.load(allow_pickle=False)``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from ..errors import ConvertError
from .arrays import IDXSource, NumpySource, read_idx
from .base import Source, SourceOptions
from .csvfile import CSVSource
from .images import IMG_EXTENSIONS, ImageFolderSource
from .torchdataset import SPEC_RE, TorchDatasetSource, as_sample

__all__ = [
    "Source",
    "SourceOptions",
    "ImageFolderSource",
    "NumpySource",
    "IDXSource",
    "CSVSource",
    "TorchDatasetSource",
    "as_sample",
    "open_source",
    "read_idx",
    "IMG_EXTENSIONS",
]


def open_source(src: str | os.PathLike[str], options: SourceOptions = SourceOptions()) -> Source:
    """Pick the reader for ``src``: a directory is an image folder, then by file name,
    and ``module:attribute`` (when no such path exists) is a PyTorch dataset."""
    text = os.fspath(src)
    path = Path(text)
    if not path.exists():
        if SPEC_RE.match(text):
            _reject(options, "a PyTorch dataset", allowed=())
            return TorchDatasetSource(text)
        raise ConvertError(f"{text}: no such file or directory")
    if path.is_dir():
        _reject(options, "an image folder", allowed=("decode", "resize", "mode"))
        return ImageFolderSource(path, options)
    name = path.name.lower()
    if name.endswith((".npy", ".npz")):
        _reject(options, "a NumPy file", allowed=("keys",) if name.endswith(".npz") else ())
        return NumpySource(path, options)
    if name.endswith(".csv"):
        _reject(options, "a CSV file", allowed=("label_column",))
        return CSVSource(path, options)
    if re.search(r"idx\d", name) or name.endswith((".idx", ".idx.gz")):
        _reject(options, "an IDX file", allowed=("labels",))
        return IDXSource(path, options)
    raise ConvertError(
        f"{text}: cannot tell what this is; expected a class-per-folder image directory, "
        ".npy/.npz, .csv, an IDX file (e.g. train-images-idx3-ubyte.gz) or module:attribute"
    )


def _reject(options: SourceOptions, what: str, allowed: Sequence[str]) -> None:
    """Refuse options that do not apply to this kind of source, rather than ignore them."""
    flags = {
        "decode": ("--decode", options.decode),
        "resize": ("--resize", options.resize is not None),
        "mode": ("--mode", options.mode != "RGB"),
        "keys": ("--keys", options.keys is not None),
        "labels": ("--labels", options.labels is not None),
        "label_column": ("--label-column", options.label_column != "label"),
    }
    for key, (flag, used) in flags.items():
        if used and key not in allowed:
            raise ConvertError(f"{flag} does not apply to {what}")
    if (options.resize is not None or options.mode != "RGB") and not options.decode:
        raise ConvertError("--resize and --mode need --decode (encoded images are stored as they are)")
