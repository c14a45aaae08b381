"""An HDF5 file checked before anything of it is read: its layout, attributes, offsets and
chunk indexes against what it claims and its size, in a watched child (``plan_reads``),
and where a reader finds each field's bytes (NOTE [ Direct reads of uncompressed HDF5
data ])."""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np

from .errors import ConvertError
from .files import check_regular
from .hdf5 import CHUNK_MAX, FORMAT, FORMAT_VERSION, UNVERIFIED_VERSION, checksum_name
from .schema import Field, Schema

# Fields up to this size are read into memory when a reader opens (labels, offsets):
# one h5py call per sample per field is the main cost of a small random read.
_CACHE_BYTES = 8 << 20

# NOTE [ Checking an HDF5 file before reading it ]
# A file we did not write, or one changed since, may claim anything: a schema that
# names groups as arrays, num_records past the data, offsets that decrease or point
# past the end, a (2**40, 2**20) dataset in a 1.4 KB file. The reader relies on
# those claims for every item, so HDF5Reader checks them once, when it opens the
# file, in vectorised NumPy (a million offsets in a few ms): after that an item is
# either right or not read. Declared sizes are checked against the file's size
# before anything is read whole, so memory follows what the file holds, not what it
# says. What no check here can bound is libhdf5 itself: a corrupt object header can
# make it loop or crash while parsing metadata. ``loadprof inspect`` runs its parse
# in a child process it can stop (converters/watchdog.py); the readers, inside a
# training process, cannot (docs/bad-input.md).

# h5py's exceptions for a file it cannot parse (corrupt metadata, broken links).
_H5_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError)
# No HDF5 filter in h5py's set expands data more than deflate, whose maximum is
# 1032:1 (zlib technical details); a compressed dataset claiming more is not real.
_MAX_EXPANSION = 1032
# libhdf5 holds a whole chunk in memory to read any part of it (decompressed, for a
# filtered one): a 1.5 GB chunk declared over 3 KB of data took 1.8 GB per reader.
# Ours are at most 1 MiB (or one record); 64 MiB leaves room for other tools' files.
_CHUNK_LIMIT = 64 << 20


@contextlib.contextmanager
def h5errors(path: str, what: str) -> Iterator[None]:
    """Turn h5py's errors about a corrupt file into one ConvertError naming it."""
    try:
        yield
    except ConvertError:
        raise
    except MemoryError:
        raise ConvertError(f"{path}: {what}: libhdf5 ran out of memory (the file claims absurd sizes?)") from None
    except _H5_ERRORS as exc:
        message = str(exc).replace("Unable to synchronously ", "").replace("Can't synchronously ", "")
        raise ConvertError(f"{path}: {what}: {message or type(exc).__name__}") from None


def decoded_attr(path: str, f: h5py.File, key: str) -> Any:
    """A root attribute: text as str, JSON text parsed; None when absent."""
    with h5errors(path, f"cannot read attribute {key!r}"):
        attrs = f.attrs  # opens the root group: a damaged one raises KeyError here
        if key not in attrs:
            return None
        value = attrs[key]
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            raise ConvertError(f"{path}: attribute {key!r} is not UTF-8 text") from None
    return value


def _json_attr(path: str, f: h5py.File, key: str, kind: type, words: str) -> Any:
    """A JSON attribute of ours, which must parse to ``kind``; None when absent."""
    value = decoded_attr(path, f, key)
    if value is None:
        return None
    try:
        parsed = json.loads(value) if isinstance(value, str) else value
    except (ValueError, RecursionError):
        raise ConvertError(f"{path}: attribute {key!r} is not valid JSON") from None
    if not isinstance(parsed, kind):
        raise ConvertError(f"{path}: attribute {key!r} is {type(parsed).__name__}, expected {words}")
    return parsed


