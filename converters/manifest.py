"""The info file as the manifest of a TFRecord output: which shards make it whole.

NOTE [ The info file is the manifest ]
A TFRecord output of loadprof is a directory holding one ``SPLIT.info.json`` and exactly
the shards it lists, ``SPLIT-NNNNN-of-MMMMM.tfrecord`` for N in 0..M-1, each with its
``.idx``. A folder cut short, with a shard deleted, or with a stray ``.tfrecord`` added
would otherwise read as another, smaller or larger, dataset without a word. So readers
and ``inspect`` (``dataset_files``) refuse, in one line naming the files:

* a shard the info file lists that is missing, or a ``.tfrecord`` it does not list;
* an info file that is not a complete manifest (``manifest_problem``);
* shards named and indexed as loadprof writes them with no info file beside them;
* shards named ``...-of-MMMMM`` (any writer) of which some of the M are missing.

Shards of other writers without an info file are read as they are.

``owned`` decides what ``--overwrite`` may delete and whether a leftover folder holds
a whole output: only files the manifest lists, whose size is the one it records and
whose first and last records' framing (length CRC-32C) checks. That costs a few small
reads per shard, whatever the shard's size.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import tfrecord
from .errors import ConvertError
from .files import check_regular

__all__ = ["FORMAT", "INFO_SUFFIX", "manifest_problem", "read_manifest", "info_beside", "dataset_files", "Owned", "owned", "owned_fd", "names"]

FORMAT = "loadprof-tfrecord"
INFO_SUFFIX = ".info.json"
# Far above what a conversion writes (a few KB, plus class names); parsing more JSON
# than this would take memory out of proportion to any real dataset description.
_INFO_MAX_BYTES = 16 << 20
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def names(items: Sequence[str], most: int = 3) -> str:
    """Up to ``most`` names, then how many more: for one-line messages."""
    shown = ", ".join(items[:most])
    return shown + (f" and {len(items) - most} more" if len(items) > most else "")


def manifest_problem(info: Mapping[str, Any], split: str) -> str | None:
    """Why a checked info file (``tfrecord.check_info``) named for ``split`` is not a complete
    manifest of a loadprof output, or None. Our writer lists shards 0..M-1 in order."""
    if info.get("format") != FORMAT:
        return f"'format' is {json.dumps(info.get('format'))}, not \"{FORMAT}\""
    if info.get("split") != split:
        return f"'split' is {json.dumps(info.get('split'))}, the file is named for \"{split}\""
    shards = info.get("shards")
    if not shards:
        return "lists no shards"
    for i, shard in enumerate(shards):
        parsed = tfrecord.parse_shard_name(shard["file"])
        if parsed is None or parsed[0] != split:
            return f"'shards' entry {i} is {json.dumps(shard['file'])}, not a name loadprof gives a shard of \"{split}\""
    for i, shard in enumerate(shards):
        want = tfrecord.shard_name(split, i, len(shards))
        if shard["file"] != want:
            return f"'shards' entry {i} is {json.dumps(shard['file'])}, loadprof names it \"{want}\""
        if "bytes" not in shard:
            return f"'shards' entry {i} ({want}) has no 'bytes' size"
    if "schema" not in info:
        return "has no 'schema'"
    total = sum(s["records"] for s in shards)
    if info.get("num_records") != total:
        return f"'num_records' is {json.dumps(info.get('num_records'))}, its shards list {total}"
    return None


def _parse_info(raw: bytes, where: Path, split: str) -> dict[str, Any]:
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ConvertError(f"{where}: not valid JSON: {exc}") from None
    problem = tfrecord.check_info(data) or manifest_problem(data, split)
    if problem is not None:
        raise ConvertError(f"{where}: {problem}")
    return data  # type: ignore[no-any-return]


def read_manifest(path: Path, split: str) -> dict[str, Any]:
    """A ``SPLIT.info.json``, checked as a complete manifest; ConvertError otherwise."""
    from .files import open_regular

    with open_regular(path, "an info file") as f:
        size = os.fstat(f.fileno()).st_size
        if size > _INFO_MAX_BYTES:
            raise ConvertError(f"{path}: {size} bytes, too large for an info file (at most {_INFO_MAX_BYTES})")
        raw = f.read()
    return _parse_info(raw, path, split)


# ---------------------------------------------------------------- readers and inspect


def _indexed_ours(directory: Path, shard_names: list[str], present: set[str]) -> list[str]:
    """Shards named as loadprof names them that have their ``.idx`` beside them."""
    return [n for n in shard_names if tfrecord.parse_shard_name(n) and n + ".idx" in present]


def _directory(d: Path) -> tuple[list[Path], dict[str, Any] | None]:
    try:
        present = set(os.listdir(d))
    except OSError as exc:
        raise ConvertError(f"{d}: cannot list: {exc.strerror or exc}") from None
    infos = sorted(n for n in present if n.endswith(INFO_SUFFIX))
    shards = sorted(n for n in present if n.endswith(".tfrecord"))
    if len(infos) > 1:
        raise ConvertError(f"{d}: holds {len(infos)} info files ({names(infos)}): one loadprof output per directory")
    if infos:
        info = read_manifest(d / infos[0], infos[0][: -len(INFO_SUFFIX)])
        listed = [s["file"] for s in info["shards"]]
        missing = [n for n in listed if n not in present]
        if missing:
            raise ConvertError(
                f"{d}: {names(missing)} listed in {infos[0]} {'is' if len(missing) == 1 else 'are'} missing: "
                "an incomplete output"
            )
        extra = sorted(set(shards) - set(listed))
        if extra:
            raise ConvertError(f"{d}: holds {names(extra)}, not listed in {infos[0]}: not part of this output")
        return [d / n for n in listed], info
    if not shards:
        raise ConvertError(f"{d}: no *.tfrecord files in this directory")
    ours = _indexed_ours(d, shards, present)
    if ours:
        split = tfrecord.parse_shard_name(ours[0])[0]  # type: ignore[index]
        raise ConvertError(
            f"{d}: holds loadprof shards ({names(ours)}) with their .idx but no {split}{INFO_SUFFIX}: "
            "an incomplete output (a conversion cut short, or the info file deleted)"
        )
    # Another writer's -of-M names still say how many shards there are.
    groups: dict[tuple[str, int], set[int]] = {}
    for n in shards:
        parsed = tfrecord.parse_shard_name(n)
        if parsed is not None:
            groups.setdefault((parsed[0], parsed[2]), set()).add(parsed[1])
    for (split, count), found in sorted(groups.items()):
        missing = [tfrecord.shard_name(split, i, count) for i in range(count) if i not in found]
        if missing:
            raise ConvertError(f"{d}: {names(missing)} missing ({len(found)} of {count} shards of {split})")
    return [d / n for n in shards], None


def info_beside(shard: Path) -> dict[str, Any] | None:
    """The info file of the output ``shard`` belongs to; None for another writer's shard."""
    parsed = tfrecord.parse_shard_name(shard.name)
    if parsed is None:
        return None
    info_path = tfrecord.info_path_for(shard.parent, parsed[0])
    if not os.path.lexists(info_path):
        if os.path.lexists(tfrecord.index_path_for(shard)):
            raise ConvertError(
                f"{shard}: a loadprof shard with its .idx but no {info_path.name} beside it: an incomplete "
                "output (a conversion cut short, or the info file deleted)"
            )
        return None
    info = read_manifest(info_path, parsed[0])
    if shard.name not in {s["file"] for s in info["shards"]}:
        raise ConvertError(f"{shard}: not listed in {info_path.name}: not part of that output")
    return info


