"""NumPy files (.npy, .npz) and MNIST's IDX files, read row by row in bounded memory."""

from __future__ import annotations

import gzip
import os
import tokenize
import warnings
import zipfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConvertError, clean_message
from .base import Source, SourceOptions

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


# -- IDX (MNIST)

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
