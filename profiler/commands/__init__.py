"""Every ``loadprof`` subcommand, one module each, on one protocol.

A command declares its options (``prepare_parser``) and runs (``run(args)``, the
exit code). Bad input raises ``UsageError`` (or the converters' ``ConvertError``):
``cli.main`` prints it as one line and exits 2. Files go out through outputs.py
(NOTE [ A failed output ]). The work itself lives in the library (experiments/: tune,
compare, check; report/, ...); a command parses, calls them and writes.
"""

from __future__ import annotations

import argparse
from typing import Protocol

__all__ = ["Command", "all_commands"]


class Command(Protocol):
    name: str
    help: str

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def all_commands() -> list[Command]:
    """In the order ``loadprof --help`` lists them."""
    from .check import CheckCommand
    from .compare import CompareCommand
    from .convert import ConvertCommand
    from .diagnose import DiagnoseCommand
    from .inspect import InspectCommand
    from .merge import MergeCommand
    from .report import ReportCommand
    from .tune import TuneCommand

    return [DiagnoseCommand(), ReportCommand(), TuneCommand(), CompareCommand(), CheckCommand(), MergeCommand(),
            ConvertCommand(), InspectCommand()]
