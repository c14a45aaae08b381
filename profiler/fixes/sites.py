"""Where a fix's target was built in the user's code: the first frame outside the
framework and loadprof, and how a value is shown in the lines about it."""

from __future__ import annotations

import os
from types import FrameType
from typing import Any

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def is_framework_file(filename: str, roots: tuple[str, ...]) -> bool:
    return filename.startswith(roots) or filename.startswith(_PACKAGE_DIR) or filename.startswith("<frozen")


def call_site(frame: FrameType | None, roots: tuple[str, ...], init_of: type | None = None) -> tuple[str, int] | None:
    """(file, line) of the first frame outside the framework, loadprof and ``init_of`` subclasses' __init__."""
    while frame is not None:
        code = frame.f_code
        if init_of is not None and code.co_name == "__init__" and isinstance(frame.f_locals.get("self"), init_of):
            frame = frame.f_back
            continue
        if not is_framework_file(code.co_filename, roots):
            return os.path.abspath(code.co_filename) if not code.co_filename.startswith("<") else code.co_filename, frame.f_lineno
        frame = frame.f_back
    return None


def fmt(value: Any) -> str:
    return repr(value)


