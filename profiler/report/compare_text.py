"""``loadprof compare``'s terminal table: each variant's time, its ratio to the baseline,
its final loss and what its input wait costs (the compare page, pages.py, shows the same
table)."""

from __future__ import annotations

import sys
from typing import IO, TYPE_CHECKING

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from ..experiments.compare import Comparison


class CompareConsoleRenderer:
    def __init__(self, file: IO[str] | None = None, width: int | None = None) -> None:
        self.console = Console(file=file or sys.stdout, width=width or 110, highlight=False)

    def render(self, cmp: Comparison) -> None:
        console = self.console
        env = cmp.machine()
        gpu = "no GPU" if not env.get("cuda_in_use") else ", ".join(g.get("name", "GPU") for g in env.get("gpus", []))
        console.print(f"[bold]loadprof compare[/bold] {' '.join(cmp.command)}: {env.get('usable_cores', '?')} usable "
                      f"cores, {gpu}" + (f"; median of {cmp.repeat} runs each" if cmp.repeat > 1 else ""))
        table = Table()
        costed = any(r.input_gpu_hours_per_day is not None for r in cmp.results)
        cols = [("variant", "left"), ("change", "left"), ("time (s)", "right"), ("vs baseline", "right"),
                ("training loop (s)", "right"), ("final loss", "right")]
        cols += [("input GPU-h/day", "right")] if costed else []
        for col, just in [*cols, ("status", "left")]:
            table.add_column(col, justify=just)  # type: ignore[arg-type]
        ref = cmp.reference()
        for r in cmp.results:
            ratio = cmp.ratio(r)
            loss = r.final_loss()
            notes = cmp.status(r)
            if r.runs and r.runs[0].ok and r.runs[0].not_applied:
                notes += "; not applied: " + "; ".join(r.runs[0].not_applied)
            elif r.runs and r.runs[0].ok and not r.runs[0].applied and not r.variant.changes.empty:
                notes += "; nothing in the script matched"
            table.add_row(
                r.variant.name, r.variant.label(),
                f"{r.time_s:.2f}" if r.time_s else "-",
                ("baseline" if r is ref else f"{ratio:.2f}x ({ratio - 1:+.0%})") if ratio else "-",
                f"{r.train_s:.2f}" if r.train_s else "-",
                (r.nonfinite_loss() or "-") if loss is None or r.nonfinite_loss() else f"{loss:.4f}",
                *([_lost(r.input_gpu_hours_per_day, cmp.saves(r))] if costed else []),
                notes,
            )
        console.print(table)
        console.print("time: the script end to end under the profiler; vs baseline: time ratio (negative % = faster).")
        if costed:
            console.print("input GPU-h/day: GPU-hours a day lost to input wait at the variant's pace (what it saves "
                          "against the baseline in brackets).")
        else:
            why = next((r.cost().get("why_not") for r in cmp.results if r.cost().get("why_not")), None)
            console.print(f"cost of the input wait: not measured ({why or 'no run finished'}).")


def _lost(hours: float | None, saves: float | None) -> str:
    if hours is None:
        return "-"
    return f"{hours:.2f}" + (f" (saves {saves:.2f})" if saves is not None and saves > 0 else "")
