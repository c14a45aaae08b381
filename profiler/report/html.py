"""The HTML renderer: one self-contained page of a report, and of a tune or compare.

NOTE [ A page that opens anywhere ]
The page must open from disk, as an e-mail attachment or behind a firewall, so
nothing is fetched when it is viewed: no scripts, fonts or stylesheets from
anywhere. The charts are matplotlib figures written as SVG and inlined: no
JavaScript, text stays text (sharp at any zoom, searchable). Inline SVGs share
one document and matplotlib numbers its ids per figure, so each chart's ids get
a prefix of their own. Everything that comes from the run (script names,
arguments, messages, hostnames) is HTML-escaped here; matplotlib escapes the
text it writes into SVG. matplotlib is optional: without it the page keeps its
tables and says how to get the charts. Figures are built with ``Figure``, never
pyplot, so a training script's own pyplot backend and figures are left alone.

NOTE [ Honest downsampling ]
A 100,000-step run holds up to 20,000 step records (timeline.MAX_STEP_RECORDS:
older steps merged pairwise) and up to 20,000 samples per buffer; drawn point by
point that is tens of MB of SVG. Each series is cut into at most ``buckets``
equal slices of the run's time: a line is the slice's mean (time-weighted where
a reading covers a window), a shaded band its lowest to highest reading. The
page says how many records went into how many slices.
"""

from __future__ import annotations

import functools
import html
import io
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..advice.base import speedup_text
from ..jsonio import write_text_atomic
from ..waits import waits_line
from ..whatif import summary as whatif_summary
from . import RunReport
from .console import MAX_GPUS_NAMED, gpu_names
from .job import JobReport
from .stages import MAX_ROWS, caption, random_label, where_text

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ..cost import Cost
    from ..jobs.records import RankRun
    from ..stagemodel import Loading
    from ..waits import Waits
    from . import Report

#: Time slices per chart (NOTE [ Honest downsampling ]): a few hundred keep each
#: series to tens of KB and are finer than a 1,000-pixel-wide chart can show.
BUCKETS = 500

PLOT_HINT = "Charts need matplotlib: pip install matplotlib"

_VERDICT_COLOURS = {  # as the terminal's (console.py)
    "data-starved": "#c62828", "memory-bound": "#8e24aa", "host-bound": "#a67c00",
    "compute-bound": "#2e7d32", "inconclusive": "#555555",
}
# Input wait, copy, compute: warm to cool, so "waiting" reads as the problem.
_WAIT, _H2D, _COMPUTE = "#e4572e", "#f3a712", "#4c72b0"
_JUDGED = "#fff4cc"

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;
 margin:0 auto;max-width:1120px;padding:16px 24px 48px;color:#1d1d1f;line-height:1.45}
