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
import os
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ConvertError

__all__ = [
    "Source",
    "SourceOptions",
    "ImageFolderSource",
    "NumpySource",
    "IDXSource",
    "CSVSource",
    "TorchDatasetSource",
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
                raise ConvertError(f"{where}: not a decodable image: {exc}") from exc
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


class NumpySource(Source):
    """``.npy`` (one array, field ``data``) or ``.npz`` (one field per array); axis 0 indexes samples."""

    kind = "numpy"

    def __init__(self, path: str | os.PathLike[str], options: SourceOptions = SourceOptions()) -> None:
        self.path = Path(path)
        self.description = str(self.path)
        arrays: dict[str, np.ndarray] = {}
        try:
            if self.path.suffix == ".npy":
                # mmap: a large .npy is read sample by sample, never all at once.
                arrays["data"] = np.load(self.path, mmap_mode="r", allow_pickle=False)
            else:
                with np.load(self.path, allow_pickle=False) as npz:
                    names = list(options.keys) if options.keys else list(npz.files)
                    missing = [k for k in names if k not in npz.files]
                    if missing:
                        raise ConvertError(f"{self.path}: no array(s) {missing}; it holds {npz.files}")
                    for name in names:
                        arrays[name] = npz[name]
        except ConvertError:
            raise
        except ValueError as exc:
            # allow_pickle=False refuses object arrays with a ValueError (mmap_mode, for
            # .npy, refuses them first, with "Python objects in dtype").
            if "pickle" in str(exc) or "Python objects" in str(exc):
                raise ConvertError(
                    f"{self.path}: holds Python objects (dtype=object); loading them would mean "
                    "unpickling, which loadprof never does"
                ) from exc
            raise ConvertError(f"{self.path}: malformed NumPy file: {exc}") from exc
        except (OSError, EOFError) as exc:
            raise ConvertError(f"{self.path}: cannot read as NumPy: {exc}") from exc
        if not arrays:
            raise ConvertError(f"{self.path}: holds no arrays")
        for name, arr in arrays.items():
            if arr.ndim == 0:
                raise ConvertError(f"{self.path}: array {name!r} is a scalar; axis 0 must index samples")
            if arr.dtype.kind not in "biuf":
                raise ConvertError(f"{self.path}: array {name!r} has dtype {arr.dtype}, expected numeric")
        lengths = {name: arr.shape[0] for name, arr in arrays.items()}
        if len(set(lengths.values())) != 1:
            raise ConvertError(
                f"{self.path}: arrays differ in length along axis 0: {lengths}; "
                "pick arrays of one split with --keys"
            )
        self.arrays = arrays
        self._n = next(iter(lengths.values()))

    def __len__(self) -> int:
        return self._n

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]:
        for i in range(self._n):
            yield f"{self.path}: index {i}", {name: np.asarray(arr[i]) for name, arr in self.arrays.items()}


# ---------------------------------------------------------------- IDX (MNIST)

# IDX type codes (yann.lecun.com/exdb/mnist, "THE IDX FILE FORMAT"); data is big-endian.
_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an IDX file (gzip-compressed or not) into a native-endian array."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except FileNotFoundError as exc:
        raise ConvertError(f"{path}: no such file") from exc
    except (OSError, EOFError) as exc:
        raise ConvertError(f"{path}: cannot read: {exc}") from exc
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES or raw[3] == 0:
        raise ConvertError(f"{path}: not an IDX file (bad magic number {raw[:4].hex()})")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ConvertError(f"{path}: truncated IDX header")
    dims = tuple(int(d) for d in np.frombuffer(raw, ">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_TYPES[raw[2]])
    expected = header + int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(raw) != expected:
        raise ConvertError(
            f"{path}: IDX header promises {expected} bytes for shape {list(dims)}, file holds {len(raw)}"
        )
    return np.frombuffer(raw, dtype, offset=header).reshape(dims).astype(dtype.newbyteorder("="))


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
        data = read_idx(self.path)
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
            self.arrays = {"data": data}
        else:
            labels = read_idx(labels_path)
            if labels.ndim != 1:
                raise ConvertError(f"{labels_path}: labels must be one-dimensional, got shape {list(labels.shape)}")
            if len(labels) != len(data):
                raise ConvertError(f"{labels_path}: {len(labels)} labels for {len(data)} images in {self.path}")
            self.arrays = {"image": data, "label": labels}
            self.description = f"{self.path} + {labels_path}"

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values())))

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]:
        for i in range(len(self)):
            yield f"{self.path}: record {i}", {name: arr[i] for name, arr in self.arrays.items()}


# ---------------------------------------------------------------- CSV


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
                    values.append(float(cell))
                except ValueError:
                    raise ConvertError(
                        f"{self.path}: line {line}, column {header[i]!r}: {cell!r} is not a number"
                    ) from None
            features.append(values)
            labels.append(row[label_at].strip())
            lines.append(line)
        return lines, features, labels

    def _labels(self, raw: list[str]) -> np.ndarray:
        if all(re.fullmatch(r"[+-]?\d+", v) for v in raw):
            return np.array([int(v) for v in raw], dtype=np.int64)
        try:
            return np.array([float(v) for v in raw], dtype=np.float32)
        except ValueError:
            pass
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
            yield where, _as_sample(item, where)


def _as_sample(item: Any, where: str) -> dict[str, Any]:
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
