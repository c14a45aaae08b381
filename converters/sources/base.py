"""What every source is: ``Source`` (a length, class names, ``(where, sample)`` pairs) and
the ``SourceOptions`` that say how to read one."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


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
