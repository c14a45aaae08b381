"""What a converted dataset holds: named fields, each fixed-shape array or encoded bytes.

A sample is a ``dict[str, numpy.ndarray | bytes]``. The first sample of a source
fixes the schema; every later sample must match it exactly, because both HDF5
(one chunked dataset per field) and our TFRecord readers (static shapes for
``tf.io.parse_single_example``) need one shape per field.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import google_crc32c
import numpy as np

from .errors import ConvertError

__all__ = ["Field", "Schema", "SampleDigest", "Sample", "to_value"]

Sample = dict[str, "np.ndarray | bytes"]
Kind = Literal["array", "bytes"]

# Numeric kinds only: bool, signed/unsigned int, float. Object and string arrays
# would need pickling or a text encoding, and we never pickle.
_ALLOWED_KINDS = frozenset("biuf")


@dataclass(frozen=True)
class Field:
    """One named feature: ``kind="array"`` (fixed shape and dtype) or ``kind="bytes"``."""

    name: str
    kind: Kind
    dtype: str  # numpy dtype name ("uint8", "float32", ...); "bytes" for kind="bytes"
    shape: tuple[int, ...] = ()
    # "image" marks encoded image files (PNG, JPEG, ...) so readers may decode them.
    content: str | None = None

    @property
    def numpy_dtype(self) -> np.dtype[Any]:
        # Stored data is always little-endian (TFRecord raw bytes, our HDF5 files).
        return np.dtype(self.dtype).newbyteorder("<")

    @property
    def item_nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.numpy_dtype.itemsize

    def describe(self) -> str:
        if self.kind == "bytes":
            return f"bytes ({self.content})" if self.content else "bytes"
        return f"{self.dtype}{list(self.shape)}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "dtype": self.dtype,
            "shape": list(self.shape),
        }
        if self.content:
            out["content"] = self.content
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Field:
        kind = data["kind"]
        if kind not in ("array", "bytes"):
            raise ValueError(f"unknown field kind {kind!r}")
        return cls(
            name=str(data["name"]),
            kind=kind,
            dtype=str(data["dtype"]),
            shape=tuple(int(n) for n in data.get("shape", ())),
            content=data.get("content"),
        )


def to_value(value: Any, where: str, name: str) -> np.ndarray | bytes:
    """Normalise one field value to a little-endian numpy array or ``bytes``."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if type(value).__module__.startswith("torch"):
        value = value.detach().cpu().numpy()  # a torch.Tensor; torch is imported lazily
    elif type(value).__module__.startswith("PIL."):
        value = np.asarray(value)
    arr = np.asarray(value)
    if arr.dtype.kind not in _ALLOWED_KINDS:
        raise ConvertError(
            f"{where}: field {name!r} has dtype {arr.dtype}, expected a numeric array "
            "(bool, int, uint or float) or bytes"
        )
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return arr


@dataclass(frozen=True)
class Schema:
    fields: tuple[Field, ...]

    def __post_init__(self) -> None:
        names = [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ConvertError(f"duplicate field names in {names}")
        for n in names:
            if not n or "/" in n:
                raise ConvertError(f"field name {n!r} is not allowed (empty or contains '/')")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    @classmethod
    def infer(cls, sample: Mapping[str, Any], where: str) -> Schema:
        fields = []
        for name, raw in sample.items():
            value = to_value(raw, where, name)
            if isinstance(value, bytes):
                fields.append(Field(name, "bytes", "bytes"))
            else:
                fields.append(Field(name, "array", value.dtype.name, tuple(value.shape)))
        return cls(tuple(fields))

    def check(self, sample: Mapping[str, Any], where: str) -> Sample:
        """Normalise ``sample`` and check it against this schema; ConvertError if it differs."""
        if set(sample) != set(self.names):
            raise ConvertError(
                f"{where}: fields {sorted(sample)} differ from the first sample's {sorted(self.names)}"
            )
        out: Sample = {}
        for f in self.fields:
            value = to_value(sample[f.name], where, f.name)
            if f.kind == "bytes":
                if not isinstance(value, bytes):
                    raise ConvertError(
                        f"{where}: field {f.name!r} is an array, expected bytes like the first sample"
                    )
            else:
                if isinstance(value, bytes):
                    raise ConvertError(
                        f"{where}: field {f.name!r} is bytes, expected {f.describe()} like the first sample"
                    )
                if tuple(value.shape) != f.shape:
                    raise ConvertError(
                        f"{where}: field {f.name!r} has shape {list(value.shape)}, expected "
                        f"{list(f.shape)} like the first sample (a fixed shape is needed)"
                    )
                if value.dtype.name != f.dtype:
                    raise ConvertError(
                        f"{where}: field {f.name!r} has dtype {value.dtype.name}, expected "
                        f"{f.dtype} like the first sample"
                    )
            out[f.name] = value
        return out

    def to_json(self) -> str:
        return json.dumps([f.to_dict() for f in self.fields])

    @classmethod
    def from_json(cls, text: str) -> Schema:
        return cls(tuple(Field.from_dict(d) for d in json.loads(text)))


class SampleDigest:
    """Order-sensitive CRC-32C per field over every sample, for ``--verify`` and ``inspect``.

    Each value is fed as its 8-byte length then its bytes (arrays as their
    little-endian C-order bytes), so moved boundaries between blobs change it.
    """

    def __init__(self, schema: Schema) -> None:
        self.schema = schema
        self.count = 0
        self._crc = dict.fromkeys(schema.names, 0)

    def update(self, sample: Mapping[str, np.ndarray | bytes]) -> None:
        self.count += 1
        for name in self.schema.names:
            value = sample[name]
            data = value if isinstance(value, bytes) else np.ascontiguousarray(value).tobytes()
            crc = google_crc32c.extend(self._crc[name], struct.pack("<Q", len(data)))
            self._crc[name] = google_crc32c.extend(crc, data)

    def result(self) -> dict[str, str]:
        return {name: f"{crc:08x}" for name, crc in self._crc.items()}
