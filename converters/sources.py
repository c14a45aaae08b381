"""What can be converted: image folders, NumPy files, MNIST IDX files, CSV, PyTorch datasets.

Every source yields ``(where, sample)`` pairs: ``where`` names the file and record
for error messages ("photos/cat/1.png", "data.csv: line 17", "mod:ds: index 5"),
and ``sample`` is ``{field name: array-like or bytes}``. Sources raise ConvertError
for bad input; they never unpickle (``np.load(allow_pickle=False)``).
"""

from __future__ import annotations

import csv
import gzip
import importlib
import io
import math
import os
import re
import sys
import tokenize
import warnings
import zipfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ConvertError, clean_message

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

# torchvision.datasets.folder.IMG_EXTENSIONS: the files ImageFolder picks up.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


@dataclass(frozen=True)
class SourceOptions:
    """How to read a source. Defaults are documented here and nowhere else.

    decode:        image folders: store decoded uint8 arrays instead of the encoded files.
    resize:        image folders with decode: resize every image to (height, width).
    mode:          image folders with decode: PIL mode to convert to, "RGB" (as
                   torchvision's default loader does) or "L" (grayscale).
    keys:          .npz: which arrays to take (default: all of them).
    labels:        IDX: the labels file (default: found beside the images file).
    label_column:  CSV: the column holding labels; every other column is a feature.
    """

    decode: bool = False
    resize: tuple[int, int] | None = None
    mode: str = "RGB"
    keys: tuple[str, ...] | None = None
    labels: str | None = None
    label_column: str = "label"


class Source:
    """Base of all sources: a length, optional class names, and ``(where, sample)`` pairs."""

    kind: str = "source"
    description: str = ""
    class_names: list[str] | None = None
    # Field name -> content marker for the schema ("image" for encoded image files).
    contents: dict[str, str] = {}
    # One-line notes on what was read differently from what was listed (not errors).
    notes: tuple[str, ...] = ()

    def __len__(self) -> int:
        raise NotImplementedError

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]:
        raise NotImplementedError

    def metadata(self) -> dict[str, Any]:
        """Extra provenance worth keeping (e.g. CSV column names)."""
        return {}


# ---------------------------------------------------------------- image folders


