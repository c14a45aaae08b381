"""Convert a source into HDF5 or sharded TFRecord, all or nothing.

NOTE [ No partial output ]
Output is written under a hidden temporary name beside ``out`` (a file for HDF5,
a directory of shards for TFRecord), verified if asked, and renamed into place
only at the end, in one step (NOTE [ Replacing OUT in one step ] in swap.py). Any
failure, Ctrl-C included, removes the temporary output, so ``out`` is either absent,
untouched (the old one), or complete.

NOTE [ Signals during a conversion ]
SIGTERM and SIGHUP would end the process without running any cleanup, leaving the
temporary output behind. So while ``convert`` runs in the main thread, a stop signal
whose handler is the default raises ConversionStopped instead: the temporary output is
removed on the way out, then the default handler is put back and the signal sent again,
so the process ends as it would have (killed by that signal). The CLI installs its own
handler first and exits 128 + signal number with one line (130 for Ctrl-C). Creating
the temporaries, removing them and putting the output in place run with these signals
blocked, so none of them is cut in half. A SIGKILL cannot be caught: each temporary is
named ``.OUT.tmp-PID-HOST-XXXXXXXX`` and the next conversion into the same directory
deals with those of processes on this host that no longer exist (swap.clean_leftovers).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import numpy as np

from . import hdf5, hdf5read, manifest, samplecodec, swap, tfrecord, tfrecordindex
from .errors import ConvertError
from .overwrite import replaceable
from .schema import Field, Sample, SampleDigest, Schema
from .sources import Source, SourceOptions, open_source
from .stopping import signals_held, stop_on_signals

__all__ = [
    "ConvertOptions",
    "ConvertResult",
    "convert",
    "DEFAULT_SHARD_SIZE",
    "TFRECORD_FORMAT",
]

Format = Literal["hdf5", "tfrecord"]

# TF's performance guide suggests 100-200 MB per file; TFDS uses 64 MiB-1 GiB.
DEFAULT_SHARD_SIZE = 128 << 20
TFRECORD_FORMAT = manifest.FORMAT


@dataclass(frozen=True)
class ConvertOptions:
    """Every conversion setting, with its default; the CLI maps its flags onto this.

    to:           output format, "hdf5" (one file) or "tfrecord" (a directory of shards).
    source:       how to read the source (see SourceOptions).
    compression:  HDF5 only: None (default), "lzf" or "gzip" (level 4).
    shard_size:   TFRecord only: start a new shard once one holds this many bytes.
    split:        TFRecord only: shard name prefix, as in train-00000-of-00004.tfrecord.
    overwrite:    replace an existing output (otherwise refused).
    verify:       read the output back and compare count and per-field checksums
                  with what was read from the source, before publishing it.
    progress:     progress bar on stderr: None = only when stderr is a terminal.
    """

    to: Format
    source: SourceOptions = field(default_factory=SourceOptions)
    compression: str | None = None
    shard_size: int = DEFAULT_SHARD_SIZE
    split: str = "train"
    overwrite: bool = False
    verify: bool = False
    progress: bool | None = None


@dataclass(frozen=True)
class ConvertResult:
    output: Path
    format: Format
    records: int
    bytes: int
    files: list[Path]
    schema: Schema
    checksums: dict[str, str]
    verified: bool
    seconds: float
    # One-line notes for the user (not errors): what was skipped or cleaned up.
    notes: tuple[str, ...] = ()


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("loadprof")
    except PackageNotFoundError:
        return "unknown"


def _check(options: ConvertOptions, out: Path) -> None:
    if options.to not in ("hdf5", "tfrecord"):
        raise ConvertError(f"unknown output format {options.to!r}; expected hdf5 or tfrecord")
    if options.compression is not None and options.to != "hdf5":
        raise ConvertError("--compression applies to HDF5 output only")
    if options.compression not in (None, "lzf", "gzip"):
        raise ConvertError(f"unknown compression {options.compression!r}; expected lzf or gzip")
    if options.shard_size <= 0:
        raise ConvertError(f"--shard-size must be positive, got {options.shard_size}")
    if not options.split or "/" in options.split or options.split.startswith("."):
        raise ConvertError(f"--split {options.split!r} is not a usable file name prefix")
    if not out.parent.is_dir():
        raise ConvertError(f"{out}: parent directory {out.parent} does not exist")


def _target(out: str | os.PathLike[str]) -> Path:
    """OUT as a path with a real name in a real parent: ``.`` and ``..`` are resolved, so the
    temporary output lands beside OUT, not inside it."""
    path = Path(out)
    if path.name in ("", ".", ".."):
        path = path.resolve()
    return path


def _names(names: list[str], most: int = 3) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


@contextlib.contextmanager
def _progress(enabled: bool | None, total: int, label: str) -> Iterator[Callable[[], None]]:
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        yield lambda: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
    ) as bar:
        task = bar.add_task(label, total=total)
        yield lambda: bar.advance(task)


# ---------------------------------------------------------------- signals and leftovers

_host_tag = swap.host_tag  # the HOST part of temporary names


class _Output:
    """The temporary output and its writer; see NOTE [ No partial output ]."""

    def __init__(self, out: Path, options: ConvertOptions, replaces: swap.Previous | None = None) -> None:
        self.out = out
        self.options = options
        # None: OUT did not exist; else the existing OUT and what in it is ours.
        self.replaces = replaces
        self.published = False
        self.notes: list[str] = []
        prefix = swap.temp_prefix(out, "tmp")
        # mkstemp/mkdtemp create 0600/0700; the published output should get the usual
        # permissions, as if created with open()/mkdir() under the current umask.
        umask = os.umask(0)
        os.umask(umask)
        with signals_held():  # not stopped between creating the temporary and knowing its name
            try:
                # Both create a new name (O_EXCL, mkdir): never a file or link planted there.
                if options.to == "hdf5":
                    fd, name = tempfile.mkstemp(prefix=prefix, suffix=".h5", dir=out.parent)
                else:
                    name = tempfile.mkdtemp(prefix=prefix, dir=out.parent)
                    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            except OSError as exc:
                raise ConvertError(f"{out}: cannot create output in {out.parent}: {exc.strerror}") from exc
            self.tmp = Path(name)
            try:
                os.fchmod(fd, (0o666 if options.to == "hdf5" else 0o777) & ~umask)
            finally:
                os.close(fd)
        self.h5: hdf5.HDF5Writer | None = None
        self.tf: tfrecord.ShardedTFRecordWriter | None = None
        self.schema: Schema | None = None

    def start(self, schema: Schema, expected: int) -> None:
        self.schema = schema
        if self.options.to == "hdf5":
            self.h5 = hdf5.HDF5Writer(
                self.tmp, schema, expected=expected, compression=self.options.compression, overwrite=True
            )
        else:
            self.tf = tfrecord.ShardedTFRecordWriter(self.tmp, self.options.split, self.options.shard_size)

    def write(self, sample: Sample) -> None:
        if self.h5 is not None:
            self.h5.write(sample)
        else:
            assert self.tf is not None and self.schema is not None
            self.tf.write(samplecodec.encode_sample(self.schema, sample))

    def finish(self, meta: dict[str, Any]) -> list[Path]:
        """Close the writer; return the files of the output, as they will be named in ``out``."""
        if self.h5 is not None:
            self.h5.close(meta)
            return [self.out]
        assert self.tf is not None and self.schema is not None
        shards = self.tf.close()
        info = {
            "format": TFRECORD_FORMAT,
            "format_version": 1,
            "split": self.options.split,
            "num_records": sum(s.records for s in shards),
            "schema": json.loads(self.schema.to_json()),
            "encoding": {f.name: samplecodec.feature_encoding(f) for f in self.schema.fields},
            "shards": [asdict(s) for s in shards],
            **meta,
        }
        info_path = tfrecord.info_path_for(self.tmp, self.options.split)
        with open(info_path, "x", encoding="utf-8") as f:  # a new file, never one planted there
            f.write(json.dumps(info, indent=1) + "\n")
        names = [s.file for s in shards]
        return [self.out / n for n in names] + [self.out / (n + ".idx") for n in names] + [self.out / info_path.name]

    def abort(self) -> None:
        if self.published:
            return
        with signals_held():
            for writer in (self.h5, self.tf):
                if writer is not None:
                    writer.abort()
            if self.tmp.is_dir():
                shutil.rmtree(self.tmp, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    self.tmp.unlink()

    def publish(self) -> None:
        with signals_held():
            if self.options.to == "hdf5":
                os.replace(self.tmp, self.out)  # atomic
            else:
                self.notes = swap.put_in_place(self.tmp, self.out, self.replaces)
            self.published = True


def _read_back(tmp: Path, options: ConvertOptions, schema: Schema) -> Iterator[Sample]:
    if options.to == "hdf5":
        reader = hdf5read.HDF5Reader(tmp)
        try:
            yield from reader.iter_samples()
        finally:
            reader.close()
        return
    decode = samplecodec.SampleDecoder(schema)
    for shard in sorted(tmp.glob("*.tfrecord")):
        index = tfrecordindex.read_index(tfrecord.index_path_for(shard))
        scanned = tfrecord.scan_records(shard, verify=True)
        if not np.array_equal(index, scanned):
            raise ConvertError(f"{shard.name}.idx: does not match the records of {shard.name}")
        for offset, data in tfrecord.iter_records(shard):
            try:
                yield decode(data)
            except ValueError as exc:
                raise ConvertError(f"{shard.name}: record at byte offset {offset} does not decode: {exc}") from exc


def _verify(output: _Output, expected: SampleDigest) -> None:
    assert output.schema is not None
    digest = SampleDigest(output.schema)
    try:
        for sample in _read_back(output.tmp, output.options, output.schema):
            digest.update(sample)
    except ConvertError as exc:  # a record that fails its own checksum: named in OUT, not the temporary
        if output.options.to != "hdf5":
            raise
        raise ConvertError(f"{output.out}: verification failed: {str(exc).removeprefix(f'{output.tmp}: ')}") from None
    if digest.count != expected.count:
        raise ConvertError(
            f"{output.out}: verification failed: read back {digest.count} records, wrote {expected.count}"
        )
    got, want = digest.result(), expected.result()
    for name in want:
        if got[name] != want[name]:
            raise ConvertError(
                f"{output.out}: verification failed: field {name!r} checksum {got[name]} "
                f"differs from the source's {want[name]}"
            )


def _schema_for(source: Source, sample: dict[str, Any], where: str) -> Schema:
    inferred = Schema.infer(sample, where)
    return Schema(
        tuple(
            Field(f.name, f.kind, f.dtype, f.shape, source.contents.get(f.name)) for f in inferred.fields
        )
    )


def convert(src: str | os.PathLike[str], out: str | os.PathLike[str], options: ConvertOptions) -> ConvertResult:
    """Convert ``src`` into ``out`` (an HDF5 file, or a directory of TFRecord shards).

    Raises ConvertError, with a one-line message naming the file and record, for
    bad input and for disk or permission errors; then nothing is left at ``out``
    that was not there before. A SIGTERM or SIGHUP removes the temporary output
    before it ends the process (NOTE [ Signals during a conversion ]).
    """
    with stop_on_signals():
        return _convert(src, out, options)


def _convert(src: str | os.PathLike[str], out: str | os.PathLike[str], options: ConvertOptions) -> ConvertResult:
    started = time.perf_counter()
    out_path = _target(out)
    _check(options, out_path)
    inputs = [Path(p) for p in (src, options.source.labels) if p is not None and os.path.exists(p)]
    # Before OUT is looked at: a whole output left aside by a conversion cut short may be put back as OUT.
    stale, notes = swap.clean_leftovers(out_path.parent)
    if stale:
        shown = _names([str(out_path.parent / name) for name in stale])
        notes.insert(0, f"removed {shown}: temporary output left by a conversion that did not finish")
    try:
        replaces = replaceable(out_path, options.to, options.overwrite, inputs)
    except ConvertError as exc:
        restored = [n for n in notes if n.startswith("restored ")]
        if restored:  # the refusal must not hide that OUT came back
            raise ConvertError(f"{exc} (note: {'; '.join(restored)})") from None
        raise
    source = open_source(src, options.source)
    total = len(source)
    if total == 0:
        raise ConvertError(f"{src}: holds no samples")
    notes = list(source.notes) + notes
    output = _Output(out_path, options, replaces)
    digest: SampleDigest | None = None
    count = 0
    try:
        with _progress(options.progress, total, f"{out_path.name}") as advance:
            for where, raw in source:
                if digest is None:
                    schema = _schema_for(source, raw, where)
                    try:
                        output.start(schema, total)
                    except OSError as exc:
                        raise ConvertError(f"{out_path}: cannot create output: {exc.strerror or exc}") from exc
                    digest = SampleDigest(schema)
                sample = output.schema.check(raw, where)  # type: ignore[union-attr]
                digest.update(sample)
                try:
                    output.write(sample)
                except OSError as exc:
                    raise ConvertError(
                        f"{out_path}: writing record {count} ({where}) failed: {exc.strerror or exc}"
                    ) from exc
                count += 1
                advance()
        assert digest is not None and output.schema is not None
        meta = {
            "class_names": source.class_names,
            "checksums": digest.result(),
            "provenance": {
                "source": source.description,
                "source_kind": source.kind,
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "loadprof_version": _version(),
                "source_options": asdict(options.source),
                **source.metadata(),
            },
        }
        if meta["class_names"] is None:
            del meta["class_names"]
        try:
            files = output.finish(meta)
        except OSError as exc:
            raise ConvertError(f"{out_path}: finishing the output failed: {exc.strerror or exc}") from exc
        if options.verify:
            _verify(output, digest)
        size = (
            output.tmp.stat().st_size
            if options.to == "hdf5"
            else sum(p.stat().st_size for p in output.tmp.iterdir())
        )
        try:
            output.publish()
        except OSError as exc:
            raise ConvertError(f"{out_path}: cannot move the finished output into place: {exc.strerror}") from exc
    except BaseException:
        output.abort()
        raise
    return ConvertResult(
        output=out_path,
        format=options.to,
        records=count,
        bytes=size,
        files=files,
        schema=output.schema,
        checksums=digest.result(),
        verified=options.verify,
        seconds=time.perf_counter() - started,
        notes=tuple(notes + output.notes),
    )
