"""Every file a command or ``Profile`` writes, through one writer with one policy.

An ``Output`` is an option, a path and a renderer's result to be made when written,
one per format registered for what is written (formats.py: ``--json``, ``--trace``,
``--html``, ``--png``, ...); ``write_outputs`` renders and writes each through jsonio's
atomic writer (never half a file, never through a planted link: NOTE [ Output paths
and symbolic links ]).

NOTE [ A failed output ]
One behaviour wherever an output is asked for:
- Before any long work, every output path is checked (``check_outputs``): a missing
  folder, a path that is a folder, or a format whose module is not installed
  (``--png`` without matplotlib) is a usage error (one line, exit 2) before a script
  runs, not after it ran for an hour.
- An output that still cannot be written (disk full, permissions, a renderer that
  fails) is one line naming the option and the file:
  ``loadprof: error: --html out/r.html: cannot write (No space left on device)``.
  The other outputs are written all the same.
- A command then exits 2, unless it has a failure of its own to report, whose code
  wins: the script's exit code under ``diagnose``, 1 for a broken limit under
  ``check`` or a failed variant under ``compare``.
- ``Profile`` inside a user's script cannot choose the exit code of the script: the
  line is a warning (``loadprof: warning: ...``), the report's limitations list it,
  and training goes on (NOTE [ Never break the run ]).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import IO, TYPE_CHECKING, Any, NamedTuple

from .formats import formats
from .jsonio import JsonWriteError, write_bytes_atomic
from .options import UsageError

if TYPE_CHECKING:
    from .report import Report

__all__ = ["FAILED_OUTPUT", "Output", "check_outputs", "check_writable", "exit_code", "finish_command", "outputs_of",
           "report_outputs", "write_outputs"]

#: A command's exit code when an output it was asked for could not be written.
FAILED_OUTPUT = 2


class Output(NamedTuple):
    option: str  # "--html": how the user asked for it
    path: str | None  # None: not asked for, skipped
    render: Callable[[], str | bytes]  # made when written, so a failing renderer is one line too
    needs: str | None = None  # a module it cannot be made without (formats.Format.needs)


def check_writable(path: str, option: str = "--json") -> None:
    """Refuse an output path whose folder is missing, or that is a folder, before any run."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise UsageError(f"{option} {path}: {folder} is not a folder")
    if not os.path.isdir(folder):
        raise UsageError(f"{option} {path}: folder {folder} does not exist")
    if os.path.isdir(path):
        raise UsageError(f"{option} {path}: is a directory")


def check_outputs(outputs: Iterable[Output]) -> None:
    """Refuse unusable output paths, and outputs that cannot be made here, before any
    work (UsageError, one line)."""
    for out in outputs:
        if out.path:
            check_writable(out.path, out.option)
            if out.needs and importlib.util.find_spec(out.needs) is None:
                raise UsageError(f"{out.option} needs {out.needs}: pip install {out.needs}")


def write_outputs(outputs: Iterable[Output]) -> list[str]:
    """Write every output asked for; the failures, one line each (NOTE [ A failed output ])."""
    failed = []
    for out in outputs:
        if not out.path:
            continue
        try:
            data = out.render()
            write_bytes_atomic(out.path, data.encode("utf-8") if isinstance(data, str) else data)
        except JsonWriteError as exc:  # already "PATH: why"
            failed.append(f"{out.option} {exc}")
        except Exception as exc:  # a renderer's failure: the other outputs still go out
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            failed.append(f"{out.option} {out.path}: not written ({why})")
    return failed


def exit_code(own: int, failed: list[str]) -> int:
    """The command's own failure wins; else a failed output is FAILED_OUTPUT."""
    return own if own else (FAILED_OUTPUT if failed else 0)


def finish_command(outputs: Iterable[Output], own: int = 0, file: IO[str] | None = None) -> int:
    """A command's end: write its outputs, one error line per failure, and its exit code
    (NOTE [ A failed output ])."""
    failed = write_outputs(outputs)
    for line in failed:
        print(f"loadprof: error: {line}", file=file or sys.stderr)
    return exit_code(own, failed)


def outputs_of(of: str, subject: Any | None, paths: Mapping[str, str | None]) -> list[Output]:
    """The files ``subject`` can be written as: one per format registered for ``of``
    (formats.py), at its path in ``paths`` by the format's name (missing or None: not
    asked for). The renderers are imported only for the outputs written. Without a
    subject yet (None), for ``check_outputs``."""
    registered = formats(of)
    unknown = sorted(set(paths) - {f.name for f in registered})
    if unknown:
        raise ValueError(f"no {of} format named {', '.join(unknown)}; registered: "
                         f"{', '.join(f.name for f in registered)}")

    def made(render: Callable[[Any], str | bytes]) -> Callable[[], str | bytes]:
        def output() -> str | bytes:
            if subject is None:
                raise RuntimeError(f"no {of} to write")
            return render(subject)

        return output

    return [Output(f.option, paths.get(f.name), made(f.render), f.needs) for f in registered]


def report_outputs(report: Report | None, **paths: str | None) -> list[Output]:
    """The files a report (a run's or a job's) can be written as, by format name:
    ``report_outputs(report, json="run.json", html="run.html")``."""
    return outputs_of("report", report, paths)
