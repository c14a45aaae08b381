"""The pages and charts of ``loadprof tune`` and ``loadprof compare``: a search's or a
comparison's result in, an HTML page (or a PNG chart) out, as the report's renderers
(html.py's page frame, inline SVG charts, nothing fetched)."""

from __future__ import annotations

import io
import os
from typing import TYPE_CHECKING, Any

from .charts import COMPUTE
from .compare_text import CompareConsoleRenderer
from .html import _chart, _e, _machine_table, _page, _script
from .tune_text import TuneConsoleRenderer

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..experiments.compare import Comparison
    from ..experiments.tune import TuneResult


class TunePageRenderer:
    """``loadprof tune``'s trial table and a bar chart of each trial's throughput."""

    suffix = ".html"

    def render(self, result: TuneResult) -> str:
        table = io.StringIO()
        TuneConsoleRenderer(file=table, width=120).render(result)
        script = _script(result.command)
        out = [f"<h1>loadprof tune: {_e(script)}</h1>",
               f"<p class='muted'>{_e(' '.join(result.command))}</p>"]
        best = result.best
        if best is not None:
            out.append(f"<div class='verdict' style='--c:#2e7d32'><span class='word'>{best.speedup:.2f}x</span> "
                       f"<span class='muted'>best: {_e(best.name)}</span>"
                       f"<p class='reason'>{_e(best.name)} beat the baseline's throughput "
                       f"{best.speedup:.2f} times, loss trajectory checked.</p></div>")
        else:
            out.append("<div class='verdict' style='--c:#555555'><span class='word'>NO CHANGE</span>"
                       "<p class='reason'>No change beat the baseline safely: keep the script as it is.</p></div>")
        out.append("<h2>Throughput by trial</h2>")
        out.append(_chart(lambda: tune_figure(result), "tune"))
        out.append(f"<h2>Trials</h2><pre>{_e(table.getvalue())}</pre>")
        if result.code_change:
            out.append(f"<h2>Change to make in the script</h2><pre><code>{_e(result.code_change)}</code></pre>")
        out.append("<h2>Environment</h2>" + _machine_table(result.baseline.environment))
        return _page(f"loadprof tune - {script}", "\n".join(out))


class ComparePageRenderer:
    """``loadprof compare``'s table and its bar chart (the same figure as ``--png``)."""

    suffix = ".html"

    def render(self, cmp: Comparison) -> str:
        table = io.StringIO()
        CompareConsoleRenderer(file=table, width=120).render(cmp)
        script = _script(cmp.command)
        out = [f"<h1>loadprof compare: {_e(script)}</h1>",
               f"<p class='muted'>{_e(' '.join(cmp.command))}</p>",
               "<h2>Time by variant</h2>", _chart(lambda: bar_figure(cmp), "compare"),
               f"<h2>Variants</h2><pre>{_e(table.getvalue())}</pre>",
               "<h2>Environment</h2>" + _machine_table(cmp.machine())]
        return _page(f"loadprof compare - {script}", "\n".join(out))



class ComparePngRenderer:
    """``loadprof compare --png``: the page's bar chart alone."""

    suffix = ".png"

    def render(self, cmp: Comparison) -> bytes:
        buf = io.BytesIO()
        bar_figure(cmp).savefig(buf, format="png")
        return buf.getvalue()


def tune_figure(result: TuneResult) -> Figure | None:
    from matplotlib.figure import Figure

    trials = [t for t in [result.baseline, *result.trials] if t.ok and t.steps_per_s]
    if not trials:
        return None
    fig = Figure(figsize=(1.8 + 0.9 * len(trials), 3.6), dpi=96)
    ax = fig.subplots()
    colours = ["#7f7f7f" if t is result.baseline else "#2e7d32" if t is result.best
               else "#c62828" if t.safe is False else COMPUTE for t in trials]
    bars = ax.bar(range(len(trials)), [t.steps_per_s or 0.0 for t in trials], color=colours)
    for bar, t in zip(bars, trials, strict=True):
        label = f"{t.steps_per_s:.1f}" + (f"\n{t.speedup:.2f}x" if t.speedup and t is not result.baseline else "")
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                    fontsize=7.5, xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(range(len(trials)), [t.name for t in trials], rotation=30, ha="right", fontsize=7.5)
    ax.set_ylabel("steps/s (measured steps)")
    ax.set_ylim(0, max(t.steps_per_s or 0.0 for t in trials) * 1.3)
    ax.spines[["top", "right"]].set_visible(False)
    ax.set_title("grey: baseline, green: best, red: unsafe (loss moved)", fontsize=8)
    fig.tight_layout()
    return fig



def bar_figure(cmp: Comparison) -> Any:
    """The bar chart of the times (a matplotlib Figure: no pyplot, no global backend)."""
    from matplotlib.figure import Figure

    rows = [r for r in cmp.results if r.time_s]
    names = [r.variant.name for r in rows]
    times = [r.time_s or 0.0 for r in rows]
    fig = Figure(figsize=(1.6 + 1.3 * max(1, len(rows)), 3.8), dpi=120)
    ax = fig.subplots()
    ref = cmp.reference()
    colors = ["#7f7f7f" if r is ref else "#1f77b4" for r in rows]
    bars = ax.bar(names, times, color=colors)
    tops = list(times)  # labels go above the error bar, not through it
    if cmp.repeat > 1:
        tops = [max(run.script_s for run in r.ok_runs) for r in rows]
        lo = [t - min(run.script_s for run in r.ok_runs) for t, r in zip(times, rows, strict=True)]
        hi = [top - t for t, top in zip(times, tops, strict=True)]
        ax.errorbar(names, times, yerr=[lo, hi], fmt="none", ecolor="black", capsize=3, linewidth=1)
    for bar, r, top in zip(bars, rows, tops, strict=True):
        ratio = cmp.ratio(r)
        label = f"{bar.get_height():.1f} s" + (f"\n{ratio:.2f}x" if ratio and r is not ref else "")
        ax.annotate(label, (bar.get_x() + bar.get_width() / 2, top), ha="center", va="bottom",
                    fontsize=8, xytext=(0, 3), textcoords="offset points")
    env = cmp.machine()
    gpu = "no GPU" if not env.get("cuda_in_use") else "GPU"
    ax.set_ylabel("time (s), whole script")
    ax.set_title(f"{os.path.basename(cmp.command[0]) if cmp.command else ''}: "
                 f"{env.get('usable_cores', '?')} cores, {gpu}", fontsize=10)
    ax.set_ylim(0, max(tops or [1.0]) * 1.3)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    return fig


