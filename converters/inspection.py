"""``loadprof inspect``: summarise an HDF5 file or TFRecord shards and check their integrity.

TFRecord: every record's two CRC-32Cs are checked, the ``.idx`` files compared with
the records, and where our ``<split>.info.json`` is present, record counts and
per-field checksums compared with those taken at conversion. HDF5: the layout is
checked and every sample read, in a child process that is stopped if libhdf5 hangs
(NOTE [ Parsing HDF5 in a child process ]); stored checksums (per record, and per field
over the whole file) are compared where present. Anything but a regular file or a
directory is refused before it is opened. The first problem raises ConvertError
(CorruptFileError with a byte offset for TFRecord framing), one line, naming the file.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import hdf5read, samplecodec, tfrecord, tfrecordindex, watchdog
from .errors import ConvertError
from .example_proto import ExampleDecodeError, decode_example
from .files import describe_mode, open_regular
from .manifest import dataset_files
from .schema import SampleDigest
from .sizes import format_size

__all__ = ["Summary", "inspect_path"]


@dataclass
class Summary:
    path: Path
    format: str
    records: int
    bytes: int
    files: int
    # (name, type description, notes)
    features: list[tuple[str, str, str]] = field(default_factory=list)
    class_names: list[str] | None = None
    checks: list[str] = field(default_factory=list)
    provenance: dict[str, Any] | None = None

    def lines(self) -> list[str]:
        out = [
            f"{self.path}: {self.format}, {self.files} file{'s' if self.files != 1 else ''}, "
            f"{format_size(self.bytes)}",
            f"records: {self.records}",
            "features:",
        ]
        width = max((len(n) for n, _, _ in self.features), default=0)
        for name, kind, notes in self.features:
            out.append(f"  {name:<{width}}  {kind}" + (f"  ({notes})" if notes else ""))
        if self.class_names:
            shown = ", ".join(self.class_names[:8]) + (", ..." if len(self.class_names) > 8 else "")
            out.append(f"classes: {len(self.class_names)} ({shown})")
        if self.provenance and "source" in self.provenance:
            out.append(f"source: {self.provenance['source']} ({self.provenance.get('source_kind', '?')})")
        out.extend(f"ok: {c}" for c in self.checks)
        return out


_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _is_hdf5(path: Path, size: int) -> bool:
    """Whether the HDF5 signature is where the format puts it: at 0, 512, 1024, 2048, ...

    Checked here rather than with h5py.is_hdf5, which has libhdf5 parse the file in
    this process (NOTE [ Parsing HDF5 in a child process ]).
    """
    with open_regular(path) as f:
        at = 0
        while at + len(_HDF5_SIGNATURE) <= size:
            if os.pread(f.fileno(), len(_HDF5_SIGNATURE), at) == _HDF5_SIGNATURE:
                return True
            at = 512 if at == 0 else 2 * at
    return False


def inspect_path(path: str | os.PathLike[str], *, stall: float | None = None) -> Summary:
    """Summarise and check an HDF5 file, a TFRecord shard or a directory of shards.

    ConvertError (one line) for anything wrong. An HDF5 file is parsed in a child
    process, stopped after ``stall`` seconds without progress (NOTE [ Parsing HDF5 in
    a child process ]; None: ``LOADPROF_HDF5_STALL`` or 30 s).
    """
    p = Path(path)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise ConvertError(f"{p}: no such file or directory") from None
    except OSError as exc:
        raise ConvertError(f"{p}: cannot read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        return _inspect_tfrecord(p)
    if not stat.S_ISREG(st.st_mode):
        raise ConvertError(f"{p}: is {describe_mode(st.st_mode)}, not an HDF5 or TFRecord file")
    if _is_hdf5(p, st.st_size):
        return _inspect_hdf5(p, st.st_size, stall)
    return _inspect_tfrecord(p)


def _inspect_hdf5(p: Path, size: int, stall: float | None) -> Summary:
    info = watchdog.run_watched(
        hdf5read.check_file, (str(p),), path=p, stall=stall, memory=watchdog.memory_budget(size)
    )
    summary = Summary(p, "HDF5" if info["format"] == "plain HDF5" else f"HDF5 ({info['format']})",
                      info["records"], size, 1, class_names=info["class_names"])
    for fld, compression, nbytes in info["fields"]:
        notes = [format_size(nbytes)]
        if compression:
            notes.append(str(compression))
        summary.features.append((fld.name, fld.describe(), ", ".join(notes)))
    summary.checks.append("layout consistent; every sample read")
    if info["record_checksums"]:
        summary.checks.append("every record matches the checksums stored for it at conversion")
    if info["checksums"] == "match":
        summary.checks.append("per-field checksums match those stored at conversion")
    summary.provenance = info["provenance"]
    return summary


def _describe_raw(example: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows = []
    for name in sorted(example):
        value = example[name]
        if isinstance(value, list):
            rows.append((name, f"bytes_list[{len(value)}]", ""))
        elif value.dtype == np.float32:
            rows.append((name, f"float_list[{value.size}]", ""))
        else:
            rows.append((name, f"int64_list[{value.size}]", ""))
    return rows


def _inspect_tfrecord(p: Path) -> Summary:
    # Checked against their info file: NOTE [ The info file is the manifest ].
    shards, info = dataset_files(p)
    schema = tfrecord.schema_from_info(info)
    expected_counts = tfrecord.expected_counts(info)
    # Totals and checksums describe the whole dataset: compare them only when given all of it.
    complete = bool(expected_counts) and set(expected_counts) == {s.name for s in shards}
    digest = SampleDigest(schema) if schema is not None and complete and info and "checksums" in info else None
    decode = samplecodec.SampleDecoder(schema)
    total = 0
    size = 0
    first: dict[str, Any] | None = None
    indexed = 0
    for shard in shards:
        shard_size = shard.stat().st_size
        size += shard_size
        count = 0
        entries = []
        for offset, data in tfrecord.iter_records(shard, verify=True):
            entries.append((offset, len(data) + tfrecord.FRAMING_BYTES))
            if first is None:
                # Only to describe the features: a TFRecord may hold any payload.
                try:
                    first = decode_example(data)
                except ExampleDecodeError:
                    first = {}
            if digest is not None:
                try:
                    digest.update(decode(data))
                except ExampleDecodeError as exc:
                    raise ConvertError(
                        f"{shard}: record at byte offset {offset} is not a tf.train.Example matching "
                        f"the schema: {exc}"
                    ) from exc
            count += 1
        idx = tfrecord.index_path_for(shard)
        if os.path.lexists(idx):
            index = tfrecordindex.read_index(idx, max_bytes=tfrecordindex.index_size_limit(shard_size))
            scanned = np.array(entries, dtype=np.int64).reshape(-1, 2)
            if len(index) != len(scanned):
                raise ConvertError(f"{idx}: lists {len(index)} records, {shard.name} holds {len(scanned)}")
            bad = np.flatnonzero((index != scanned).any(axis=1))
            if len(bad):
                raise ConvertError(
                    f"{idx}: line {bad[0] + 1} says '{index[bad[0]][0]} {index[bad[0]][1]}', the record "
                    f"is at '{scanned[bad[0]][0]} {scanned[bad[0]][1]}'"
                )
            indexed += 1
        if shard.name in expected_counts and expected_counts[shard.name] != count:
            raise ConvertError(
                f"{shard}: holds {count} records, {expected_counts[shard.name]} when converted"
            )
        total += count
    kind = "TFRecord" if not info else f"TFRecord ({info.get('format', '?')})"
    summary = Summary(p, kind, total, size, len(shards))
    if schema is not None and info is not None:
        encoding = info.get("encoding", {})
        for f in schema.fields:
            summary.features.append((f.name, f.describe(), f"stored as {encoding.get(f.name, '?')}"))
        summary.class_names = info.get("class_names")
        summary.provenance = info.get("provenance")
    elif first:
        summary.features = [(n, k, "from the first record") for n, k, _ in _describe_raw(first)]
    elif first is not None:
        summary.features = [("(payload)", "not a tf.train.Example", "from the first record")]
    summary.checks.append(f"every CRC-32C checked ({2 * total} CRCs in {len(shards)} shard(s))")
    if indexed:
        summary.checks.append(f"{indexed} index file(s) match their records")
    if complete and info is not None and total != info.get("num_records", total):
        raise ConvertError(f"{p}: holds {total} records, {info['num_records']} when converted")
    if digest is not None and info is not None:
        got = digest.result()
        for name, stored in info["checksums"].items():
            if got.get(name) != stored:
                raise ConvertError(
                    f"{p}: field {name!r} checksum {got.get(name)} differs from the {stored} "
                    "stored at conversion: the data changed or is corrupt"
                )
        summary.checks.append("per-field checksums match those stored at conversion")
    return summary
