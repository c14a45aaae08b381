"""How the report names a user's function: ``qualname (file.py:line)``, as its author wrote it.

Framework-free: each framework unwraps its own wrappers (TensorFlow's ``EagerFunc``, a
torchdata ``MapOverBatch``) before asking.
"""

from __future__ import annotations

import functools
import os
from typing import Any

__all__ = ["callable_name"]


def callable_name(fn: Any) -> str:
    """``qualname (file.py:line)`` of a Python callable (a function, a bound method, a
    ``functools.partial``, an object with ``__call__``); its qualname (or type's) alone where no
    source line is known."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    name = getattr(target, "__qualname__", None) or type(target).__qualname__
    code = getattr(target, "__code__", None) or getattr(getattr(target, "__func__", None), "__code__", None)
    if code is None:  # a callable object: its class's __call__
        code = getattr(vars(type(target)).get("__call__"), "__code__", None)
    if code is None:
        return str(name)
    return f"{name} ({os.path.basename(code.co_filename)}:{code.co_firstlineno})"
