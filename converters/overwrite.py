"""Whether a conversion may replace what is at OUT (NOTE [ What --overwrite replaces ]): only a
previous output of loadprof, never the source, a link, or anything a user put there.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from . import hdf5check, manifest, swap
from .errors import ConvertError

__all__ = ["replaceable"]


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def replaceable(out: Path, to: str, overwrite: bool, inputs: list[Path]) -> swap.Previous | None:
    """What of an existing OUT may be replaced by a conversion ``to`` "hdf5" or "tfrecord"
    (``overwrite``: --overwrite was given): None when OUT does not exist, else OUT's identity
    and the names inside a TFRecord output directory that are ours (none for a file or an
    empty directory).

    NOTE [ What --overwrite replaces ]
    --overwrite replaces only a previous output of loadprof, recognised by what loadprof
    writes: an HDF5 file that starts with the HDF5 signature, carries the root attribute
    loadprof_format = "loadprof-hdf5" and passes every check a reader makes when it opens
    it (``hdf5check.check_output``: schema and attributes, each dataset against the schema,
    record counts, offsets, chunk indexes, the per-record checksum table), parsed in a
    watched child. Those checks are what make a file one of ours rather than a file with
    our attribute: a file on which libhdf5 crashes or loops, or whose layout a reader
    refuses, is refused too (the user deletes it if it is theirs to lose). Its data is not
    read: a file of ours with damaged records is still ours, and converting again is how
    it gets mended; or a directory holding exactly one
    ``SPLIT.info.json``, a complete manifest with "format": "loadprof-tfrecord", and regular
    files it lists as shards (and their ``.idx``), nothing else, each shard of the size the
    info file records and with valid framing at its first and last record (``manifest.owned``:
    a hand-edited info file cannot make a user's file one of ours). An empty directory is
    fine for TFRecord. Never a symbolic link, the current directory or a mount point (they
    cannot be renamed: NOTE [ Replacing OUT in one step ]), the source, a directory
    containing the source, or anything inside a source directory, compared by device and
    inode so that other spellings (relative paths, ``.``, links, hard links) are caught too.
    Anything else is refused with one line: loadprof deletes nothing it did not write.
    """
    if not os.path.lexists(out):
        return None
    out_lstat = out.lstat()
    if stat.S_ISDIR(out_lstat.st_mode) and to == "tfrecord" and not any(out.iterdir()):
        _check_renamable(out, out_lstat)
        return swap.Previous(out_lstat.st_dev, out_lstat.st_ino, frozenset())
    if not overwrite:
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
    if to == "hdf5":
        if out.is_dir():
            raise ConvertError(f"{out}: is a directory; HDF5 output is a file")
        why = _not_our_hdf5(out)
        if why:
            raise ConvertError(f"{refuse}, and this is {why}")
        return swap.Previous(out_stat.st_dev, out_stat.st_ino, frozenset())
    if not out.is_dir():
        raise ConvertError(f"{refuse}, and this is a file, not a TFRecord output directory")
    _check_renamable(out, out_stat)
    ours = manifest.owned(out)
    if ours.files is None:
        raise ConvertError(f"{refuse}, and this directory {ours.why}")
    if not os.access(out.parent, os.W_OK | os.X_OK):
        raise ConvertError(f"{out}: cannot replace it: {out.parent}: {os.strerror(errno.EACCES)}")
    return swap.Previous(out_stat.st_dev, out_stat.st_ino, ours.files)


def _check_renamable(out: Path, out_stat: os.stat_result) -> None:
    """Refuse a directory that cannot be renamed (NOTE [ Replacing OUT in one step ])."""
    if _same(out_stat, os.stat(os.curdir)):
        raise ConvertError(f"{out}: is the current directory, which cannot be replaced in one step; run from its parent")
    if out_stat.st_dev != out.parent.stat().st_dev:
        raise ConvertError(f"{out}: is a mount point, which cannot be replaced in one step; write to a directory inside it")


_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


def _not_our_hdf5(path: Path) -> str | None:
    """Why ``path`` is not an HDF5 file loadprof wrote, or None if it is one.

    libhdf5 reads the file in a child that is stopped if it hangs: OUT may be any
    file (NOTE [ Parsing HDF5 in a child process ] in watchdog.py). NOTE [ What --overwrite replaces ].
    """
    from . import watchdog

    try:
        with open(path, "rb") as fh:
            head = fh.read(len(_HDF5_SIGNATURE))
            size = os.fstat(fh.fileno()).st_size
    except OSError as exc:
        return f"a file that cannot be read ({exc.strerror})"
    if head != _HDF5_SIGNATURE:
        return "not an HDF5 file"
    try:
        why: str | None = watchdog.run_watched(
            hdf5check.check_output, (str(path),), path=path, memory=watchdog.memory_budget(size)
        )
    except ConvertError as exc:
        return f"an HDF5 file libhdf5 cannot read ({str(exc).removeprefix(f'{path}: ')})"
    return why
