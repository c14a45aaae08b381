"""CSV files: a header row, numeric feature columns and one label column."""

from __future__ import annotations

import csv
import math
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConvertError
from .base import Source, SourceOptions

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
