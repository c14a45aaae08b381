"""Short renderers for an interactive session: ``str(report)`` (plain text) and a
notebook's ``_repr_html_``. The verdict, its warnings and the recommendations;
the evidence table only in HTML, where it folds away. No rich, no colour codes.
"""

from __future__ import annotations

import html
import sys
from typing import TYPE_CHECKING, Any

from ..advice.base import speedup_text

if TYPE_CHECKING:
    from .base import Advice, Report

#: Colours of the verdict word in a notebook, as the terminal's (console.py).
_COLOURS = {"data-starved": "#c62828", "memory-bound": "#8e24aa", "host-bound": "#b58900",
            "compute-bound": "#2e7d32"}


def _speedup(r: Advice) -> str:
    est = speedup_text(r.estimated_speedup, r.bound, r.floor)
    return f" {est} ({r.basis})" if est else ""


def _cost(report: Report) -> str:
    """The terminal's cost line (cost.py): a run's, or a job's across its ranks' GPUs."""
    from ..cost import cost_line

    return cost_line(report.cost) if report.cost is not None else ""


class TextRenderer:
    """A few lines: what ``print(prof.report)`` shows."""

    suffix = ".txt"

    def render(self, report: Report) -> str:
        lines = [f"loadprof verdict: {report.headline()}", report.summary]
        lines += [f"warning [{w.id}]: {w.detail}" for w in report.warnings]
        lines.append(_cost(report))
        for i, r in enumerate(report.recommendations, 1):
            lines.append(f"{i}. {r.title} [{r.id}]{_speedup(r)}")
        if report.limitations:
            lines.append(f"not measured: {len(report.limitations)} item(s), see report.limitations")
        return "\n".join(line for line in lines if line)


class HtmlRenderer:
    """One self-contained HTML fragment (no scripts, no external styles)."""

    suffix = ".html"

    def render(self, report: Report) -> str:
        e = html.escape
        colour = _COLOURS.get(report.verdict, "inherit")
        cause = f" ({e(report.cause)})" if report.cause else ""
        out = [
            # sized for a notebook cell: a readable line length, the rule column wrapping
            "<div class='loadprof-report' style='max-width:56em'>",
            f"<p><b>loadprof verdict: <span style='color:{colour}'>{e(report.verdict.upper())}</span>{cause}</b>"
            f" &nbsp; confidence: {e(report.confidence)}</p>",
            f"<p>{e(report.summary)}</p>",
        ]
        for w in report.warnings:
            out.append(f"<p style='color:#b58900'><b>warning [{e(w.id)}]</b>: {e(w.detail)}</p>")
        cost = _cost(report)
        if cost:
            out.append(f"<p style='color:#555'>{e(cost)}</p>")
        if report.evidence:
            rows = "".join(f"<tr><td style='text-align:left'>{e(ev.label)}</td><td>{e(ev.display)}</td>"
                           f"<td style='text-align:left'>{e(ev.threshold)}</td></tr>" for ev in report.evidence)
            out.append(f"<details><summary>Evidence ({len(report.evidence)})</summary>"
                       f"<table><tr><th>measured</th><th>value</th><th>rule</th></tr>{rows}</table></details>")
        if report.recommendations:
            out.append("<ol>")
            for r in report.recommendations:
                out.append(f"<li><b>{e(r.title)}</b> <code>[{e(r.id)}]</code>{e(_speedup(r))}"
                           f"<br>{e(r.detail)}<pre>{e(r.code)}</pre></li>")
            out.append("</ol>")
        if report.limitations:
            items = "".join(f"<li>{e(line)}</li>" for line in report.limitations)
            out.append(f"<details><summary>Not measured ({len(report.limitations)})</summary><ul>{items}</ul></details>")
        out.append("</div>")
        return "\n".join(out)


def kernel_shell() -> Any:
    """The running IPython kernel's shell, or None (a terminal IPython is no notebook)."""
    ipython = sys.modules.get("IPython")
    if ipython is None or "ipykernel" not in sys.modules:
        return None
    shell = ipython.get_ipython()
    return shell if shell is not None and getattr(shell, "kernel", None) is not None else None


def show_inline(report: Report) -> bool:
    """Display ``report`` as the cell's HTML output; False where there is no notebook."""
    if kernel_shell() is None:
        return False
    from IPython.display import display

    display(report)
    return True