def _count_attr(path: str, f: h5py.File, key: str = "num_records") -> int | None:
    value = decoded_attr(path, f, key)
    if value is None:
        return None
    if isinstance(value, np.ndarray) and value.shape in ((), (1,)):
        value = value.reshape(())[()]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise ConvertError(f"{path}: attribute {key!r} is {shown}, expected a whole number >= 0")
    return int(value)


def _stored_crcs(path: str, f: h5py.File, schema: Schema, n: int, file_size: int) -> tuple[int | None, Any]:
    """The format version of a file of ours (None: another tool's file) and its per-record
    checksums, (n, fields) uint32 (None: a version-1 file). NOTE [ Per-record checksums ]."""
    if decoded_attr(path, f, "schema") is None:
        if decoded_attr(path, f, "loadprof_format") == FORMAT:
            raise ConvertError(f"{path}: attribute 'schema' is missing; every file of loadprof carries one")
        return None, None
    key = "loadprof_format_version"
    version = _count_attr(path, f, key)
    if version is None:
        raise ConvertError(f"{path}: attribute {key!r} is missing; every file of loadprof carries one")
    if not UNVERIFIED_VERSION <= version <= FORMAT_VERSION:
        newer = " (written by a newer loadprof?)" if version > FORMAT_VERSION else ""
        raise ConvertError(
            f"{path}: attribute {key!r} is {version}{newer}; this loadprof reads versions "
            f"{UNVERIFIED_VERSION} to {FORMAT_VERSION}"
        )
    name, shape = checksum_name(schema), (n, len(schema.fields))
    obj = _get(path, f, name)
    if obj is None and version == UNVERIFIED_VERSION:
        return version, None
    # Used whatever the version says when present: one damaged byte must not turn checks off.
    ds = _dataset(path, obj, name, f"uint32{list(shape)} (the per-record checksums)")
    if ds.dtype.kind != "u" or ds.dtype.itemsize != 4 or tuple(ds.shape) != shape:
        raise ConvertError(
            f"{path}: {name!r} is {ds.dtype}{list(ds.shape)}, expected uint32{list(shape)} (the per-record checksums)"
        )
    _check_stored(path, name, ds, file_size)
    with h5errors(path, f"cannot read {name!r}"):
        table = np.asarray(ds[()], dtype=np.uint32)
    return version, table


def _get(path: str, f: h5py.File, name: str) -> Any:
    with h5errors(path, f"cannot open {name!r}"):
        if name not in f:
            return None
        return f[name]


def _check_stored(path: str, name: str, ds: h5py.Dataset, file_size: int) -> None:
    """Refuse a dataset whose declared size the file cannot hold, or whose data lies elsewhere.

    See NOTE [ Checking an HDF5 file before reading it ].
    """
    with h5errors(path, f"cannot read the layout of {name!r}"):
        dcpl = ds.id.get_create_plist()
        layout, external, filters = dcpl.get_layout(), dcpl.get_external_count(), dcpl.get_nfilters()
        shape, itemsize = tuple(ds.shape or ()), ds.dtype.itemsize
        chunks = tuple(ds.chunks) if layout == h5py.h5d.CHUNKED and ds.chunks else ()
    if layout not in (h5py.h5d.COMPACT, h5py.h5d.CONTIGUOUS, h5py.h5d.CHUNKED) or external:
        raise ConvertError(
            f"{path}: {name!r} keeps its data in other files (a virtual or external dataset), "
            "which loadprof does not read"
        )
    declared = math.prod(shape) * itemsize  # Python integers: no overflow
    if chunks:
        chunk = math.prod(chunks) * itemsize
        record = math.prod(shape[1:]) * itemsize
        allowed = min(max(declared, CHUNK_MAX), max(_CHUNK_LIMIT, record))
        if chunk > allowed:
            raise ConvertError(
                f"{path}: {name!r} is stored in chunks of {chunk} bytes ({list(chunks)} x {itemsize}) for "
                f"{declared} bytes of data; loadprof reads chunks of at most {allowed} bytes (the data or "
                "1 MiB, and 64 MiB unless one record is larger)"
            )
    limit = file_size * (_MAX_EXPANSION if filters else 1)
    if declared > limit:
        how = f"{_MAX_EXPANSION}x the file's" if filters else "the file's"
        raise ConvertError(
            f"{path}: {name!r} declares shape {list(shape)} ({declared} bytes), more than {how} "
            f"{file_size} bytes: unwritten or truncated data"
        )


