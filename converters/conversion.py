"""Convert a source into HDF5 or sharded TFRecord, all or nothing.

NOTE [ No partial output ]
Output is written under a hidden temporary name beside ``out`` (a file for HDF5,
a directory of shards for TFRecord), verified if asked, and renamed into place
only at the end. Any failure, Ctrl-C included, removes the temporary output, so
``out`` is either absent, untouched (the old one), or complete.

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
removes those of processes on this host that no longer exist.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import h5py
import numpy as np

from . import hdf5, tfrecord
from .errors import ConvertError
from .schema import Field, Sample, SampleDigest, Schema
from .sources import Source, SourceOptions, open_source

__all__ = [
    "ConvertOptions",
    "ConvertResult",
    "ConversionStopped",
    "convert",
    "DEFAULT_SHARD_SIZE",
    "TFRECORD_FORMAT",
    "stop_on_signals",
]

Format = Literal["hdf5", "tfrecord"]

# TF's performance guide suggests 100-200 MB per file; TFDS uses 64 MiB-1 GiB.
DEFAULT_SHARD_SIZE = 128 << 20
TFRECORD_FORMAT = "loadprof-tfrecord"


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


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _replaceable(out: Path, options: ConvertOptions, inputs: list[Path]) -> frozenset[str] | None:
    """What of an existing OUT may be replaced: None when OUT does not exist, else the names
    inside a TFRecord output directory that are ours (empty for a file or an empty directory).

    NOTE [ What --overwrite replaces ]
    --overwrite replaces only a previous output of loadprof, recognised by what loadprof
    writes: an HDF5 file that starts with the HDF5 signature and carries the root attribute
    loadprof_format = "loadprof-hdf5"; or a directory holding exactly one
    ``SPLIT.info.json`` with "format": "loadprof-tfrecord" and regular files it lists as
    shards (and their ``.idx``), nothing else. An empty directory is fine for TFRecord.
    Never a symbolic link, the source, a directory containing the source, or anything
    inside a source directory, compared by device and inode so that other spellings
    (relative paths, ``.``, links, hard links) are caught too. Anything else is refused
    with one line: loadprof deletes nothing it did not write.
    """
    if not os.path.lexists(out):
        return None
    if options.to == "tfrecord" and out.is_dir() and not out.is_symlink() and not any(out.iterdir()):
        return frozenset()
    if not options.overwrite:
        raise ConvertError(f"{out}: already exists (pass --overwrite to replace it)")
    refuse = f"{out}: not replaced: --overwrite replaces only a previous loadprof output"
    if out.is_symlink():
        raise ConvertError(f"{refuse}, and this is a symbolic link")
    out_stat = out.stat()
    for src in inputs:
        try:
            src_stat = src.stat()
            real = src.resolve()
        except OSError:
            continue
        if _same(src_stat, out_stat):
            raise ConvertError(f"{out}: is the source {src}; choose another OUT")
        if any(_same(parent.stat(), out_stat) for parent in real.parents):
            raise ConvertError(f"{out}: contains the source {src}; choose another OUT")
        if src.is_dir() and any(_same(parent.stat(), src_stat) for parent in out.resolve().parents):
            raise ConvertError(f"{out}: is inside the source {src}; choose another OUT")
    if options.to == "hdf5":
        if out.is_dir():
            raise ConvertError(f"{out}: is a directory; HDF5 output is a file")
        why = _not_our_hdf5(out)
        if why:
            raise ConvertError(f"{refuse}, and this is {why}")
        return frozenset()
    if not out.is_dir():
        raise ConvertError(f"{refuse}, and this is a file, not a TFRecord output directory")
    ours, why = _our_tfrecord_entries(out)
    if ours is None:
        raise ConvertError(f"{refuse}, and this directory {why}")
    if not os.access(out, os.W_OK | os.X_OK):
        raise ConvertError(f"{out}: cannot replace its files: {os.strerror(errno.EACCES)}")
    return ours


_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_INFO_MAX_BYTES = 64 << 20  # an info file of ours lists shards: far smaller than this


def _not_our_hdf5(path: Path) -> str | None:
    """Why ``path`` is not an HDF5 file loadprof wrote, or None if it is one."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(_HDF5_SIGNATURE))
    except OSError as exc:
        return f"a file that cannot be read ({exc.strerror})"
    if head != _HDF5_SIGNATURE:
        return "not an HDF5 file"
    try:
        with h5py.File(path, "r") as f:
            found = f.attrs.get("loadprof_format")
    except (OSError, RuntimeError, ValueError, TypeError, KeyError):
        return "an HDF5 file h5py cannot open"
    if isinstance(found, bytes):
        found = found.decode("utf-8", "replace")
    if found != hdf5.FORMAT:
        return "an HDF5 file not written by loadprof (no loadprof_format attribute)"
    return None