class ImageFolderSource(Source):
    """One subfolder per class, like torchvision's ImageFolder (same class order and files).

    Every image is decoded once during conversion so that a corrupt file fails here,
    naming the file, rather than in a training job hours later.
    """

    kind = "image-folder"

    def __init__(self, root: str | os.PathLike[str], options: SourceOptions = SourceOptions()) -> None:
        try:
            from PIL import Image
        except ImportError as exc:
            raise ConvertError("reading image folders needs Pillow: pip install pillow") from exc
        self._Image = Image
        self.root = Path(root)
        self.options = options
        if options.mode not in ("RGB", "L"):
            raise ConvertError(f"image mode must be RGB or L, got {options.mode!r}")
        if options.resize is not None:
            h, w = options.resize
            if h <= 0 or w <= 0:
                raise ConvertError(f"--resize needs positive height and width, got {h} {w}")
        # torchvision find_classes: sorted names of the subdirectories.
        try:
            classes = sorted(e.name for e in os.scandir(self.root) if e.is_dir())
        except OSError as exc:
            raise ConvertError(f"{self.root}: cannot list: {exc.strerror}") from exc
        if not classes:
            raise ConvertError(f"{self.root}: no class subfolders (expected one folder per class)")
        self.class_names = classes
        self.files: list[tuple[Path, int]] = []
        empty = []
        # Links are followed, as torchvision does, but no directory twice: a link back up
        # the tree (a loop) or into another class would repeat images under wrong labels.
        visited = {_dir_key(self.root)} | {_dir_key(self.root / name) for name in classes}
        skipped: list[Path] = []
        for label, name in enumerate(classes):
            before = len(self.files)
            # torchvision make_dataset: sorted os.walk, following links, sorted names.
            for dirpath, names in sorted(_walk_once(self.root / name, visited, skipped)):
                for fname in sorted(names):
                    if fname.lower().endswith(IMG_EXTENSIONS):
                        self.files.append((Path(dirpath) / fname, label))
            if len(self.files) == before:
                empty.append(name)
        if skipped:
            n = len(skipped)
            self.notes = (
                f"{self.root}: skipped {n} director{'y' if n == 1 else 'ies'} reached again through a "
                f"symbolic link ({_shown(skipped)}); each directory is read once",
            )
        if empty:
            raise ConvertError(
                f"{self.root}: no images ({', '.join(IMG_EXTENSIONS)}) in class folder(s) {', '.join(empty)}"
            )
        self.description = str(self.root)
        if not options.decode:
            self.contents = {"image": "image"}

    def __len__(self) -> int:
        return len(self.files)

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]:
        Image = self._Image
        opts = self.options
        first: tuple[tuple[int, ...], Path] | None = None
        for path, label in self.files:
            where = str(path)
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise ConvertError(f"{where}: cannot read: {exc.strerror}") from exc
            try:
                with Image.open(io.BytesIO(data)) as im:
                    im.load()  # a full decode: verify() alone misses truncated pixel data
                    if opts.decode:
                        im = im.convert(opts.mode)
                        if opts.resize is not None:
                            im = im.resize((opts.resize[1], opts.resize[0]), Image.Resampling.BILINEAR)
                        array = np.asarray(im, dtype=np.uint8)
            except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
                raise ConvertError(f"{where}: not a decodable image: {clean_message(exc, repr(where))}") from exc
            if not opts.decode:
                yield where, {"image": data, "label": np.int64(label)}
                continue
            if first is None:
                first = (array.shape, path)
            elif array.shape != first[0]:
                raise ConvertError(
                    f"{where}: decoded to shape {list(array.shape)} but {first[1]} has "
                    f"{list(first[0])}; --decode needs one shape: pass --resize H W"
                )
            yield where, {"image": array, "label": np.int64(label)}


def _dir_key(path: Path) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ConvertError(f"{path}: cannot read: {exc.strerror}") from exc
    return st.st_dev, st.st_ino


def _walk_once(
    top: Path, visited: set[tuple[int, int]], skipped: list[Path]
) -> Iterator[tuple[str, list[str]]]:
    """``os.walk(top, followlinks=True)`` entering no directory already in ``visited`` (by
    device and inode); those are added to ``skipped``. Sorted, so which path of a directory
    reached twice is read does not depend on listing order."""

    def fail(exc: OSError) -> None:
        raise ConvertError(f"{exc.filename}: cannot list: {exc.strerror}") from exc

    for dirpath, dirnames, filenames in os.walk(top, followlinks=True, onerror=fail):
        dirnames.sort()
        keep = []
        for d in dirnames:
            key = _dir_key(Path(dirpath) / d)
            if key in visited:
                skipped.append(Path(dirpath) / d)
            else:
                visited.add(key)
                keep.append(d)
        dirnames[:] = keep
        yield dirpath, filenames


def _shown(paths: Sequence[Path], most: int = 3) -> str:
    text = ", ".join(str(p) for p in paths[:most])
    return text + (f" and {len(paths) - most} more" if len(paths) > most else "")


# ---------------------------------------------------------------- NumPy


# NOTE [ Arrays read row by row ]
# A NumPy or IDX file declares its shape in a header, and the header is hostile until
# checked: sizes are computed with Python integers (no int64 wrap-around) and must equal
# the bytes the file holds before anything is read. Then rows are read as conversion
# asks for them: plain files are memory-mapped; compressed ones (.npz members, .gz IDX)
# are decompressed a block at a time (about _BLOCK_BYTES, or one row when a row is
# larger), so memory stays bounded whatever the file declares or decompresses to.