def _dataset(path: str, obj: Any, name: str, expected: str) -> h5py.Dataset:
    if not isinstance(obj, h5py.Dataset):
        what = "missing" if obj is None else "a group" if isinstance(obj, h5py.Group) else f"a {type(obj).__name__}"
        raise ConvertError(f"{path}: {name!r} is {what}, expected {expected}")
    return obj


def _field_records(path: str, f: h5py.File, field: Field, file_size: int) -> int:
    """How many records ``field`` holds, after checking that its objects match the schema."""
    obj = _get(path, f, field.name)
    if field.kind == "bytes":
        if not isinstance(obj, h5py.Group):
            what = "missing" if obj is None else "a dataset" if isinstance(obj, h5py.Dataset) else "not a group"
            raise ConvertError(f"{path}: {field.name!r} is {what}; the schema says bytes (a group of data and offsets)")
        data = _dataset(path, _get(path, f, f"{field.name}/data"), f"{field.name}/data", "a uint8 dataset")
        offsets = _dataset(path, _get(path, f, f"{field.name}/offsets"), f"{field.name}/offsets", "an int64 dataset")
        if data.ndim != 1 or data.dtype.itemsize != 1 or data.dtype.kind not in "iu":
            raise ConvertError(f"{path}: {field.name}/data is {data.dtype}{list(data.shape)}, expected uint8[n]")
        if offsets.ndim != 1 or offsets.dtype.kind not in "iu" or offsets.shape[0] < 1:
            raise ConvertError(
                f"{path}: {field.name}/offsets is {offsets.dtype}{list(offsets.shape)}, expected int64[records + 1]"
            )
        _check_stored(path, f"{field.name}/data", data, file_size)
        _check_stored(path, f"{field.name}/offsets", offsets, file_size)
        return int(offsets.shape[0]) - 1
    ds = _dataset(path, obj, field.name, f"a dataset ({field.describe()} per record)")
    stored = ds.dtype
    if ds.ndim < 1 or stored.kind not in "biuf" or stored.newbyteorder("=") != np.dtype(field.dtype).newbyteorder("="):
        raise ConvertError(
            f"{path}: {field.name!r} is {stored}{list(ds.shape)}; the schema says {field.describe()} per record"
        )
    if tuple(ds.shape[1:]) != field.shape:
        raise ConvertError(
            f"{path}: {field.name!r} has records of shape {list(ds.shape[1:])}; the schema says {list(field.shape)}"
        )
    _check_stored(path, field.name, ds, file_size)
    return int(ds.shape[0])


def _check_offsets(path: str, name: str, offsets: np.ndarray, data_bytes: int) -> None:
    """Offsets must rise (or stay) from record to record and stay within the data.

    See NOTE [ Checking an HDF5 file before reading it ]: with them checked, every item
    is a slice of the data of the length its offsets say.
    """
    outside = (offsets < 0) | (offsets > data_bytes)
    if outside.any():
        i = int(np.flatnonzero(outside)[0])
        where = f"record {i}" if i < len(offsets) - 1 else f"the end of record {i - 1}"
        raise ConvertError(
            f"{path}: {name}/offsets gives {int(offsets[i])} for {where}, outside the data (0 to {data_bytes} bytes)"
        )
    falls = np.flatnonzero(offsets[1:] < offsets[:-1])
    if len(falls):
        i = int(falls[0])
        raise ConvertError(
            f"{path}: {name}/offsets decrease at record {i} ({int(offsets[i])} then {int(offsets[i + 1])})"
        )