.stagebar{display:flex;height:22px;border:1px solid #ddd;margin:6px 0 10px}.stagebar span{display:block;height:100%}
h1{font-size:1.35em;margin:.2em 0}h2{font-size:1.12em;margin:1.6em 0 .5em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.verdict{border-left:8px solid var(--c);background:#f7f7f9;padding:12px 16px;margin:12px 0}
.verdict .word{color:var(--c);font-weight:700;font-size:1.5em;letter-spacing:.02em}
.verdict .reason{font-size:1.08em;margin:.3em 0 0}
.muted{color:#666;font-size:.92em}.warn{color:#8a6100}
.figures{display:flex;flex-wrap:wrap;gap:8px 32px;margin:8px 0}
.figures div{flex:1 1 0;min-width:110px}.figures b{display:block;font-size:1.25em}
table{border-collapse:collapse;margin:6px 0;font-size:.94em}
th,td{border-bottom:1px solid #e3e3e3;padding:4px 10px;text-align:left;vertical-align:top}
td.num{text-align:right}table.evidence{width:100%}table.evidence td:first-child{width:34%}
pre{background:#f4f4f6;padding:10px 12px;overflow-x:auto;font-size:.88em;
 font-family:ui-monospace,"SF Mono",Menlo,Consolas,"DejaVu Sans Mono",monospace}
.rec{margin:14px 0}.rec .id{color:#00707a;font-family:monospace}.rec .est{color:#2e7d32}
.chart svg{max-width:100%;height:auto}table.ranks{font-size:.86em}table.ranks td{white-space:nowrap}
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


# -- pages ---------------------------------------------------------------------
class HtmlPageRenderer:
    """A report as one self-contained HTML page (NOTE [ A page that opens anywhere ]).

    A multi-process job's report (report/job.py) is read through its JSON form: the
    job's verdict, evidence and advice, the pace-setting rank's run over time, and a
    per-rank view (each rank's step time and input share over time, stragglers marked)."""

    suffix = ".html"

    def __init__(self, buckets: int = BUCKETS) -> None:
        self.buckets = buckets

    def render(self, report: Report) -> str:
        return self._page(report)

    @functools.singledispatchmethod
    def _page(self, report: Report) -> str:
        raise TypeError(f"no HTML page for {type(report).__name__}")

    @_page.register
    def _run(self, report: RunReport) -> str:
        d, run = report.diagnosis, report.run
        head = _Head(d.verdict, d.cause, d.confidence, d.summary, list(report.warnings))  # with the run's notices
        evidence = [(ev.label, ev.display, ev.threshold, ev.source) for ev in d.evidence]
        recs = [(r.title, r.id, r.detail, r.code, speedup_text(r.estimated_speedup, r.bound), r.basis, "")
                for r in report.recommendations]
        title = f"loadprof report: {_script(run.command)}"
        return _report_page(title, _started(run), head, report, evidence, recs, "", list(report.limitations),
                            self.buckets, report.cost)

    @_page.register
    def _job(self, job: JobReport) -> str:
        """The job's report as given: the pace-setting rank's run with the diagnosis the
        job report already made of it (nothing diagnosed again)."""
        d = job.diagnosis
        with_runs = [r for r in job.job.ranks if r.run is not None and r.rank in d.per_rank]
        pace = [r for r in with_runs if r.rank in d.pace_ranks] or with_runs
        if not pace:
            raise ValueError("the job's report holds no rank's run")
        first = pace[0]
        assert first.run is not None
        report = RunReport(first.run, d.per_rank[first.rank])
        data = job.to_dict(columns=None)  # the summary's keys, without the raw runs
        head = _Head(d.verdict, d.cause, d.confidence, d.summary, list(d.warnings))
        evidence = [(ev.get("label"), ev.get("display"), ev.get("threshold"), ev.get("source"))
                    for ev in data.get("evidence") or []]
        recs = []
        for r in job.recommendations:
            note = (f"for rank{'s' if len(r.ranks) > 1 else ''} {', '.join(str(k) for k in r.ranks)}"
                    if r.ranks else "")
            rec = r.recommendation
            recs.append((rec.title, rec.id, rec.detail, rec.code, speedup_text(rec.estimated_speedup, rec.bound),
                         rec.basis, note))
        title = f"loadprof job report: {_script(first.run.command)}, {job.job.world_size} ranks"
        started = (f"{_started(first.run)}; the charts over time are rank {first.rank}'s "
                   f"(it sets the job's pace); every rank is in Ranks below")
        ranks = _job_ranks_section(data, job.job.ranks, self.buckets)
        return _report_page(title, started, head, report, evidence, recs, ranks,
                            list(job.job.limitations) + list(first.run.limitations), self.buckets, job.cost)


@dataclass
class _Head:
    verdict: str
    cause: str | None
    confidence: str
    summary: str
    warnings: list[tuple[Any, Any]]


def _started(run: Any) -> str:
    if not run.started_at:
        return f"{run.duration:.1f} s"
    return f"started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(run.started_at))}, {run.duration:.1f} s"


def _report_page(title: str, started: str, head: _Head, report: RunReport, evidence: list[tuple[Any, ...]],
                 recs: list[tuple[Any, ...]], ranks: str, limitations: list[str], buckets: int,
                 cost: Cost) -> str:
    run, m = report.run, report.diagnosis.metrics
    colour = _VERDICT_COLOURS.get(head.verdict, "#555555")
    cause = f" ({_e(head.cause)})" if head.cause else ""
    out = [f"<h1>{_e(title)}</h1>", f"<p class='muted'>{_e(started)}</p>",
           f"<div class='verdict' style='--c:{colour}'><span class='word'>{_e(head.verdict.upper())}</span>"
           f"{cause} <span class='muted'>confidence: {_e(head.confidence)}</span>"
           f"<p class='reason'>{_e(head.summary)}</p>"]
    for wid, detail in head.warnings:
        out.append(f"<p class='warn'><b>warning [{_e(wid)}]</b>: {_e(detail)}</p>")
    out.append("</div>")
    out.append(_figures([
        ("steps", f"{m.steps_total:,}", f"{m.warmup_steps} warm-up, {m.steps_judged:,} judged"),
        ("input share", f"{m.data_wait_fraction:.0%}", f"timed by {run.data_wait_method or 'n/a'}"),
        ("median step", _ms(m.step_time_median), f"compute {_ms(m.compute_per_step)} a step"),
        *_wait_figure(m.waits),
        ("GPU busy (median)", f"{m.gpu_util_median:.0f}%" if m.gpu_util_median is not None else "n/a",
         _gpu_names(run)),
        ("usable cores", str(m.usable_cores),
         f"{m.workers_seen} loader workers seen" if m.workers_seen else "no loader workers seen"),
    ]))
    if m.waits is not None and m.waits.stall_steps:
        out.append(f"<p class='muted'>{_e(waits_line(m.waits))}</p>")
    out.append(_cost_section(cost))
    out.append("<h2>Over time</h2>")
    out.append(_run_charts(report, buckets))
    if report.stages is not None:
        out.append(_stages_section(report.stages))
    if evidence:
        out.append("<h2>Evidence</h2><table class='evidence'>"
                   "<tr><th>measured</th><th>value</th><th>rule</th><th>source</th></tr>")
        for label, display, threshold, source in evidence:
            out.append(f"<tr><td>{_e(label)}</td><td class='num'>{_e(display)}</td>"
                       f"<td>{_e(threshold or '')}</td><td class='muted'>{_e(source or '')}</td></tr>")
        out.append("</table>")
    out.append("<h2>Recommendations</h2>")
    if recs:
        for i, (rtitle, rid, detail, code, speedup, basis, note) in enumerate(recs, 1):
            est = (f" <span class='est'>{_e(speedup)} ({_e(basis)})</span>" if speedup else
                   f" <span class='muted'>({_e(basis)})</span>" if basis else "")
            where = f" <span class='muted'>{_e(note)}</span>" if note else ""
            out.append(f"<div class='rec'><b>{i}. {_e(rtitle)}</b> <span class='id'>[{_e(rid)}]</span>{est}{where}"
                       f"<br>{_e(detail)}<pre><code>{_e(code)}</code></pre></div>")
    elif head.verdict != "inconclusive":
        out.append("<p class='muted'>No changes recommended: nothing measured points at a fix.</p>")
    measured = whatif_summary(report.run) if isinstance(report, RunReport) else ""
    if measured:
        out.append(f"<p class='muted'>{_e(measured)}</p>")
    else:
        out.append("<p class='muted'>None: the run could not be judged.</p>")
    out.append(ranks)
    if limitations:
        out.append("<h2>Not measured</h2><ul>")
        out += [f"<li>{_e(line)}</li>" for line in limitations]
        out.append("</ul>")
    if run.loaders:
        out.append("<h2>Input pipelines</h2>" + _loaders_table(run.loaders))
    out.append("<h2>Environment</h2>" + _environment_table(report))
    return _page(f"{title}: {head.verdict}", "\n".join(out))


def write_html(page: str, path: str) -> None:
    """Write a rendered page atomically (jsonio's temporary + rename); raises OSError."""
    write_text_atomic(path, page)


def _page(title: str, body: str) -> str:
    return ("<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{_e(title)}</title><style>{_CSS}</style></head>\n<body>\n{body}\n"
            f"<p class='muted'>Written by loadprof. This page fetches nothing: charts are inline SVG.</p>"
            "</body></html>\n")


# -- pieces of the report page ----------------------------------------------------------
def _script(command: Sequence[str]) -> str:
    if not command:
        return "(no command)"
    if command[0] == "-m" and len(command) > 1:
        return f"-m {command[1]}"
    return str(command[0]).rsplit("/", 1)[-1] or str(command[0])


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _size(n: float | None) -> str:
    if not n:
        return "n/a"
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _gpu_names(run: Any) -> str:
    return gpu_names(run.environment.gpus) or "no GPU sampled (see Environment)"


def _figures(items: list[tuple[str, str, str]]) -> str:
    cells = "".join(f"<div><span class='muted'>{_e(k)}</span><b>{_e(v)}</b><span class='muted'>{_e(note)}</span></div>"
                    for k, v, note in items)
    return f"<div class='figures'>{cells}</div>"


def _wait_figure(w: Waits | None) -> list[tuple[str, str, str]]:
    """The input wait's tail as one figure (the stalls' line follows the figures)."""
    if w is None:
        return []
    return [("input wait p95", _ms(w.p95), f"p50 {_ms(w.p50)}, p99 {_ms(w.p99)}, max {_ms(w.max)}")]


def _cost_section(cost: Cost) -> str:
    """The cost of the wait (cost.py; a job's: across its ranks' GPUs) as figures; one line
    where it was not measured."""
    from ..cost import cost_line

    if not cost.measured:
        return f"<p class='muted'>{_e(cost_line(cost))}</p>"
    items = [("GPU-hours lost to input", f"{cost.gpu_hours_input_per_day:.2f}/day",
              f"{cost.input_wait_fraction:.0%} of GPU time"
              + (f"; {cost.gpu_hours_input_per_epoch:.3g} an epoch" if cost.gpu_hours_input_per_epoch is not None
                 else ""))]
    if cost.gpu_hours_idle_per_day is not None:
        items.append(("other idle GPU-hours", f"{cost.gpu_hours_idle_per_day:.2f}/day",
                      f"{cost.other_idle_fraction or 0.0:.0%} of GPU time"))
    if cost.joules_per_step is not None:
        waiting = (f"{cost.input_wait_energy_fraction:.0%} spent waiting for input"
                   if cost.input_wait_energy_fraction is not None else f"from {cost.energy_source}")
        items.append(("energy a step", f"{cost.joules_per_step:.3g} J", waiting))
    if cost.money_input_per_day is not None and cost.gpu_hour_price is not None:
        items.append(("money lost to input", f"{cost.money_input_per_day:.2f}/day",
                      f"at {cost.gpu_hour_price:g} a GPU-hour"))
    gpus = f"{len(cost.gpus)} GPU" + ("s" if len(cost.gpus) > 1 else "")
    ranks = cost.ranks
    across = f"on {gpus}" + (f" of {len(ranks)} rank{'s' if len(ranks) > 1 else ''}, summed" if ranks is not None
                             else "")
    return f"<h2>Cost of the wait</h2><p class='muted'>{_e(across)}</p>" + _figures(items)


#: Colours of the stage kinds in the stacked bar.
_STAGE_COLOURS = {"read": "#8c6d31", "decode": "#e4572e", "transform": "#4c72b0", "user": "#8e24aa",
                  "collate": "#2e7d32", "pin": "#b58900", "copy": "#555555"}


def _stages_section(load: Loading) -> str:
    """The loader's stages (stagemodel.py): one bar stacked by stage, and the table; the
    slowest ``MAX_ROWS`` as the terminal's table, the rest as one piece and one row."""
    shown, rest = load.rows[:MAX_ROWS], load.rows[MAX_ROWS:]
    pieces = [(r.stage, r.share, _STAGE_COLOURS.get(r.kind, "#999999")) for r in shown]
    if rest:
        pieces.append((f"({len(rest):,} more)", sum(r.share for r in rest), "#cccccc"))
    bar = "".join(f"<span title='{_e(name)}: {share:.0%}' style='width:{100 * share:.2f}%;background:{colour}'></span>"
                  for name, share, colour in pieces if share > 0)
    rows = "".join(f"<tr><td>{_e(r.stage)}</td><td class='num'>{r.ms_per_batch:.2f}</td>"
                   f"<td class='num'>{r.share:.0%}</td><td>{_e(where_text(r))}</td><td>{_e(random_label(r.random))}</td></tr>"
                   for r in shown)
    if rest:
        rows += (f"<tr><td>({len(rest):,} more)</td><td class='num'>{sum(r.ms_per_batch for r in rest):.2f}</td>"
                 f"<td class='num'>{sum(r.share for r in rest):.0%}</td><td></td><td></td></tr>")
    waited = (f"; the loop waited {load.wait_ms_per_batch:.1f} ms a batch" if load.wait_ms_per_batch is not None
              else "")
    note = f"<p class='muted'>{_e(caption(load) or '')}</p>" if load.source else ""
    return (f"<h2>Loading, stage by stage</h2><p class='muted'>{load.ms_per_batch:.1f} ms a batch over "
            f"{load.batches} timed batches{_e(waited)}</p><div class='stagebar'>{bar}</div>"
            "<table class='evidence'><tr><th>stage</th><th>ms/batch</th><th>share</th><th>where</th><th>random</th>"
            f"</tr>{rows}</table>{note}")


def _rows(pairs: list[tuple[str, object]]) -> str:
    return "<table>" + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in pairs) + "</table>"


#: Input pipelines the page lists, the most iterated: a script that makes a DataLoader
#: every epoch has one per epoch. The JSON report lists them all.
MAX_LOADER_ROWS = 16


def _loaders_table(loaders: list[Any]) -> str:
    cols = ("framework", "kind", "batch_size", "num_workers", "pin_memory", "persistent_workers",
            "prefetch_factor", "dataset_type", "iterations")
    head = "".join(f"<th>{_e(c.replace('_', ' '))}</th>" for c in cols)
    shown = loaders
    if len(loaders) > MAX_LOADER_ROWS:  # the most iterated, in the order seen
        keep = set(sorted(range(len(loaders)), key=lambda i: -loaders[i].iterations)[:MAX_LOADER_ROWS])
        shown = [li for i, li in enumerate(loaders) if i in keep]
    rows = []
    for li in shown:
        cells = "".join(f"<td>{_e('-' if getattr(li, c) is None else getattr(li, c))}</td>" for c in cols)
        notes = "; ".join(li.notes)
        rows.append(f"<tr>{cells}</tr>" + (f"<tr><td colspan='{len(cols)}' class='muted'>{_e(notes)}</td></tr>"
                                          if notes else ""))
    more = len(loaders) - len(shown)
    rest = (f"<p class='muted'>{_plural(more, 'more input pipeline')}, iterated "
            f"{sum(li.iterations for li in loaders) - sum(li.iterations for li in shown):,} times in all "
            f"(the JSON report lists every one)</p>" if more else "")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>{rest}"


def _environment_table(report: RunReport) -> str:
    run, env = report.run, report.run.environment
    more = len(env.gpus) - MAX_GPUS_NAMED
    gpus = "; ".join(f"GPU {g.index}: {g.name}, {_size(g.memory_total)}"
                     + (f", sm_{g.compute_capability[0]}{g.compute_capability[1]}" if g.compute_capability else "")
                     for g in env.gpus[:MAX_GPUS_NAMED]) or env.gpu_status
    if more > 0:
        gpus += f"; and {more:,} more"
    interval = run.sampling.get("interval")
    return _rows([
        ("command", " ".join(run.command)),
        ("exit", run.exit_status or "ok"),
        ("python", env.python), ("platform", env.platform), ("host", env.hostname),
        ("frameworks", ", ".join(f"{k} {v}" for k, v in env.frameworks.items()) or "none seen"),
        ("cores", f"{env.usable_cores} usable of {env.logical_cores} logical"),
        ("memory", _size(env.memory_total)),
        ("GPUs", gpus),
        ("samples", f"{len(run.host_samples):,} host, {len(run.gpu_samples):,} GPU"
                    + (f", every {interval:g} s" if interval else "")),
        ("loadprof", env.loadprof),
    ])


def _machine_table(env: dict[str, Any]) -> str:
    gpus = ", ".join(str(g.get("name", "GPU")) for g in env.get("gpus", []) if isinstance(g, dict))
    return _rows([
        ("python", env.get("python", "?")), ("platform", env.get("platform", "?")),
        ("host", env.get("hostname", "?")),
        ("frameworks", ", ".join(f"{k} {v}" for k, v in (env.get("frameworks") or {}).items()) or "none seen"),
        ("cores", f"{env.get('usable_cores', '?')} usable of {env.get('logical_cores', '?')} logical"),
        ("GPUs", gpus if env.get("cuda_in_use") else f"{gpus or 'none'} (not used)" if gpus else "none used"),
    ])


# -- charts ------------------------------------------------------------------------
def _chart(build: Any, prefix: str) -> str:
    """A figure as inline SVG, or the line saying what draws it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return f"<p class='muted'>{_e(PLOT_HINT)}</p>"
    fig = build()
    if fig is None:
        return "<p class='muted'>Nothing to draw.</p>"
    return f"<div class='chart'>{_svg(fig, prefix)}</div>"


def _svg(fig: Figure, prefix: str) -> str:
    import matplotlib

    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # text as <text>, not outlined paths: smaller
        fig.savefig(buf, format="svg")
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]  # no XML prolog nor DOCTYPE (which names a DTD by URL)
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, flags=re.S)
    # Own ids per chart (NOTE [ A page that opens anywhere ]).
    svg = re.sub(r'\bid="([^"]+)"', rf'id="{prefix}-\1"', svg)
    svg = re.sub(r"url\(#([^)]+)\)", rf"url(#{prefix}-\1)", svg)
    svg = re.sub(r'href="#([^"]+)"', rf'href="#{prefix}-\1"', svg)
    return svg


@dataclass
class _Binned:
    x: np.ndarray  # mean time of each slice's readings
    mean: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    binned: bool  # False: the readings as they are (no more of them than slices)


def _bin(t: Sequence[float], v: Sequence[float] | np.ndarray, span: float, buckets: int,
         weights: Sequence[float] | None = None) -> _Binned:
    """Slice means, lows and highs (NOTE [ Honest downsampling ]); empty slices are left out."""
    ta = np.asarray(t, dtype=float)
    va = np.asarray(v, dtype=float)
    keep = np.isfinite(va)
    ta, va = ta[keep], va[keep]
    if len(ta) <= buckets:
        return _Binned(ta, va, va, va, False)
    w = np.ones_like(va) if weights is None else np.asarray(weights, dtype=float)[keep]
    if not np.all(w > 0):
        w = np.ones_like(va)  # a window unknown (a run saved before windows were recorded): plain means
    idx = np.clip((ta / max(span, 1e-9) * buckets).astype(int), 0, buckets - 1)
    wsum = np.bincount(idx, weights=w, minlength=buckets)
    used = wsum > 0
    count = np.bincount(idx, minlength=buckets)
    x = np.bincount(idx, weights=ta, minlength=buckets)[used] / count[used]
    mean = np.bincount(idx, weights=va * w, minlength=buckets)[used] / wsum[used]
    lo = np.full(buckets, np.inf)
    hi = np.full(buckets, -np.inf)
    np.minimum.at(lo, idx, va)
    np.maximum.at(hi, idx, va)
    return _Binned(x, mean, lo[used], hi[used], True)


def _line(ax: Axes, b: _Binned, label: str, colour: str, band: bool = True, linewidth: float = 1.3,
          **kw: Any) -> None:
    if not len(b.x):
        return
    if b.binned and band:
        ax.fill_between(b.x, b.lo, b.hi, color=colour, alpha=0.15, linewidth=0)
    ax.plot(b.x, b.mean, label=label, color=colour, linewidth=linewidth, **kw)


#: Loader workers drawn one line each in the CPU chart, the busiest; the rest are summed
#: into one line (short-lived workers, forked again every epoch, can number hundreds).
MAX_WORKER_LINES = 8
# Not the training process's blue (C0), nor the grey of "others" (C7).
_WORKER_COLOURS = ("C1", "C2", "C3", "C4", "C5", "C6", "C8", "C9")


@dataclass
class _Workers:
    """Each drawn worker's CPU per host reading (NaN where it was not there), busiest first."""

    pids: list[int]
    cpu: list[np.ndarray]
    rest: np.ndarray | None  # the other workers' CPU summed, when there are others
    seen: int  # distinct workers in the run


def _workers(host: Sequence[Any], most: int) -> _Workers:
    """The ``most`` busiest workers by CPU time over the run (a reading weighs its window)."""
    total: dict[int, float] = {}
    for h in host:
        w = h.window or 1.0  # a run saved before windows were recorded: readings weigh alike
        for pid, c in zip(h.worker_pids, h.worker_cpu, strict=False):
            total[pid] = total.get(pid, 0.0) + c * w
    if not total:
        return _Workers([], [], None, 0)
    pids = sorted(total, key=lambda p: -total[p])[:most]
    slot = {pid: n for n, pid in enumerate(pids)}
    cpu = np.full((len(pids), len(host)), math.nan)
    rest = np.zeros(len(host)) if len(total) > len(pids) else None
    for i, h in enumerate(host):
        for pid, c in zip(h.worker_pids, h.worker_cpu, strict=False):
            n = slot.get(pid)
            if n is not None:
                cpu[n, i] = c
            elif rest is not None:
                rest[i] += c
    return _Workers(pids, list(cpu), rest, len(total))


#: GPUs drawn one line each in the GPU and power charts: a node holds 8 (16 at most).
#: Past that, the GPUs the process used, then the busiest, get a line each and the
#: others one line of their mean: the chart's cost follows what it draws, never the
#: number of GPU indices a saved run names.
MAX_GPU_LINES = 8


@dataclass
class _Gpus:
    """The drawn GPUs' readings by index (in index order) and the other GPUs' readings."""

    drawn: dict[int, list[Any]]
    rest: list[Any]
    seen: int  # distinct GPU indices in the run


def _gpus(samples: Sequence[Any], most: int) -> _Gpus:
    """The ``most`` GPUs that matter: those holding the process's memory, then the busiest."""
    by_index: dict[int, list[Any]] = {}
    for g in samples:
        by_index.setdefault(g.index, []).append(g)

    def rank(i: int) -> tuple[bool, float, int]:
        utils = [g.util_gpu for g in by_index[i] if g.util_gpu is not None]
        used = any((g.process_memory_used or 0) > 0 for g in by_index[i])
        return not used, -sum(utils) / len(utils) if utils else math.inf, i

    drawn = {i: by_index[i] for i in sorted(sorted(by_index, key=rank)[:most])}
    rest = [g for i, gs in by_index.items() if i not in drawn for g in gs]
    return _Gpus(drawn, rest, len(by_index))


def _memory_pct(g: Any) -> float:
    return 100.0 * g.memory_used / g.memory_total if g.memory_used is not None and g.memory_total else math.nan


def _across(t: Sequence[float], v: Sequence[float], span: float, buckets: int) -> _Binned:
    """Readings of several GPUs as one series: at each reading time their mean, lowest and
    highest; past ``buckets`` reading times, sliced as ``_bin`` slices."""
    ta = np.asarray(t, dtype=float)
    va = np.asarray(v, dtype=float)
    keep = np.isfinite(va)
    ta, va = ta[keep], va[keep]
    times, at = np.unique(ta, return_inverse=True)
    if len(times) > buckets:
        return _bin(ta, va, span, buckets)
    lo = np.full(len(times), np.inf)
    hi = np.full(len(times), -np.inf)
    np.minimum.at(lo, at, va)
    np.maximum.at(hi, at, va)
    return _Binned(times, np.bincount(at, weights=va) / np.bincount(at), lo, hi, True)


@dataclass
class _Downsampled:
    """What the page says about the slicing of its charts."""

    step_records: int = 0
    steps: int = 0
    buckets: int = 0
    span: float = 0.0
    binned: bool = False
    workers_seen: int = 0  # loader workers with CPU of their own recorded
    workers_drawn: int = 0
    gpus_seen: int = 0  # distinct GPU indices sampled
    gpus_drawn: int = 0


def _run_charts(report: RunReport, buckets: int) -> str:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return f"<p class='muted'>{_e(PLOT_HINT)}</p>"
    note = _Downsampled()
    fig = _run_figure(report, buckets, note)
    if fig is None:
        return "<p class='muted'>No steps and no samples were recorded: nothing to draw.</p>"
    run = report.run
    if note.binned:
        slice_s = note.span / note.buckets
        how = (f"Drawn in {note.buckets} time slices of {slice_s:.3g} s each: lines are the slice's mean, "
               f"shaded bands its lowest to highest reading. ")
    else:
        how = "Every step record and sample is drawn as recorded. "
    merged = (" (older steps merged pairwise by the profiler to bound its memory: a record's times are "
              "the mean of its steps)" if note.steps > note.step_records else "")
    if note.workers_seen > note.workers_drawn:
        workers = (f" The CPU chart draws the {note.workers_drawn} busiest of {note.workers_seen} loader workers "
                   f"one line each (legend: worker PID), the other "
                   f"{_plural(note.workers_seen - note.workers_drawn, 'worker')} summed in one line.")
    elif note.workers_seen:
        workers = " The CPU chart draws the CPU of each loader worker as a line of its own (legend: worker PID)."
    else:
        workers = ""
    gpus = (f" The GPU charts draw {note.gpus_drawn} of {note.gpus_seen:,} GPUs one line each (those the training "
            f"process used, then the busiest), the other {_plural(note.gpus_seen - note.gpus_drawn, 'GPU')} as one "
            f"line of their mean." if note.gpus_seen > note.gpus_drawn else "")
    text = (f"{how}{note.steps:,} steps in {note.step_records:,} records{merged}; "
            f"{len(run.host_samples):,} host and {len(run.gpu_samples):,} GPU samples. "
            f"The shaded yellow span is the judged window (warm-up steps left out of the verdict).{workers}{gpus}")
    return f"<p class='muted'>{_e(text)}</p><div class='chart'>{_svg(fig, 'run')}</div>"


def _run_figure(report: RunReport, buckets: int, note: _Downsampled) -> Figure | None:
    from matplotlib.figure import Figure

    run, m = report.run, report.diagnosis.metrics
    steps = run.steps
    span = max(run.duration, steps[-1].end if steps else 0.0,
               max((s.t for s in run.host_samples), default=0.0), max((g.t for g in run.gpu_samples), default=0.0))
    if span <= 0:
        return None
    gpus = _gpus(run.gpu_samples, MAX_GPU_LINES)
    note.gpus_seen, note.gpus_drawn = gpus.seen, len(gpus.drawn)
    has_power = any(g.power_w is not None for g in run.gpu_samples)
    host = run.host_samples
    panels = ["steps"] if steps else []
    if gpus.seen:
        panels += ["gpu"] + (["power"] if has_power else [])
    if host:
        panels += ["cpu", "memory", "disk"]
    if not panels:
        return None
    workers = _workers(host, MAX_WORKER_LINES)
    note.workers_seen, note.workers_drawn = workers.seen, len(workers.pids)
    # the CPU and GPU panels' legends list each worker or GPU drawn: room for them
    cpu_height = max(1.35, 0.19 * (3 + len(workers.pids) + (workers.rest is not None)))
    gpu_lines = len(gpus.drawn) + bool(gpus.rest)
    heights = [{"steps": 2.2, "cpu": cpu_height, "gpu": max(1.35, 0.19 * 2 * gpu_lines),
                "power": max(1.35, 0.19 * gpu_lines)}.get(p, 1.35) for p in panels]
    fig = Figure(figsize=(10.5, 0.55 + sum(heights) * 1.05), dpi=96)
    axes = fig.subplots(len(panels), 1, sharex=True, gridspec_kw={"height_ratios": heights})
    axes = list(np.atleast_1d(axes))
    note.buckets, note.span = buckets, span
    judged = _judged_window(run, m.warmup_steps)
    weights = [h.window for h in host]
    others = _plural(gpus.seen - len(gpus.drawn), "other GPU")
    for ax, panel in zip(axes, panels, strict=True):
        if judged is not None:
            ax.axvspan(judged[0], judged[1], color=_JUDGED, zorder=0, linewidth=0)
        if panel == "steps":
            _steps_panel(ax, steps, span, buckets, note)
        elif panel == "gpu":
            for n, (i, gs) in enumerate(gpus.drawn.items()):
                c = f"C{n % 10}"
                _line(ax, _bin([g.t for g in gs], [_nan(g.util_gpu) for g in gs], span, buckets),
                      f"GPU {i} busy", c)
                _line(ax, _bin([g.t for g in gs], [_memory_pct(g) for g in gs], span, buckets), f"GPU {i} memory", c,
                      linestyle="--")
            if gpus.rest:
                t = [g.t for g in gpus.rest]
                _line(ax, _across(t, [_nan(g.util_gpu) for g in gpus.rest], span, buckets),
                      f"{others} busy, mean", "#999999", linestyle=":")
                _line(ax, _across(t, [_memory_pct(g) for g in gpus.rest], span, buckets),
                      f"{others} memory, mean", "#999999", band=False, linestyle="-.")
            ax.set_ylim(0, 105)
            ax.set_ylabel("GPU %")
        elif panel == "power":
            for n, (i, gs) in enumerate(gpus.drawn.items()):
                _line(ax, _bin([g.t for g in gs], [_nan(g.power_w) for g in gs], span, buckets),
                      f"GPU {i}", f"C{n % 10}")
            if gpus.rest:
                _line(ax, _across([g.t for g in gpus.rest], [_nan(g.power_w) for g in gpus.rest], span, buckets),
                      f"{others}, mean", "#999999", linestyle=":")
            ax.set_ylabel("power (W)")
            ax.set_ylim(bottom=0)
        elif panel == "cpu":
            t = [h.t for h in host]
            _line(ax, _bin(t, [sum(h.cpu_per_core) / 100 if h.cpu_per_core else math.nan for h in host],
                           span, buckets, weights), "cores busy (all processes)", "#333333")
            _line(ax, _bin(t, [h.process_cpu / 100 for h in host], span, buckets, weights),
                  "training process", _COMPUTE)
            if m.workers_seen:
                _line(ax, _bin(t, [h.children_cpu / 100 for h in host], span, buckets, weights),
                      f"loader workers, all ({m.workers_seen})", _WAIT)
                if workers.pids:
                    for n, pid in enumerate(workers.pids):
                        _line(ax, _bin(t, workers.cpu[n] / 100, span, buckets, weights), f"worker {pid}",
                              _WORKER_COLOURS[n % len(_WORKER_COLOURS)], band=False, linewidth=1.0)
                    if workers.rest is not None:
                        _line(ax, _bin(t, workers.rest / 100, span, buckets, weights),
                              f"{_plural(workers.seen - len(workers.pids), 'other worker')}, summed", "#999999",
                              band=False, linewidth=0.9, linestyle=":")
                else:  # a run saved before each worker's CPU was recorded
                    _line(ax, _bin(t, [h.children_cpu / 100 / h.n_children if h.n_children else math.nan
                                       for h in host], span, buckets, weights), "per worker (mean)", _WAIT,
                          linestyle=":")
            ax.axhline(m.usable_cores, color="#999999", linewidth=0.8, linestyle="--", zorder=1)
            ax.annotate(f"{m.usable_cores} usable cores", (0.005, m.usable_cores), xycoords=("axes fraction", "data"),
                        fontsize=7, va="bottom")
            ax.set_ylim(0, m.usable_cores * 1.25)
            ax.set_ylabel("CPU (cores)")
        elif panel == "memory":
            gib = 2**30
            t = [h.t for h in host]
            _line(ax, _bin(t, [(h.process_pss or h.process_rss) / gib for h in host], span, buckets),
                  "training process", _COMPUTE)
            if m.workers_seen:
                _line(ax, _bin(t, [(h.children_pss if h.children_pss is not None else h.children_rss) / gib
                                   for h in host], span, buckets), "loader workers", _WAIT)
            total = run.environment.memory_total
            if total:
                _line(ax, _bin(t, [(total - h.memory_available) / gib if h.memory_available else math.nan
                                   for h in host], span, buckets), "system in use", "#7f7f7f")
            ax.set_ylabel("memory (GiB)")
            ax.set_ylim(bottom=0)
        elif panel == "disk":
            _line(ax, _bin([h.t for h in host], [h.disk_read_bps / 1e6 for h in host], span, buckets, weights),
                  "disk reads (system)", "#6a3d9a")
            ax.set_ylabel("disk (MB/s)")
            ax.set_ylim(bottom=0)
        ax.margins(x=0)
        ax.grid(axis="y", color="#e6e6e6", linewidth=0.6)
        ax.spines[["top", "right"]].set_visible(False)
        ax.tick_params(labelsize=8)
        ax.yaxis.label.set_size(8.5)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7.5, frameon=False)
    axes[-1].set_xlim(0, span)
    axes[-1].set_xlabel("seconds since profiling started", fontsize=8.5)
    if judged is not None:
        axes[0].annotate("judged window", ((judged[0] + judged[1]) / 2, 1.0), xycoords=("data", "axes fraction"),
                         ha="center", va="bottom", fontsize=7.5, color="#8a6100")
    fig.subplots_adjust(left=0.07, right=0.80, top=0.97, bottom=0.35 / (0.55 + sum(heights) * 1.05) + 0.03,
                        hspace=0.18)
    return fig


def _plural(n: int, what: str) -> str:
    return f"{n:,} {what}{'' if n == 1 else 's'}"


def _nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _judged_window(run: Any, warmup: int) -> tuple[float, float] | None:
    steps = run.steps[warmup:]  # warm-up records are never merged (metrics.compute_metrics)
    return (steps[0].start, steps[-1].end) if steps else None


def _steps_panel(ax: Axes, steps: list[Any], span: float, buckets: int, note: _Downsampled) -> None:
    """Per-step input wait, copy and compute, stacked; slices weigh records by the steps they hold."""
    note.step_records = len(steps)
    note.steps = sum(s.merged for s in steps)
    t = np.array([(s.start + s.end) / 2 for s in steps])
    n = np.array([s.merged for s in steps], dtype=float)
    wait = np.array([s.data_wait for s in steps])
    h2d = np.array([s.h2d for s in steps])
    dur = np.array([s.duration for s in steps])
    per_step = dur / n * 1000
    if len(steps) <= buckets:
        x, k = t, n
        sums = [wait, h2d, dur]
        lo = hi = per_step
        binned = False
    else:
        idx = np.clip((t / span * buckets).astype(int), 0, buckets - 1)
        k_all = np.bincount(idx, weights=n, minlength=buckets)
        used = k_all > 0
        k = k_all[used]
        x = np.bincount(idx, weights=t * n, minlength=buckets)[used] / k
        sums = [np.bincount(idx, weights=a, minlength=buckets)[used] for a in (wait, h2d, dur)]
        lo_all, hi_all = np.full(buckets, np.inf), np.full(buckets, -np.inf)
        np.minimum.at(lo_all, idx, per_step)
        np.maximum.at(hi_all, idx, per_step)
        lo, hi = lo_all[used], hi_all[used]
        binned = note.binned = True
    w_ms, c_ms, d_ms = (a / k * 1000 for a in sums)
    c_ms = np.minimum(c_ms, np.maximum(d_ms - w_ms, 0))
    compute = np.maximum(d_ms - w_ms - c_ms, 0)
    kw: dict[str, Any] = {"step": "mid", "linewidth": 0}
    if binned:
        ax.fill_between(x, lo, hi, color="#bbbbbb", alpha=0.5, label="step time, lowest to highest", **kw)
    ax.fill_between(x, 0, w_ms, color=_WAIT, label="input wait", **kw)
    ax.fill_between(x, w_ms, w_ms + c_ms, color=_H2D, label="host-to-device copy", **kw)
    ax.fill_between(x, w_ms + c_ms, w_ms + c_ms + compute, color=_COMPUTE, label="compute", **kw)
    # A first step with compilation can be 100x the others: scale to the bulk, say what is cut.
    total = w_ms + c_ms + compute
    top = float(np.percentile(total, 98)) * 1.3 if len(total) else 1.0
    peak = float(np.max(hi)) if len(hi) else 0.0
    if top > 0:
        ax.set_ylim(0, top)
    if peak > top > 0:
        ax.annotate(f"peaks up to {peak:,.0f} ms cut off", (0.995, 0.97), xycoords="axes fraction", ha="right",
                    va="top", fontsize=7, color="#555555")
    ax.set_ylabel("per step (ms)")


# -- a multi-process job ---------------------------------------------------------------
def _job_ranks_section(data: dict[str, Any], raw: list[RankRun], buckets: int) -> str:
    """Each rank's figures, its stragglers, and a heatmap of every rank over time."""
    stragglers = {s.get("rank"): s for s in data.get("stragglers") or [] if isinstance(s, dict)}
    out = ["<h2>Ranks</h2>"]
    if stragglers:
        out.append("<ul>" + "".join(f"<li class='warn'><b>rank {_e(r)} is a straggler</b> ({_e(s.get('cause'))}): "
                                    f"{_e(s.get('detail') or '')}</li>" for r, s in stragglers.items()) + "</ul>")
    else:
        out.append("<p class='muted'>No straggler: no rank's own work kept the others waiting.</p>")
    out.append(_chart(lambda: _ranks_figure(raw, list(stragglers), buckets), "ranks"))
    cols = [("rank", "rank"), ("host", "host"), ("verdict", "verdict"), ("steps", "steps"),
            ("step_time_s", "step"), ("input_wait_s", "input wait"), ("h2d_s", "copy"), ("compute_s", "compute"),
            ("collective_s", "collectives"), ("data_wait_fraction", "input share"), ("gpu_util", "GPU busy"),
            ("cpu_cores", "CPU (cores)")]
    out.append("<table class='ranks'><tr>" + "".join(f"<th>{_e(label)}</th>" for _, label in cols) + "<th></th></tr>")
    for row in data.get("ranks") or []:
        if not isinstance(row, dict):
            continue
        cells = "".join(f"<td class='num'>{_e(_cell(key, row.get(key)))}</td>" for key, _ in cols)
        mark = row.get("missing") or (f"straggler: {stragglers[row.get('rank')].get('cause')}"
                                      if row.get("rank") in stragglers else "")
        out.append(f"<tr>{cells}<td class='warn'>{_e(mark or '')}</td></tr>")
    out.append("</table>")
    return "".join(out)


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-"
    if key.endswith("_s") and isinstance(value, int | float):
        return _ms(value)
    if key == "data_wait_fraction" and isinstance(value, int | float):
        return f"{value:.0%}"
    if key == "gpu_util" and isinstance(value, int | float):
        return f"{value:.0f}%"
    if key == "cpu_cores" and isinstance(value, int | float):
        return f"{value:.2f}"
    return str(value)


#: Ranks labelled on the heatmap's axis, and stragglers labelled beyond them.
MAX_RANK_TICKS = 24


def _ranks_figure(raw: list[RankRun], worst_first: list[Any], buckets: int) -> Figure | None:
    """Rows: ranks; columns: time slices on rank 0's clock; colour: step time, then input share.
    ``worst_first``: the stragglers; the worst ``MAX_RANK_TICKS`` get a tick of their own."""
    from matplotlib.figure import Figure

    series = []
    for r in sorted(raw, key=lambda r: r.rank):
        if r.run is None or not r.run.steps:
            continue
        shift = float(r.started_at or r.run.started_at or 0.0) + float(r.clock_offset or 0.0)
        series.append((r.rank, shift, r.run.steps))
    if len(series) < 2:
        return None
    origin = min(shift for _, shift, _ in series)
    # From the first step of any rank to the last: a job's start-up (process group, data) is not drawn.
    first = min(shift - origin + min(s.start for s in steps) for _, shift, steps in series)
    span = max(shift - origin + max(s.end for s in steps) for _, shift, steps in series) - first
    # No more slices than a rank has step records: an empty slice would read as a gap.
    cols = max(1, min(buckets // 2, min(len(steps) for _, _, steps in series)))
    step_ms = np.full((len(series), cols), np.nan)
    share = np.full((len(series), cols), np.nan)
    for row, (_, shift, steps) in enumerate(series):
        mid = np.array([(s.start + s.end) / 2 for s in steps]) + shift - origin - first
        dur = np.array([s.end - s.start for s in steps])
        n = np.array([s.merged or 1 for s in steps], dtype=float)
        inp = np.array([(s.data_wait or 0.0) + (s.h2d or 0.0) for s in steps])
        idx = np.clip((mid / max(span, 1e-9) * cols).astype(int), 0, cols - 1)
        k = np.bincount(idx, weights=n, minlength=cols)
        d = np.bincount(idx, weights=dur, minlength=cols)
        w = np.bincount(idx, weights=inp, minlength=cols)
        used = k > 0
        step_ms[row, used] = d[used] / k[used] * 1000
        share[row, used] = np.minimum(w[used] / np.maximum(d[used], 1e-12), 1.0) * 100
    height = 1.2 + 0.22 * len(series)
    fig = Figure(figsize=(10.5, min(2 * height + 0.8, 16)), dpi=96)
    axes = fig.subplots(2, 1, sharex=True)
    stragglers, ticked = set(worst_first), set(worst_first[:MAX_RANK_TICKS])  # more ticks would overlap
    labels = [f"rank {rank}" + ("  straggler" if rank in stragglers else "") for rank, _, _ in series]
    for ax, grid, name, cmap in ((axes[0], step_ms, "step time (ms)", "viridis"),
                                 (axes[1], share, "input share of step (%)", "Reds")):
        image = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap=cmap, origin="upper",
                          extent=(first, first + span, len(series) - 0.5, -0.5), vmin=0,
                          vmax=100 if "share" in name else None)
        fig.colorbar(image, ax=ax, pad=0.01, fraction=0.04).set_label(name, fontsize=8)
        every = max(1, len(series) // MAX_RANK_TICKS)  # a tick a rank up to 24, then fewer
        ticks = [i for i, (rank, _, _) in enumerate(series) if i % every == 0 or rank in ticked]
        ax.set_yticks(ticks, [labels[i] for i in ticks], fontsize=7.5)
        for i, label in zip(ticks, ax.get_yticklabels(), strict=True):
            if series[i][0] in stragglers:
                label.set_color("#c62828")
        ax.tick_params(labelsize=8)
        ax.set_title(name, fontsize=9, loc="left")
    axes[-1].set_xlabel("seconds since the first rank started (rank 0's clock)", fontsize=8.5)
    fig.tight_layout()
    return fig
