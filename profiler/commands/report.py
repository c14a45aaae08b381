"""``loadprof report RUN.json``: re-render and re-diagnose a saved run."""

from __future__ import annotations

import argparse
import sys

from ..options import UsageError, add_price_option


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
        from ..outputs import check_outputs, finish_command, report_outputs
        from ..report import ReportError, load_report, render_console

        check_outputs(report_outputs(None, json=args.json, trace=args.trace, html=args.html))
        try:
            report = load_report(args.path, args.gpu_hour_price)
        except ReportError as exc:
            raise UsageError(str(exc)) from None
        render_console(report, file=sys.stdout)
        return finish_command(report_outputs(report, json=args.json, trace=args.trace, html=args.html))
