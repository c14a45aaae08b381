"""HDF5 (h5py): writer, reader and layout checks.

Layout of a file we write (format "loadprof-hdf5", version 1):

* a fixed-shape field ``x`` is a dataset ``/x`` of shape (N, *shape), chunked a
  few samples at a time (about 64 KiB per chunk, within the 10 KiB-1 MiB range
  the HDF5 chunking guide recommends);
* a bytes field ``x`` (encoded images) is a group ``/x`` holding one flat
  ``uint8`` dataset ``data`` and an ``int64`` dataset ``offsets`` of N + 1 entries;
  sample i is ``data[offsets[i]:offsets[i+1]]``. Not a variable-length type:
  random reads of vlen data measured about 9x slower here (FIELD-NOTES), and
  compression filters do not apply to vlen data;
* root attributes: ``loadprof_format``, ``loadprof_format_version``,
  ``num_records``, ``schema`` / ``class_names`` / ``provenance`` / ``checksums``
  (JSON text).

``HDF5Reader`` also reads plain HDF5 files whose top-level datasets share their
first dimension (each becomes an array field).
"""

from __future__ import annotations

import array
import contextlib
import json
import mmap
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import h5py
import numpy as np

from .errors import ConvertError
from .schema import Field, Sample, SampleDigest, Schema

__all__ = ["HDF5Writer", "HDF5Reader", "FORMAT", "FORMAT_VERSION", "chunk_rows", "check_file"]

FORMAT = "loadprof-hdf5"
FORMAT_VERSION = 1

# 64 KiB chunks read fastest for random access to ~3 KB blobs here: 54.7k reads/s
# cold vs 49.5k at 16 KiB and 39.3k contiguous (10,000 blobs, page cache dropped
# with POSIX_FADV_DONTNEED; /tmp/exp/cold.py during development).
_CHUNK_TARGET = 64 << 10
_CHUNK_MAX = 1 << 20
_FLUSH_BYTES = 4 << 20  # write to h5py in blocks: one call per sample costs ~20 us
# Fields up to this size are read into memory when a reader opens (labels, offsets):
# one h5py call per sample per field is the main cost of a small random read.
_CACHE_BYTES = 8 << 20


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
        self.used = 0
        self.written = 0

    def add(self, value: np.ndarray) -> None:
        self.buf[self.used] = value
        self.used += 1
        if self.used == len(self.buf):
            self.flush()

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

    def add(self, value: bytes) -> None:
        self.pending.append(value)
        self.pending_bytes += len(value)
        self.offsets.append(self.offsets[-1] + len(value))
        if self.pending_bytes >= _FLUSH_BYTES:
            self.flush()

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
        self.count = 0

    def write(self, sample: Mapping[str, np.ndarray | bytes]) -> None:
        """Add one sample; raises OSError (with errno where HDF5 gave one) if the disk fails."""
        try:
            for name, column in self._columns.items():
                column.add(sample[name])  # type: ignore[arg-type]
        except (OSError, RuntimeError) as exc:
            raise _os_error(exc) from exc
        self.count += 1

    def close(self, attrs: Mapping[str, Any]) -> None:
        """Finish every dataset, write root attributes (dicts/lists as JSON), close.

        On failure the file stays open for ``abort``; see NOTE [ Abandoning a failed HDF5 file ].
        """
        try:
            for column in self._columns.values():
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


def _json_attr(attrs: Any, key: str) -> Any:
    if key not in attrs:
        return None
    value = attrs[key]
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    try:
        return json.loads(value)
    except (TypeError, ValueError):
        return value


def _layout(path: str, f: h5py.File) -> tuple[Schema, int]:
    """Schema and record count of an open file: ours from attributes, others inferred."""
    if "schema" in f.attrs:
        raw = f.attrs["schema"]
        try:
            schema = Schema.from_json(raw.decode("utf-8") if isinstance(raw, bytes) else str(raw))
        except (ValueError, KeyError, TypeError) as exc:
            raise ConvertError(f"{path}: unreadable schema attribute: {exc}") from exc
        n = int(f.attrs.get("num_records", -1))
        for field in schema.fields:
            if field.name not in f:
                raise ConvertError(f"{path}: field {field.name!r} named in the schema is missing")
        if n < 0:
            first = schema.fields[0]
            obj = f[first.name]
            n = obj["offsets"].shape[0] - 1 if first.kind == "bytes" else obj.shape[0]
        return schema, n
    fields = []
    lengths: dict[str, int] = {}
    for name, obj in f.items():
        if isinstance(obj, h5py.Dataset) and obj.ndim >= 1 and obj.dtype.kind in "biuf":
            fields.append(Field(name, "array", obj.dtype.name, tuple(obj.shape[1:])))
            lengths[name] = obj.shape[0]
        elif isinstance(obj, h5py.Group) and "data" in obj and "offsets" in obj:
            fields.append(Field(name, "bytes", "bytes"))
            lengths[name] = obj["offsets"].shape[0] - 1
    if not fields:
        raise ConvertError(f"{path}: no numeric datasets at the top level to read as samples")
    if len(set(lengths.values())) != 1:
        raise ConvertError(f"{path}: top-level datasets differ in length: {lengths}")
    return Schema(tuple(fields)), next(iter(lengths.values()))


