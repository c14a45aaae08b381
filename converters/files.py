"""Opening files users hand the readers: regular files only.

A FIFO blocks ``open`` until a writer comes (``inspect`` hung on one), a character
device such as /dev/zero reads as an endless or empty file, and a directory raises
IsADirectoryError mid-read. Each is refused with one line before anything is read.
The check is made on the opened descriptor (``O_NONBLOCK`` so a FIFO cannot block
the open), so a path swapped between a check and the open cannot slip through.
"""

from __future__ import annotations

import os
import stat
from typing import BinaryIO

from .errors import ConvertError

__all__ = ["describe_mode", "check_regular", "open_regular"]

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def describe_mode(mode: int) -> str:
    """What kind of file ``mode`` describes, in words: "a FIFO", "a directory", ..."""
    for test, words in _KINDS:
        if test(mode):
            return words
    return "not a regular file"


def _refuse(path: str | os.PathLike[str], mode: int, what: str) -> ConvertError:
    return ConvertError(f"{os.fspath(path)}: is {describe_mode(mode)}, not {what}")


def check_regular(path: str | os.PathLike[str], what: str = "a regular file") -> os.stat_result:
    """``os.stat(path)`` when it is a regular file (links followed); ConvertError otherwise."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ConvertError(f"{os.fspath(path)}: no such file or directory") from None
    except OSError as exc:
        raise ConvertError(f"{os.fspath(path)}: cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, st.st_mode, what)
    return st


def open_regular(
    path: str | os.PathLike[str], what: str = "a regular file", buffering: int = -1
) -> BinaryIO:
    """Open ``path`` for binary reading if it is a regular file; ConvertError otherwise."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise ConvertError(f"{os.fspath(path)}: no such file or directory") from None
    except IsADirectoryError:
        raise ConvertError(f"{os.fspath(path)}: is a directory, not {what}") from None
    except OSError as exc:
        raise ConvertError(f"{os.fspath(path)}: cannot open: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _refuse(path, mode, what)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)  # no effect on a regular file's reads; restores the usual flags
        return open(fd, "rb", buffering=buffering)
    except BaseException:
        os.close(fd)
        raise