def _our_tfrecord_entries(path: Path) -> tuple[frozenset[str] | None, str]:
    """The names in a TFRecord output directory of ours, or None and why it is not one."""
    try:
        with os.scandir(path) as it:
            entries = {e.name: (e.is_file(follow_symlinks=False), e.is_dir(follow_symlinks=False)) for e in it}
    except OSError as exc:
        return None, f"cannot be listed ({exc.strerror})"
    shown = {name: name + "/" if is_dir else name for name, (_, is_dir) in entries.items()}
    infos = [name for name in entries if name.endswith(".info.json")]
    if len(infos) != 1:
        return None, (
            f"holds {_names(sorted(shown.values()))}, not one loadprof output (no SPLIT.info.json)"
            if not infos
            else f"holds {len(infos)} info files ({_names(infos)}), not one loadprof output"
        )
    info_path = path / infos[0]
    listed: set[str] = set()
    info: Any = None
    try:
        if entries[infos[0]][0] and info_path.stat().st_size <= _INFO_MAX_BYTES:
            info = json.loads(info_path.read_bytes())
    except (OSError, ValueError):
        info = None
    if not isinstance(info, dict) or info.get("format") != TFRECORD_FORMAT:
        return None, f"holds {infos[0]}, which is not a loadprof info file"
    for shard in info.get("shards") or []:
        name = shard.get("file") if isinstance(shard, dict) else None
        if isinstance(name, str):
            listed |= {name, name + ".idx"}
    foreign = sorted(
        shown[name] for name, (is_file, _) in entries.items() if name != infos[0] and (not is_file or name not in listed)
    )
    if foreign:
        return None, f"holds {_names(foreign)}, not written by loadprof"
    return frozenset(entries), ""


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

_STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))
# Stop signals that end a process by default; SIGINT already raises KeyboardInterrupt.
_ENDING_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


class ConversionStopped(BaseException):
    """A stop signal arrived during a conversion (NOTE [ Signals during a conversion ]).

    A BaseException, like KeyboardInterrupt, so ``except Exception`` does not swallow it.
    """

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.signame = signal.Signals(signum).name
        super().__init__(f"stopped by {self.signame}")


