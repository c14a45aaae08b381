"""``loadprof report RUN.json``: re-render and re-diagnose a saved run."""

from __future__ import annotations

import argparse
import sys

from ..options import UsageError, add_file_options, add_price_option, output_paths


class ReportCommand:
    name = "report"
    help = "re-render and re-diagnose a saved run (from --json) without running it again"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("path", help="a JSON report written by loadprof diagnose --json")
        add_file_options(parser, "report", {"json": "write the re-diagnosed report here",
                                            "trace": "write the run as a Chrome trace-event file",
                                            "html": "write the report as one self-contained HTML page"})
        add_price_option(parser)

    def run(self, args: argparse.Namespace) -> int:
        from ..outputs import check_outputs, finish_command, report_outputs
        from ..report import ReportError, load_report, render_console

        paths = output_paths(args, "report")
        check_outputs(report_outputs(None, **paths))
        try:
            report = load_report(args.path, args.gpu_hour_price)
        except ReportError as exc:
            raise UsageError(str(exc)) from None
        render_console(report, file=sys.stdout)
        return finish_command(report_outputs(report, **paths))
