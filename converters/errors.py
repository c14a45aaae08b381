"""Errors for known bad input.

Every error here carries a one-line message that names the file (and the record
or byte offset where there is one). ``loadprof.cli.main`` prints it as
``loadprof: error: <message>`` and exits 2; nothing else about it is shown, so
the message must stand on its own.
"""

from __future__ import annotations

import os
import re

__all__ = ["ConvertError", "CorruptFileError", "clean_message"]

# How Python shows an object without a useful str(): "<_io.BytesIO object at 0x7f...>".
_OBJECT_REPR = re.compile(r"<[\w.]+ object at 0x[0-9a-fA-F]+>")


def clean_message(exc: BaseException | str, name: str) -> str:
    """A library's error message with in-memory objects it names (a BytesIO holding a
    file's bytes, say) replaced by ``name``, the file or member they stand for."""
    return _OBJECT_REPR.sub(name, str(exc))


class ConvertError(Exception):
    """Bad input or an environment failure the user can fix: one line, no traceback."""

    def __init__(self, message: str) -> None:
        # One line is the contract with the CLI: fold anything a library put in. An object's
        # address means nothing to the user; callers name the file (clean_message).
        super().__init__(" ".join(_OBJECT_REPR.sub("(in memory)", str(message)).split()))


class CorruptFileError(ConvertError):
    """A file whose bytes are not what its format promises, at a known byte offset."""

    def __init__(self, path: str | os.PathLike[str], offset: int, reason: str) -> None:
        self.path = os.fspath(path)
        self.offset = offset
        self.reason = reason
        super().__init__(f"{self.path}: corrupt at byte offset {offset}: {reason}")

    def __reduce__(self) -> tuple[type[CorruptFileError], tuple[str, int, str]]:
        # Exceptions pickle as cls(*args); ours takes three, not the message.
        return (type(self), (self.path, self.offset, self.reason))
