"""The command line's shared parts, declared once: the options several subcommands
take, the files they write (one option per registered format: formats.py), the
script or module they run, and the one-line usage error.

``cli.py`` and the subcommands (commands/) import these; nothing here imports a
subcommand, so no module imports ``cli.py`` back. Defaults come from
``settings.Settings``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from .formats import formats
from .settings import Settings, gpu_hour_price, what_if_budget

if TYPE_CHECKING:
    from .target import Target


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


def add_file_options(parser: argparse.ArgumentParser, of: str, helps: Mapping[str, str] | None = None) -> None:
    """``--NAME PATH`` for each format registered for ``of`` (formats.py: ``--json``,
    ``--trace``, ``--html``, ...); ``helps``: the command's own words for some of them."""
    for fmt in formats(of):
        parser.add_argument(fmt.option, dest=fmt.name, metavar="PATH", help=(helps or {}).get(fmt.name, fmt.help))


def output_paths(args: argparse.Namespace, of: str) -> dict[str, str | None]:
    """The paths ``add_file_options`` read, by format name (None: not asked for)."""
    given = vars(args)
    return {fmt.name: given.get(fmt.name) for fmt in formats(of)}


def add_output_options(parser: argparse.ArgumentParser, of: str, *, helps: Mapping[str, str] | None = None,
                       quiet_help: str = "no terminal summary (use with --json)") -> None:
    """The files (``add_file_options``), ``--no-gpu`` and ``-q/--quiet``: every command that
    runs a script takes them."""
    add_file_options(parser, of, helps)
    parser.add_argument("--no-gpu", action="store_true", help="do not sample GPUs through NVML")
    parser.add_argument("-q", "--quiet", action="store_true", help=quiet_help)


def add_profile_options(parser: argparse.ArgumentParser) -> None:
    """The options of a single profiled run (``loadprof diagnose``)."""
    add_output_options(parser, "report")
    parser.add_argument("--interval", type=positive_float, default=Settings.interval, metavar="SECONDS",
                        help=f"sampling interval (default {Settings.interval:g} s)")
    parser.add_argument("--max-steps", type=positive_int, metavar="N",
                        help="stop the script after N training steps and report")
    parser.add_argument("--live", action="store_true",
                        help="redraw a live view on the terminal while the script runs (stderr a terminal)")
    add_price_option(parser)
    parser.add_argument("--what-if", type=what_if_seconds, metavar="SECONDS",
                        help="after the run, measure the advised changes on the job's own step for at most "
                             f"this long (default {Settings.what_if:g} s, or LOADPROF_WHAT_IF; 0: skip)")
    parser.add_argument("--log-to", metavar="TRACKERS", type=trackers,
                        help="log the summary to these trackers, starting a run where the script has none: "
                             "wandb,mlflow,tensorboard[=DIR] (a run the script has gets it anyway); otlp: "
                             "export the figures while the job runs (OTEL_EXPORTER_OTLP_ENDPOINT, ...)")


def what_if_seconds(text: str) -> float:
    try:
        return what_if_budget(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def trackers(text: str) -> str:
    from .trackers.fields import parse_log_to

    try:
        parse_log_to(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("log_to: ")) from None
    return text


def add_price_option(parser: argparse.ArgumentParser) -> None:
    """``--gpu-hour-price``: the report's cost in money too (cost.py); no default price."""
    parser.add_argument("--gpu-hour-price", type=price, metavar="PRICE",
                        help="what one GPU-hour costs (any currency): the cost of input wait in money too")


def price(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a price per GPU-hour such as 2.50, got {text!r}") from None
    try:
        checked = gpu_hour_price(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace(repr(value), repr(text))) from None
    assert checked is not None
    return checked


def option_strings(add: Callable[[argparse.ArgumentParser], None]) -> tuple[str, ...]:
    """The option strings ``add`` declares (``--json``, ``-q``, ...): a command's own
    options, which a user may also have written after the script."""
    parser = argparse.ArgumentParser(add_help=False)
    add(parser)
    return tuple(s for action in parser._actions for s in action.option_strings)


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """``script [args...]`` or ``-m module [args...]``, as python takes them."""
    parser.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE [ARGS]",
                        help="run a library module as a script, like python -m")
    parser.add_argument("script", nargs="?", help="the training script, run as `python script.py` would")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")


def target_from(args: argparse.Namespace) -> Target:
    from .target import Target

    if args.module is not None:
        if args.script is not None:
            raise UsageError("give either a script or -m module, not both")
        if not args.module:
            raise UsageError("-m needs a module name")
        return Target(module=args.module[0], args=list(args.module[1:]))
    if args.script is None:
        raise UsageError("no script given (loadprof diagnose script.py [args...], or -m module)")
    return Target(script=args.script, args=list(args.args))
