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
"""

from __future__ import annotations

import functools
import html
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..advice.base import speedup_text
from ..jsonio import write_text_atomic
from ..units import plural
from ..waits import waits_line
from ..whatif import summary as whatif_summary
from . import RunReport
from .charts import Downsampled, ranks_figure, run_figure, svg
from .console import MAX_GPUS_NAMED, gpu_names
from .job import JobReport
from .stages import MAX_ROWS, caption, random_label, where_text

if TYPE_CHECKING:

    from ..cost import Cost
    from ..jobs.records import RankRun
    from ..stagemodel import Loading
    from ..waits import Waits
    from . import Report

#: Time slices per chart (NOTE [ Honest downsampling ] in charts.py): a few hundred keep each
#: series to tens of KB and are finer than a 1,000-pixel-wide chart can show.
BUCKETS = 500

PLOT_HINT = "Charts need matplotlib: pip install matplotlib"

_VERDICT_COLOURS = {  # as the terminal's (console.py)
    "data-starved": "#c62828", "memory-bound": "#8e24aa", "host-bound": "#a67c00",
    "compute-bound": "#2e7d32", "inconclusive": "#555555",
}

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
        recs = [(r.title, r.id, r.detail, r.code, speedup_text(r.estimated_speedup, r.bound, r.floor), r.basis, "")
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
            recs.append((rec.title, rec.id, rec.detail, rec.code, speedup_text(rec.estimated_speedup, rec.bound, rec.floor),
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
    rest = (f"<p class='muted'>{plural(more, 'more input pipeline')}, iterated "
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
    return f"<div class='chart'>{svg(fig, prefix)}</div>"


def _run_charts(report: RunReport, buckets: int) -> str:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return f"<p class='muted'>{_e(PLOT_HINT)}</p>"
    note = Downsampled()
    fig = run_figure(report, buckets, note)
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
                   f"{plural(note.workers_seen - note.workers_drawn, 'worker')} summed in one line.")
    elif note.workers_seen:
        workers = " The CPU chart draws the CPU of each loader worker as a line of its own (legend: worker PID)."
    else:
        workers = ""
    gpus = (f" The GPU charts draw {note.gpus_drawn} of {note.gpus_seen:,} GPUs one line each (those the training "
            f"process used, then the busiest), the other {plural(note.gpus_seen - note.gpus_drawn, 'GPU')} as one "
            f"line of their mean." if note.gpus_seen > note.gpus_drawn else "")
    text = (f"{how}{note.steps:,} steps in {note.step_records:,} records{merged}; "
            f"{len(run.host_samples):,} host and {len(run.gpu_samples):,} GPU samples. "
            f"The shaded yellow span is the judged window (warm-up steps left out of the verdict).{workers}{gpus}")
    return f"<p class='muted'>{_e(text)}</p><div class='chart'>{svg(fig, 'run')}</div>"


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
    out.append(_chart(lambda: ranks_figure(raw, list(stragglers), buckets), "ranks"))
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
