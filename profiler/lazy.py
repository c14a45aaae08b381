"""A package's public names, imported on first use (PEP 562).

``profiler`` and ``loadprof.samplers`` name their API in ``__init__`` but import
a submodule only when one of its names is first read, so that importing one
submodule does not load them all (the host sampler's helper process imports
``loadprof.samplers.hostproc`` and what it needs, nothing else).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable
from typing import Any


def lazy_names(
    package: str, where: dict[str, str], public: Iterable[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package``: ``where`` maps
    each public name to the submodule (relative to the package) that defines it."""
    namespace = sys.modules[package].__dict__
    names = set(public)

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        namespace[name] = value  # once: later lookups do not come here
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | names)

    return __getattr__, __dir__
