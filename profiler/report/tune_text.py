"""``loadprof tune``'s terminal table: each trial's throughput, input share, memory, loss
check and status, then the best change (the tune page, pages.py, shows the same table)."""

from __future__ import annotations

import math
import sys
from typing import IO, TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

if TYPE_CHECKING:
    from ..experiments.trial import TrialResult
    from ..experiments.tune import TuneResult


class TuneConsoleRenderer:
    def __init__(self, file: IO[str] | None = None, width: int | None = None) -> None:
        self.console = Console(file=file or sys.stdout, width=width or 110, highlight=False, soft_wrap=False)

    def render(self, result: TuneResult) -> None:
        console = self.console
        base = result.baseline
        env = base.environment
        gpu = "no GPU" if not env.get("cuda_in_use") else ", ".join(g.get("name", "GPU") for g in env.get("gpus", []))
        o = result.options
        console.print(f"[bold]loadprof tune[/bold] {' '.join(result.command)}: {env.get('usable_cores')} usable cores, "
                      f"{gpu}; {o.warmup} warm-up + {o.steps} measured steps per trial; {result.elapsed_s:.0f} s "
                      f"of a {o.budget:.0f} s budget")
        for w in result.warnings():
            console.print(f"[bold yellow]warning {w['id']}[/bold yellow] {escape(w['detail'])}")
            if w["id"] == "host-contended":
                console.print("  Other processes took cores while the trials ran: the speed-ups carry that "
                              "noise; run tune again on a quieter host to confirm them.")
            elif w["id"] == "host-steal":
                console.print("  The hypervisor took this VM's CPU time while the trials ran: the speed-ups carry "
                              "that noise; run tune again when the host is quieter to confirm them.")
        table = Table(show_lines=False)
        for col, just in (("trial", "left"), ("steps/s", "right"), ("samples/s", "right"), ("speedup", "right"),
                          ("input", "right"), ("peak memory", "right"), ("loss check", "left"), ("status", "left")):
            table.add_column(col, justify=just)  # type: ignore[arg-type]
        for t in [base, *result.trials]:
            status = t.status if t.status != "ok" else ("ok" if t.safe is not False else "unsafe")
            if t.status in ("skipped", "crashed", "timed out", "not applied", "too few steps") and t.detail:
                status = f"{t.status}: {t.detail}"
            elif t.safe is False:
                status = f"unsafe: {t.unsafe_reason}"
            elif t.setup_s >= 0.05:
                back = result.pays_back(t)
                status += f" (+{t.setup_s:.1f} s one-time fill" + (f", paid back after {back:,} steps)" if back else ")")
            if result.above_ideal(t):
                status += "; faster than the model-only rate: noise"
            if result.best is t:
                status = "best; " + status
            table.add_row(
                t.name, _num(t.steps_per_s), _num(t.samples_per_s),
                f"{t.speedup:.2f}x" if t.speedup else "-",
                f"{t.data_wait_fraction:.0%}" if t.data_wait_fraction is not None and t.ok else "-",
                _memory(t),
                "baseline" if t is base else (t.loss_check or "-") if t.ok else "-",
                status,
            )
        console.print(table)
        best = result.best
        share = result.share_of_ideal()
        if best is None:
            console.print(f"No change beat the baseline by {o.min_gain:.0%} or more safely: keep the script as it is.")
        else:
            line = (f"[bold]Best:[/bold] {best.name}: {best.speedup:.2f}x the baseline's throughput" if best.speedup
                    else f"[bold]Best:[/bold] {best.name}: the largest micro-batch that fits in memory, where the "
                         f"baseline ran out ({_num(best.samples_per_s)} samples/s)")
            console.print(line + (f", {result.ideal_text()}" if share is not None else ""))
            if best.setup_s >= 0.05:
                back = result.pays_back(best)
                console.print(f"  (plus a one-time {best.setup_s:.1f} s cache fill before the first step"
                              + (f": the whole job gains only past {back:,} steps" if back else "") + ")")
            if result.code_change:
                console.print("Change to make in the script:")
                console.print(result.code_change, markup=False, highlight=False)
        if best is None and share is not None:
            console.print(f"The baseline: {result.ideal_text()}.")


def _memory(t: TrialResult) -> str:
    """'812 MiB', '38.4 GiB GPU': the trial's peak (a crashed one's, up to its end)."""
    if not t.memory_peak:
        return "-"
    size = f"{t.memory_peak / 2**30:.1f} GiB" if t.memory_peak >= 2**30 else f"{t.memory_peak / 2**20:.0f} MiB"
    return size + (" GPU" if t.memory_where == "GPU" else "")


def _num(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return f"{x:.1f}" if x < 1000 else f"{x:.0f}"