def dataset_files(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
) -> tuple[list[Path], dict[str, Any] | None]:
    """The shards to read, and the info file of the first one's output (None for another
    writer's files), checked against their manifest (NOTE [ The info file is the manifest ])."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    out: list[Path] = []
    first: dict[str, Any] | None = None
    for k, item in enumerate(items):
        p = Path(item)
        if p.is_dir():
            shards, info = _directory(p)
        else:
            check_regular(p, "a TFRecord file")  # a FIFO would block the reader, a directory fail mid-read
            shards, info = [p], info_beside(p)
        if k == 0:
            first = info
        out.extend(shards)
    for p in out:
        check_regular(p, "a TFRecord file")
    if not out:
        raise ConvertError("no TFRecord files given")
    return out, first


# ---------------------------------------------------------------- what --overwrite may delete


@dataclass(frozen=True)
class Owned:
    """What a directory holds of a loadprof output: ``files``, the names that are ours (None
    when the directory is not one of our outputs, and ``why``); ``whole``: every listed file
    is there and checks."""

    files: frozenset[str] | None
    whole: bool
    why: str = ""


@contextlib.contextmanager
def _opened_dir(path: str | os.PathLike[str]) -> Iterator[int]:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW)
    try:
        yield fd
    finally:
        os.close(fd)


def _frame_ok(fd: int, offset: int, framed: int | None, size: int) -> bool:
    """The record header at ``offset`` has a valid length CRC, and its record fits (or is
    ``framed`` bytes long, and ends the file when that is given)."""
    head = os.pread(fd, 12, offset)
    if len(head) != 12:
        return False
    (length,) = struct.unpack_from("<Q", head)
    if tfrecord.masked_crc32c(head[:8]) != struct.unpack_from("<I", head, 8)[0]:
        return False
    if framed is not None:
        return length + tfrecord.FRAMING_BYTES == framed and offset + framed == size
    return bool(offset + length + tfrecord.FRAMING_BYTES <= size)


def _last_index_line(fd: int, size: int) -> tuple[int, int] | None:
    tail = os.pread(fd, 64, max(0, size - 64))
    lines = tail.rstrip(b"\n").rsplit(b"\n", 1)
    parts = lines[-1].split()
    if not tail.endswith(b"\n") or len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


def _shard_is_ours(dir_fd: int, name: str, size_listed: int, records: int, has_idx: bool) -> bool:
    fd = os.open(name, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0), dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != size_listed:
            return False
        if records == 0:
            return st.st_size == 0
        if not _frame_ok(fd, 0, None, st.st_size):
            return False
    finally:
        os.close(fd)
    return not has_idx or _index_is_ours(dir_fd, name + ".idx", size_listed, dir_fd, name)


def _index_is_ours(dir_fd: int, idx: str, size_listed: int, shard_dir_fd: int | None, shard: str | None) -> bool:
    """The last line of an ``.idx`` ends its shard at the size the manifest records (and,
    with the shard there, points at a record header that checks)."""
    fd = os.open(idx, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0), dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return False
        last = _last_index_line(fd, st.st_size) if st.st_size else None
    finally:
        os.close(fd)
    if last is None:
        return st.st_size == 0 and size_listed == 0
    offset, framed = last
    if offset + framed != size_listed:
        return False
    if shard is None or shard_dir_fd is None:
        return True
    sfd = os.open(shard, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0), dir_fd=shard_dir_fd)
    try:
        return _frame_ok(sfd, offset, framed, size_listed)
    finally:
        os.close(sfd)


def owned(path: str | os.PathLike[str]) -> Owned:
    """What of the directory ``path`` (not followed if a link) is a loadprof TFRecord output;
    see NOTE [ The info file is the manifest ]. A few small reads per shard."""
    try:
        with _opened_dir(path) as fd:
            return owned_fd(fd)
    except OSError as exc:
        return Owned(None, False, f"cannot be read ({exc.strerror or exc})")


def owned_fd(fd: int) -> Owned:
    """``owned`` of the directory open as ``fd``."""
    try:
        return _owned(fd)
    except OSError as exc:
        return Owned(None, False, f"cannot be read ({exc.strerror or exc})")


def _owned(fd: int) -> Owned:
    with os.scandir(fd) as it:
        entries = {e.name: (e.is_file(follow_symlinks=False), e.is_dir(follow_symlinks=False)) for e in it}
    shown = sorted(name + "/" if is_dir else name for name, (_, is_dir) in entries.items())
    if not entries:
        return Owned(frozenset(), False)
    infos = sorted(n for n in entries if n.endswith(INFO_SUFFIX))
    if len(infos) != 1:
        return Owned(None, False, (
            f"holds {names(shown)}, not one loadprof output (no SPLIT{INFO_SUFFIX})" if not infos
            else f"holds {len(infos)} info files ({names(infos)}), not one loadprof output"))
    info_name = infos[0]
    not_ours = Owned(None, False, f"holds {info_name}, which is not a loadprof info file")
    info_fd = os.open(info_name, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0), dir_fd=fd)
    try:
        st = os.fstat(info_fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > _INFO_MAX_BYTES:
            return not_ours
        raw = os.pread(info_fd, st.st_size, 0)
    finally:
        os.close(info_fd)
    try:
        info = _parse_info(raw, Path(info_name), info_name[: -len(INFO_SUFFIX)])
    except ConvertError as exc:
        return Owned(None, False, f"holds {info_name}, which is not a complete loadprof info file "
                                  f"({str(exc).removeprefix(info_name + ': ')})")
    listed = {s["file"]: s for s in info["shards"]}
    allowed = set(listed) | {n + ".idx" for n in listed} | {info_name}
    foreign = sorted(
        (n + "/" if entries[n][1] else n) for n in entries if n not in allowed or not entries[n][0]
    )
    if foreign:
        return Owned(None, False, f"holds {names(foreign)}, not written by loadprof")
    for name, shard in listed.items():
        has_idx = name + ".idx" in entries
        if name in entries:
            ok = _shard_is_ours(fd, name, shard["bytes"], shard["records"], has_idx)
        else:
            ok = not has_idx or _index_is_ours(fd, name + ".idx", shard["bytes"], None, None)
        if not ok:
            return Owned(None, False, f"holds {name}{'' if name in entries else '.idx'}, whose size or framing "
                                      f"is not what {info_name} records: not written by loadprof")
    whole = all(n in entries and n + ".idx" in entries for n in listed)
    return Owned(frozenset(entries), whole)
