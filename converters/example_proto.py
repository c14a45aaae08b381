"""tf.train.Example encode/decode without TensorFlow or protobuf.

Message layout (tensorflow/core/example/example.proto and feature.proto):

    Example  { Features features = 1; }
    Features { map<string, Feature> feature = 1; }      map entry: key = 1, value = 2
    Feature  { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                            Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }
    FloatList { repeated float value = 1 [packed = true]; }
    Int64List { repeated int64 value = 1 [packed = true]; }

Wire format (protobuf encoding guide): a key is varint(field_number << 3 | wire_type);
wire type 0 = varint, 1 = 64-bit, 2 = length-delimited, 5 = 32-bit. Negative int64
values are 10-byte two's-complement varints. Parsers must accept packed and unpacked
repeated scalars, so the decoder takes both. Byte-identity with TensorFlow's own
serialiser is not a goal: TF parses whatever is valid protobuf.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from .schema import Field, Sample, Schema

__all__ = ["FeatureValue", "encode_example", "decode_example", "ExampleDecodeError", "SampleDecoder", "decode_sample",
           "encode_sample", "feature_encoding"]

# bytes / list of bytes -> BytesList; float array -> FloatList (float32);
# integer or bool array -> Int64List.
FeatureValue = bytes | Sequence[bytes] | np.ndarray


class ExampleDecodeError(ValueError):
    """The payload is not a valid tf.train.Example."""


def _varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# Varint of a length: precomputed for the common small lengths.
_SMALL_VARINTS = [_varint(i) for i in range(1 << 14)]


def _len_varint(n: int) -> bytes:
    return _SMALL_VARINTS[n] if n < (1 << 14) else _varint(n)


def _ld(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: tag, varint length, payload."""
    return tag + _len_varint(len(payload)) + payload


