"""The ``loadprof`` command: one small class per subcommand.

``main(argv) -> int`` turns known errors into a one-line ``loadprof: error: ...``
and exit code 2; the exit code of ``diagnose`` is the script's own.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Protocol

from . import __version__


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


class Command(Protocol):
    name: str
    help: str

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


def add_profile_options(parser: argparse.ArgumentParser) -> None:
    """Options shared by every command that runs a script under Profile."""
    parser.add_argument("--json", metavar="PATH", help="write the report (with the raw measurements) as JSON")
    parser.add_argument("--interval", type=_positive_float, default=0.1, metavar="SECONDS",
                        help="sampling interval (default 0.1 s)")
    parser.add_argument("--max-steps", type=_positive_int, metavar="N",
                        help="stop the script after N training steps and report")
    parser.add_argument("--no-gpu", action="store_true", help="do not sample GPUs through NVML")
    parser.add_argument("-q", "--quiet", action="store_true", help="no terminal summary (use with --json)")


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE [ARGS]",
                        help="run a library module as a script, like python -m")
    parser.add_argument("script", nargs="?", help="the training script, run as `python script.py` would")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")


def target_from(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from .runner import Target

    if args.module is not None:
        if args.script is not None:
            raise UsageError("give either a script or -m module, not both")
        if not args.module:
            raise UsageError("-m needs a module name")
        return Target(module=args.module[0], args=list(args.module[1:]))
    if args.script is None:
        raise UsageError("no script given (loadprof diagnose script.py [args...], or -m module)")
    return Target(script=args.script, args=list(args.args))


class DiagnoseCommand:
    name = "diagnose"
    help = "run a training script unchanged under the profiler and diagnose it"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        add_profile_options(parser)
        add_target_arguments(parser)

    def run(self, args: argparse.Namespace) -> int:
        from .runner import TargetError, run

        target = target_from(args)
        try:
            return run(
                target,
                interval=args.interval,
                json=args.json,
                max_steps=args.max_steps,
                gpu=not args.no_gpu,
                print_report=not args.quiet,
            )
        except TargetError as exc:
            raise UsageError(str(exc)) from None


class ReportCommand:
    name = "report"
    help = "re-render and re-diagnose a saved run (from --json) without running it again"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("path", help="a JSON report written by loadprof diagnose --json")
        parser.add_argument("--json", metavar="PATH", help="write the re-diagnosed report here")

    def run(self, args: argparse.Namespace) -> int:
        from .report import JsonWriteError, ReportError, load_report, render_console, write_json

        try:
            report = load_report(args.path)
        except ReportError as exc:
            raise UsageError(str(exc)) from None
        render_console(report, file=sys.stdout)
        if args.json:
            try:
                write_json(report, args.json)
            except JsonWriteError as exc:
                raise UsageError(str(exc)) from None
        return 0


def commands() -> list[Command]:
    from .compare import CompareCommand
    from .tune import TuneCommand

    cmds: list[Command] = [DiagnoseCommand(), ReportCommand(), TuneCommand(), CompareCommand()]
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
    sys.exit(main())
