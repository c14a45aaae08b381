"""What ``loadprof`` runs: a script or ``-m module`` and its arguments, checked before
anything runs (one line naming what is wrong)."""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path


class TargetError(Exception):
    """The script or module to run is unusable; the message is one line naming it."""


@dataclass
class Target:
    script: str | None = None
    module: str | None = None
    args: list[str] = field(default_factory=list)
    #: the command's own options ("--json", ...): one of them among ``args`` may be a slip
    own_options: tuple[str, ...] = ()

    def source_file(self) -> str | None:
        """The file that runs as ``__main__``, when there is one to read."""
        if self.module is not None:
            try:
                spec = importlib.util.find_spec(self.module)
            except (ImportError, ValueError):
                return None
            return spec.origin if spec is not None and spec.origin not in (None, "built-in", "frozen") else None
        if self.script and Path(self.script).is_dir():
            return str(Path(self.script) / "__main__.py")
        return self.script

    def validate(self) -> None:
        if self.module is not None:
            if not self.module or self.module.startswith("."):
                raise TargetError(f"-m {self.module!r}: not a module name")
            cwd = os.getcwd()
            added = cwd not in sys.path
            if added:
                sys.path.insert(0, cwd)
            try:
                spec = importlib.util.find_spec(self.module)
            except (ImportError, ValueError) as exc:
                raise TargetError(f"-m {self.module}: cannot be found ({exc})") from None
            finally:
                if added:
                    sys.path.remove(cwd)
            if spec is None:
                raise TargetError(f"-m {self.module}: no module named {self.module!r}")
            return
        if not self.script:
            raise TargetError("no script given (loadprof diagnose script.py [args...], or -m module)")
        path = Path(self.script)
        if not path.exists():
            raise TargetError(f"{self.script}: no such file")
        if path.is_dir():
            if (path / "__main__.py").is_file():
                return
            raise TargetError(f"{self.script}: is a directory without __main__.py")
        try:
            source = path.read_bytes()
        except OSError as exc:
            raise TargetError(f"{self.script}: cannot read ({exc.strerror})") from None
        first = source.split(b"\n", 1)[0]
        if path.suffix != ".py" and not (first.startswith(b"#!") and b"python" in first):
            raise TargetError(f"{self.script}: not a Python script (expected a .py file or a python shebang)")
        try:
            compile(source, str(path), "exec")
        except SyntaxError as exc:
            raise TargetError(f"{self.script}:{exc.lineno}: not valid Python ({exc.msg})") from None
        except ValueError as exc:  # null bytes: a binary file
            raise TargetError(f"{self.script}: not a Python script ({exc})") from None
