"""Watching a tracker's own calls while a Profile runs: after each call of one method of
one class (found once the script imports its module), a callback notes what it made.

Wrapped through the one patcher (NOTE [ One patcher ] in patch.py), and only once the
script imports the module (an import watch, as for the framework hooks): loadprof
never imports a tracker the script did not. Once stopped, a wrapper that could not be
removed is inert.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ..instrument import ImportWatch
from ..patch import Patches


class MethodWatch:
    """Calls ``noted(obj, result)`` after each ``obj.<method>(...)`` of the class named
    ``attr`` in each of ``modules``, between ``start()`` and ``stop()``; with ``before``,
    ``noted(obj, None)`` before the call instead (what it ends is still there)."""

    def __init__(self, name: str, modules: Sequence[str], attr: str, method: str,
                 noted: Callable[[Any, Any], None], before: bool = False) -> None:
        self._patches = Patches(name)
        self._modules = tuple(modules)
        self._attr, self._method, self._noted, self._before = attr, method, noted, before
        self._finder: ImportWatch | None = None
        self._on = False

    def start(self) -> MethodWatch:
        self._on = True
        pending = [name for name in self._modules if name not in sys.modules]
        for name in self._modules:
            if name in sys.modules:
                self._wrap(name)
        if pending:
            self._finder = ImportWatch(pending, self._wrap).install()
        return self

    def _wrap(self, module: str) -> None:
        cls = getattr(sys.modules.get(module), self._attr, None)
        if not isinstance(cls, type) or not self._on:
            return
        watch = self

        def make(inner: Any) -> Any:
            @functools.wraps(inner)
            def call(obj: Any, *args: Any, **kwargs: Any) -> Any:
                if watch._before and watch._on:
                    watch._noted(obj, None)
                result = inner(obj, *args, **kwargs)
                if not watch._before and watch._on:  # inert once the watch stopped (NOTE [ One patcher ])
                    watch._noted(obj, result)
                return result

            return call

        self._patches.wrap(cls, self._method, make)

    def stop(self) -> list[str]:
        """Unwrap; lines for ``Run.limitations`` where a wrap had to stay."""
        self._on = False
        if self._finder is not None:
            self._finder.remove()
            self._finder = None
        return self._patches.restore()