def _layout(path: str, f: h5py.File, file_size: int) -> tuple[Schema, int]:
    """Schema and record count of an open file: ours from attributes, others inferred; all checked."""
    raw = decoded_attr(path, f, "schema")
    if raw is not None:
        if not isinstance(raw, str):
            raise ConvertError(f"{path}: attribute 'schema' is {type(raw).__name__}, expected JSON text")
        try:
            schema = Schema.from_json(raw)
        except ValueError as exc:
            raise ConvertError(f"{path}: attribute 'schema': {exc}") from None
        declared = _count_attr(path, f)
        counts = {field.name: _field_records(path, f, field, file_size) for field in schema.fields}
        n = declared if declared is not None else counts[schema.fields[0].name]
        for name, count in counts.items():
            if count != n:
                said = "attribute 'num_records' says" if declared is not None else f"{schema.fields[0].name!r} holds"
                raise ConvertError(f"{path}: {said} {n} records, {name!r} holds {count}")
        return schema, n
    fields = []
    lengths: dict[str, int] = {}
    with h5errors(path, "cannot list the top level"):
        names = list(f.keys())
    for name in names:
        obj = _get(path, f, name)
        if isinstance(obj, h5py.Dataset) and obj.ndim >= 1 and obj.dtype.kind in "biuf":
            field = Field(name, "array", obj.dtype.newbyteorder("=").name, tuple(obj.shape[1:]))
        elif isinstance(obj, h5py.Group) and "data" in obj and "offsets" in obj:
            field = Field(name, "bytes", "bytes")
        else:
            continue
        fields.append(field)
        lengths[name] = _field_records(path, f, field, file_size)
    if not fields:
        raise ConvertError(f"{path}: no numeric datasets at the top level to read as samples")
    if len(set(lengths.values())) != 1:
        raise ConvertError(f"{path}: top-level datasets differ in length: {lengths}")
    return Schema(tuple(fields)), next(iter(lengths.values()))


def open_hdf5(path: str) -> tuple[h5py.File, int]:
    """The file open for reading, and its size; ConvertError for anything but a readable HDF5 file."""
    size = check_regular(path, "an HDF5 file").st_size
    try:
        return h5py.File(path, "r"), size
    except FileNotFoundError as exc:
        raise ConvertError(f"{path}: no such file") from exc
    except _H5_ERRORS as exc:
        raise ConvertError(f"{path}: cannot open as HDF5: {exc}") from exc


def check_output(path: str, progress: Callable[[int], None]) -> str | None:
    """Why ``path`` is not an output of loadprof that its readers open, None when it is one.

    The root attribute ``loadprof_format``, then every check a reader makes when it opens
    the file (``plan_reads``); the data itself is not read. For ``run_watched``: libhdf5
    can hang on or crash on the file (NOTE [ Parsing HDF5 in a child process ]); NOTE
    [ What --overwrite replaces ] in overwrite.py.
    """
    progress(0)
    f, _ = open_hdf5(path)
    with f:
        value = decoded_attr(path, f, "loadprof_format")
    if value != FORMAT:
        return "an HDF5 file not written by loadprof (no loadprof_format attribute)"
    try:
        plan_reads(path, None, progress)
    except ConvertError as exc:
        return f"an HDF5 file marked as loadprof's that its readers refuse ({str(exc).removeprefix(f'{path}: ')})"
    return None


