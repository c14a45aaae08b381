"""``loadprof merge report.rank*.json``: one report of a job whose ranks wrote one file each."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..options import UsageError, add_file_options, add_price_option, output_paths


class MergeCommand:
    name = "merge"
    help = "merge the per-rank reports of a multi-process job (report.rank*.json) into one report"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("paths", nargs="+", metavar="RANKFILE",
                            help="the files report.rankR.json that the ranks wrote")
        add_file_options(parser, "report", {"json": "write the merged report here",
                                            "trace": "write every rank's run as one Chrome trace-event file",
                                            "html": "write the job's report as one self-contained HTML page"})
        parser.add_argument("-q", "--quiet", action="store_true", help="no terminal summary")
        add_price_option(parser)

    def run(self, args: argparse.Namespace) -> int:
        from ..jobs.merge import MergeError, check_total, merge_ranks, read_rank_file
        from ..outputs import check_outputs, finish_command, report_outputs
        from ..report import render_console
        from ..report.job import build_job_report

        paths = output_paths(args, "report")
        check_outputs(report_outputs(None, **paths))
        try:
            check_total(args.paths)
            job = merge_ranks([read_rank_file(p) for p in args.paths])
        except MergeError as exc:
            raise UsageError(str(exc)) from None
        report: Any = build_job_report(job, gpu_hour_price=args.gpu_hour_price)
        if not args.quiet:
            render_console(report, file=sys.stdout)
        return finish_command(report_outputs(report, **paths))
