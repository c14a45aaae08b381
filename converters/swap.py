"""Putting a finished TFRecord output in place of OUT, and what a conversion cut short leaves.

NOTE [ Replacing OUT in one step ]
A TFRecord output is a directory, written under the hidden temporary name
``.OUT.tmp-PID-HOST-XXXXXXXX`` beside OUT. It takes OUT's place in one step that a
kill cannot split:

* OUT absent: ``renameat2(RENAME_NOREPLACE)``, so nothing that appeared there meanwhile
  is replaced (``os.rename`` where there is no renameat2: it cannot replace a file, a
  link or a non-empty directory either).
* OUT present, and checked to be ours (NOTE [ What --overwrite replaces ] in
  overwrite.py) once more just before: ``renameat2(RENAME_EXCHANGE)`` swaps the two
  names at once. The previous output is then under the temporary's name; its files
  are deleted, info file first, so a half-deleted one is visibly incomplete.
  Where the filesystem or libc cannot exchange, OUT is first renamed aside to
  ``.OUT.old-PID-HOST-XXXXXXXX`` (the previous output), then the new one renamed to
  OUT, then the old one deleted.

A SIGKILL between two of these steps leaves OUT a whole output (the old or the new
one), or, in the fallback, absent while ``.OUT.old-...`` holds the whole previous
output. So the next conversion in that directory (``clean_leftovers``) treats a
leftover that holds a whole output (its info file and every file it lists check,
``manifest.owned``) as possibly the only copy: renamed back to OUT when OUT is
absent, kept and said when OUT is not a whole output, deleted only when OUT is one.
Other leftovers, partial ones, are deleted as before: only those of processes of
this host that no longer exist, and only when they hold nothing but plain files.

The current directory and a mount point cannot be renamed: they are refused as OUT.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import re
import socket
import stat
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from . import manifest
from .errors import ConvertError

__all__ = ["Previous", "host_tag", "temp_prefix", "put_in_place", "clean_leftovers"]

_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_NOFOLLOW_DIR = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _libc_renameat2() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2  # glibc >= 2.28, musl >= 1.2.?
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


# The libc call, or None where there is none (tests replace it to cut a swap short).
_renameat2 = _libc_renameat2()


def _rename2(src: Path, dst: Path, flags: int) -> bool:
    """renameat2(src, dst, flags): False where this system or filesystem lacks it; OSError
    for any other failure."""
    call = _renameat2
    if call is None:
        return False
    if call(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(src), None, str(dst))


@contextlib.contextmanager
def _opened_dir(path: Path) -> Iterator[int]:
    fd = os.open(path, _NOFOLLOW_DIR)  # never a directory reached through a link
    try:
        yield fd
    finally:
        os.close(fd)


def host_tag() -> str:
    return hashlib.blake2s(socket.gethostname().encode(), digest_size=4).hexdigest()


def temp_prefix(out: Path, kind: str) -> str:
    return f".{out.name}.{kind}-{os.getpid()}-{host_tag()}-"


@dataclass(frozen=True)
class Previous:
    """An existing OUT directory that may be replaced: its identity and the names in it
    that are ours, as checked when the conversion began."""

    device: int
    inode: int
    files: frozenset[str]


def put_in_place(tmp: Path, out: Path, previous: Previous | None) -> list[str]:
    """Make the finished directory ``tmp`` OUT (NOTE [ Replacing OUT in one step ]); return
    notes for the user. OSError or ConvertError leaves OUT as it was."""
    if previous is None:
        if not _rename2(tmp, out, _RENAME_NOREPLACE):
            os.rename(tmp, out)
        return []
    st = os.lstat(out)
    if not stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) != (previous.device, previous.inode):
        raise ConvertError(f"{out}: was replaced by something else during the conversion; not replaced")
    now = manifest.owned(out)
    if now.files is None:
        raise ConvertError(f"{out}: not replaced: during the conversion this directory came to {now.why}")
    if _rename2(tmp, out, _RENAME_EXCHANGE):
        aside = tmp
    else:
        aside = Path(tempfile.mkdtemp(prefix=temp_prefix(out, "old"), dir=out.parent))
        try:
            os.rename(out, aside)  # onto the empty directory just made
        except OSError:
            os.rmdir(aside)
            raise
        try:
            os.rename(tmp, out)
        except OSError:
            os.rename(aside, out)
            raise
    return _remove_previous(aside, out, now.files, (st.st_dev, st.st_ino))


def _remove_previous(aside: Path, out: Path, files: frozenset[str], identity: tuple[int, int]) -> list[str]:
    """Delete the previous output now under ``aside``: only the files checked as ours."""
    try:
        with _opened_dir(aside) as fd:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != identity:
                return [f"left {aside}: it is not the previous {out.name} this conversion checked"]
            present = set(os.listdir(fd))
            for name in sorted(present & files, key=lambda n: not n.endswith(manifest.INFO_SUFFIX)):
                os.unlink(name, dir_fd=fd)
        os.rmdir(aside)
    except OSError as exc:
        return [f"left {aside}: the previous {out.name}, which could not be removed ({exc.strerror or exc})"]
    return []


# ---------------------------------------------------------------- leftovers of a conversion cut short

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


def _whole_output(path: Path) -> bool:
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return False
    except OSError:
        return False
    return manifest.owned(path).whole


def clean_leftovers(directory: Path) -> tuple[list[str], list[str]]:
    """Deal with the temporary outputs in ``directory`` of processes of this host that no
    longer exist (NOTE [ Replacing OUT in one step ]): return the names removed, and
    notes on those restored or kept."""
    try:
        with os.scandir(directory) as it:
            candidates = sorted((e for e in it if e.name.startswith(".") and _TEMP_NAME.match(e.name)),
                                key=lambda e: e.name)  # .OUT.old-* before .OUT.tmp-*: restore the previous first
    except OSError:
        return [], []
    host = host_tag()
    removed: list[str] = []
    notes: list[str] = []
    for entry in candidates:
        m = _TEMP_NAME.match(entry.name)
        assert m is not None
        if m.group("host") != host or not _process_gone(int(m.group("pid"))):
            continue
        path = Path(entry.path)
        try:
            if entry.is_file(follow_symlinks=False):
                path.unlink()
                removed.append(entry.name)
                continue
            if not entry.is_dir(follow_symlinks=False):
                continue
            with _opened_dir(path) as fd:
                with os.scandir(fd) as inner:
                    files = [(f.name, f.is_file(follow_symlinks=False)) for f in inner]
                # Only what loadprof puts there: plain files, no subdirectories or links.
                if not all(is_file for _, is_file in files):
                    continue
                if files and manifest.owned_fd(fd).whole:
                    out = directory / m.group("name")
                    if not os.path.lexists(out):
                        if not _rename2(path, out, _RENAME_NOREPLACE):
                            os.rename(path, out)
                        notes.append(f"restored {out} from {path}: a whole output left aside by a conversion "
                                     "that did not finish")
                        continue
                    if not _whole_output(out):
                        notes.append(f"kept {path}: it holds a whole output and {out} is not one; rename it to "
                                     f"{out.name} to use it")
                        continue
                for name, _ in files:
                    os.unlink(name, dir_fd=fd)
            path.rmdir()
        except OSError:
            continue
        removed.append(entry.name)
    return removed, notes
