"""Reading an HDF5 file of loadprof's (or a plain one of arrays): ``HDF5Reader``, random and
sequential, every value checked against its stored CRC-32C; ``check_file`` reads one whole
for ``loadprof inspect``."""

from __future__ import annotations

import array
import contextlib
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import h5py
import numpy as np

from . import watchdog
from .errors import ConvertError
from .files import check_regular, open_regular
from .hdf5 import U32, UNVERIFIED_VERSION, crc32c, crc_of, little_endian
from .hdf5check import (
    Plan,
    decoded_attr,
    file_identity,
    h5errors,
    open_hdf5,
    plan_reads,
    read_offsets,
)
from .schema import Sample, SampleDigest

# What iter_samples reads per h5py call at most (one record more when a record is larger):
# inspect and --verify stream a file of any size in bounded memory.
_BLOCK_BYTES = 16 << 20


class _ShortRead(Exception):
    """The file ends before an extent the checked layout put inside it."""


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


class HDF5Reader:
    """Random and sequential access to samples of an HDF5 file.

    NOTE [ Reading HDF5 without trusting libhdf5 ]
    libhdf5 can loop for ever or crash on a corrupt file (NOTE [ Parsing HDF5 in a
    child process ] in watchdog.py), and Python cannot stop it. So the constructor
    does every metadata parse the reader relies on (layout, attributes, offsets,
    each dataset's chunk index, the addresses of uncompressed data) in a watched
    child, stopped after ``stall`` seconds without progress (``LOADPROF_HDF5_STALL``,
    default 30 s), and keeps what it found (a ``Plan``) with the file's identity
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
        plan: Plan = watchdog.run_watched(
            plan_reads, (self.path, self._fields), path=self.path, stall=stall, memory=watchdog.memory_budget(size)
        )
        self._plan = plan
        self.schema = plan.schema
        self.class_names = plan.class_names
        self.provenance = plan.provenance
        self.checksums = plan.checksums
        # Whether every value read is checked against its stored CRC-32C: NOTE [ Per-record checksums ].
        self.version = plan.version
        self.verified = verify and plan.crcs is not None
        if verify and plan.version == UNVERIFIED_VERSION and plan.crcs is None:
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
        plan: Plan = watchdog.run_watched(
            plan_reads, (self.path, self._fields), path=self.path, stall=self._stall,
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
            if file_identity(os.fstat(fd)) != self._plan.identity:
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
        stored = array.array(U32, self._plan.crcs[name].tobytes())
        if how in ("bytes", "h5bytes"):
            return name, stored, None
        if how == "array":
            return name, stored, little_endian(extra[0])
        if how == "h5array":
            return name, stored, little_endian(self._h5()[name].dtype)
        return name, stored, little_endian(src.dtype)

    def _damaged(self, i: int, name: str, got: int, stored: int) -> ConvertError:
        return ConvertError(
            f"{self.path}: record {i} of {name!r} does not match the checksum stored for it at conversion "
            f"(CRC-32C {got:08x}, stored {stored:08x}): the file is damaged"
        )

    def _h5(self) -> h5py.File:
        """This process's h5py handle, on the file checked: NOTE [ Reading HDF5 without trusting libhdf5 ]."""
        if self._file is None:
            f, _ = open_hdf5(self.path)
            try:
                same = file_identity(os.fstat(f.id.get_vfd_handle())) == self._plan.identity
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
        crc = crc32c  # a bound name: the checks are ~0.5 us an item of Python (benchmarks/convert_read.py)
        for name, stored, little in self._checks:
            value = sample[name]
            got = crc(value) if isinstance(value, bytes) else crc_of(value, little)
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
    f, _ = open_hdf5(spath)
    with f:
        found = decoded_attr(spath, f, "loadprof_format")
        summary["format"] = "plain HDF5" if found is None else str(found)[:40]
        with h5errors(spath, "cannot read the layout"):
            for field in reader.schema.fields:
                obj = f[field.name]
                if field.kind == "bytes":
                    # The reader needs offsets within the data; a file of ours uses all of it, from 0.
                    data, offsets = obj["data"], read_offsets(spath, f, field.name)
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
