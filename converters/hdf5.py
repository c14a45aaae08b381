"""HDF5 (h5py): writer, reader and layout checks.

Layout of a file we write (format "loadprof-hdf5", version 2):

* a fixed-shape field ``x`` is a dataset ``/x`` of shape (N, *shape), chunked a
  few samples at a time (about 64 KiB per chunk, within the 10 KiB-1 MiB range
  the HDF5 chunking guide recommends);
* a bytes field ``x`` (encoded images) is a group ``/x`` holding one flat
  ``uint8`` dataset ``data`` and an ``int64`` dataset ``offsets`` of N + 1 entries;
  sample i is ``data[offsets[i]:offsets[i+1]]``. Not a variable-length type:
  random reads of vlen data measured about 9x slower, and
  compression filters do not apply to vlen data;
* a ``uint32`` dataset of shape (N, fields), named ``_crc32c`` (underscores added
  while a field has that name: ``checksum_name``): the CRC-32C of each record's value
  per field, in schema order; NOTE [ Per-record checksums ];
* root attributes: ``loadprof_format``, ``loadprof_format_version``,
  ``num_records``, ``schema`` / ``class_names`` / ``provenance`` / ``checksums``
  (JSON text).

Version 2 added the per-record checksums; version 1 files are read unverified, with
a warning.

``HDF5Reader`` also reads plain HDF5 files whose top-level datasets share their
first dimension (each becomes an array field).
"""

from __future__ import annotations

import array
import contextlib
import json
import math
import os
import re
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import google_crc32c
import h5py
import numpy as np

from . import watchdog
from .errors import ConvertError
from .files import check_regular, open_regular
from .schema import Field, Sample, SampleDigest, Schema

__all__ = [
    "HDF5Writer", "HDF5Reader", "FORMAT", "FORMAT_VERSION", "chunk_rows", "checksum_name", "check_file",
    "check_output",
]

FORMAT = "loadprof-hdf5"
FORMAT_VERSION = 2
_UNVERIFIED_VERSION = 1  # before per-record checksums: still read, with a warning

# 64 KiB chunks read fastest for random access to ~3 KB blobs here: 54.7k reads/s
# cold vs 49.5k at 16 KiB and 39.3k contiguous (10,000 blobs, page cache dropped
# with POSIX_FADV_DONTNEED; /tmp/exp/cold.py during development).
_CHUNK_TARGET = 64 << 10
_CHUNK_MAX = 1 << 20
_FLUSH_BYTES = 4 << 20  # write to h5py in blocks: one call per sample costs ~20 us
# Fields up to this size are read into memory when a reader opens (labels, offsets):
# one h5py call per sample per field is the main cost of a small random read.
_CACHE_BYTES = 8 << 20
# What iter_samples reads per h5py call at most (one record more when a record is larger):
# inspect and --verify stream a file of any size in bounded memory.
_BLOCK_BYTES = 16 << 20


