"""Framework hooks (each adapter's, frameworks/), installed only for frameworks the user's code imports.

``FrameworkWatch`` installs a framework's hooks right away when it is already
imported (``with Profile():`` in a script that imported torch), or the moment
the user's code imports it (``loadprof diagnose script.py``, where the script
imports torch after profiling began). loadprof itself never imports a framework
the script does not use.
"""

from __future__ import annotations

import importlib
import importlib.abc
import os
import sys
import threading
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

from ..frameworks import hooks_by_module


class ThisProcess:
    """``ThisProcess.pid`` is ``os.getpid()``, kept current across ``fork`` by an
    at-fork handler, so the hooks' per-batch check that they run in the process
    that installed them (NOTE [ Fork safety ] in torchhooks.py) costs an attribute
    read rather than a system call."""

    pid = os.getpid()


def _after_fork_in_child() -> None:
    ThisProcess.pid = os.getpid()


if hasattr(os, "register_at_fork"):  # POSIX; elsewhere workers are spawned, not forked
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Hooks(Protocol):
    framework: str

    def install(self) -> None: ...

    def remove(self) -> None: ...


@runtime_checkable
class ProcessHooks(Protocol):
    """Hooks that profile processes of their own (Ray Train's workers): they are given the
    run's settings to profile them with."""

    settings: Any


class Limits:
    """A hooks' limitations: each line said once in the run, after its library's name."""

    def __init__(self, run: Any, framework: str) -> None:
        self._run, self._framework = run, framework
        self._said: set[str] = set()

    def __call__(self, line: str) -> None:
        if line not in self._said:
            self._said.add(line)
            self._run.limitations.append(f"{self._framework}: {line}")


class ImportWatch(importlib.abc.MetaPathFinder):
    """Calls ``on_loaded(name)`` right after one of ``names`` is imported.

    It sits in front of ``sys.meta_path`` and asks the finders behind it for the
    spec (another watch included, so watches nest: NOTE [ Import watch order ]
    in fixes/applier.py), then wraps the loader's ``exec_module``.
    """

    def __init__(self, names: Iterable[str], on_loaded: Callable[[str], None]) -> None:
        self.names = set(names)
        self.on_loaded = on_loaded
        self._busy = threading.local()

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in self.names or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            spec = None
            behind = sys.meta_path[sys.meta_path.index(self) + 1:] if self in sys.meta_path else []
            for finder in behind:
                find = getattr(finder, "find_spec", None)
                if find is not None:
                    spec = find(fullname, path, target)
                    if spec is not None:
                        break
        finally:
            self._busy.on = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        loader = spec.loader
        inner = loader.exec_module
        on_loaded = self.on_loaded

        def exec_module(module: ModuleType) -> None:
            inner(module)
            on_loaded(fullname)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec

    def install(self) -> ImportWatch:
        sys.meta_path.insert(0, self)
        return self

    def remove(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass


class FrameworkWatch:
    """Installs hooks for each framework as soon as it is importable-and-imported."""

    def __init__(self, make_hooks: Callable[[str, type], Hooks], frameworks: dict[str, str] | None = None,
                 on_error: Callable[[str], None] | None = None) -> None:
        self.make_hooks = make_hooks
        self.frameworks = dict(hooks_by_module() if frameworks is None else frameworks)
        self.on_error = on_error or (lambda msg: None)
        self.hooks: dict[str, Hooks] = {}
        self._finder: ImportWatch | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        pending = []
        for name in self.frameworks:
            if name in sys.modules:
                self._install(name)
            else:
                pending.append(name)
        if pending:
            self._finder = ImportWatch(pending, self._install).install()

    def stop(self) -> None:
        if self._finder is not None:
            self._finder.remove()
            self._finder = None
        for name, hooks in list(self.hooks.items()):
            try:  # removal runs the TensorFlow probes: NOTE [ Never break the run ] in session.py
                hooks.remove()
            except Exception as exc:
                self.on_error(f"{name}: hooks not removed cleanly ({type(exc).__name__}: {exc})")

    def _install(self, name: str) -> None:
        with self._lock:
            if name in self.hooks:
                return
            target = self.frameworks[name]
            module_name, _, attr = target.partition(":")
            try:
                module = importlib.import_module(module_name)
                factory = getattr(module, attr)
            except ImportError as exc:
                self.on_error(f"{name}: hooks unavailable ({exc})")
                return
            hooks = None
            try:  # inside the user's own import: NOTE [ Never break the run ] in session.py
                hooks = self.make_hooks(name, factory)
                hooks.install()
            except Exception as exc:
                self.on_error(f"{name}: hooks could not be installed ({type(exc).__name__}: {exc}); "
                              "its steps and input waits are not measured")
                try:
                    if hooks is not None:
                        hooks.remove()  # what the install patched before it failed
                except Exception as again:
                    self.on_error(f"{name}: hooks not removed cleanly ({type(again).__name__}: {again})")
                return
            self.hooks[name] = hooks
