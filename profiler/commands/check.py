"""``loadprof check RUN.json``: the CI gate (the limits and their rules: check.py)."""

from __future__ import annotations

import argparse
import math
import sys

from ..diagnosis import VERDICTS
from ..options import UsageError


def _fraction(text: str) -> float:
    """0.2 or 20%: a share of step time."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction such as 0.2 (or 20%), got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1 (or 0% and 100%), got {text!r}")
    return value


def _percent(text: str) -> float:
    try:
        value = float(text.strip().removesuffix("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage such as 10, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a percentage >= 0, got {text!r}")
    return value


def _verdict(text: str) -> str:
    if text not in VERDICTS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(VERDICTS)}, got {text!r}")
    return text


class CheckCommand:
    name = "check"
    help = "gate a saved run for CI: exit 1 when it breaks a limit (input share, slowdown, verdict)"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("path", metavar="RUN.json", help="a report written by loadprof diagnose --json")
        parser.add_argument("--baseline", metavar="BASE.json", help="a report of the same script to compare with")
        parser.add_argument("--max-data-wait", type=_fraction, metavar="FRACTION",
                            help="most input share of step time allowed (0.2 or 20%%)")
        parser.add_argument("--max-slowdown", type=_percent, metavar="PERCENT",
                            help="most the median step time may exceed the baseline's, in percent")
        parser.add_argument("--fail-on", type=_verdict, nargs="+", action="extend", default=[], metavar="VERDICT",
                            help=f"fail on these verdicts ({', '.join(VERDICTS)})")
        parser.add_argument("--force", action="store_true",
                            help="compare with a baseline of another script or batch size anyway")

    def run(self, args: argparse.Namespace) -> int:
        # imported when run: the reports' modules cost every other command's start-up ~0.1 s
        from ..experiments.check import CheckError, Limits, check, figures
        from ..report import ReportError, load_report

        limits = Limits(args.max_data_wait, args.max_slowdown, tuple(args.fail_on))
        if limits.max_data_wait is None and limits.max_slowdown is None and not limits.fail_on:
            raise UsageError("no limit given (--max-data-wait, --max-slowdown with --baseline, --fail-on)")
        try:
            report = load_report(args.path)
            baseline = load_report(args.baseline) if args.baseline else None
            broken = check(report, limits, baseline, force=args.force)
        except (ReportError, CheckError) as exc:
            raise UsageError(str(exc)) from None
        for b in broken:
            print(f"loadprof check: {args.path}: {b.line}", file=sys.stdout)
        if not broken:
            held = sum(x is not None for x in (limits.max_data_wait, limits.max_slowdown)) + bool(limits.fail_on)
            m = figures(report)
            print(f"loadprof check: {args.path}: ok ({held} limit{'s' if held > 1 else ''} held; verdict "
                  f"{m.verdict}, data wait {m.data_wait()}, median step {m.median_step()})")
        return 1 if broken else 0
