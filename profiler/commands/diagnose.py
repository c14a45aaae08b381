"""``loadprof diagnose script.py``: run a training script unchanged under the profiler."""

from __future__ import annotations

import argparse

from ..options import (
    UsageError,
    add_profile_options,
    add_target_arguments,
    option_strings,
    output_paths,
    target_from,
)


class DiagnoseCommand:
    name = "diagnose"
    help = "run a training script unchanged under the profiler and diagnose it"

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        add_profile_options(parser)
        add_target_arguments(parser)

    def run(self, args: argparse.Namespace) -> int:
        from ..outputs import check_outputs, report_outputs
        from ..runner import run
        from ..settings import what_if_budget
        from ..target import TargetError

        try:
            what_if = what_if_budget(args.what_if)  # LOADPROF_WHAT_IF's, where no --what-if
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        target = target_from(args)
        target.own_options = option_strings(add_profile_options)
        # NOTE [ A failed output ] in outputs.py: before the script runs
        paths = output_paths(args, "report")
        check_outputs(report_outputs(None, **paths))
        try:
            return run(
                target,
                outputs=paths,
                interval=args.interval,
                max_steps=args.max_steps,
                gpu=not args.no_gpu,
                print_report=not args.quiet,
                live=args.live,
                gpu_hour_price=args.gpu_hour_price,
                log_to=args.log_to,
                what_if=what_if,
            )
        except TargetError as exc:
            raise UsageError(str(exc)) from None
