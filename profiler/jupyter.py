"""Jupyter: the report shown inline when a ``Profile`` block ends in a notebook, and the
``%%loadprof`` cell magic (``%load_ext loadprof``).

In a kernel, the terminal summary (rich panels on stderr) would come out as red text;
the notebook gets the report's HTML (report/notebook.py) instead (report/notebook.py shows it). IPython is used only
where it is already loaded: nothing here imports it outside a running kernel.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from .options import positive_float, positive_int, price, trackers
from .report.notebook import kernel_shell


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="%%loadprof", add_help=False)
    p.add_argument("--interval", type=positive_float)
    p.add_argument("--max-steps", type=positive_int)
    p.add_argument("--json")
    p.add_argument("--html")
    p.add_argument("--no-gpu", action="store_true")
    p.add_argument("--gpu-hour-price", type=price)
    p.add_argument("--log-to", type=trackers)
    return p


def loadprof_cell(line: str, cell: str) -> Any:
    """``%%loadprof [--max-steps N] [--json PATH] [--gpu-hour-price P] [--log-to T] ...``:
    run the cell under a Profile; its report is the cell's output, the Profile
    ``_loadprof`` in the notebook's namespace."""
    from .session import Profile

    shell = kernel_shell() or sys.modules["IPython"].get_ipython()
    try:
        args = _parser().parse_args(shlex.split(line))
    except SystemExit:  # argparse printed the usage line
        return None
    options = {k: v for k, v in (("interval", args.interval), ("max_steps", args.max_steps),
                                 ("json", args.json), ("html", args.html),
                                 ("gpu_hour_price", args.gpu_hour_price), ("log_to", args.log_to)) if v is not None}
    prof = Profile(print_report=False, gpu=not args.no_gpu, **options)
    shell.user_ns["_loadprof"] = prof
    with prof:
        # exec, not run_cell: the cell's exceptions (StopRun at --max-steps) must reach the block
        exec(compile(cell, "<%%loadprof cell>", "exec"), shell.user_ns)
    return prof.report


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext loadprof``: registers the ``%%loadprof`` cell magic."""
    ipython.register_magic_function(loadprof_cell, magic_kind="cell", magic_name="loadprof")