def chunk_rows(sample_nbytes: int) -> int:
    """Samples per chunk: about 64 KiB, at least one sample, at most 1 MiB when one fits."""
    if sample_nbytes <= 0:
        return 4096
    return max(1, min(_CHUNK_TARGET // sample_nbytes, _CHUNK_MAX // sample_nbytes) or 1)


def _compression_args(compression: str | None) -> dict[str, Any]:
    if compression is None:
        return {}
    if compression == "gzip":
        return {"compression": "gzip", "compression_opts": 4}
    if compression == "lzf":
        return {"compression": "lzf"}
    raise ConvertError(f"unknown compression {compression!r}; expected lzf or gzip")


# NOTE [ Per-record checksums ]
# A flipped bit in a chunk's data reads back as a plausible wrong value (0.1257 became
# 4.28e37): libhdf5 has no checksum on raw data, and the per-field checksums over the
# whole file can only be checked by reading all of it (inspect, --verify). So the
# writer stores the CRC-32C of every record's value per field (the _crc32c table, 4
# bytes per record and field, uncompressed), and the readers check each value they
# return against it: a damaged record is a ConvertError naming the file and the record,
# never data. Checksums are per record rather than per chunk so that a random read
# costs only the record it reads (a 64 KiB chunk holds ~20 small images). A value is
# checksummed as its little-endian C-order bytes (bytes fields: the blob), computed on
# what the reader returns: a damaged datatype message (byte order, say) that changes
# values without changing the stored bytes is caught too. The reader holds the
# table in memory (as it holds offsets), checked against the file's size first.
# Version-1 files have no table: read unverified, with one warning per reader. A
# table that is there is used whatever the version attribute says, so that one
# damaged byte there cannot turn the checks off; a version-2 file without it is refused.
_CHECKSUMS = "_crc32c"


def checksum_name(schema: Schema) -> str:
    """The per-record checksum dataset's name: ``_crc32c``, with ``_`` added while a field has it."""
    name = _CHECKSUMS
    while name in schema.names:
        name += "_"
    return name


def _little_endian(dtype: np.dtype[Any]) -> np.dtype[Any] | None:
    """The little-endian dtype to checksum values of ``dtype`` as, None when they already are."""
    little = dtype.newbyteorder("<")
    return None if dtype == little else little


def _crc_of(value: np.ndarray, little: np.dtype[Any] | None) -> int:
    """CRC-32C of an array's little-endian C-order bytes."""
    if little is not None:
        value = value.astype(little)
    try:
        # Read in place: a copy of a 150 KB record (tobytes) cost more than the CRC itself.
        return _crc32c(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # not C-contiguous, or a NumPy whose arrays the C call refuses
        return _crc32c(value.tobytes())


_crc32c: Callable[[bytes], int] = google_crc32c.value
_U32 = "I" if array.array("I").itemsize == 4 else "L"  # array.array's code for uint32 here


class _ArrayColumn:
    def __init__(self, f: h5py.File, field: Field, expected: int, comp: dict[str, Any]) -> None:
        rows = min(chunk_rows(field.item_nbytes), max(expected, 1))  # no chunk larger than the data
        self.ds = f.create_dataset(
            field.name,
            shape=(max(expected, 1), *field.shape),
            maxshape=(None, *field.shape),
            chunks=(rows, *field.shape),
            dtype=field.numpy_dtype,
            **comp,
        )
        block = max(rows, (_FLUSH_BYTES // max(field.item_nbytes, 1)) // rows * rows)
        self.buf = np.empty((block, *field.shape), dtype=field.numpy_dtype)
        self.little = _little_endian(self.buf.dtype)
        self.used = 0
        self.written = 0

    def add(self, value: np.ndarray | list[int]) -> int:
        """Buffer one record; its CRC-32C as stored (NOTE [ Per-record checksums ])."""
        self.buf[self.used] = value
        crc = _crc_of(self.buf[self.used : self.used + 1], self.little)
        self.used += 1
        if self.used == len(self.buf):
            self.flush()
        return crc

    def flush(self) -> None:
        if not self.used:
            return
        end = self.written + self.used
        if end > self.ds.shape[0]:
            self.ds.resize(max(end, 2 * self.ds.shape[0]), axis=0)
        self.ds[self.written : end] = self.buf[: self.used]
        self.written = end
        self.used = 0

    def finish(self) -> None:
        self.flush()
        self.ds.resize(self.written, axis=0)


class _BytesColumn:
    def __init__(self, f: h5py.File, field: Field, comp: dict[str, Any]) -> None:
        self.group = f.create_group(field.name)
        self.comp = comp
        self.ds: h5py.Dataset | None = None
        self.pending: list[bytes] = []
        self.pending_bytes = 0
        self.offsets = [0]

    def add(self, value: bytes) -> int:
        self.pending.append(value)
        self.pending_bytes += len(value)
        self.offsets.append(self.offsets[-1] + len(value))
        if self.pending_bytes >= _FLUSH_BYTES:
            self.flush()
        return _crc32c(value)

    def _create(self) -> h5py.Dataset:
        # Chunk by the typical blob: a power of two >= the mean blob, 64 KiB-1 MiB.
        mean = self.pending_bytes // max(len(self.pending), 1)
        chunk = _CHUNK_TARGET
        while chunk < mean and chunk < _CHUNK_MAX:
            chunk *= 2
        chunk = min(chunk, max(self.pending_bytes, 1))  # all of a small dataset is pending here
        return self.group.create_dataset(
            "data", shape=(0,), maxshape=(None,), chunks=(chunk,), dtype=np.uint8, **self.comp
        )

    def flush(self) -> None:
        if self.ds is None:
            self.ds = self._create()
        if not self.pending:
            return
        blob = np.frombuffer(b"".join(self.pending), dtype=np.uint8)
        start = self.ds.shape[0]
        self.ds.resize(start + len(blob), axis=0)
        self.ds[start:] = blob
        self.pending.clear()
        self.pending_bytes = 0

    def finish(self) -> None:
        self.flush()
        self.group.create_dataset("offsets", data=np.asarray(self.offsets, dtype=np.int64))
        self.group.attrs["kind"] = "bytes"


class HDF5Writer:
    """Write samples of one schema to a new HDF5 file at ``path`` (which must not exist)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        schema: Schema,
        *,
        expected: int = 0,
        compression: str | None = None,
        overwrite: bool = False,
    ) -> None:
        self.path = os.fspath(path)
        self.schema = schema
        comp = _compression_args(compression)
        self._file = h5py.File(self.path, "w" if overwrite else "w-")
        self._columns: dict[str, _ArrayColumn | _BytesColumn] = {}
        for field in schema.fields:
            if field.kind == "bytes":
                self._columns[field.name] = _BytesColumn(self._file, field, comp)
            else:
                self._columns[field.name] = _ArrayColumn(self._file, field, expected, comp)
        # Uncompressed whatever the fields: CRCs do not compress, and the reader loads them whole.
        table = Field(checksum_name(schema), "array", "uint32", (len(schema.fields),))
        self._crcs = _ArrayColumn(self._file, table, expected, {})
        self.count = 0

    def write(self, sample: Mapping[str, np.ndarray | bytes]) -> None:
        """Add one sample; raises OSError (with errno where HDF5 gave one) if the disk fails."""
        try:
            crcs = [column.add(sample[name]) for name, column in self._columns.items()]  # type: ignore[arg-type]
            self._crcs.add(crcs)
        except (OSError, RuntimeError) as exc:
            raise _os_error(exc) from exc
        self.count += 1

    def close(self, attrs: Mapping[str, Any]) -> None:
        """Finish every dataset, write root attributes (dicts/lists as JSON), close.

        On failure the file stays open for ``abort``; see NOTE [ Abandoning a failed HDF5 file ].
        """
        try:
            for column in (*self._columns.values(), self._crcs):
                column.finish()
            a = self._file.attrs
            a["loadprof_format"] = FORMAT
            a["loadprof_format_version"] = FORMAT_VERSION
            a["num_records"] = self.count
            a["schema"] = self.schema.to_json()
            for key, value in attrs.items():
                a[key] = json.dumps(value) if isinstance(value, (dict, list)) else value
            self._file.flush()
            self._file.close()
        except (OSError, RuntimeError) as exc:
            raise _os_error(exc) from exc

    def abort(self) -> None:
        """Close a file that is about to be deleted, whatever state a failed write left it in.

        NOTE [ Abandoning a failed HDF5 file ]
        After a failed write (disk full, EFBIG), HDF5 1.14.6 keeps dirty chunks and
        the dataset whose flush failed; closing retries the write and fails again, and
        the half-closed dataset then crashes the process in H5_term_library at exit
        (SIGSEGV, seen under RLIMIT_FSIZE; tests/test_convert_errors.py). So the
        file's descriptor is first pointed at /dev/null (dup2): the retried writes
        succeed into nothing, the close is clean, and the caller deletes the file.
        """
        if not self._file.id.valid:
            return
        with contextlib.suppress(OSError, RuntimeError, ValueError, TypeError):
            fd = self._file.id.get_vfd_handle()
            null = os.open(os.devnull, os.O_RDWR)
            try:
                os.dup2(null, fd)
            finally:
                os.close(null)
        with contextlib.suppress(OSError, RuntimeError, ValueError):
            self._file.close()


def _os_error(exc: BaseException) -> OSError:
    """An h5py error as an OSError with errno and strerror, when HDF5's message has them."""
    errno = getattr(exc, "errno", None)
    if not errno:
        m = re.search(r"errno = (\d+)", str(exc))
        errno = int(m.group(1)) if m else None
    if errno:
        return OSError(errno, os.strerror(errno))
    return OSError(str(exc).split("(")[0].strip() or type(exc).__name__)


# ---------------------------------------------------------------- reading


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
def _h5errors(path: str, what: str) -> Iterator[None]:
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


def _decoded_attr(path: str, f: h5py.File, key: str) -> Any:
    """A root attribute: text as str, JSON text parsed; None when absent."""
    with _h5errors(path, f"cannot read attribute {key!r}"):
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
    value = _decoded_attr(path, f, key)
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
    value = _decoded_attr(path, f, key)
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
    if _decoded_attr(path, f, "schema") is None:
        if _decoded_attr(path, f, "loadprof_format") == FORMAT:
            raise ConvertError(f"{path}: attribute 'schema' is missing; every file of loadprof carries one")
        return None, None
    key = "loadprof_format_version"
    version = _count_attr(path, f, key)
    if version is None:
        raise ConvertError(f"{path}: attribute {key!r} is missing; every file of loadprof carries one")
    if not _UNVERIFIED_VERSION <= version <= FORMAT_VERSION:
        newer = " (written by a newer loadprof?)" if version > FORMAT_VERSION else ""
        raise ConvertError(
            f"{path}: attribute {key!r} is {version}{newer}; this loadprof reads versions "
            f"{_UNVERIFIED_VERSION} to {FORMAT_VERSION}"
        )
    name, shape = checksum_name(schema), (n, len(schema.fields))
    obj = _get(path, f, name)
    if obj is None and version == _UNVERIFIED_VERSION:
        return version, None
    # Used whatever the version says when present: one damaged byte must not turn checks off.
    ds = _dataset(path, obj, name, f"uint32{list(shape)} (the per-record checksums)")
    if ds.dtype.kind != "u" or ds.dtype.itemsize != 4 or tuple(ds.shape) != shape:
        raise ConvertError(
            f"{path}: {name!r} is {ds.dtype}{list(ds.shape)}, expected uint32{list(shape)} (the per-record checksums)"
        )
    _check_stored(path, name, ds, file_size)
    with _h5errors(path, f"cannot read {name!r}"):
        table = np.asarray(ds[()], dtype=np.uint32)
    return version, table


def _get(path: str, f: h5py.File, name: str) -> Any:
    with _h5errors(path, f"cannot open {name!r}"):
        if name not in f:
            return None
        return f[name]


def _check_stored(path: str, name: str, ds: h5py.Dataset, file_size: int) -> None:
    """Refuse a dataset whose declared size the file cannot hold, or whose data lies elsewhere.

    See NOTE [ Checking an HDF5 file before reading it ].
    """
    with _h5errors(path, f"cannot read the layout of {name!r}"):
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
        allowed = min(max(declared, _CHUNK_MAX), max(_CHUNK_LIMIT, record))
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
    raw = _decoded_attr(path, f, "schema")
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
    with _h5errors(path, "cannot list the top level"):
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


def _open(path: str) -> tuple[h5py.File, int]:
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
    the file (``_plan_reads``); the data itself is not read. For ``run_watched``: libhdf5
    can hang on or crash on the file (NOTE [ Parsing HDF5 in a child process ]); NOTE
    [ What --overwrite replaces ] in conversion.py.
    """
    progress(0)
    f, _ = _open(path)
    with f:
        value = _decoded_attr(path, f, "loadprof_format")
    if value != FORMAT:
        return "an HDF5 file not written by loadprof (no loadprof_format attribute)"
    try:
        _plan_reads(path, None, progress)
    except ConvertError as exc:
        return f"an HDF5 file marked as loadprof's that its readers refuse ({str(exc).removeprefix(f'{path}: ')})"
    return None


class _ShortRead(Exception):
    """The file ends before an extent the checked layout put inside it."""


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


class _File:
    """A file read with ``pread``, with the read-around a memory map's page faults gave.

    A small random ``pread`` of a cold page reads that page alone, where a fault in a
    mapping reads the device's read-ahead size around it (``read_ahead_kb``: 128 KiB
    by default, 8 MiB on the CI VM's virtio disk): cold random reads of 3 KB blobs
    ran at 0.4-0.6x the mapping's speed. So the first read in each such window asks
    the kernel to read the whole window (POSIX_FADV_WILLNEED), once per window and
    process, as the fault did.
    """

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.shift = max(_read_ahead(os.fstat(fd).st_dev), 1 << 17).bit_length() - 1
        self.advised = bytearray((size >> self.shift) + 1)
        self.advise = getattr(os, "posix_fadvise", None)

    def pread(self, n: int, at: int) -> bytes:
        w = at >> self.shift
        if self.advise is not None and w < len(self.advised) and not self.advised[w]:
            self.advised[w] = 1
            self.advise(self.fd, w << self.shift, 1 << self.shift, os.POSIX_FADV_WILLNEED)
        data = os.pread(self.fd, n, at)
        if len(data) != n:
            raise _ShortRead(at + len(data))
        return data


def _read_ahead(dev: int) -> int:
    """The block device's read-ahead in bytes (Linux sysfs; a partition's is its disk's), 0 if unknown."""
    base = f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    for where in (f"{base}/queue/read_ahead_kb", f"{base}/../queue/read_ahead_kb"):
        try:
            with open(where, encoding="ascii") as f:
                return min(int(f.read()), 64 << 10) << 10  # KiB; at most 64 MiB
        except (OSError, ValueError):
            continue
    return 0


def _walk_chunks(ds: h5py.Dataset) -> None:
    """Have libhdf5 walk a chunked dataset's whole chunk index (in the watched child)."""
    if ds.chunks is not None and hasattr(ds.id, "chunk_iter"):
        ds.id.chunk_iter(lambda info: None)


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass
class _Plan:
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


def _plan_reads(path: str, fields: Sequence[str] | None, progress: Callable[[int], None]) -> _Plan:
    """Parse and check everything a reader of ``path`` relies on; run in a watched child.

    See NOTE [ Reading HDF5 without trusting libhdf5 ].
    """
    progress(0)
    before = _identity(check_regular(path, "an HDF5 file"))
    f, size = _open(path)
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
            with _h5errors(path, f"cannot read {field.name!r}"):
                obj = f[field.name]
                if field.kind == "bytes":
                    data, offsets = obj["data"], _read_offsets(path, f, field.name)
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
    if _identity(check_regular(path, "an HDF5 file")) != before:
        raise ConvertError(f"{path}: changed while it was being checked")
    crcs = None if table is None else {name: table[:, columns[name]].copy() for name in schema.names}
    return _Plan(schema, n, class_names, provenance, checksums, before, plan, version, crcs)


def _read_offsets(path: str, f: h5py.File, name: str) -> np.ndarray:
    """A bytes field's offsets, checked: NOTE [ Checking an HDF5 file before reading it ]."""
    with _h5errors(path, f"cannot read {name}/offsets"):
        offsets = np.asarray(f[name]["offsets"][()], dtype=np.int64)
        data_bytes = int(f[name]["data"].shape[0])
    _check_offsets(path, name, offsets, data_bytes)
    return offsets


class HDF5Reader:
    """Random and sequential access to samples of an HDF5 file.

    NOTE [ Reading HDF5 without trusting libhdf5 ]
    libhdf5 can loop for ever or crash on a corrupt file (NOTE [ Parsing HDF5 in a
    child process ] in watchdog.py), and Python cannot stop it. So the constructor
    does every metadata parse the reader relies on (layout, attributes, offsets,
    each dataset's chunk index, the addresses of uncompressed data) in a watched
    child, stopped after ``stall`` seconds without progress (``LOADPROF_HDF5_STALL``,
    default 30 s), and keeps what it found (a ``_Plan``) with the file's identity
    (device, inode, size, mtime). Reads then need no libhdf5 for uncompressed fields
    (``pread`` at the addresses found) and small ones (kept in memory). Compressed
    fields and ``iter_samples`` go through h5py in this process, only on a file
    whose identity is still the one checked: libhdf5 then re-reads metadata it
    already parsed to the end in the child, and reads chunks through the filters.
    A file that changed since the check is refused. Every value ``[i]`` and
    ``iter_samples`` return is checked against the CRC-32C stored for its record
    (``verify=False`` skips it; ``verified`` says whether the file has them): NOTE
    [ Per-record checksums ].

    NOTE [ HDF5 handles and worker processes ]
    An h5py file handle must not cross fork or pickling (pytorch#11929, h5py#934;
    "h5py objects cannot be pickled" under spawn). The descriptor and any h5py
    handle are opened on first access in each process (tracked by pid), and
    ``__getstate__`` drops them, so the reader can be sent to DataLoader workers
    under fork or spawn. A handle inherited through fork is kept, never used and
    never closed in the child, so the parent's stays intact.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        fields: Sequence[str] | None = None,
        *,
        verify: bool = True,
        stall: float | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self._fields = None if fields is None else tuple(fields)
        self._stall = stall
        size = check_regular(self.path, "an HDF5 file").st_size
        plan: _Plan = watchdog.run_watched(
            _plan_reads, (self.path, self._fields), path=self.path, stall=stall, memory=watchdog.memory_budget(size)
        )
        self._plan = plan
        self.schema = plan.schema
        self.class_names = plan.class_names
        self.provenance = plan.provenance
        self.checksums = plan.checksums
        # Whether every value read is checked against its stored CRC-32C: NOTE [ Per-record checksums ].
        self.version = plan.version
        self.verified = verify and plan.crcs is not None
        if verify and plan.version == _UNVERIFIED_VERSION and plan.crcs is None:
            warnings.warn(
                f"{self.path}: written by an older loadprof (format version {plan.version}), without per-record "
                "checksums: its reads are not verified (convert it again, or check it whole with loadprof inspect)",
                RuntimeWarning,
                stacklevel=2,
            )
        self._n = plan.records
        self._pid: int | None = None
        self._fd: int | None = None
        self._raw: _File | None = None
        self._file: h5py.File | None = None
        self._fast: list[tuple[str, str, Any, Any]] = []  # for [i]; see _ensure_open
        # Per field when verified: name, stored CRCs, byte order to check values in; see _ensure_open.
        self._checks: list[tuple[str, Any, np.dtype[Any] | None]] = []
        # Whether [i] reads any field past h5py: NOTE [ Direct reads of uncompressed HDF5 data ].
        self.direct = any(how in ("bytes", "array") for _, how, _, _ in plan.fields)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_file=None, _pid=None, _fd=None, _fast=[], _checks=[], _raw=None)
        return state

    def __len__(self) -> int:
        return self._n

    def _check_again(self) -> None:
        """The file changed since it was checked: check it again, keep reading if only bytes moved."""
        plan: _Plan = watchdog.run_watched(
            _plan_reads, (self.path, self._fields), path=self.path, stall=self._stall,
            memory=watchdog.memory_budget(check_regular(self.path, "an HDF5 file").st_size),
        )
        if plan.records != self._n or plan.schema != self.schema or (plan.crcs is None) != (self._plan.crcs is None):
            raise ConvertError(f"{self.path}: changed since it was opened (layout or record count differs)")
        self._plan = plan

    def _ensure_open(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            return
        if self._file is not None:
            _INHERITED.append(self._file)  # see NOTE [ HDF5 handles and worker processes ]
        if self._fd is not None:  # inherited through fork: this process's copy only
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._file, self._fd, self._pid, self._fast, self._checks = None, None, None, [], []
        with open_regular(self.path, "an HDF5 file") as raw:
            fd = os.dup(raw.fileno())
        try:
            if _identity(os.fstat(fd)) != self._plan.identity:
                self._check_again()
            self._pid = os.getpid()
            fast: list[tuple[str, str, Any, Any]] = []
            checks: list[tuple[str, Any, np.dtype[Any] | None]] = []
            for name, how, src, extra in self._plan.fields:
                if self.verified:
                    checks.append(self._check_for(name, how, src, extra))
                if how == "bytes":
                    fast.append((name, how, src, array.array("q", extra.tobytes())))
                elif how == "array":
                    fast.append((name, how, src, extra))
                elif how == "h5bytes":
                    fast.append((name, how, self._h5()[name]["data"], extra))
                elif how == "h5array":
                    fast.append((name, how, self._h5()[name], None))
                else:
                    fast.append((name, how, src, None))
        except BaseException:
            os.close(fd)
            if self._file is not None:
                self._file.close()
            self._file, self._pid = None, None
            raise
        self._fd, self._fast, self._checks, self._raw = fd, fast, checks, _File(fd, self._plan.identity[2])

    def _check_for(self, name: str, how: str, src: Any, extra: Any) -> tuple[str, Any, np.dtype[Any] | None]:
        """A field's name, its stored CRCs (fast to index) and the byte order to check its values in."""
        assert self._plan.crcs is not None
        stored = array.array(_U32, self._plan.crcs[name].tobytes())
        if how in ("bytes", "h5bytes"):
            return name, stored, None
        if how == "array":
            return name, stored, _little_endian(extra[0])
        if how == "h5array":
            return name, stored, _little_endian(self._h5()[name].dtype)
        return name, stored, _little_endian(src.dtype)

    def _damaged(self, i: int, name: str, got: int, stored: int) -> ConvertError:
        return ConvertError(
            f"{self.path}: record {i} of {name!r} does not match the checksum stored for it at conversion "
            f"(CRC-32C {got:08x}, stored {stored:08x}): the file is damaged"
        )

    def _h5(self) -> h5py.File:
        """This process's h5py handle, on the file checked: NOTE [ Reading HDF5 without trusting libhdf5 ]."""
        if self._file is None:
            f, _ = _open(self.path)
            try:
                same = _identity(os.fstat(f.id.get_vfd_handle())) == self._plan.identity
            except BaseException:
                f.close()
                raise
            if not same:
                f.close()
                raise ConvertError(f"{self.path}: changed while it was being opened; open it again")
            self._file = f
        return self._file

    def __getitem__(self, index: int) -> Sample:
        i = int(index)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"index {index} out of range for {self._n} records")
        self._ensure_open()
        out: Sample = {}
        assert self._raw is not None
        pread = self._raw.pread
        name = ""
        try:
            for name, how, src, extra in self._fast:
                if how == "memory":
                    out[name] = np.array(src[i])
                elif how == "bytes":  # see NOTE [ Direct reads of uncompressed HDF5 data ]
                    out[name] = src.read(pread, extra[i], extra[i + 1])
                elif how == "array":
                    dtype, shape, n = extra
                    item = np.frombuffer(src.read(pread, i * n, (i + 1) * n), dtype=dtype).reshape(shape)
                    out[name] = item.copy()  # writable, as h5py's would be
                elif how == "h5bytes":
                    out[name] = src[extra[i] : extra[i + 1]].tobytes()
                else:
                    out[name] = np.asarray(src[i])
        except _ShortRead as exc:
            raise ConvertError(
                f"{self.path}: cannot read record {i} of {name!r}: the file ends at byte {exc.args[0]}, "
                "inside its data (truncated while open?)"
            ) from None
        except (OSError, RuntimeError) as exc:  # h5py: a chunk that does not decompress, say
            raise ConvertError(f"{self.path}: cannot read record {i} of {name!r}: {exc}") from None
        if self.verified:
            self._verify(i, out)
        return out

    def iter_samples(self, block: int = 1024, progress: Callable[[int], None] | None = None) -> Iterator[Sample]:
        """Every sample in order, read up to ``block`` samples and about 16 MiB per h5py call.

        ``progress(records)`` is called after each block is read.
        """
        self._ensure_open()
        f = self._h5()
        readers: list[tuple[str, Any, Any]] = []
        for name, how, src, extra in self._plan.fields:
            if how == "memory":
                readers.append((name, None, src))
            elif how in ("bytes", "h5bytes"):
                readers.append((name, f[name]["data"], extra))
            else:
                readers.append((name, f[name], None))
        item_bytes = sum(fld.item_nbytes for fld in self.schema.fields if fld.kind == "array")
        rows = max(1, min(block, _BLOCK_BYTES // max(item_bytes, 1)))
        start = 0
        while start < self._n:
            stop = min(start + rows, self._n)
            for _, ds, cached in readers:
                if ds is not None and cached is not None:  # bytes: stop before a block's data passes the budget
                    last = int(np.searchsorted(cached, int(cached[start]) + _BLOCK_BYTES, side="right")) - 1
                    stop = max(start + 1, min(stop, last))
            cols: dict[str, Any] = {}
            try:
                for name, ds, cached in readers:
                    if ds is None:
                        cols[name] = cached[start:stop]
                    elif cached is None:
                        cols[name] = ds[start:stop]
                    else:
                        base = int(cached[start])
                        raw = ds[base : int(cached[stop])].tobytes()
                        bounds = cached[start : stop + 1].tolist()
                        cols[name] = [
                            raw[a - base : b - base] for a, b in zip(bounds[:-1], bounds[1:], strict=True)
                        ]
            except (OSError, RuntimeError) as exc:
                raise ConvertError(f"{self.path}: cannot read records {start} to {stop - 1}: {exc}") from None
            if progress is not None:
                progress(stop)
            for j in range(stop - start):
                sample = {name: (np.array(col[j]) if isinstance(col, np.ndarray) else col[j]) for name, col in cols.items()}
                if self.verified:
                    self._verify(start + j, sample)
                yield sample
            start = stop

    def _verify(self, i: int, sample: Sample) -> None:
        """Raise if a value of record ``i`` as read differs from its stored CRC-32C: checked as
        returned, whatever the path that read it (NOTE [ Per-record checksums ])."""
        crc = _crc32c  # a bound name: the checks are ~0.5 us an item of Python (benchmarks/convert_read.py)
        for name, stored, little in self._checks:
            value = sample[name]
            got = crc(value) if isinstance(value, bytes) else _crc_of(value, little)
            if got != stored[i]:
                raise self._damaged(i, name, got, stored[i])

    def close(self) -> None:
        if self._pid == os.getpid():
            if self._file is not None:
                self._file.close()
            if self._fd is not None:
                os.close(self._fd)
        self._file, self._pid, self._fd, self._fast, self._checks, self._raw = None, None, None, [], [], None


_INHERITED: list[h5py.File] = []


def check_file(path: str | os.PathLike[str], progress: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Read every sample of an HDF5 file, check its layout and stored checksums.

    Returns a summary dict; raises ConvertError for anything inconsistent. Memory stays
    bounded whatever the file declares (NOTE [ Checking an HDF5 file before reading it ]);
    ``progress(records)`` is called as blocks are read. ``loadprof inspect`` runs this
    in a child process it can stop (converters/watchdog.py).
    """
    spath = os.fspath(path)
    reader = HDF5Reader(spath)
    n = len(reader)
    summary: dict[str, Any] = {
        "records": n,
        "fields": [],
        "class_names": reader.class_names,
        "provenance": reader.provenance,
    }
    f, _ = _open(spath)
    with f:
        found = _decoded_attr(spath, f, "loadprof_format")
        summary["format"] = "plain HDF5" if found is None else str(found)[:40]
        with _h5errors(spath, "cannot read the layout"):
            for field in reader.schema.fields:
                obj = f[field.name]
                if field.kind == "bytes":
                    # The reader needs offsets within the data; a file of ours uses all of it, from 0.
                    data, offsets = obj["data"], _read_offsets(spath, f, field.name)
                    if offsets[0] != 0 or offsets[-1] != data.shape[0]:
                        raise ConvertError(
                            f"{spath}: {field.name}/offsets run from {offsets[0]} to {offsets[-1]}, "
                            f"expected 0 to {data.shape[0]} (the size of {field.name}/data)"
                        )
                    summary["fields"].append((field, data.compression, int(data.shape[0])))
                else:
                    summary["fields"].append((field, obj.compression, int(obj.size * obj.dtype.itemsize)))
    digest = SampleDigest(reader.schema)
    try:
        for sample in reader.iter_samples(progress=progress):
            digest.update(sample)
    finally:
        reader.close()
    summary["record_checksums"] = reader.verified  # every record checked as it was read
    summary["checksums"] = "not stored"
    if reader.checksums:
        computed = digest.result()
        for name, stored in reader.checksums.items():
            if computed.get(name) != stored:
                raise ConvertError(
                    f"{spath}: field {name!r} checksum {computed.get(name)} differs from the "
                    f"{stored} stored at conversion: the data changed or is corrupt"
                )
        summary["checksums"] = "match"
    return summary