def _varints_numpy(values: np.ndarray) -> bytes:
    """Packed varint encoding of an int64 array, vectorised."""
    v = values.astype(np.int64, copy=False).view(np.uint64)
    nbytes = np.ones(v.shape, dtype=np.int64)
    for k in range(1, 10):
        nbytes += v >= np.uint64(1 << (7 * k))
    ends = np.cumsum(nbytes)
    starts = ends - nbytes
    out = np.empty(int(ends[-1]), dtype=np.uint8)
    for k in range(10):
        live = nbytes > k
        if not live.any():
            break
        part = ((v[live] >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        part |= np.where(nbytes[live] > k + 1, 0x80, 0).astype(np.uint8)
        out[starts[live] + k] = part
    return out.tobytes()


def _encode_feature(value: FeatureValue) -> bytes:
    if isinstance(value, bytes):
        return _ld(b"\x0a", _ld(b"\x0a", value))
    if isinstance(value, np.ndarray):
        flat = value.reshape(-1)
        if flat.dtype.kind == "f":
            packed = flat.astype("<f4", copy=False).tobytes()
            inner = _ld(b"\x0a", packed) if packed else b""
            return _ld(b"\x12", inner)
        if flat.dtype.kind in "biu":
            if flat.dtype.kind == "u" and flat.dtype.itemsize == 8 and flat.size and flat.max() >= 2**63:
                raise ValueError("uint64 values >= 2**63 do not fit an Int64List")
            if flat.size == 0:
                packed = b""
            elif flat.size <= 16:
                packed = b"".join(_varint(int(x)) for x in flat.tolist())
            else:
                packed = _varints_numpy(flat)
            inner = _ld(b"\x0a", packed) if packed else b""
            return _ld(b"\x1a", inner)
        raise TypeError(f"cannot encode a {flat.dtype} array in a tf.train.Feature")
    if isinstance(value, (list, tuple)) and all(isinstance(v, bytes) for v in value):
        return _ld(b"\x0a", b"".join(_ld(b"\x0a", v) for v in value))
    raise TypeError(f"cannot encode {type(value).__name__} in a tf.train.Feature")


def encode_example(features: Mapping[str, FeatureValue]) -> bytes:
    """Serialise a tf.train.Example from ``{name: value}``."""
    entries = []
    for name, value in features.items():
        entry = _ld(b"\x0a", name.encode("utf-8")) + _ld(b"\x12", _encode_feature(value))
        entries.append(_ld(b"\x0a", entry))
    return _ld(b"\x0a", b"".join(entries))


# ---------------------------------------------------------------- decoding
#
# Written as flat loops over the bytes, not a generic field iterator: this runs
# once per record in the readers, where a generator's calls add up (docs/dev/measured.md).


def _read_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise ExampleDecodeError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            if shift == 63 and b > 1:  # a 10th byte holds one bit of a 64-bit value
                raise ExampleDecodeError("varint larger than 64 bits")
            return result, pos
        shift += 7
        if shift >= 70:
            raise ExampleDecodeError("varint longer than 10 bytes")


def _span(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """The (start, stop) of a length-delimited value whose length varint is at ``pos``."""
    if pos < end and buf[pos] < 0x80:
        start = pos + 1
        stop = start + buf[pos]
    else:
        length, start = _read_varint(buf, pos, end)
        stop = start + length
    if stop > end:
        raise ExampleDecodeError("length-delimited field runs past its message")
    return start, stop


def _skip(buf: bytes, pos: int, end: int) -> int:
    """Skip one field (key at ``pos``) of any wire type; return the position after it."""
    key, pos = _read_varint(buf, pos, end)
    wire = key & 7
    if wire == 0:
        return _read_varint(buf, pos, end)[1]
    if wire == 2:
        return _span(buf, pos, end)[1]
    if wire in (1, 5):
        pos += 8 if wire == 1 else 4
        if pos > end:
            raise ExampleDecodeError("truncated fixed-width field")
        return pos
    raise ExampleDecodeError(f"unsupported wire type {wire}")


def _decode_varints(buf: bytes, start: int, stop: int) -> np.ndarray:
    if stop - start <= 32:
        values = []
        pos = start
        while pos < stop:
            v, pos = _read_varint(buf, pos, stop)
            values.append(v - (1 << 64) if v >= (1 << 63) else v)
        return np.array(values, dtype=np.int64)
    b = np.frombuffer(buf, dtype=np.uint8, count=stop - start, offset=start)
    if b[-1] >= 0x80:
        raise ExampleDecodeError("truncated varint")
    ends = np.flatnonzero(b < 0x80)
    starts = np.concatenate(([0], ends[:-1] + 1))
    lengths = ends - starts + 1
    if lengths.max() > 10:
        raise ExampleDecodeError("varint longer than 10 bytes")
    if (b[ends[lengths == 10]] > 1).any():
        raise ExampleDecodeError("varint larger than 64 bits")
    out = np.zeros(len(ends), dtype=np.uint64)
    for k in range(int(lengths.max())):
        live = lengths > k
        out[live] |= (b[starts[live] + k] & 0x7F).astype(np.uint64) << np.uint64(7 * k)
    return out.view(np.int64)


def _bytes_list(buf: bytes, pos: int, end: int) -> list[bytes]:
    values = []
    while pos < end:
        if buf[pos] == 0x0A:  # value = 1, length-delimited
            a, pos = _span(buf, pos + 1, end)
            values.append(buf[a:pos])
        else:
            pos = _skip(buf, pos, end)
    return values


def _float_list(buf: bytes, pos: int, end: int) -> np.ndarray:
    parts = []
    while pos < end:
        key = buf[pos]
        if key == 0x0A:  # packed
            a, pos = _span(buf, pos + 1, end)
            if (pos - a) % 4:
                raise ExampleDecodeError("packed FloatList length is not a multiple of 4")
            parts.append(np.frombuffer(buf, "<f4", count=(pos - a) // 4, offset=a))
        elif key == 0x0D:  # one unpacked float (field 1, wire type 5)
            if pos + 5 > end:
                raise ExampleDecodeError("truncated float")
            parts.append(np.frombuffer(buf, "<f4", count=1, offset=pos + 1))
            pos += 5
        else:
            pos = _skip(buf, pos, end)
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def _int64_list(buf: bytes, pos: int, end: int) -> np.ndarray:
    parts = []
    while pos < end:
        key = buf[pos]
        if key == 0x0A:  # packed
            a, pos = _span(buf, pos + 1, end)
            parts.append(_decode_varints(buf, a, pos))
        elif key == 0x08:  # one unpacked varint
            v, pos = _read_varint(buf, pos + 1, end)
            parts.append(np.array([v], dtype=np.uint64).view(np.int64))
        else:
            pos = _skip(buf, pos, end)
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def _feature(buf: bytes, pos: int, end: int) -> list[bytes] | np.ndarray:
    result: list[bytes] | np.ndarray = []  # a Feature with no kind set reads as empty
    while pos < end:
        key = buf[pos]
        if key in (0x0A, 0x12, 0x1A):  # bytes_list = 1, float_list = 2, int64_list = 3
            a, pos = _span(buf, pos + 1, end)
            if key == 0x0A:
                result = _bytes_list(buf, a, pos)
            elif key == 0x12:
                result = _float_list(buf, a, pos)
            else:
                result = _int64_list(buf, a, pos)
        else:
            pos = _skip(buf, pos, end)
    return result


def _features(buf: bytes, pos: int, end: int, out: dict[str, list[bytes] | np.ndarray]) -> None:
    while pos < end:
        if buf[pos] != 0x0A:  # map entry = 1
            pos = _skip(buf, pos, end)
            continue
        a, stop = _span(buf, pos + 1, end)
        name = b""
        value: list[bytes] | np.ndarray = []
        while a < stop:
            key = buf[a]
            if key == 0x0A or key == 0x12:  # entry key = 1, value = 2
                s, e = _span(buf, a + 1, stop)
                if key == 0x0A:
                    name = buf[s:e]
                else:
                    value = _feature(buf, s, e)
                a = e
            else:
                a = _skip(buf, a, stop)
        try:
            out[name.decode("utf-8")] = value
        except UnicodeDecodeError as exc:
            raise ExampleDecodeError("feature name is not UTF-8") from exc
        pos = stop


def decode_example(data: bytes) -> dict[str, list[bytes] | np.ndarray]:
    """Parse a serialised tf.train.Example into ``{name: list[bytes] | float32/int64 array}``.

    Float and int64 arrays may be read-only views of ``data``. Raises
    ExampleDecodeError for bytes that are not a valid Example.
    """
    out: dict[str, list[bytes] | np.ndarray] = {}
    end = len(data)
    pos = 0
    try:
        while pos < end:
            if data[pos] == 0x0A:  # features = 1 (repeated messages merge)
                a, pos = _span(data, pos + 1, end)
                _features(data, a, pos, out)
            else:
                pos = _skip(data, pos, end)
    except IndexError as exc:  # a read past a sub-message end that the checks missed
        raise ExampleDecodeError("truncated message") from exc
    except OverflowError as exc:  # a value no Example holds: still the one error type
        raise ExampleDecodeError(f"value out of range ({exc})") from exc
    return out


# ---------------------------------------------------------------- samples of a schema <-> Example

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
        n, pos = _read_varint(data, 1, end)
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
                n, pos = _read_varint(data, pos + 1, end)
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
                n, pos = _read_varint(data, pos + 1, end)
            if pos + n != entry_end or data[pos] != tag:  # its one list
                return None
            n = data[pos + 1]
            if n < 0x80:
                pos += 2
            else:
                n, pos = _read_varint(data, pos + 1, end)
            if pos + n != entry_end or data[pos] != 0x0A:  # the list's one value
                return None
            n = data[pos + 1]
            if n < 0x80:
                pos += 2
            else:
                n, pos = _read_varint(data, pos + 1, end)
            if pos + n != entry_end:
                return None
            if enc == "bytes":
                out[name] = data[pos:entry_end]
            elif enc == "int64":
                v = data[pos]
                if n != 1 or v >= 0x80:
                    v, stop = _read_varint(data, pos, end)
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
