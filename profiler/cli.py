"""The ``loadprof`` command: it only dispatches to the subcommands (commands/).

``main(argv) -> int`` turns known errors into a one-line ``loadprof: error: ...``
and exit code 2; the exit code of ``diagnose`` is the script's own.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from . import __version__
from .commands import Command, all_commands
from .options import UsageError

__all__ = ["Command", "UsageError", "build_parser", "main", "main_entry"]


def build_parser(cmds: Sequence[Command]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loadprof",
        description="Find out whether training waits for data, compute or memory, and what to change.",
    )
    parser.add_argument("--version", action="version", version=f"loadprof {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for cmd in cmds:
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        cmd.prepare_parser(p)
        p.set_defaults(_command=cmd)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    cmds = all_commands()
    parser = build_parser(cmds)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2), already printed
        return int(exc.code or 0)
    cmd = getattr(args, "_command", None)
    if cmd is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(cmd.run(args))
    except UsageError as exc:
        print(f"loadprof: error: {exc}", file=sys.stderr)
        return 2
    except _known_errors() as exc:
        print(f"loadprof: error: {exc}", file=sys.stderr)
        return 2


def _known_errors() -> tuple[type[BaseException], ...]:
    from .converters.errors import ConvertError

    return (ConvertError,)


def main_entry() -> None:
    """The console script: ``main()``, and a reader that stops early ends us quietly.

    ``loadprof inspect big | head`` closes the pipe under us: Python's advice (the
    signal module's note on SIGPIPE) is to point stdout at devnull, so the flush at
    exit cannot fail again, and leave; 141 = 128 + SIGPIPE, what a shell shows for
    ``yes | head``.
    """
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        sys.exit(128 + 13)
    sys.exit(code)
