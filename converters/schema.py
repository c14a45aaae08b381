"""What a converted dataset holds: named fields, each fixed-shape array or encoded bytes.

A sample is a ``dict[str, numpy.ndarray | bytes]``. The first sample of a source
fixes the schema; every later sample must match it exactly, because both HDF5
(one chunked dataset per field) and our TFRecord readers (static shapes for
``tf.io.parse_single_example``) need one shape per field.
"""

from __future__ import annotations

import json
import math
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
    def from_dict(cls, data: Any) -> Field:
        """A field from its JSON form, checked: ValueError saying what is wrong otherwise."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a field is {_json_type(data)}, expected an object")
        name = data.get("name")
        if not isinstance(name, str):
            raise ValueError(f"a field's 'name' is {_shown(name)}, expected a string")
        where = f"field {name!r}"
        kind = data.get("kind")
        if kind not in ("array", "bytes"):
            raise ValueError(f"{where}: 'kind' is {_shown(kind)}, expected \"array\" or \"bytes\"")
        dtype = data.get("dtype", "bytes" if kind == "bytes" else None)
        shape = data.get("shape", [])
        if not isinstance(shape, list) or not all(type(n) is int and 0 <= n < 1 << 62 for n in shape):
            raise ValueError(f"{where}: 'shape' is {_shown(shape)}, expected a list of sizes")
        if len(shape) > 32:
            raise ValueError(f"{where}: 'shape' has {len(shape)} dimensions, at most 32 are allowed")
        if kind == "bytes":
            if dtype != "bytes" or shape:
                raise ValueError(f"{where}: a bytes field has dtype \"bytes\" and no shape")
        else:
            if not isinstance(dtype, str) or _numeric_dtype(dtype) is None:
                raise ValueError(f"{where}: 'dtype' is {_shown(dtype)}, expected a numeric NumPy dtype name")
            item = math.prod(shape) * np.dtype(dtype).itemsize
            if item > _MAX_ITEM_BYTES:
                raise ValueError(f"{where}: shape {shape} makes one sample {item} bytes")
        content = data.get("content")
        if content is not None and not isinstance(content, str):
            raise ValueError(f"{where}: 'content' is {_shown(content)}, expected a string")
        return cls(name=name, kind=kind, dtype=dtype, shape=tuple(shape), content=content)


# One sample above 1 PiB cannot be real; the bound keeps size arithmetic in int64.
_MAX_ITEM_BYTES = 1 << 50


def _numeric_dtype(name: str) -> np.dtype[Any] | None:
    """The dtype a canonical name ("float32", "uint8") stands for, if numeric; None otherwise."""
    try:
        dtype = np.dtype(name)
    except (TypeError, ValueError):
        return None
    return dtype if dtype.kind in _ALLOWED_KINDS and dtype.name == name else None


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    for kind, words in names.items():
        if isinstance(value, kind):
            return words
    return "a number" if isinstance(value, (int, float)) else type(value).__name__


def _shown(value: Any) -> str:
    """A value as an error message quotes it: short, one line."""
    text = json.dumps(value) if isinstance(value, (str, int, float, bool, list, dict, type(None))) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


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
        """A schema from the JSON we store (a list of fields); ValueError saying what is wrong."""
        try:
            data = json.loads(text)
        except (TypeError, ValueError, RecursionError) as exc:
            raise ValueError(f"not valid JSON: {exc}") from None
        return cls.from_obj(data)

    @classmethod
    def from_obj(cls, data: Any) -> Schema:
        """A schema from parsed JSON, every part checked; ValueError saying what is wrong."""
        if not isinstance(data, list):
            raise ValueError(f"the schema is {_json_type(data)}, expected a list of fields")
        if not data:
            raise ValueError("the schema lists no fields")
        fields = tuple(Field.from_dict(d) for d in data)
        try:
            return cls(fields)
        except ConvertError as exc:
            raise ValueError(str(exc)) from None


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