def _open(path: str) -> h5py.File:
    try:
        return h5py.File(path, "r")
    except FileNotFoundError as exc:
        raise ConvertError(f"{path}: no such file") from exc
    except OSError as exc:
        raise ConvertError(f"{path}: cannot open as HDF5: {exc}") from exc


class _Direct:
    """Where an uncompressed dataset's bytes lie in the file, for reads that bypass HDF5.

    NOTE [ Direct reads of uncompressed HDF5 data ]
    One h5py read of a few KB costs ~10 us (selection, type conversion, chunk
    cache), as much as reading a small file from a warm page cache: with it the
    HDF5 reader could never be several times faster than an image folder. For a
    dataset with no filters, each chunk is the raw C-order bytes of its samples at
    a file address HDF5 reports (``H5Dget_chunk_info``; one address for a
    contiguous dataset), so a sample is a slice of an ``mmap`` of the file. The
    mapping also reads ahead around cold pages, as HDF5's 64 KiB chunk reads did.
    Used only when every chunk is allocated, unfiltered, the chunk spans whole
    samples, there is no user block, and every extent lies inside the file;
    otherwise reads go through h5py. The mapping is made per process, like the
    h5py handle (NOTE [ HDF5 handles and worker processes ]).
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

    def read(self, mm: mmap.mmap, a: int, b: int) -> bytes:
        """Bytes ``[a, b)`` of the dataset's flat data."""
        if self.base is not None:
            return mm[self.base + a : self.base + b]
        unit, addrs = self.unit, self.addrs
        k = a // unit
        if b <= (k + 1) * unit:
            start = addrs[k] + a - k * unit
            return mm[start : start + b - a]
        parts = []
        while a < b:
            k = a // unit
            stop = min(b, (k + 1) * unit)
            start = addrs[k] + a - k * unit
            parts.append(mm[start : start + stop - a])
            a = stop
        return b"".join(parts)


