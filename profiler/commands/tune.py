"""``loadprof tune script.py``: each applicable fix measured on a bounded run; the best printed."""

from __future__ import annotations

import argparse
import math
import sys

from ..experiments.trial import run_stopped_cleanly
from ..experiments.tune import Search, TuneError
from ..experiments.tuneplan import DEFAULT_FIXES, FAMILIES, TuneOptions
from ..options import (
    UsageError,
    add_output_options,
    add_target_arguments,
    output_paths,
    positive_float,
    positive_int,
    target_from,
)
from ..outputs import check_outputs, finish_command, outputs_of


class TuneCommand:
    name = "tune"
    help = "measure each applicable fix on a bounded run of the script and print the best change"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--budget", type=float, default=TuneOptions.budget, metavar="SECONDS",
                            help="seconds for the whole search, baseline included (default %(default)g)")
        parser.add_argument("--steps", type=positive_int, default=TuneOptions.steps, metavar="N",
                            help="measured steps per trial (default %(default)s)")
        parser.add_argument("--warmup", type=int, default=TuneOptions.warmup, metavar="N",
                            help="steps per trial before measuring (default %(default)s)")
        parser.add_argument("--fixes", default=",".join(DEFAULT_FIXES), metavar="LIST",
                            help=f"fix families to consider, of {','.join(FAMILIES)} (default: all but compile, "
                                 "which is added where the model runs on a GPU)")
        parser.add_argument("--loss-tolerance", type=float, default=TuneOptions.loss_tolerance, metavar="X",
                            help="relative move of the loss trajectory that makes a fix unsafe (default %(default)s)")
        parser.add_argument("--trial-timeout", type=positive_float, metavar="SECONDS",
                            help="stop a fix's trial after this long (default: 3x its estimate, at least 30 s more)")
        parser.add_argument("--no-ideal", action="store_true", help="skip the model-only (ideal) trial")
        add_output_options(parser, "tune", quiet_help="no progress lines, only the table")
        add_target_arguments(parser)

    def run(self, args: argparse.Namespace) -> int:
        from ..report.tune_text import TuneConsoleRenderer
        from ..target import TargetError

        options = options_from(args)
        target = target_from(args)
        try:
            target.validate()
        except TargetError as exc:
            raise UsageError(str(exc)) from None
        paths = output_paths(args, "tune")
        check_outputs(outputs_of("tune", None, paths))
        progress = None if args.quiet else (lambda line: print(f"loadprof tune: {line}", file=sys.stderr, flush=True))
        search = Search(target.script, target.module, target.args, options, progress)
        try:
            result, code = run_stopped_cleanly("tune", "the trial that was running", search.run)
        except TuneError as exc:
            print(f"loadprof: tune: {exc}", file=sys.stderr)
            return 1
        if result is None:
            return code
        TuneConsoleRenderer().render(result)
        return finish_command(outputs_of("tune", result, paths))


def options_from(args: argparse.Namespace) -> TuneOptions:
    if not (args.budget > 0) or not math.isfinite(args.budget):
        raise UsageError(f"--budget: must be > 0 seconds, got {args.budget!r}")
    if args.warmup < 0:
        raise UsageError(f"--warmup: must be >= 0, got {args.warmup}")
    if not (0 < args.loss_tolerance < 10):
        raise UsageError(f"--loss-tolerance: expected a share like 0.1, got {args.loss_tolerance!r}")
    fixes = tuple(f.strip() for f in args.fixes.split(",") if f.strip())
    unknown = [f for f in fixes if f not in FAMILIES]
    if unknown or not fixes:
        raise UsageError(f"--fixes: unknown fix family {unknown[0] if unknown else args.fixes!r}; "
                         f"known: {', '.join(FAMILIES)}")
    return TuneOptions(budget=args.budget, warmup=args.warmup, steps=args.steps, loss_tolerance=args.loss_tolerance,
                       fixes=fixes, ideal=not args.no_ideal, gpu=not args.no_gpu, trial_timeout=args.trial_timeout)