@contextlib.contextmanager
def stop_on_signals(*, replace: bool = False) -> Iterator[None]:
    """Turn SIGTERM/SIGHUP into ConversionStopped inside the block (main thread only).

    replace=False (``convert``): only signals whose handler is the default, and after the
    block the signal is sent again, so the process still ends by it. replace=True (the CLI):
    every such signal, and ConversionStopped is left to the caller.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise ConversionStopped(signum)

    previous = {}
    for sig in _ENDING_SIGNALS:
        if replace or signal.getsignal(sig) == signal.SIG_DFL:
            previous[sig] = signal.signal(sig, stop)
    try:
        yield
    except ConversionStopped as exc:
        if not replace and exc.signum in previous:
            for sig in previous:
                signal.signal(sig, signal.SIG_DFL)
            previous = {}
            os.kill(os.getpid(), exc.signum)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Block stop signals (delivered at the end of the block): for steps that must not be cut in half."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _host_tag() -> str:
    return hashlib.blake2s(socket.gethostname().encode(), digest_size=4).hexdigest()


def _temp_prefix(out: Path, kind: str) -> str:
    return f".{out.name}.{kind}-{os.getpid()}-{_host_tag()}-"


# mkstemp/mkdtemp add 8 characters from [a-z0-9_].
_TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.(?:tmp|old)-(?P<pid>\d{1,10})-(?P<host>[0-9a-f]{8})-[a-z0-9_]{8}(?:\.h5)?$")


def _process_gone(pid: int) -> bool:
    if os.name != "posix" or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):  # EPERM: it exists, as another user's
        return False
    return False


def _remove_stale_temporaries(directory: Path) -> list[str]:
    """Remove temporary outputs of loadprof in ``directory`` left by processes of this host that
    no longer exist (NOTE [ Signals during a conversion ]); return their names."""
    try:
        with os.scandir(directory) as it:
            candidates = [e for e in it if e.name.startswith(".") and _TEMP_NAME.match(e.name)]
    except OSError:
        return []
    host = _host_tag()
    removed = []
    for entry in sorted(candidates, key=lambda e: e.name):
        m = _TEMP_NAME.match(entry.name)
        assert m is not None
        if m.group("host") != host or not _process_gone(int(m.group("pid"))):
            continue
        path = Path(entry.path)
        try:
            if entry.is_file(follow_symlinks=False):
                path.unlink()
            elif entry.is_dir(follow_symlinks=False):
                # Only what loadprof puts there: plain files, no subdirectories or links.
                with os.scandir(path) as inner:
                    files = list(inner)
                if not all(f.is_file(follow_symlinks=False) for f in files):
                    continue
                for f in files:
                    os.unlink(f.path)
                path.rmdir()
            else:
                continue
        except OSError:
            continue
        removed.append(entry.name)
    return removed


class _Output:
    """The temporary output and its writer; see NOTE [ No partial output ]."""

    def __init__(self, out: Path, options: ConvertOptions, replaces: frozenset[str] | None = None) -> None:
        self.out = out
        self.options = options
        # None: OUT did not exist; else the names in an existing OUT directory to move aside.
        self.replaces = replaces
        self.published = False
        prefix = _temp_prefix(out, "tmp")
        with _signals_held():  # not stopped between creating the temporary and knowing its name
            try:
                if options.to == "hdf5":
                    fd, name = tempfile.mkstemp(prefix=prefix, suffix=".h5", dir=out.parent)
                    os.close(fd)
                else:
                    name = tempfile.mkdtemp(prefix=prefix, dir=out.parent)
            except OSError as exc:
                raise ConvertError(f"{out}: cannot create output in {out.parent}: {exc.strerror}") from exc
            self.tmp = Path(name)
        # mkstemp/mkdtemp create 0600/0700; the published output should get the usual
        # permissions, as if created with open()/mkdir() under the current umask.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(name, (0o666 if options.to == "hdf5" else 0o777) & ~umask)
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
            self.tf.write(tfrecord.encode_sample(self.schema, sample))

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
            "encoding": {f.name: tfrecord.feature_encoding(f) for f in self.schema.fields},
            "shards": [asdict(s) for s in shards],
            **meta,
        }
        info_path = tfrecord.info_path_for(self.tmp, self.options.split)
        info_path.write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
        names = [s.file for s in shards]
        return [self.out / n for n in names] + [self.out / (n + ".idx") for n in names] + [self.out / info_path.name]

    def abort(self) -> None:
        if self.published:
            return
        with _signals_held():
            for writer in (self.h5, self.tf):
                if writer is not None:
                    writer.abort()
            if self.tmp.is_dir():
                shutil.rmtree(self.tmp, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    self.tmp.unlink()

    def publish(self) -> None:
        out = self.out
        with _signals_held():
            if self.options.to == "hdf5" or self.replaces is None:
                os.replace(self.tmp, out)  # atomic; for a directory, OUT did not exist
            else:
                self._publish_into(out, self.replaces)
            self.published = True

    def _publish_into(self, out: Path, replaces: frozenset[str]) -> None:
        """Swap the files of an existing OUT directory for ours, keeping the directory itself
        (it may be the current directory or a mount point, which cannot be renamed). Old files
        go to a hidden directory beside OUT first, the info file first of all and back last,
        so a directory without its info file is visibly incomplete; any failure puts back
        what was moved."""
        old = Path(tempfile.mkdtemp(prefix=_temp_prefix(out, "old"), dir=out.parent))
        new = sorted(os.listdir(self.tmp), key=lambda n: n.endswith(".info.json"))
        moved_old: list[str] = []
        moved_new: list[str] = []
        try:
            for name in sorted(replaces, key=lambda n: not n.endswith(".info.json")):
                try:
                    os.rename(out / name, old / name)
                except FileNotFoundError:
                    continue
                moved_old.append(name)
            for name in new:
                os.rename(self.tmp / name, out / name)
                moved_new.append(name)
        except OSError:
            for name in reversed(moved_new):
                with contextlib.suppress(OSError):
                    os.rename(out / name, self.tmp / name)
            for name in reversed(moved_old):
                with contextlib.suppress(OSError):
                    os.rename(old / name, out / name)
            with contextlib.suppress(OSError):
                old.rmdir()
            raise
        os.rmdir(self.tmp)
        shutil.rmtree(old, ignore_errors=True)


def _read_back(tmp: Path, options: ConvertOptions, schema: Schema) -> Iterator[Sample]:
    if options.to == "hdf5":
        reader = hdf5.HDF5Reader(tmp)
        try:
            yield from reader.iter_samples()
        finally:
            reader.close()
        return
    decode = tfrecord.SampleDecoder(schema)
    for shard in sorted(tmp.glob("*.tfrecord")):
        index = tfrecord.read_index(tfrecord.index_path_for(shard))
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
    for sample in _read_back(output.tmp, output.options, output.schema):
        digest.update(sample)
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
    replaces = _replaceable(out_path, options, inputs)
    source = open_source(src, options.source)
    total = len(source)
    if total == 0:
        raise ConvertError(f"{src}: holds no samples")
    notes = list(source.notes)
    stale = _remove_stale_temporaries(out_path.parent)
    if stale:
        shown = _names([str(out_path.parent / name) for name in stale])
        notes.append(f"removed {shown}: temporary output left by a conversion that did not finish")
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
        notes=tuple(notes),
    )
