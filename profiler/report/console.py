"""The terminal renderer: verdict, evidence table, recommendations (rich)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO, TYPE_CHECKING

from rich.console import Console, Group
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from ..advice.base import speedup_text
from ..cost import cost_line
from ..waits import waits_line
from ..whatif import summary as whatif_summary
from .stages import stage_table

if TYPE_CHECKING:
    from ..records import GpuInfo
    from . import RunReport
    from .base import Advice

#: GPUs a report names: a node holds 16 at most, and a saved run may list thousands.
MAX_GPUS_NAMED = 16

_COLOURS = {
    "data-starved": "bold red",
    "memory-bound": "bold magenta",
    "host-bound": "bold yellow",
    "compute-bound": "bold green",
    "inconclusive": "bold white",
}


class ConsoleRenderer:
    def __init__(self, file: IO[str] | None = None, width: int | None = None) -> None:
        self.console = Console(file=file, width=width, highlight=False, soft_wrap=False)

    def render(self, report: RunReport) -> None:
        c = self.console
        d = report.diagnosis
        m = d.metrics
        run = report.run
        head = Text()
        head.append("loadprof verdict: ", style="bold")
        head.append(d.verdict.upper(), style=_COLOURS.get(d.verdict, "bold"))
        if d.cause:
            head.append(f" ({d.cause})")
        head.append(f"   confidence: {d.confidence}\n")
        head.append(d.summary)
        gpu = gpu_names(run.environment.gpus) or run.environment.gpu_status
        head.append(
            f"\n{m.steps_total} steps ({m.warmup_steps} warm-up), input timed by "
            f"{run.data_wait_method or 'n/a'}; {run.duration:.1f} s; GPU: {gpu}; "
            f"{run.environment.usable_cores} usable cores",
            style="dim",
        )
        if m.waits is not None:
            head.append(f"\n{waits_line(m.waits)}", style="dim")
        for wid, detail in report.warnings:
            head.append(f"\nwarning [{wid}]: ", style="bold yellow")
            head.append(detail, style="yellow")
        c.print(Panel(head, expand=False))

        if d.evidence:
            # Two columns fit 80: the rule and its source go on a dim line under the label.
            table = Table(title="Evidence", title_justify="left", expand=False)
            table.add_column("measured", ratio=3)
            table.add_column("value", justify="right", ratio=1)
            for e in d.evidence:
                label = Text(e.label)
                rule = "; ".join(part for part in (e.threshold, e.source) if part)
                if rule:
                    label.append(f"\n{rule}", style="dim")
                table.add_row(label, e.display)
            c.print(table)
        if report.stages is not None:  # report/stages.py
            c.print(stage_table(report.stages))

        cost = report.cost
        c.print(Text(cost_line(cost), style="dim" if not cost.measured else ""))

        if report.recommendations:
            c.print(Text("Recommendations", style="bold"))
            for i, r in enumerate(report.recommendations, 1):
                print_recommendation(c, i, r)
        elif d.verdict != "inconclusive":
            c.print(Text("No changes recommended: nothing measured points at a fix.", style="dim"))
        measured = whatif_summary(run)
        if measured:
            c.print(Text(measured, style="dim"))

        if report.limitations:
            c.print(Text("Not measured:", style="bold yellow"))
            for line in report.limitations:
                c.print(Text(f"  - {line}", style="yellow"))
        if run.exit_status not in ("ok", ""):
            c.print(Text(f"Run ended: {run.exit_status}", style="dim"))


def gpu_names(gpus: Sequence[GpuInfo]) -> str:
    """The GPUs' names, the first ``MAX_GPUS_NAMED`` of them and how many more; "" for none."""
    more = len(gpus) - MAX_GPUS_NAMED
    return ", ".join(g.name for g in gpus[:MAX_GPUS_NAMED]) + (f" and {more:,} more" if more > 0 else "")


def print_recommendation(c: Console, i: int, r: Advice, where: str = "") -> None:
    """One recommendation as every terminal report prints it: title, id, estimate, for
    whom (a job's ranks), why, and the code."""
    title = Text(f"{i}. {r.title} ", style="bold")
    title.append(f"[{r.id}]", style="cyan")
    if r.estimated_speedup:
        title.append(f"  {speedup_text(r.estimated_speedup, r.bound, r.floor)} ({r.basis})", style="green")
    if where:
        title.append(f"  {where}", style="green")
    c.print(title)
    if not r.estimated_speedup and r.basis:  # why it carries no figure
        c.print(Text(f"   ({r.basis})", style="dim"))
    c.print(Text(f"   {r.detail}"))
    if r.code:
        c.print(Group(Syntax(r.code, "python", theme="ansi_dark", background_color="default", padding=(0, 3),
                             word_wrap=True)))