class HDF5Reader:
    """Random and sequential access to samples of an HDF5 file.

    NOTE [ HDF5 handles and worker processes ]
    An h5py file handle must not cross fork or pickling (pytorch#11929, h5py#934;
    "h5py objects cannot be pickled" under spawn). The constructor opens the file
    only long enough to read the layout, then closes it; the handle used for
    reads is opened on first access in each process (tracked by pid), and
    ``__getstate__`` drops it, so the reader can be sent to DataLoader workers
    under fork or spawn. A handle inherited through fork is kept, never used and
    never closed in the child, so the parent's stays intact.

    ``reader[i]`` reads uncompressed fields from a memory map of the file (see
    NOTE [ Direct reads of uncompressed HDF5 data ]); ``iter_samples``, which
    ``--verify`` and ``inspect`` use, reads through h5py.
    """

    def __init__(self, path: str | os.PathLike[str], fields: Sequence[str] | None = None) -> None:
        self.path = os.fspath(path)
        with _open(self.path) as f:
            schema, n = _layout(self.path, f)
            self.class_names: list[str] | None = _json_attr(f.attrs, "class_names")
            self.provenance: dict[str, Any] | None = _json_attr(f.attrs, "provenance")
            self.checksums: dict[str, str] | None = _json_attr(f.attrs, "checksums")
        if fields is not None:
            unknown = [name for name in fields if name not in schema.names]
            if unknown:
                raise ConvertError(f"{self.path}: no field(s) {unknown}; fields are {list(schema.names)}")
            schema = Schema(tuple(schema.field(name) for name in fields))
        self.schema = schema
        self._n = n
        self._pid: int | None = None
        self._file: h5py.File | None = None
        self._readers: list[tuple[str, Any, Any]] = []  # for iter_samples, through h5py
        self._fast: list[tuple[str, str, Any, Any]] = []  # for [i]; see _ensure_open
        self._mm: mmap.mmap | None = None
        self.direct = False  # whether [i] reads any field past h5py (set on first access)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_file=None, _pid=None, _readers=[], _fast=[], _mm=None)
        return state

    def __len__(self) -> int:
        return self._n

    def _ensure_open(self) -> None:
        if self._file is not None and self._pid == os.getpid():
            return
        if self._file is not None:
            _INHERITED.append(self._file)  # see NOTE [ HDF5 handles and worker processes ]
        f = _open(self.path)
        try:
            readers: list[tuple[str, Any, Any]] = []
            fast: list[tuple[str, str, Any, Any]] = []
            with open(self.path, "rb") as raw:
                size = os.fstat(raw.fileno()).st_size
                mm = mmap.mmap(raw.fileno(), 0, access=mmap.ACCESS_READ) if size else None
            for field in self.schema.fields:
                obj = f[field.name]
                if field.kind == "bytes":
                    data, offsets = obj["data"], obj["offsets"][()]
                    readers.append((field.name, data, offsets))
                    direct = _Direct.probe(f, data, size) if mm is not None else None
                    if direct is not None and len(offsets) and offsets[0] >= 0 and offsets[-1] <= data.shape[0] \
                            and not (np.diff(offsets) < 0).any():
                        fast.append((field.name, "bytes", direct, array.array("q", offsets.tobytes())))
                    else:
                        fast.append((field.name, "h5bytes", data, offsets))
                elif obj.size * obj.dtype.itemsize <= _CACHE_BYTES:
                    cached = obj[()]
                    readers.append((field.name, None, cached))
                    fast.append((field.name, "memory", cached, None))
                else:
                    readers.append((field.name, obj, None))
                    direct = _Direct.probe(f, obj, size) if mm is not None else None
                    if direct is not None:
                        item = obj.dtype.itemsize * int(np.prod(obj.shape[1:], dtype=np.int64))
                        fast.append((field.name, "array", direct, (obj.dtype, obj.shape[1:], item)))
                    else:
                        fast.append((field.name, "h5array", obj, None))
        except (OSError, RuntimeError, ValueError) as exc:
            f.close()
            raise ConvertError(f"{self.path}: cannot read: {exc}") from exc
        self._file, self._pid, self._readers, self._fast, self._mm = f, os.getpid(), readers, fast, mm
        self.direct = any(how in ("bytes", "array") for _, how, _, _ in fast)

    def __getitem__(self, index: int) -> Sample:
        i = int(index)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"index {index} out of range for {self._n} records")
        self._ensure_open()
        out: Sample = {}
        mm = self._mm
        for name, how, src, extra in self._fast:
            if how == "memory":
                out[name] = np.array(src[i])
            elif how == "bytes":  # see NOTE [ Direct reads of uncompressed HDF5 data ]
                out[name] = src.read(mm, extra[i], extra[i + 1])
            elif how == "array":
                dtype, shape, n = extra
                item = np.frombuffer(src.read(mm, i * n, (i + 1) * n), dtype=dtype).reshape(shape)
                out[name] = item.copy()  # writable, as h5py's would be
            elif how == "h5bytes":
                out[name] = src[extra[i] : extra[i + 1]].tobytes()
            else:
                out[name] = np.asarray(src[i])
        return out

    def iter_samples(self, block: int = 1024) -> Iterator[Sample]:
        """Every sample in order, read ``block`` samples per h5py call."""
        self._ensure_open()
        for start in range(0, self._n, block):
            stop = min(start + block, self._n)
            cols: dict[str, Any] = {}
            for name, ds, cached in self._readers:
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
            for j in range(stop - start):
                yield {name: (np.array(col[j]) if isinstance(col, np.ndarray) else col[j]) for name, col in cols.items()}

    def close(self) -> None:
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
            if self._mm is not None:
                self._mm.close()
        self._file, self._pid, self._readers, self._fast, self._mm = None, None, [], [], None


_INHERITED: list[h5py.File] = []


def check_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read every sample of an HDF5 file, check its layout and stored checksums.

    Returns a summary dict; raises ConvertError for anything inconsistent.
    """
    spath = os.fspath(path)
    reader = HDF5Reader(spath)
    summary: dict[str, Any] = {
        "records": len(reader),
        "fields": [],
        "class_names": reader.class_names,
        "provenance": reader.provenance,
    }
    with _open(spath) as f:
        summary["format"] = f.attrs.get("loadprof_format", "plain HDF5")
        for field in reader.schema.fields:
            obj = f[field.name]
            if field.kind == "bytes":
                data, offsets = obj["data"], obj["offsets"][()]
                if len(offsets) != len(reader) + 1 or offsets[0] != 0:
                    raise ConvertError(f"{spath}: {field.name}/offsets has {len(offsets)} entries, expected {len(reader) + 1} starting at 0")
                steps = np.diff(offsets)
                if (steps < 0).any():
                    bad = int(np.flatnonzero(steps < 0)[0])
                    raise ConvertError(f"{spath}: {field.name}/offsets decrease at record {bad}")
                if offsets[-1] != data.shape[0]:
                    raise ConvertError(f"{spath}: {field.name}/offsets end at {offsets[-1]} but data holds {data.shape[0]} bytes")
                summary["fields"].append((field, data.compression, int(data.shape[0])))
            else:
                if obj.shape[0] != len(reader):
                    raise ConvertError(f"{spath}: {field.name} holds {obj.shape[0]} records, expected {len(reader)}")
                summary["fields"].append((field, obj.compression, int(obj.size * obj.dtype.itemsize)))
    digest = SampleDigest(reader.schema)
    try:
        for sample in reader.iter_samples():
            digest.update(sample)
    except OSError as exc:
        raise ConvertError(f"{spath}: unreadable data near record {digest.count}: {exc}") from exc
    finally:
        reader.close()
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
