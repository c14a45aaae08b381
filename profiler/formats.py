"""Every file loadprof writes, by its renderer's name, in one registry.

A ``Format`` is a renderer's name (``json``, ``trace``, ``html``, ``png``), what it
renders (``of``: ``"report"``, a run's or a job's report; ``"tune"``, a search;
``"compare"``, a comparison), the file suffix it makes, the command-line option that
asks for it (``--`` and its name) with that option's help, and the renderer that makes
it (report/: ``render(subject) -> str | bytes``). The commands' file options
(options.py), their outputs and ``Profile``'s (outputs.py) iterate the formats
registered for what they make; none of them names a format.

A declaration is plain data and names its renderer as ``"module:Class"`` (made with no
arguments), imported when a file is made: every command's parser is built at each
start, and importing the reports' modules would add ~40 ms to each.

To add a format: its renderer's module, and its ``Format`` in ``REGISTERED`` (or
``register()`` at run time, as tests/unit/test_formats.py does with a toy).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .report.base import Renderer

__all__ = ["REGISTERED", "SUBJECTS", "Format", "formats", "register", "unregister"]

#: What a format can render: a run's or a job's report, a tune search, a comparison.
SUBJECTS = ("report", "tune", "compare")

_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")  # an option (--name) and an argparse dest alike


@dataclass(frozen=True)
class Format:
    #: the renderer's name: its option is ``--`` and this, and the keyword it is asked for by
    name: str
    #: what it renders: one of ``SUBJECTS``
    of: str
    #: the file type it makes (".html")
    suffix: str
    #: the option's help (a command may word it for its own subject: options.add_file_options)
    help: str
    #: ``"module:Class"``, or a class: made with no arguments, it has ``render(subject)``
    renderer: str | Callable[[], Renderer]
    #: a module it cannot be made without, checked before any work: ``--png needs matplotlib``
    needs: str | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"format name: expected lower-case letters, digits and _, got {self.name!r}")
        if self.of not in SUBJECTS:
            raise ValueError(f"format {self.name!r}: 'of' expected one of {', '.join(SUBJECTS)}, got {self.of!r}")

    @property
    def option(self) -> str:
        return "--" + self.name.replace("_", "-")

    def make(self) -> Renderer:
        """The renderer, its module imported now."""
        if callable(self.renderer):
            return self.renderer()
        module, _, attr = self.renderer.partition(":")
        made: Renderer = getattr(importlib.import_module(module), attr)()
        return made

    def render(self, subject: Any) -> str | bytes:
        return self.make().render(subject)


#: the formats loadprof ships; a command lists a subject's options in this order
REGISTERED: list[Format] = [
    Format("json", "report", ".json", "write the report (with the raw measurements) as JSON",
           "loadprof.report.jsonfile:ReportJsonRenderer"),
    Format("trace", "report", ".json", "write a Chrome trace-event file (Perfetto UI, chrome://tracing)",
           "loadprof.report.trace:TraceRenderer"),
    Format("html", "report", ".html",
           "write the report as one self-contained HTML page with charts (opens offline)",
           "loadprof.report.html:HtmlPageRenderer"),
    Format("json", "tune", ".json", "write the search (baseline, best, every trial) as JSON",
           "loadprof.report.jsonfile:TuneJsonRenderer"),
    Format("html", "tune", ".html", "write the trial table and a bar chart as one HTML page",
           "loadprof.report.pages:TunePageRenderer"),
    Format("json", "compare", ".json", "write the comparison as JSON",
           "loadprof.report.jsonfile:CompareJsonRenderer"),
    Format("png", "compare", ".png", "write a bar chart of the times (PNG)",
           "loadprof.report.pages:ComparePngRenderer", needs="matplotlib"),
    Format("html", "compare", ".html", "write the table and the bar chart as one HTML page",
           "loadprof.report.pages:ComparePageRenderer"),
]


def formats(of: str) -> list[Format]:
    """The formats registered for ``of``, in the order registered."""
    if of not in SUBJECTS:
        raise ValueError(f"expected one of {', '.join(SUBJECTS)}, got {of!r}")
    return [f for f in REGISTERED if f.of == of]


def register(fmt: Format) -> Format:
    """Adds a format after those registered (a plug-in, a test's toy)."""
    if any(f.name == fmt.name and f.of == fmt.of for f in REGISTERED):
        raise ValueError(f"a {fmt.of} format named {fmt.name!r} is registered already")
    REGISTERED.append(fmt)
    return fmt


def unregister(name: str, of: str) -> None:
    REGISTERED[:] = [f for f in REGISTERED if not (f.name == name and f.of == of)]
