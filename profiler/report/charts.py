"""The report's charts: matplotlib figures of a run (steps, GPUs, CPU, memory over time)
and of a job (every rank over time), written as SVG for the HTML page.

NOTE [ Honest downsampling ]
A 100,000-step run holds up to 20,000 step records (timeline.MAX_STEP_RECORDS:
older steps merged pairwise) and up to 20,000 samples per buffer; drawn point by
point that is tens of MB of SVG. Each series is cut into at most ``buckets``
equal slices of the run's time: a line is the slice's mean (time-weighted where
a reading covers a window), a shaded band its lowest to highest reading. The
page says how many records went into how many slices.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..units import plural

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ..jobs.records import RankRun
    from . import RunReport

# Input wait, copy, compute: warm to cool, so "waiting" reads as the problem.
_WAIT, _H2D, COMPUTE = "#e4572e", "#f3a712", "#4c72b0"
_JUDGED = "#fff4cc"


def svg(fig: Figure, prefix: str) -> str:
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
class Downsampled:
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


def run_figure(report: RunReport, buckets: int, note: Downsampled) -> Figure | None:
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
    others = plural(gpus.seen - len(gpus.drawn), "other GPU")
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
                  "training process", COMPUTE)
            if m.workers_seen:
                _line(ax, _bin(t, [h.children_cpu / 100 for h in host], span, buckets, weights),
                      f"loader workers, all ({m.workers_seen})", _WAIT)
                if workers.pids:
                    for n, pid in enumerate(workers.pids):
                        _line(ax, _bin(t, workers.cpu[n] / 100, span, buckets, weights), f"worker {pid}",
                              _WORKER_COLOURS[n % len(_WORKER_COLOURS)], band=False, linewidth=1.0)
                    if workers.rest is not None:
                        _line(ax, _bin(t, workers.rest / 100, span, buckets, weights),
                              f"{plural(workers.seen - len(workers.pids), 'other worker')}, summed", "#999999",
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
                  "training process", COMPUTE)
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


def _nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


def _judged_window(run: Any, warmup: int) -> tuple[float, float] | None:
    steps = run.steps[warmup:]  # warm-up records are never merged (metrics.compute_metrics)
    return (steps[0].start, steps[-1].end) if steps else None


def _steps_panel(ax: Axes, steps: list[Any], span: float, buckets: int, note: Downsampled) -> None:
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
    ax.fill_between(x, w_ms + c_ms, w_ms + c_ms + compute, color=COMPUTE, label="compute", **kw)
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


#: Ranks labelled on the heatmap's axis, and stragglers labelled beyond them.
MAX_RANK_TICKS = 24


def ranks_figure(raw: list[RankRun], worst_first: list[Any], buckets: int) -> Figure | None:
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
