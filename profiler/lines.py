"""One-line texts for the user: an error's first line, a note on stderr."""

from __future__ import annotations

import sys


def first_line(err: BaseException, limit: int = 300) -> str:
    """The first line of what ``err`` says, at most ``limit`` characters."""
    text = str(err)
    return text.splitlines()[0][:limit] if text else ""


def note(line: str) -> None:
    """One line on stderr, which may itself be gone (a closed pipe): never raises."""
    try:
        print(f"loadprof: {line}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def warn(line: str) -> None:
    """A warning line on stderr, as ``note`` writes one."""
    note(f"warning: {line}")
