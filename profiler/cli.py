"""The ``loadprof`` command: one small class per subcommand.

``main(argv) -> int`` turns known errors into a one-line ``loadprof: error: ...``
and exit code 2; the exit code of ``diagnose`` is the script's own.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Protocol

from . import __version__
from .options import (
    UsageError,
    add_price_option,
    add_profile_options,
    add_target_arguments,
    option_strings,
    target_from,
)

__all__ = ["Command", "UsageError", "build_parser", "commands", "main", "main_entry"]


class Command(Protocol):
    name: str
    help: str

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


class DiagnoseCommand:
    name = "diagnose"
    help = "run a training script unchanged under the profiler and diagnose it"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        add_profile_options(parser)
        add_target_arguments(parser)

    def run(self, args: argparse.Namespace) -> int:
        from .runner import TargetError, run

        target = target_from(args)
        target.own_options = option_strings(add_profile_options)
        try:
            return run(
                target,
                interval=args.interval,
                json=args.json,
                max_steps=args.max_steps,
                gpu=not args.no_gpu,
                print_report=not args.quiet,
                trace=args.trace,
                live=args.live,
                html=args.html,
                gpu_hour_price=args.gpu_hour_price,
                log_to=args.log_to,
            )
        except TargetError as exc:
            raise UsageError(str(exc)) from None


class ReportCommand:
    name = "report"
    help = "re-render and re-diagnose a saved run (from --json) without running it again"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("path", help="a JSON report written by loadprof diagnose --json")
        parser.add_argument("--json", metavar="PATH", help="write the re-diagnosed report here")
        parser.add_argument("--trace", metavar="PATH", help="write the run as a Chrome trace-event file")
        parser.add_argument("--html", metavar="PATH", help="write the report as one self-contained HTML page")
        add_price_option(parser)

    def run(self, args: argparse.Namespace) -> int:
        from .report import JsonWriteError, ReportError, load_report, render_console, write_json

        try:
            report = load_report(args.path, args.gpu_hour_price)
        except ReportError as exc:
            raise UsageError(str(exc)) from None
        render_console(report, file=sys.stdout)
        if args.json:
            try:
                write_json(report, args.json)
            except JsonWriteError as exc:
                raise UsageError(str(exc)) from None
        if args.trace:
            from .report.trace import write_trace

            try:
                write_trace(report, args.trace)
            except JsonWriteError as exc:
                raise UsageError(str(exc)) from None
        if args.html:
            from .report.html import HtmlPageRenderer, write_html

            try:
                write_html(HtmlPageRenderer().render(report), args.html)
            except (OSError, ValueError) as exc:  # ValueError: a job report with no rank's run to draw
                raise UsageError(f"--html: {exc}") from None
        return 0


def commands() -> list[Command]:
    from .check import CheckCommand
    from .compare import CompareCommand
    from .dist.merge import MergeCommand
    from .tune import TuneCommand

    cmds: list[Command] = [DiagnoseCommand(), ReportCommand(), TuneCommand(), CompareCommand(), CheckCommand(),
                           MergeCommand()]
    try:
        from loadprof.converters.commands import ConvertCommand, InspectCommand
    except ImportError:  # converters not built yet in this checkout
        pass
    else:
        cmds += [ConvertCommand(), InspectCommand()]
    return cmds


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
    cmds = commands()
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
    errors: list[type[BaseException]] = []
    try:
        from loadprof.converters.errors import ConvertError
    except ImportError:
        pass
    else:
        errors.append(ConvertError)
    return tuple(errors) or (UsageError,)


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
