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
serialiser is not a goal: TF parses whatever is valid protobuf. How the samples of a
schema map to Examples, and back: samplecodec.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["FeatureValue", "encode_example", "decode_example", "ExampleDecodeError", "read_varint"]

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


def read_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
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
        length, start = read_varint(buf, pos, end)
        stop = start + length
    if stop > end:
        raise ExampleDecodeError("length-delimited field runs past its message")
    return start, stop


def _skip(buf: bytes, pos: int, end: int) -> int:
    """Skip one field (key at ``pos``) of any wire type; return the position after it."""
    key, pos = read_varint(buf, pos, end)
    wire = key & 7
    if wire == 0:
        return read_varint(buf, pos, end)[1]
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
            v, pos = read_varint(buf, pos, stop)
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
            v, pos = read_varint(buf, pos + 1, end)
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