_BLOCK_BYTES = 1 << 20
# A Fortran-ordered array in an .npz cannot be streamed by rows: read whole up to this.
_FORTRAN_WHOLE_MAX = 256 << 20


def _native(dtype: np.dtype) -> np.dtype:
    return dtype.newbyteorder("=")


def _prod(dims: Sequence[int]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _read_exact(fh: Any, n: int, where: str) -> bytes:
    """``n`` bytes from ``fh``, asked for a block at a time (never one allocation of a declared size)."""
    parts = []
    got = 0
    while got < n:
        chunk = fh.read(min(_BLOCK_BYTES, n - got))
        if not chunk:
            raise ConvertError(f"{where}: truncated: data ends {n - got} bytes early")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


class _Column:
    """One array field of ``shape[0]`` samples, read in order; rows come out native-endian."""

    def __init__(self, name: str, dtype: np.dtype, shape: tuple[int, ...], where: str) -> None:
        self.name = name
        self.dtype = dtype
        self.shape = shape
        self.where = where

    def __len__(self) -> int:
        return self.shape[0]

    def rows(self) -> Iterator[Any]:
        """Every row in order; after the last, the generator checks the file's end when resumed."""
        raise NotImplementedError

    def whole(self) -> np.ndarray:
        raise NotImplementedError


class _MappedColumn(_Column):
    def __init__(self, name: str, array: np.ndarray, where: str) -> None:
        super().__init__(name, array.dtype, tuple(array.shape), where)
        self.array = array

    def rows(self) -> Iterator[Any]:
        native = _native(self.dtype)
        for i in range(self.shape[0]):
            yield self.array[i].astype(native, copy=False)

    def whole(self) -> np.ndarray:
        return np.array(self.array, dtype=_native(self.dtype))


class _StreamColumn(_Column):
    """Rows decompressed from a stream that ``opener()`` returns positioned at the data."""

    def __init__(
        self, name: str, dtype: np.dtype, shape: tuple[int, ...], where: str, opener: Callable[[], Any]
    ) -> None:
        super().__init__(name, dtype, shape, where)
        self.opener = opener

    def _blocks(self, rows_per_block: int) -> Iterator[np.ndarray]:
        item = self.shape[1:]
        row_bytes = _prod(item) * self.dtype.itemsize
        native = _native(self.dtype)
        try:
            with self.opener() as fh:
                left = self.shape[0]
                while left:
                    k = min(rows_per_block, left)
                    data = _read_exact(fh, k * row_bytes, self.where)
                    yield np.frombuffer(data, self.dtype).reshape(k, *item).astype(native, copy=False)
                    left -= k
                if fh.read(1):
                    raise ConvertError(f"{self.where}: holds more data than its header declares")
        except (OSError, EOFError, zlib.error, zipfile.BadZipFile, RuntimeError, NotImplementedError) as exc:
            raise ConvertError(f"{self.where}: cannot read: {clean_message(exc, self.where)}") from exc
        except MemoryError as exc:
            raise ConvertError(f"{self.where}: a row of {row_bytes} bytes does not fit in memory") from exc

    def rows(self) -> Iterator[Any]:
        row_bytes = _prod(self.shape[1:]) * self.dtype.itemsize
        for block in self._blocks(max(1, _BLOCK_BYTES // row_bytes)):
            yield from block

    def whole(self) -> np.ndarray:
        if not self.shape[0]:
            return np.empty(self.shape, _native(self.dtype))
        return np.concatenate(list(self._blocks(self.shape[0])))


def _read_npy_header(fh: Any, where: str) -> tuple[np.dtype, tuple[int, ...], bool]:
    """dtype, shape and Fortran order from a .npy header, ``fh`` left at the data."""
    fmt = np.lib.format
    try:
        # A mangled header can make Python warn while numpy parses it ("invalid escape
        # sequence"): that would be a second line on stderr beside our error.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            version = fmt.read_magic(fh)
            if version == (1, 0):
                shape, fortran, dtype = fmt.read_array_header_1_0(fh)
            elif version in ((2, 0), (3, 0)):
                shape, fortran, dtype = fmt.read_array_header_2_0(fh)
            else:
                raise ValueError(f"unsupported .npy format version {version[0]}.{version[1]}")
    except (ValueError, TypeError, SyntaxError, tokenize.TokenError, EOFError, RecursionError, MemoryError) as exc:
        # numpy parses the header's Python literal with tokenize and ast: any of these.
        if "pickle" in str(exc) or "Python objects" in str(exc):
            raise ConvertError(
                f"{where}: holds Python objects (dtype=object); loading them would mean "
                "unpickling, which loadprof never does"
            ) from exc
        raise ConvertError(f"{where}: malformed NumPy file: {clean_message(exc, where)}") from exc
    if any(d < 0 for d in shape):
        raise ConvertError(f"{where}: malformed NumPy file: negative dimension in shape {list(shape)}")
    return dtype, tuple(int(d) for d in shape), bool(fortran)


def _check_array(where: str, dtype: np.dtype, shape: tuple[int, ...], data_bytes: int) -> None:
    """The declared array must be numeric, have samples, and take exactly the bytes that hold it."""
    if dtype.hasobject:
        raise ConvertError(
            f"{where}: holds Python objects (dtype=object); loading them would mean "
            "unpickling, which loadprof never does"
        )
    if not shape:
        raise ConvertError(f"{where}: is a scalar; axis 0 must index samples")
    if dtype.kind not in "biuf" or dtype.subdtype is not None:
        raise ConvertError(f"{where}: has dtype {dtype}, expected numeric")
    if shape[0] and not _prod(shape[1:]):
        raise ConvertError(f"{where}: samples of shape {list(shape[1:])} hold no values")
    declared = _prod(shape) * dtype.itemsize
    if declared != data_bytes:
        raise ConvertError(
            f"{where}: header declares shape {list(shape)} of {dtype} ({declared} bytes), "
            f"but {data_bytes} bytes of data follow it"
        )


def _npy_column(path: Path) -> _Column:
    where = str(path)
    try:
        with open(path, "rb") as fh:
            dtype, shape, fortran = _read_npy_header(fh, where)
            offset = fh.tell()
            size = os.fstat(fh.fileno()).st_size
    except OSError as exc:
        raise ConvertError(f"{path}: cannot read as NumPy: {exc.strerror or exc}") from exc
    _check_array(where, dtype, shape, size - offset)
    if not shape[0]:
        return _MappedColumn("data", np.empty(shape, dtype), where)
    # mmap: a large .npy is read sample by sample, never all at once.
    try:
        array = np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape, order="F" if fortran else "C")
    except (OSError, ValueError) as exc:
        raise ConvertError(f"{path}: cannot map: {exc}") from exc
    return _MappedColumn("data", array, where)


def _npz_columns(path: Path, keys: Sequence[str] | None) -> list[_Column]:
    try:
        with zipfile.ZipFile(path) as zf:
            members = {(i.filename[:-4] if i.filename.endswith(".npy") else i.filename): i for i in zf.infolist()}
            names = list(keys) if keys else list(members)
            missing = [k for k in names if k not in members]
            if missing:
                raise ConvertError(f"{path}: no array(s) {missing}; it holds {list(members)}")
            columns = [_npz_column(path, zf, name, members[name]) for name in names]
    except (OSError, EOFError, zlib.error, zipfile.BadZipFile, RuntimeError, NotImplementedError, ValueError) as exc:
        raise ConvertError(f"{path}: cannot read as .npz: {clean_message(exc, str(path))}") from exc
    return columns


def _npz_column(path: Path, zf: zipfile.ZipFile, name: str, info: zipfile.ZipInfo) -> _Column:
    where = f"{path}: array {name!r}"
    if not info.filename.endswith(".npy"):
        raise ConvertError(f"{where}: member {info.filename!r} is not a .npy array")
    with zf.open(info) as fh:
        dtype, shape, fortran = _read_npy_header(fh, where)
        offset = fh.tell()
    _check_array(where, dtype, shape, info.file_size - offset)

    def opener() -> Any:
        zfile = zipfile.ZipFile(path)
        try:
            fh = zfile.open(info)
            fh.read(offset)
        except BaseException:
            zfile.close()
            raise
        return _Closing(fh, zfile)

    column = _StreamColumn(name, dtype, shape, where, opener)
    if fortran and len(shape) > 1 and _prod(shape[1:]) > 1:
        nbytes = _prod(shape) * dtype.itemsize
        if nbytes > _FORTRAN_WHOLE_MAX:
            raise ConvertError(
                f"{where}: a Fortran-ordered array of {nbytes} bytes cannot be read row by row; "
                "save it with np.ascontiguousarray"
            )
        flat = _StreamColumn(name, dtype, (_prod(shape),), where, opener).whole()
        return _MappedColumn(name, flat.reshape(shape, order="F"), where)
    return column


class _Closing:
    """A zip member stream that also closes its zip file."""

    def __init__(self, fh: Any, zfile: zipfile.ZipFile) -> None:
        self.fh = fh
        self.zfile = zfile

    def read(self, n: int = -1) -> bytes:
        return bytes(self.fh.read(n))

    def __enter__(self) -> _Closing:
        return self

    def __exit__(self, *exc: object) -> None:
        self.fh.close()
        self.zfile.close()


class NumpySource(Source):
    """``.npy`` (one array, field ``data``) or ``.npz`` (one field per array); axis 0 indexes samples.

    Read row by row (NOTE [ Arrays read row by row ]), never unpickled.
    """

    kind = "numpy"

    def __init__(self, path: str | os.PathLike[str], options: SourceOptions = SourceOptions()) -> None:
        self.path = Path(path)
        self.description = str(self.path)
        if self.path.suffix.lower() == ".npy":
            columns = [_npy_column(self.path)]
        else:
            columns = _npz_columns(self.path, options.keys)
        if not columns:
            raise ConvertError(f"{self.path}: holds no arrays")
        lengths = {c.name: len(c) for c in columns}
        if len(set(lengths.values())) != 1:
            raise ConvertError(
                f"{self.path}: arrays differ in length along axis 0: {lengths}; "
                "pick arrays of one split with --keys"
            )
        self.columns = columns
        self._n = next(iter(lengths.values()))

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]:
        yield from _iter_columns(self.columns, self._n, lambda i: f"{self.path}: index {i}", np.asarray)


def _iter_columns(
    columns: Sequence[_Column], n: int, where: Callable[[int], str], convert: Callable[[Any], Any] = lambda v: v
) -> Iterator[tuple[str, dict[str, Any]]]:
    streams = [(c.name, c.rows()) for c in columns]
    for i in range(n):
        yield where(i), {name: convert(next(rows)) for name, rows in streams}
    for _, rows in streams:
        next(rows, None)  # each stream checks that its file ends where its header said


# ---------------------------------------------------------------- IDX (MNIST)

# IDX type codes (yann.lecun.com/exdb/mnist, "THE IDX FILE FORMAT"); data is big-endian.
_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _idx_header(fh: Any, path: Path) -> tuple[np.dtype, tuple[int, ...], int]:
    magic = fh.read(4)
    if len(magic) < 4 or magic[0] != 0 or magic[1] != 0 or magic[2] not in _IDX_TYPES or magic[3] == 0:
        raise ConvertError(f"{path}: not an IDX file (bad magic number {magic[:4].hex()})")
    ndim = magic[3]
    raw = fh.read(4 * ndim)
    if len(raw) < 4 * ndim:
        raise ConvertError(f"{path}: truncated IDX header")
    dims = tuple(int.from_bytes(raw[4 * i : 4 * i + 4], "big") for i in range(ndim))
    return np.dtype(_IDX_TYPES[magic[2]]), dims, 4 + 4 * ndim


def _idx_column(path: Path, name: str) -> _Column:
    """An IDX file (gzip-compressed or not) as a column; sizes checked before any data is read."""
    where = str(path)
    try:
        with open(path, "rb") as fh:
            gz = fh.read(2) == b"\x1f\x8b"
            fh.seek(0)
            if not gz:
                dtype, dims, header = _idx_header(fh, path)
                size = os.fstat(fh.fileno()).st_size
        if gz:
            with gzip.open(path, "rb") as gzfh:
                dtype, dims, header = _idx_header(gzfh, path)
                size = header
                while chunk := gzfh.read(_BLOCK_BYTES):  # counted, not kept: the size is not stored
                    size += len(chunk)
    except FileNotFoundError as exc:
        raise ConvertError(f"{path}: no such file") from exc
    except (OSError, EOFError, zlib.error) as exc:
        raise ConvertError(f"{path}: cannot read: {exc}") from exc
    expected = header + _prod(dims) * dtype.itemsize
    if size != expected:
        raise ConvertError(f"{path}: IDX header promises {expected} bytes for shape {list(dims)}, file holds {size}")
    if dims[0] and not _prod(dims[1:]):
        raise ConvertError(f"{path}: records of shape {list(dims[1:])} hold no values")
    if gz:

        def opener() -> Any:
            fh = gzip.open(path, "rb")
            fh.read(header)
            return fh

        return _StreamColumn(name, dtype, dims, where, opener)
    if not dims[0]:
        return _MappedColumn(name, np.empty(dims, dtype), where)
    try:
        array = np.memmap(path, dtype=dtype, mode="r", offset=header, shape=dims)
    except (OSError, ValueError) as exc:
        raise ConvertError(f"{path}: cannot map: {exc}") from exc
    return _MappedColumn(name, array, where)


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an IDX file (gzip-compressed or not) into a native-endian array."""
    return _idx_column(Path(path), "data").whole()


class IDXSource(Source):
    """MNIST-style IDX files: images (field ``image``) with their labels file (field ``label``).

    The labels file is found beside ``train-images-idx3-ubyte[.gz]`` as
    ``train-labels-idx1-ubyte[.gz]`` unless given. An IDX file that is not an
    images file converts alone, as field ``data``.
    """

    kind = "idx"

    def __init__(self, path: str | os.PathLike[str], options: SourceOptions = SourceOptions()) -> None:
        self.path = Path(path)
        self.description = str(self.path)
        data = _idx_column(self.path, "data")
        labels_path: Path | None = Path(options.labels) if options.labels else None
        if labels_path is None and "images" in self.path.name:
            stem = self.path.name.replace("images", "labels").replace("idx3", "idx1")
            candidates = [self.path.with_name(stem)]
            candidates += [self.path.with_name(stem[:-3])] if stem.endswith(".gz") else [self.path.with_name(stem + ".gz")]
            labels_path = next((c for c in candidates if c.exists()), None)
            if labels_path is None:
                raise ConvertError(
                    f"{self.path}: no labels file beside it (looked for {candidates[0].name}); "
                    "name one with --labels"
                )
        if labels_path is None:
            self.columns = [data]
        else:
            labels = _idx_column(labels_path, "label")
            if len(labels.shape) != 1:
                raise ConvertError(f"{labels_path}: labels must be one-dimensional, got shape {list(labels.shape)}")
            if len(labels) != len(data):
                raise ConvertError(f"{labels_path}: {len(labels)} labels for {len(data)} images in {self.path}")
            data.name = "image"
            self.columns = [data, labels]
            self.description = f"{self.path} + {labels_path}"

    def __len__(self) -> int:
        return len(self.columns[0])

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]:
        yield from _iter_columns(self.columns, len(self), lambda i: f"{self.path}: record {i}")


# ---------------------------------------------------------------- CSV


_FLOAT32_MAX = float(np.finfo(np.float32).max)


class CSVSource(Source):
    """A header row, numeric feature columns and one label column.

    Features become one float32 vector ``features`` (the column names are kept in
    the provenance). Labels that are all integers stay int64; all numbers,
    float32; anything else is a class name, numbered in sorted order.
    The file is parsed once, up front, so every bad cell is found before any
    output is written.
    """

    kind = "csv"

    def __init__(self, path: str | os.PathLike[str], options: SourceOptions = SourceOptions()) -> None:
        self.path = Path(path)
        self.description = str(self.path)
        try:
            with open(self.path, newline="", encoding="utf-8") as fh:
                rows = self._parse(csv.reader(fh), options.label_column)
        except UnicodeDecodeError as exc:
            raise ConvertError(f"{self.path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
        except csv.Error as exc:
            raise ConvertError(f"{self.path}: malformed CSV: {exc}") from exc
        except OSError as exc:
            raise ConvertError(f"{self.path}: cannot read: {exc.strerror}") from exc
        self.lines, features, raw_labels = rows
        if not self.lines:
            raise ConvertError(f"{self.path}: no data rows after the header")
        self.features = np.asarray(features, dtype=np.float32).reshape(len(self.lines), -1)
        self.labels = self._labels(raw_labels)

    def _parse(self, reader: Any, label_column: str) -> tuple[list[int], list[list[float]], list[str]]:
        header = next(reader, None)
        if not header:
            raise ConvertError(f"{self.path}: empty file (expected a header row)")
        header = [h.strip() for h in header]
        if label_column not in header:
            raise ConvertError(
                f"{self.path}: no {label_column!r} column (columns: {', '.join(header)}); "
                "name the label column with --label-column"
            )
        label_at = header.index(label_column)
        self.columns = [h for i, h in enumerate(header) if i != label_at]
        if not self.columns:
            raise ConvertError(f"{self.path}: no feature columns besides {label_column!r}")
        lines: list[int] = []
        features: list[list[float]] = []
        labels: list[str] = []
        for row in reader:
            if not row or (len(row) == 1 and not row[0].strip()):
                continue  # blank line
            line = reader.line_num
            if len(row) != len(header):
                raise ConvertError(f"{self.path}: line {line}: {len(row)} cells, expected {len(header)}")
            values = []
            for i, cell in enumerate(row):
                if i == label_at:
                    continue
                try:
                    value = float(cell)
                except ValueError:
                    raise ConvertError(
                        f"{self.path}: line {line}, column {header[i]!r}: {cell!r} is not a number"
                    ) from None
                if abs(value) > _FLOAT32_MAX and math.isfinite(value):  # would become inf, silently
                    raise ConvertError(
                        f"{self.path}: line {line}, column {header[i]!r}: {cell.strip()} does not fit in float32"
                    )
                values.append(value)
            features.append(values)
            labels.append(row[label_at].strip())
            lines.append(line)
        return lines, features, labels

    def _labels(self, raw: list[str]) -> np.ndarray:
        if all(re.fullmatch(r"[+-]?\d+", v) for v in raw):
            for line, v in zip(self.lines, raw, strict=True):
                if len(v) > 20 or not -(2**63) <= int(v) < 2**63:
                    raise ConvertError(f"{self.path}: line {line}: label {v} does not fit in int64")
            return np.array([int(v) for v in raw], dtype=np.int64)
        try:
            floats = [float(v) for v in raw]
        except ValueError:
            pass
        else:
            for line, v, f in zip(self.lines, raw, floats, strict=True):
                if abs(f) > _FLOAT32_MAX and math.isfinite(f):
                    raise ConvertError(f"{self.path}: line {line}: label {v} does not fit in float32")
            return np.array(floats, dtype=np.float32)
        if any(not v for v in raw):
            line = self.lines[raw.index("")]
            raise ConvertError(f"{self.path}: line {line}: empty label")
        self.class_names = sorted(set(raw))
        lookup = {name: i for i, name in enumerate(self.class_names)}
        return np.array([lookup[v] for v in raw], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.lines)

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]:
        for i, line in enumerate(self.lines):
            yield f"{self.path}: line {line}", {"features": self.features[i], "label": self.labels[i]}

    def metadata(self) -> dict[str, Any]:
        return {"columns": self.columns}


# ---------------------------------------------------------------- PyTorch datasets

_SPEC_RE = re.compile(r"^(?P<module>[A-Za-z_][\w.]*):(?P<attr>[A-Za-z_][\w.]*)$")


class TorchDatasetSource(Source):
    """A map-style dataset (``__len__`` + ``__getitem__``) named ``module:attribute``.

    The attribute may be a dataset or a zero-argument callable returning one (a
    class or factory). Items may be dicts (keys become field names), 2-tuples
    (``input``, ``label``), other tuples (``x0``, ``x1``, ...) or single values
    (``input``). Tensors, arrays, PIL images and numbers become arrays; bytes stay bytes.
    """

    kind = "torch-dataset"

    def __init__(self, spec: str) -> None:
        m = _SPEC_RE.match(spec)
        if not m:
            raise ConvertError(f"{spec!r}: expected module:attribute")
        self.spec = spec
        self.description = spec
        module_name, attr = m.group("module"), m.group("attr")
        # Like `python -m`, let modules in the current directory be found.
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            obj: Any = importlib.import_module(module_name)
        except ImportError as exc:
            raise ConvertError(f"{spec}: cannot import {module_name}: {exc}") from exc
        except Exception as exc:  # the user's module failed while importing
            raise ConvertError(f"{spec}: importing {module_name} raised {type(exc).__name__}: {exc}") from exc
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise ConvertError(f"{spec}: {module_name} has no attribute {attr!r}")
            obj = getattr(obj, part)
        if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "__getitem__")):
            try:
                obj = obj()
            except Exception as exc:
                raise ConvertError(f"{spec}: calling it raised {type(exc).__name__}: {exc}") from exc
        if not (hasattr(obj, "__len__") and hasattr(obj, "__getitem__")):
            raise ConvertError(
                f"{spec}: {type(obj).__name__} is not a map-style dataset (needs __len__ and __getitem__)"
            )
        self.dataset = obj
        try:
            self._n = len(obj)
        except Exception as exc:
            raise ConvertError(f"{spec}: len() raised {type(exc).__name__}: {exc}") from exc
        classes = getattr(obj, "classes", None)
        if isinstance(classes, (list, tuple)) and all(isinstance(c, str) for c in classes):
            self.class_names = list(classes)

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]:
        for i in range(self._n):
            where = f"{self.spec}: index {i}"
            try:
                item = self.dataset[i]
            except Exception as exc:
                raise ConvertError(f"{where}: raised {type(exc).__name__}: {exc}") from exc
            yield where, as_sample(item, where)


def as_sample(item: Any, where: str) -> dict[str, Any]:
    """A dataset's item as the fields of one sample (TorchDatasetSource's rule)."""
    if isinstance(item, dict):
        return {str(k): v for k, v in item.items()}
    if isinstance(item, (tuple, list)):
        if len(item) == 2:
            return {"input": item[0], "label": item[1]}
        return {f"x{i}": v for i, v in enumerate(item)}
    if isinstance(item, str):
        raise ConvertError(f"{where}: a str item cannot be stored; return arrays, numbers or bytes")
    return {"input": item}


# ---------------------------------------------------------------- choosing a source


def open_source(src: str | os.PathLike[str], options: SourceOptions = SourceOptions()) -> Source:
    """Pick the reader for ``src``: a directory is an image folder, then by file name,
    and ``module:attribute`` (when no such path exists) is a PyTorch dataset."""
    text = os.fspath(src)
    path = Path(text)
    if not path.exists():
        if _SPEC_RE.match(text):
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