class _Direct:
    """Where an uncompressed dataset's bytes lie in the file, for reads that bypass HDF5.

    NOTE [ Direct reads of uncompressed HDF5 data ]
    One h5py read of a few KB costs ~10 us (selection, type conversion, chunk
    cache), as much as reading a small file from a warm page cache: with it the
    HDF5 reader could never be several times faster than an image folder. For a
    dataset with no filters, each chunk is the raw C-order bytes of its samples at
    a file address HDF5 reports (``H5Dget_chunk_info``; one address for a
    contiguous dataset), so a sample is one ``pread`` of the file. Not a memory
    map: a file truncated while mapped kills the process with SIGBUS at the next
    touch of a lost page, where a short ``pread`` is an error naming the file.
    Used only when every chunk is allocated, unfiltered, the chunk spans whole
    samples, there is no user block, and every extent lies inside the file;
    otherwise reads go through h5py. The descriptor is opened per process, like
    the h5py handle (NOTE [ HDF5 handles and worker processes ]).
    """

    def __init__(self, unit: int, addrs: np.ndarray) -> None:
        self.unit = unit  # bytes per chunk (the whole dataset when contiguous)
        self.addrs = addrs.tolist()  # file address of chunk k
        # Chunks laid out back to back in order (what HDF5Writer produces): one base.
        self.base: int | None = self.addrs[0] if (np.diff(addrs) == unit).all() else None

    @classmethod
    def probe(cls, f: h5py.File, ds: h5py.Dataset, file_size: int) -> _Direct | None:
        if f.userblock_size or f.driver != "sec2" or ds.dtype.kind not in "biuf" or ds.ndim < 1:
            return None
        if ds.size == 0:
            return None  # nothing stored, no address: h5py reads empty selections fine
        dcpl = ds.id.get_create_plist()
        if dcpl.get_nfilters():
            return None
        item = ds.dtype.itemsize * int(np.prod(ds.shape[1:], dtype=np.int64))
        if ds.chunks is None:
            offset = ds.id.get_offset()
            total = item * ds.shape[0]
            if offset is None or offset + total > file_size:
                return None
            return cls(max(total, 1), np.array([offset], dtype=np.int64))
        if tuple(ds.chunks[1:]) != tuple(ds.shape[1:]):
            return None  # a chunk would split samples
        rows = ds.chunks[0]
        unit = rows * item
        count = -(-ds.shape[0] // rows)
        if ds.id.get_num_chunks() != count:
            return None  # unallocated chunks read as fill values
        infos: list[Any] = []
        if hasattr(ds.id, "chunk_iter"):  # h5py >= 3.8 on HDF5 >= 1.12.3 / 1.14
            ds.id.chunk_iter(infos.append)
        elif count <= 4096:
            # H5Dget_chunk_info walks the chunk index on every call: 20,000 chunks
            # took 10.7 s here, against 0.04 s for chunk_iter.
            infos = [ds.id.get_chunk_info(k) for k in range(count)]
        else:
            return None
        addrs = np.full(count, -1, dtype=np.int64)
        for info in infos:
            first = info.chunk_offset[0]
            if first % rows or info.filter_mask or info.size != unit or info.byte_offset + unit > file_size:
                return None
            addrs[first // rows] = info.byte_offset
        if len(infos) != count or (addrs < 0).any():
            return None
        return cls(unit, addrs)

    def read(self, pread: Callable[[int, int], bytes], a: int, b: int) -> bytes:
        """Bytes ``[a, b)`` of the dataset's flat data, ``pread(n, at)`` reading the file."""
        if self.base is not None:
            return pread(b - a, self.base + a)
        unit, addrs = self.unit, self.addrs
        k = a // unit
        if b <= (k + 1) * unit:
            return pread(b - a, addrs[k] + a - k * unit)
        parts = []
        while a < b:
            k = a // unit
            stop = min(b, (k + 1) * unit)
            parts.append(pread(stop - a, addrs[k] + a - k * unit))
            a = stop
        return b"".join(parts)


def _walk_chunks(ds: h5py.Dataset) -> None:
    """Have libhdf5 walk a chunked dataset's whole chunk index (in the watched child)."""
    if ds.chunks is not None and hasattr(ds.id, "chunk_iter"):
        ds.id.chunk_iter(lambda info: None)


def file_identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass
class Plan:
    """What the watched check of a file found: all a process needs to read it.

    ``fields`` holds, per field, how ``reader[i]`` reads it: ("memory", values),
    ("bytes", _Direct, offsets), ("array", _Direct, (dtype, shape, bytes)), ("h5bytes", None,
    offsets) or ("h5array", None, (dtype, shape, bytes) of a record): the "h5" ones through h5py.
    """

    schema: Schema
    records: int
    class_names: list[str] | None
    provenance: dict[str, Any] | None
    checksums: dict[str, str] | None
    identity: tuple[int, int, int, int]
    fields: list[tuple[str, str, Any, Any]]
    # Format version of a file of ours (None: another tool's); per-record CRC-32C per field
    # read (None: none stored). NOTE [ Per-record checksums ]
    version: int | None = None
    crcs: dict[str, np.ndarray] | None = None


def plan_reads(path: str, fields: Sequence[str] | None, progress: Callable[[int], None]) -> Plan:
    """Parse and check everything a reader of ``path`` relies on; run in a watched child.

    See NOTE [ Reading HDF5 without trusting libhdf5 ].
    """
    progress(0)
    before = file_identity(check_regular(path, "an HDF5 file"))
    f, size = open_hdf5(path)
    with f:
        schema, n = _layout(path, f, size)
        version, table = _stored_crcs(path, f, schema, n, size)
        columns = {name: k for k, name in enumerate(schema.names)}
        class_names = _json_attr(path, f, "class_names", list, "a list of names")
        if class_names is not None and not all(isinstance(c, str) for c in class_names):
            raise ConvertError(f"{path}: attribute 'class_names' is not a list of strings")
        provenance = _json_attr(path, f, "provenance", dict, "an object")
        checksums = _json_attr(path, f, "checksums", dict, "an object")
        if checksums is not None:
            bad = [k for k, v in checksums.items() if k not in schema.names or not isinstance(v, str)]
            if bad:
                raise ConvertError(
                    f"{path}: attribute 'checksums' has {bad[0]!r}, expected a checksum "
                    f"(text) for each of the fields {list(schema.names)}"
                )
        if fields is not None:
            unknown = [name for name in fields if name not in schema.names]
            if unknown:
                raise ConvertError(f"{path}: no field(s) {unknown}; fields are {list(schema.names)}")
            schema = Schema(tuple(schema.field(name) for name in fields))
        plan: list[tuple[str, str, Any, Any]] = []
        for field in schema.fields:
            progress(0)
            with h5errors(path, f"cannot read {field.name!r}"):
                obj = f[field.name]
                if field.kind == "bytes":
                    data, offsets = obj["data"], read_offsets(path, f, field.name)
                    direct = _Direct.probe(f, data, size)
                    if direct is None:
                        _walk_chunks(data)
                    plan.append((field.name, "h5bytes" if direct is None else "bytes", direct, offsets))
                elif obj.size * obj.dtype.itemsize <= _CACHE_BYTES:
                    plan.append((field.name, "memory", obj[()], None))
                else:
                    direct = _Direct.probe(f, obj, size)
                    if direct is None:
                        _walk_chunks(obj)
                    item = obj.dtype.itemsize * int(np.prod(obj.shape[1:], dtype=np.int64))
                    stored = (obj.dtype, tuple(obj.shape[1:]), item)  # the file's byte order
                    plan.append((field.name, "h5array" if direct is None else "array", direct, stored))
    if file_identity(check_regular(path, "an HDF5 file")) != before:
        raise ConvertError(f"{path}: changed while it was being checked")
    crcs = None if table is None else {name: table[:, columns[name]].copy() for name in schema.names}
    return Plan(schema, n, class_names, provenance, checksums, before, plan, version, crcs)


def read_offsets(path: str, f: h5py.File, name: str) -> np.ndarray:
    """A bytes field's offsets, checked: NOTE [ Checking an HDF5 file before reading it ]."""
    with h5errors(path, f"cannot read {name}/offsets"):
        offsets = np.asarray(f[name]["offsets"][()], dtype=np.int64)
        data_bytes = int(f[name]["data"].shape[0])
    _check_offsets(path, name, offsets, data_bytes)
    return offsets
