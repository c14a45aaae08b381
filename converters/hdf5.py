"""HDF5 (h5py): the format loadprof writes, and its writer. Its checks before a read
are hdf5check.py's, its reader hdf5read.py's.

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

``HDF5Reader`` (hdf5read.py) also reads plain HDF5 files whose top-level datasets share
their first dimension (each becomes an array field).
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

import google_crc32c
import h5py
import numpy as np

from .errors import ConvertError
from .schema import Field, Schema

__all__ = ["HDF5Writer", "FORMAT", "FORMAT_VERSION", "chunk_rows", "checksum_name"]

FORMAT = "loadprof-hdf5"
FORMAT_VERSION = 2
UNVERIFIED_VERSION = 1  # before per-record checksums: still read, with a warning

# 64 KiB chunks read fastest for random access to ~3 KB blobs here: 54.7k reads/s
# cold vs 49.5k at 16 KiB and 39.3k contiguous (10,000 blobs, page cache dropped
# with POSIX_FADV_DONTNEED; /tmp/exp/cold.py during development).
_CHUNK_TARGET = 64 << 10
CHUNK_MAX = 1 << 20
_FLUSH_BYTES = 4 << 20  # write to h5py in blocks: one call per sample costs ~20 us


def chunk_rows(sample_nbytes: int) -> int:
    """Samples per chunk: about 64 KiB, at least one sample, at most 1 MiB when one fits."""
    if sample_nbytes <= 0:
        return 4096
    return max(1, min(_CHUNK_TARGET // sample_nbytes, CHUNK_MAX // sample_nbytes) or 1)


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


def little_endian(dtype: np.dtype[Any]) -> np.dtype[Any] | None:
    """The little-endian dtype to checksum values of ``dtype`` as, None when they already are."""
    little = dtype.newbyteorder("<")
    return None if dtype == little else little


def crc_of(value: np.ndarray, little: np.dtype[Any] | None) -> int:
    """CRC-32C of an array's little-endian C-order bytes."""
    if little is not None:
        value = value.astype(little)
    try:
        # Read in place: a copy of a 150 KB record (tobytes) cost more than the CRC itself.
        return crc32c(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # not C-contiguous, or a NumPy whose arrays the C call refuses
        return crc32c(value.tobytes())


crc32c: Callable[[bytes], int] = google_crc32c.value
U32 = "I" if array.array("I").itemsize == 4 else "L"  # array.array's code for uint32 here


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
        self.little = little_endian(self.buf.dtype)
        self.used = 0
        self.written = 0

    def add(self, value: np.ndarray | list[int]) -> int:
        """Buffer one record; its CRC-32C as stored (NOTE [ Per-record checksums ])."""
        self.buf[self.used] = value
        crc = crc_of(self.buf[self.used : self.used + 1], self.little)
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
        return crc32c(value)

    def _create(self) -> h5py.Dataset:
        # Chunk by the typical blob: a power of two >= the mean blob, 64 KiB-1 MiB.
        mean = self.pending_bytes // max(len(self.pending), 1)
        chunk = _CHUNK_TARGET
        while chunk < mean and chunk < CHUNK_MAX:
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
