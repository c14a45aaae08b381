"""TFRecord: framing, writer, reader and index, without TensorFlow.

Record framing (tensorflow/core/lib/io/record_writer.cc, little-endian):

    uint64 length | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)

CRC-32C is Castagnoli; masked(c) = ((c >> 15) | (c << 17)) + 0xA282EAD8 mod 2**32
(tensorflow/core/lib/hash/crc32c.h: "it is problematic to compute the CRC of a
string that contains embedded CRCs"). The index beside each shard holds one
``"offset length"`` line per record, length counting the 16 framing bytes: the
format of NVIDIA DALI's ``tools/tfrecord2idx`` and vahidk/tfrecord's
``create_index``, so either can read our shards with it.

The index files are read and checked in tfrecordindex.py.

Payloads of the shards ``converters`` writes are tf.train.Example messages
(example_proto.py, with how each schema field maps to a Feature:
``feature_encoding``).
"""

from __future__ import annotations

import array
import contextlib
import mmap
import os
import re
import struct
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import google_crc32c
import numpy as np

from .errors import ConvertError, CorruptFileError
from .files import check_regular, open_regular
from .schema import Schema

__all__ = [
    "masked_crc32c",
    "frame_record",
    "TFRecordFileWriter",
    "ShardedTFRecordWriter",
    "ShardInfo",
    "iter_records",
    "read_record_at",
    "scan_records",
    "index_path_for",
    "shard_name",
    "parse_shard_name",
    "info_path_for",
    "check_info",
    "expected_counts",
    "expand_paths",
    "schema_from_info",
    "GZIP_MAGIC",
    "FRAMING_BYTES",
]

if getattr(google_crc32c, "implementation", "c") != "c":
    # Its pure-Python fallback runs at ~7 MB/s, against ~6 GB/s for the C
    # extension: every read and write here would crawl.
    warnings.warn(
        "google-crc32c is using its pure-Python fallback: TFRecord CRCs will be very slow; "
        "reinstall google-crc32c with its C extension",
        RuntimeWarning,
        stacklevel=2,
    )

_MASK_DELTA = 0xA282EAD8
_HEADER = 12  # uint64 length + uint32 masked CRC of the length
_FOOTER = 4  # uint32 masked CRC of the data
FRAMING_BYTES = _HEADER + _FOOTER
GZIP_MAGIC = b"\x1f\x8b"
_READ_AHEAD = 8 << 20  # bytes iter_records asks the kernel to fetch ahead of it

# Shard names follow TFDS / tf.data convention: <split>-<index>-of-<count>.tfrecord.
_SHARD_RE = re.compile(r"^(?P<split>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.tfrecord$")


