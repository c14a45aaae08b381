"""``loadprof compare script.py``: the script end to end once per variant, compared."""

from __future__ import annotations

import argparse
import math
import sys

from ..experiments.compare import (
    DEFAULT_VARIANTS,
    VariantError,
    builtin_variants,
    compare,
    parse_variants,
)
from ..experiments.trial import run_stopped_cleanly
from ..options import (
    UsageError,
    add_output_options,
    add_target_arguments,
    output_paths,
    positive_int,
    target_from,
)
from ..outputs import check_outputs, finish_command, outputs_of


class CompareCommand:
    name = "compare"
    help = "run the script end to end once per variant (baseline, cache, amp, accum, ...) and compare times"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), metavar="LIST",
                            help=f"comma-separated variants to run, in order (default {','.join(DEFAULT_VARIANTS)})")
        parser.add_argument("--variant", action="append", default=[], metavar="NAME:ITEM,...",
                            help="define a variant: built-in names, FIX=VALUE, hook=FILE.py, ENV=VALUE")
        parser.add_argument("--list", action="store_true", help="list the built-in variants and exit")
        parser.add_argument("--repeat", type=positive_int, default=1, metavar="N",
                            help="runs per variant, interleaved; the median is reported (default %(default)s)")
        parser.add_argument("--timeout", type=float, default=3600.0, metavar="SECONDS",
                            help="stop a variant's run after this long (default %(default)g)")
        add_output_options(parser, "compare", quiet_help="no progress lines, only the table")
        add_target_arguments(parser)

    def run(self, args: argparse.Namespace) -> int:
        from ..report.compare_text import CompareConsoleRenderer
        from ..target import TargetError

        _take_own_options(args)
        if args.list:
            for v in builtin_variants().values():
                print(f"{v.name:13} {v.description}")
            return 0
        if not (args.timeout > 0) or not math.isfinite(args.timeout):
            raise UsageError(f"--timeout: must be > 0 seconds, got {args.timeout!r}")
        try:
            variants = parse_variants(args.variants, args.variant)
        except VariantError as exc:
            raise UsageError(str(exc)) from None
        target = target_from(args)
        try:
            target.validate()
        except TargetError as exc:
            raise UsageError(str(exc)) from None
        paths = output_paths(args, "compare")
        check_outputs(outputs_of("compare", None, paths))  # --png without matplotlib too, before the runs
        progress = None if args.quiet else (lambda line: print(f"loadprof compare: {line}", file=sys.stderr, flush=True))
        cmp, code = run_stopped_cleanly("compare", "the run that was going", lambda: compare(
            target.script, target.module, target.args, variants, repeat=args.repeat, timeout=args.timeout,
            gpu=not args.no_gpu, progress=progress))
        if cmp is None:
            return code
        CompareConsoleRenderer().render(cmp)
        return finish_command(outputs_of("compare", cmp, paths),
                              0 if all(cmp.status(r) == "ok" for r in cmp.results) else 1)


def _take_own_options(args: argparse.Namespace) -> None:
    """Move compare's own long options out of the script's arguments, so that
    ``loadprof compare train.py --variants baseline,cache`` works as well as the usual order.
    The options are those ``prepare_parser`` declares, read from it. Everything after
    a ``--`` goes to the script untouched (for a script whose own options share these names)."""
    rest = list(getattr(args, "args", None) or [])
    if not rest:
        return
    declared = argparse.ArgumentParser(add_help=False)
    CompareCommand().prepare_parser(declared)
    own = {s: a for a in declared._actions for s in a.option_strings
           if s.startswith("--") and a.dest not in ("module", "list")}
    kept: list[str] = []
    i = 0
    while i < len(rest):
        word = rest[i]
        if word == "--":
            kept.extend(rest[i + 1:])
            break
        name, eq, value = word.partition("=")
        action = own.get(name)
        i += 1
        if action is None:
            kept.append(word)
            continue
        if action.nargs == 0:  # a flag
            setattr(args, action.dest, True)
            continue
        if not eq:
            if i >= len(rest):
                raise UsageError(f"{name}: expected a value")
            value = rest[i]
            i += 1
        if action.type is not None:
            try:
                value = action.type(value)  # type: ignore[operator]
            except argparse.ArgumentTypeError as exc:
                raise UsageError(f"{name}: {exc}") from None
            except ValueError:
                raise UsageError(f"{name}: expected a number, got {value!r}") from None
        if isinstance(action.default, list):  # an option given more than once (--variant)
            getattr(args, action.dest).append(value)
        else:
            setattr(args, action.dest, value)
    args.args = kept
