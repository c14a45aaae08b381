"""Image folders: one subfolder per class, as torchvision's ImageFolder reads them."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConvertError, clean_message
from .base import Source, SourceOptions

# torchvision.datasets.folder.IMG_EXTENSIONS: the files ImageFolder picks up.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


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