def masked_crc32c(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def frame_record(data: bytes) -> bytes:
    """One record exactly as tf.io.TFRecordWriter frames it (no compression)."""
    length = struct.pack("<Q", len(data))
    return b"".join(
        (
            length,
            struct.pack("<I", masked_crc32c(length)),
            data,
            struct.pack("<I", masked_crc32c(data)),
        )
    )


def index_path_for(shard: str | os.PathLike[str]) -> Path:
    return Path(os.fspath(shard) + ".idx")


def shard_name(split: str, index: int, count: int) -> str:
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord"


def parse_shard_name(name: str) -> tuple[str, int, int] | None:
    """``(split, index, count)`` of a name as ``shard_name`` makes it, else None."""
    m = _SHARD_RE.match(name)
    return (m.group("split"), int(m.group("index")), int(m.group("count"))) if m else None


def info_path_for(directory: str | os.PathLike[str], split: str) -> Path:
    return Path(directory) / f"{split}.info.json"


_pack_i = struct.Struct("<I").pack
_crc = google_crc32c.value
# Record headers (length + its masked CRC) by payload length: datasets repeat a
# few lengths, so most headers cost a dict lookup. Bounded, for datasets of blobs.
_HEADERS: dict[int, bytes] = {}


def _header(n: int) -> bytes:
    header = _HEADERS.get(n)
    if header is None:
        length = struct.pack("<Q", n)
        header = length + _pack_i(masked_crc32c(length))
        if len(_HEADERS) < 1 << 16:
            _HEADERS[n] = header
    return header


class TFRecordFileWriter:
    """Write framed records to one file and its "offset length" index.

    NOTE [ Batched framing ]
    For small records the per-record Python work, not the CRCs or the disk, sets
    the speed (benchmarks/convert_write.py: 100-byte records). So ``write`` only
    queues the payload; ``flush`` frames ~1 MiB of records at once: CRCs by
    ``map``, their masks in NumPy, headers from a cache by length, one ``join``
    and one ``write``. The index is formatted once, at ``close``. Payloads that
    are not ``bytes`` are copied on ``write``, so a caller may reuse its buffer.
    """

    _FLUSH_AT = 1 << 20

    def __init__(
        self,
        path: str | os.PathLike[str],
        index_path: str | os.PathLike[str] | None = None,
        *,
        exclusive: bool = False,
    ) -> None:
        self.path = Path(path)
        self.index_path = Path(index_path) if index_path is not None else index_path_for(path)
        # exclusive: create both files, never open one already there (or a link planted there).
        self._mode = "xb" if exclusive else "wb"
        self._file: BinaryIO = _open_new(self.path, self._mode)
        self._pending: list[bytes] = []
        self._pending_bytes = 0  # framed size of the queued records
        self._flushed = 0
        self._sizes = array.array("q")  # payload length of each flushed record, for the index

    @property
    def offset(self) -> int:
        """Bytes written so far, queued ones included: the next record's offset."""
        return self._flushed + self._pending_bytes

    @property
    def count(self) -> int:
        return len(self._sizes) + len(self._pending)

    def write(self, data: bytes) -> None:
        if data.__class__ is not bytes:
            data = bytes(data)
        self._pending.append(data)
        self._pending_bytes += len(data) + _HEADER + _FOOTER
        if self._pending_bytes >= self._FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        """Frame and write the queued records; see NOTE [ Batched framing ]."""
        chunk = self._pending
        if not chunk:
            return
        k = len(chunk)
        lengths = list(map(len, chunk))
        headers = {n: _header(n) for n in set(lengths)}
        crc = np.fromiter(map(_crc, chunk), dtype=np.uint64, count=k)
        masked = ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF
        parts: list[bytes] = [b""] * (3 * k)
        parts[0::3] = list(map(headers.__getitem__, lengths))
        parts[1::3] = chunk
        parts[2::3] = list(map(_pack_i, masked.tolist()))
        self._file.write(b"".join(parts))
        self._flushed += self._pending_bytes
        self._sizes.extend(lengths)
        self._pending = []
        self._pending_bytes = 0

    def close(self) -> None:
        if self._file.closed:
            return
        try:
            self.flush()
            self._file.flush()
            os.fsync(self._file.fileno())
        finally:
            self._file.close()
        framed = np.frombuffer(self._sizes, dtype=np.int64) + (_HEADER + _FOOTER)
        pairs = np.empty(2 * len(framed), dtype=np.int64)
        pairs[0::2] = np.cumsum(framed) - framed  # offsets
        pairs[1::2] = framed
        with _open_new(self.index_path, self._mode) as idx:
            # One %-format over all pairs: half the time of an f-string per line.
            idx.write((("%d %d\n" * len(framed)) % tuple(pairs.tolist())).encode("ascii"))

    def abort(self) -> None:
        # Closing flushes Python's buffer, which fails again on a full disk; the
        # file is about to be deleted, so that second error says nothing new.
        with contextlib.suppress(OSError):
            self._file.close()

    def __enter__(self) -> TFRecordFileWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _open_new(path: Path, mode: str) -> BinaryIO:
    if mode == "wb":
        return open(path, "wb")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    return open(os.open(path, flags, 0o666), "wb")


@dataclass(frozen=True)
class ShardInfo:
    file: str  # name inside the output directory
    records: int
    bytes: int


class ShardedTFRecordWriter:
    """Write records into ``<split>-NNNNN-of-MMMMM.tfrecord`` shards of about ``shard_size`` bytes.

    The count MMMMM is known only at the end, so shards are written under
    provisional names and renamed in ``close``. A new shard starts before the
    record that would find the current one already at ``shard_size`` or more.
    """

    def __init__(self, directory: str | os.PathLike[str], split: str, shard_size: int) -> None:
        if shard_size <= 0:
            raise ConvertError(f"shard size must be positive, got {shard_size}")
        self.directory = Path(directory)
        self.split = split
        self.shard_size = shard_size
        self._writer: TFRecordFileWriter | None = None
        self._done: list[tuple[Path, int, int]] = []
        self.count = 0

    @property
    def current_path(self) -> Path | None:
        return self._writer.path if self._writer else None

    def write(self, data: bytes) -> None:
        if self._writer is not None and self._writer.offset >= self.shard_size:
            self._finish_shard()
        if self._writer is None:
            path = self.directory / f"{self.split}-{len(self._done):05d}.partial"
            self._writer = TFRecordFileWriter(path, Path(str(path) + ".idx"), exclusive=True)
        self._writer.write(data)
        self.count += 1

    def _finish_shard(self) -> None:
        assert self._writer is not None
        self._writer.close()
        self._done.append((self._writer.path, self._writer.count, self._writer.offset))
        self._writer = None

    def close(self) -> list[ShardInfo]:
        if self._writer is not None:
            self._finish_shard()
        total = len(self._done)
        shards = []
        for i, (path, records, size) in enumerate(self._done):
            final = self.directory / shard_name(self.split, i, total)
            os.replace(path, final)
            os.replace(str(path) + ".idx", index_path_for(final))
            shards.append(ShardInfo(final.name, records, size))
        return shards

    def abort(self) -> None:
        if self._writer is not None:
            self._writer.abort()


# ---------------------------------------------------------------- reading


def _unmask(value: int) -> int:
    rot = (value - _MASK_DELTA) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


def _check_start(path: Path, head: bytes) -> None:
    if head[:2] == GZIP_MAGIC:
        raise ConvertError(
            f"{path}: looks gzip-compressed; compressed TFRecords are one gzip stream, so "
            "byte-offset indexes cannot address their records: decompress it first"
        )


def iter_records(
    path: str | os.PathLike[str],
    *,
    start: int = 0,
    stop: int | None = None,
    verify: bool = True,
) -> Iterator[tuple[int, bytes]]:
    """Yield ``(offset, data)`` for each record whose offset lies in ``[start, stop)``.

    Raises CorruptFileError naming the file and the record's byte offset for a bad
    CRC, a truncated record, or a length field claiming more bytes than the file
    holds; the length is checked against the file size before anything of that
    length is read or allocated.
    """
    path = Path(path)
    with open_regular(path, "a TFRecord file", buffering=1 << 20) as f:
        size = os.fstat(f.fileno()).st_size
        end = size if stop is None else min(stop, size)
        offset = start
        if start:
            f.seek(start)
        read = f.read
        # Ask the kernel to read ahead of us, a window at a time, so a cold file
        # streams in while records are decoded: one thread otherwise waits for
        # each 1 MiB read in turn (benchmarks/convert_read.py, cold rows).
        advise = getattr(os, "posix_fadvise", None)
        ahead = offset
        while offset < end:
            if advise is not None and ahead < end and offset >= ahead - _READ_AHEAD // 2:
                try:
                    advise(f.fileno(), ahead, min(_READ_AHEAD, end - ahead), os.POSIX_FADV_WILLNEED)
                except OSError:  # a filesystem without a page cache to fill: read as is
                    advise = None
                ahead += _READ_AHEAD
            header = read(_HEADER)
            if offset == 0:
                _check_start(path, header)
            if len(header) < _HEADER:
                raise CorruptFileError(
                    path, offset, f"truncated record header ({len(header)} of {_HEADER} bytes)"
                )
            (length,) = struct.unpack_from("<Q", header)
            if verify and masked_crc32c(header[:8]) != struct.unpack_from("<I", header, 8)[0]:
                hint = " (not a TFRecord file?)" if offset == 0 else ""
                raise CorruptFileError(path, offset, "length CRC-32C mismatch" + hint)
            if length > size - offset - _HEADER - _FOOTER:
                raise CorruptFileError(
                    path,
                    offset,
                    f"record claims {length} data bytes but only "
                    f"{max(0, size - offset - _HEADER - _FOOTER)} remain in the file (truncated?)",
                )
            rest = read(length + _FOOTER)  # data and its CRC in one read
            if len(rest) != length + _FOOTER:
                raise CorruptFileError(path, offset, "truncated record (file changed while reading?)")
            data = rest[:length]
            if verify and masked_crc32c(data) != struct.unpack_from("<I", rest, length)[0]:
                raise CorruptFileError(path, offset, "data CRC-32C mismatch")
            yield offset, data
            offset += length + _HEADER + _FOOTER


def read_record_at(
    f: BinaryIO | mmap.mmap, path: Path, offset: int, size: int, file_size: int, verify: bool = True
) -> bytes:
    """Read the record at ``offset`` whose index says it spans ``size`` bytes.

    ``f`` is an open file (read with ``pread``) or an ``mmap`` of it (sliced).
    """
    if offset + size > file_size or size < _HEADER + _FOOTER:
        raise CorruptFileError(path, offset, f"index entry ({offset} {size}) lies outside the file ({file_size} bytes)")
    if isinstance(f, mmap.mmap):
        buf = f[offset : offset + size]
    elif hasattr(os, "pread"):
        buf = os.pread(f.fileno(), size, offset)  # one call, no seek; f's own buffer is not used
    else:  # Windows
        f.seek(offset)
        buf = f.read(size)
    if len(buf) != size:
        raise CorruptFileError(path, offset, "truncated record (file changed while reading?)")
    (length,) = struct.unpack_from("<Q", buf)
    if length != size - _HEADER - _FOOTER:
        raise CorruptFileError(path, offset, f"record length {length} disagrees with the index ({size} bytes framed)")
    data = buf[_HEADER : _HEADER + length]
    if verify:
        if masked_crc32c(buf[:8]) != struct.unpack_from("<I", buf, 8)[0]:
            raise CorruptFileError(path, offset, "length CRC-32C mismatch")
        if masked_crc32c(data) != struct.unpack_from("<I", buf, _HEADER + length)[0]:
            raise CorruptFileError(path, offset, "data CRC-32C mismatch")
    return data


def scan_records(path: str | os.PathLike[str], *, verify: bool = True) -> np.ndarray:
    """Walk a whole file, checking every CRC; return its index as an (N, 2) int64 array."""
    entries = [(off, len(data) + _HEADER + _FOOTER) for off, data in iter_records(path, verify=verify)]
    return np.array(entries, dtype=np.int64).reshape(-1, 2)


def expand_paths(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[Path]:
    """Shard paths from a file, a directory (its ``*.tfrecord``), or a list of either."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    out: list[Path] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            found = sorted(p.glob("*.tfrecord"))
            if not found:
                raise ConvertError(f"{p}: no *.tfrecord files in this directory")
            out.extend(found)
        else:
            out.append(p)
    for p in out:
        check_regular(p, "a TFRecord file")  # a FIFO would block the reader, a directory fail mid-read
    if not out:
        raise ConvertError("no TFRecord files given")
    return out


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0


def check_info(data: Any) -> str | None:
    """What is wrong with the parsed contents of an info file, or None.

    Checks every part a reader uses, so that a hand-edited or damaged file is one
    line naming the part, never a KeyError or TypeError later.
    """
    if not isinstance(data, dict):
        return f"is {type(data).__name__ if data is not None else 'null'}, expected a JSON object"
    schema = None
    if "schema" in data:
        try:
            schema = Schema.from_obj(data["schema"])
        except ValueError as exc:
            return f"'schema': {exc}"
    shards = data.get("shards", [])
    if not isinstance(shards, list):
        return "'shards' is not a list"
    for i, shard in enumerate(shards):
        if not isinstance(shard, dict):
            return f"'shards' entry {i} is not an object"
        name = shard.get("file")
        if not isinstance(name, str) or not name or "/" in name or "\\" in name:
            return f"'shards' entry {i} has no 'file' (a file name beside the info file)"
        if not _count(shard.get("records")):
            return f"'shards' entry {i} ({name}) has no 'records' count"
        if "bytes" in shard and not _count(shard["bytes"]):
            return f"'shards' entry {i} ({name}): 'bytes' is not a size"
    if "num_records" in data and not _count(data["num_records"]):
        return "'num_records' is not a count of records"
    checksums = data.get("checksums", {})
    if not isinstance(checksums, dict) or not all(isinstance(v, str) for v in checksums.values()):
        return "'checksums' is not an object of field name to checksum text"
    if schema is not None and not set(checksums) <= set(schema.names):
        return f"'checksums' names fields not in the schema: {sorted(set(checksums) - set(schema.names))[:3]}"
    for key, kind, words in (("encoding", dict, "an object"), ("provenance", dict, "an object"),
                             ("class_names", list, "a list"), ("format", str, "text")):
        if key in data and not isinstance(data[key], kind):
            return f"'{key}' is not {words}"
    names = data.get("class_names", [])
    if not all(isinstance(c, str) for c in names):
        return "'class_names' is not a list of strings"
    return None


def expected_counts(info: Mapping[str, Any] | None) -> dict[str, int]:
    """Records per shard file name, as the info file lists them at conversion."""
    return {s["file"]: s["records"] for s in info.get("shards", [])} if info else {}


def schema_from_info(info: Mapping[str, Any] | None) -> Schema | None:
    """The schema an info file gives (None without one); ConvertError if it is not one."""
    if info is None or "schema" not in info:
        return None
    try:
        return Schema.from_obj(info["schema"])
    except ValueError as exc:
        raise ConvertError(f"info file: 'schema': {exc}") from None
