"""The samples of a schema as tf.train.Examples, and back (example_proto.py has the wire
format): how each field becomes a Feature (``feature_encoding``), and a decoder that reads
records of our own layout in one pass, falling back to the generic parse for any other.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from .example_proto import ExampleDecodeError, decode_example, encode_example, read_varint
from .schema import Field, Sample, Schema

__all__ = ["Encoding", "feature_encoding", "encode_sample", "decode_sample", "SampleDecoder"]

Encoding = Literal["bytes", "int64", "float", "raw"]


def feature_encoding(field: Field) -> Encoding:
    """How a field becomes a tf.train.Feature.

    bytes -> BytesList[1]; integer/bool scalars (labels) -> Int64List[1];
    float32 arrays -> FloatList (flattened, C order); any other array -> BytesList[1]
    of its little-endian bytes, which TF reads with ``tf.io.decode_raw`` and a reshape
    (compact for uint8 images, exact for float64).
    """
    if field.kind == "bytes":
        return "bytes"
    kind = np.dtype(field.dtype).kind
    if field.shape == () and kind in "biu" and field.dtype != "uint64":
        return "int64"
    if field.dtype == "float32":
        return "float"
    return "raw"


def encode_sample(schema: Schema, sample: Mapping[str, np.ndarray | bytes]) -> bytes:
    features: dict[str, Any] = {}
    for field in schema.fields:
        value = sample[field.name]
        enc = feature_encoding(field)
        if enc == "bytes":
            features[field.name] = value
        elif enc == "int64":
            features[field.name] = np.asarray(value).astype(np.int64).reshape(1)
        elif enc == "float":
            features[field.name] = np.asarray(value, dtype=np.float32)
        else:
            features[field.name] = np.ascontiguousarray(value, dtype=field.numpy_dtype).tobytes()
    return encode_example(features)


# (name, name as UTF-8, encoding, list tag, dtype, stored dtype, shape, values, bytes, (lo, hi))
_Plan = tuple[
    tuple[str, bytes, str, int, np.dtype[Any], np.dtype[Any], tuple[int, ...], int, int, tuple[int, int]], ...
]


def _int_range(dtype: np.dtype[Any]) -> tuple[int, int]:
    """The values an Int64List entry may hold for a field of ``dtype``: others are not ours."""
    if dtype.kind == "b":
        return 0, 1
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return int(info.min), int(info.max)
    return -(1 << 63), (1 << 63) - 1
_LIST_TAG = {"bytes": 0x0A, "raw": 0x0A, "float": 0x12, "int64": 0x1A}
_LIST_DTYPE = {"float": np.dtype(np.float32), "int64": np.dtype(np.int64)}


@functools.lru_cache(maxsize=32)
def _plan(schema: Schema) -> _Plan:
    plan = []
    for f in schema.fields:
        enc = feature_encoding(f)
        count = int(np.prod(f.shape, dtype=np.int64))
        dtype = np.dtype("bytes") if f.kind == "bytes" else np.dtype(f.dtype)
        stored = f.numpy_dtype if enc == "raw" else dtype
        plan.append((f.name, f.name.encode("utf-8"), enc, _LIST_TAG[enc], dtype, stored, f.shape, count,
                     f.item_nbytes if enc == "raw" else 0, _int_range(dtype)))
    return tuple(plan)


def _decode_ours(plan: _Plan, data: bytes) -> dict[str, Any] | None:
    """Decode an Example laid out exactly as ``encode_sample`` writes it; None for anything else.

    NOTE [ Fast path for our own Examples ]
    The generic decoder (above) walks every field through helper calls, most of
    what a TFRecordDataset item costs (docs/dev/measured.md). Our
    writer always emits one map entry per schema field, in schema order, each a
    key, then a Feature with one list holding one value (one bytes value, or one
    packed run). This matches that layout byte by byte and must consume the whole
    message at every level; anything else (another writer's field order, unpacked
    lists, extra fields, a value that does not fit its dtype) returns None and the
    record goes through the generic decoder, so both read the same values.
    """
    # Lengths below 128 are one byte: read inline, a call only for longer varints.
    try:
        if data[0] != 0x0A:
            return None
        end = len(data)
        n, pos = read_varint(data, 1, end)
        if pos + n != end:
            return None
        out: dict[str, Any] = {}
        for name, key, enc, tag, dtype, stored, shape, count, nbytes, (lo, hi) in plan:
            if data[pos] != 0x0A:  # map entry
                return None
            n = data[pos + 1]
            if n < 0x80:
                pos += 2
            else:
                n, pos = read_varint(data, pos + 1, end)
            entry_end = pos + n
            k = len(key)
            if data[pos] != 0x0A or data[pos + 1] != k or data[pos + 2 : pos + 2 + k] != key:  # entry key
                return None
            pos += 2 + k
            if data[pos] != 0x12:  # entry value: the Feature
                return None
            n = data[pos + 1]
            if n < 0x80:
                pos += 2
            else:
                n, pos = read_varint(data, pos + 1, end)
            if pos + n != entry_end or data[pos] != tag:  # its one list
                return None
            n = data[pos + 1]
            if n < 0x80:
                pos += 2
            else:
                n, pos = read_varint(data, pos + 1, end)
            if pos + n != entry_end or data[pos] != 0x0A:  # the list's one value
                return None
            n = data[pos + 1]
            if n < 0x80:
                pos += 2
            else:
                n, pos = read_varint(data, pos + 1, end)
            if pos + n != entry_end:
                return None
            if enc == "bytes":
                out[name] = data[pos:entry_end]
            elif enc == "int64":
                v = data[pos]
                if n != 1 or v >= 0x80:
                    v, stop = read_varint(data, pos, end)
                    if stop != entry_end or v >= 1 << 64:
                        return None
                    if v >= 1 << 63:
                        v -= 1 << 64
                if not lo <= v <= hi:
                    return None
                out[name] = np.array(v, dtype=dtype)
            elif enc == "float":
                if n != 4 * count:
                    return None
                out[name] = np.frombuffer(data, "<f4", count, pos).reshape(shape).astype(dtype)
            else:
                if n != nbytes:
                    return None
                out[name] = np.frombuffer(data, stored, count, pos).reshape(shape).astype(dtype)
            pos = entry_end
        return out if pos == end else None
    except (IndexError, OverflowError, ExampleDecodeError):
        return None


def decode_sample(schema: Schema | None, data: bytes) -> dict[str, Any]:
    """Decode one record's Example into a sample; without a schema, the raw Feature values.

    Raises ExampleDecodeError if the payload is not an Example or does not fit the schema.
    Arrays are fresh, writable copies (torch warns on read-only NumPy arrays).
    For many records of one schema, ``SampleDecoder(schema)`` does the same faster.
    """
    return SampleDecoder(schema)(data)


class SampleDecoder:
    """``decode_sample`` bound to one schema, its plan worked out once rather than per record."""

    def __init__(self, schema: Schema | None) -> None:
        self.schema = schema
        self._plan = _plan(schema) if schema is not None else None

    def __call__(self, data: bytes) -> dict[str, Any]:
        if self._plan is not None:
            ours = _decode_ours(self._plan, data)
            if ours is not None:
                return ours
        return _decode_generic(self.schema, data)


def _decode_generic(schema: Schema | None, data: bytes) -> dict[str, Any]:
    raw = decode_example(data)
    if schema is None:
        # A one-value BytesList reads as plain bytes, other lists stay lists; numeric
        # lists are 1-D arrays because nothing says whether [x] was a scalar.
        out: dict[str, Any] = {}
        for name, value in raw.items():
            if isinstance(value, list):
                out[name] = value[0] if len(value) == 1 else value
            else:
                out[name] = value.copy()
        return out
    sample: Sample = {}
    for field in schema.fields:
        if field.name not in raw:
            raise ExampleDecodeError(f"feature {field.name!r} is missing")
        value = raw[field.name]
        enc = feature_encoding(field)
        if enc in ("bytes", "raw"):
            if not isinstance(value, list) or len(value) != 1:
                raise ExampleDecodeError(f"feature {field.name!r}: expected one bytes value")
            if enc == "bytes":
                sample[field.name] = value[0]
                continue
            if len(value[0]) != field.item_nbytes:
                raise ExampleDecodeError(
                    f"feature {field.name!r}: {len(value[0])} bytes, expected {field.item_nbytes}"
                )
            arr = np.frombuffer(value[0], dtype=field.numpy_dtype).reshape(field.shape)
            sample[field.name] = arr.astype(field.dtype)  # native order, writable copy
        else:
            expected = int(np.prod(field.shape, dtype=np.int64))
            if isinstance(value, list) or value.size != expected or value.dtype != _LIST_DTYPE[enc]:
                raise ExampleDecodeError(
                    f"feature {field.name!r}: expected {expected} {enc} values"
                )
            if enc == "int64" and value.size:
                lo, hi = _int_range(np.dtype(field.dtype))
                if not (lo <= int(value.min()) and int(value.max()) <= hi):
                    raise ExampleDecodeError(f"feature {field.name!r}: {value.tolist()[:4]} out of range for {field.dtype}")
            sample[field.name] = value.reshape(field.shape).astype(field.dtype)
    return sample
