"""Reports: a ``Run`` diagnosed and advised, and its renderers.

``build_report(run)`` is the one place where diagnosis and advice meet a run;
each output format is one renderer with ``render(report)``.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, ClassVar

from ..advice import Recommendation, recommend
from ..cost import Cost, cost_of
from ..diagnosis import Diagnosis, diagnose, near_limit
from ..frameworks import for_loader
from ..jsonio import JsonWriteError, read_json, write_text_atomic
from ..metrics import Headroom
from ..records import SCHEMA_VERSION, Environment, LoaderInfo, Run
from ..runjson import read_run
from ..settings import gpu_hour_price as check_price
from ..stagemodel import Loading, loading
from ..thresholds import Evidence
from ..typedjson import RecordError
from ..waits import Waits
from .base import RankRunOffset, Report, ReportWarning
from .console import ConsoleRenderer
from .jsonfile import JsonRenderer
from .notebook import HtmlRenderer, TextRenderer
from .stages import loading_dict, tf_limitation

__all__ = ["Report", "RunReport", "ReportWarning", "build_report", "failed_report", "load_report", "render_console",
           "write_json",
           "ConsoleRenderer", "HtmlRenderer", "JsonRenderer", "JsonWriteError", "ReportError", "TextRenderer"]


class ReportError(Exception):
    """A saved report/run that cannot be read; the message names the file."""


class _Ids(list[str]):
    """The recommendation ids; calling it, as when ``recommendation_ids`` was a method, gives the same list."""

    def __call__(self) -> list[str]:
        return list(self)


@dataclass(repr=False)
class RunReport(Report):
    """A diagnosed run: the JSON report's shape in Python.

    Each top-level key of ``to_dict()`` (what ``--json`` writes) is an attribute
    of the same name: ``verdict``, ``cause``, ``confidence``, ``summary``,
    ``warnings``, ``evidence``, ``recommendations``, ``steps``, ``waits``,
    ``data_wait_fraction``, ``data_wait_method``, ``samples``, ``memory``, ``loaders``,
    ``environment``, ``limitations``, ``exit_status``, ``duration_s``, ``cost``, ``run``.
    Objects stay objects (``recommendations[0].estimated_speedup``,
    ``environment.usable_cores``); ``to_dict()`` is the JSON. ``repr`` is one line,
    ``str`` the verdict with its warnings and recommendations, and a notebook shows
    ``_repr_html_``.
    """

    run: Run
    diagnosis: Diagnosis
    recommendations: list[Recommendation] = field(default_factory=list)
    gpu_hour_price: float | None = None  # the user's, for ``cost``'s money figures (no default)

    schema: ClassVar[int] = SCHEMA_VERSION

    @property
    def warnings(self) -> list[ReportWarning]:
        """The diagnosis's warnings, then the run's notices."""
        return super().warnings + [ReportWarning(n.id, n.detail) for n in self.run.notices]

    @property
    def evidence(self) -> list[Evidence]:
        return self.diagnosis.evidence

    @property
    def recommendation_ids(self) -> _Ids:
        return _Ids(r.id for r in self.recommendations)

    @property
    def data_wait_fraction(self) -> float:
        return self.diagnosis.metrics.data_wait_fraction

    @property
    def data_wait_method(self) -> str:
        return self.run.data_wait_method

    @property
    def steps(self) -> dict[str, Any]:
        """Counts and times of the training steps (the run's own steps: ``run.steps``)."""
        m = self.diagnosis.metrics
        return {
            "count": m.steps_total,
            "judged": m.steps_judged,
            "warmup": m.warmup_steps,
            "median_s": m.step_time_median,
            "mean_s": m.step_time_mean,
            "compute_per_step_s": m.compute_per_step,
        }

    @property
    def waits(self) -> dict[str, Any] | None:
        """The input wait per judged step as a distribution, and the steps that make its
        tail (waits.py's ``Waits``); None: no step was judged."""
        return _waits(self.diagnosis.metrics.waits)

    @property
    def samples(self) -> dict[str, Any]:
        """What the GPU and host samplers saw, summarised."""
        m = self.diagnosis.metrics
        run = self.run
        return {
            "interval_s": run.sampling.get("interval"),
            "gpu": {
                "count": len(run.gpu_samples),
                "status": run.environment.gpu_status,
                "util_median": m.gpu_util_median,
                "memory_peak_fraction": m.gpu_memory_peak_fraction,
            },
            "host": {
                "count": len(run.host_samples),
                "cpu_busy": m.cpu_busy,
                "process_tree_cpu_cores": m.tree_cpu_cores,
                "loader_workers_seen": m.workers_seen,
                "others_cpu_cores": m.others_cpu_cores,
                "run_delay": m.run_delay,
                "workers_run_delay": m.workers_run_delay,
                "disk_read_bps": m.disk_read_bps,
                "iowait_percent": m.iowait,
                "steal_percent": None if m.steal is None else 100.0 * m.steal,
            },
        }

    @property
    def memory(self) -> dict[str, Any] | None:
        """The memory headroom in bytes (NOTE [ Memory headroom ] in metrics.py); None: not read."""
        m = self.diagnosis.metrics
        return _memory(m.headroom, m.gpu_in_use)

    @property
    def stages(self) -> Loading | None:
        """The training loader's batches, stage by stage (stagemodel.py); None: not timed."""
        return loading(self.run, self.diagnosis.metrics.loader)

    @property
    def loading(self) -> dict[str, Any] | None:
        """The JSON report's ``loading``: the stages, slowest first, and their totals."""
        return loading_dict(self.stages)

    @property
    def loaders(self) -> list[LoaderInfo]:
        return self.run.loaders

    @property
    def environment(self) -> Environment:
        return self.run.environment

    @property
    def limitations(self) -> list[str]:
        """What was not measured: the run's own lines, and a tf.data loader's stages
        (all of them, or its graph transformations where its Python functions were timed)."""
        loader = self.diagnosis.metrics.loader
        line = tf_limitation(self.stages)
        adapter = for_loader(loader)
        if adapter is not None and adapter.stages_of(loader) == "python" and line not in self.run.limitations:
            return [*self.run.limitations, line]
        return self.run.limitations

    @property
    def exit_status(self) -> str:
        return self.run.exit_status

    @property
    def duration_s(self) -> float:
        return self.run.duration

    @property
    def cost(self) -> Cost:
        """Energy and GPU-hours lost to input wait (cost.py); ``measured`` False says why not."""
        return cost_of(self.run, self.diagnosis.metrics, self.gpu_hour_price)

    def to_dict(self) -> dict[str, Any]:
        run = self.run
        return {
            "schema": self.schema,
            "verdict": self.verdict,
            "cause": self.cause,
            "confidence": self.confidence,
            "summary": self.summary,
            "warnings": [w._asdict() for w in self.warnings],
            "evidence": [asdict(e) for e in self.evidence],
            "recommendations": [r.to_dict() for r in self.recommendations],
            "steps": self.steps,
            "waits": self.waits,
            "data_wait_fraction": self.data_wait_fraction,
            "data_wait_method": self.data_wait_method,
            "samples": self.samples,
            "memory": self.memory,
            "loading": self.loading,
            "loaders": [asdict(li) for li in self.loaders],
            "environment": asdict(run.environment),
            "limitations": list(self.limitations),
            "exit_status": self.exit_status,
            "duration_s": self.duration_s,
            "cost": self.cost.to_dict(),
            "run": run.to_dict(),
        }

    # -- how it shows itself ------------------------------------------------------
    def to_json(self) -> str:
        return JsonRenderer().render(self)

    def render_console(self, file: IO[str] | None = None, width: int | None = None) -> None:
        ConsoleRenderer(file=file, width=width).render(self)

    def ranked_runs(self) -> list[RankRunOffset]:
        return [(0, self.run, None)]

    def __repr__(self) -> str:
        ids = ", ".join(self.recommendation_ids) or "none"
        warned = "".join(f", warning {w.id}" for w in self.warnings)
        return (f"<loadprof Report {self.verdict}" + (f" ({self.cause})" if self.cause else "")
                + f", confidence {self.confidence}, {self.steps['count']} steps{warned}, recommendations: {ids}>")



def _memory(h: Headroom | None, gpu_in_use: bool) -> dict[str, Any] | None:
    """The memory headroom (NOTE [ Memory headroom ] in metrics.py) in bytes."""
    if h is None:
        return None
    return {
        "largest_batch": h.batch, "gpu_index": h.gpu_index, "gpu_peak_bytes": h.gpu_peak,
        "gpu_total_bytes": h.gpu_total, "gpu_peak_fraction": h.gpu_fraction, "gpu_source": h.gpu_source,
        "allocator_peak_bytes": h.allocator_peak, "host_available_min_bytes": h.host_available_min,
        "host_total_bytes": h.host_total, "limit_left_min_bytes": h.limit_left_min,
        "swap_growth_bytes": h.swap_growth, "process_peak_bytes": h.process_peak,
        "model_state_bytes": h.model_state, "step_transient_bytes": h.step_transient,
        "near_limit": near_limit(h, gpu_in_use=gpu_in_use),
    }


def _waits(w: Waits | None) -> dict[str, Any] | None:
    """The input waits (``Waits``) in seconds, as the JSON report's ``waits``."""
    if w is None:
        return None
    return {
        "steps": w.steps, "p50_s": w.p50, "p95_s": w.p95, "p99_s": w.p99, "max_s": w.max, "mean_s": w.mean,
        "stall_cut_s": w.cut, "stall_steps": w.stall_steps, "stall_s": w.stall_seconds, "tail_share": w.tail_share,
        "stalls": [{"index": st.index, "steps": st.steps, "wait_s": st.seconds, "at": st.at} for st in w.stalls],
        "at_epoch_start": w.at_epoch_start, "epoch_start_s": w.epoch_start_seconds, "period_steps": w.period,
        "first_batch_s": w.first_batch, "gc_in_waits_s": w.gc_in_waits,
    }


def build_report(run: Run, gpu_hour_price: float | None = None) -> RunReport:
    diagnosis = diagnose(run)
    return RunReport(run, diagnosis, recommend(run, diagnosis), gpu_hour_price=gpu_hour_price)


def failed_report(run: Run, reason: str) -> RunReport:
    """The report of a run whose diagnosis failed: inconclusive, saying why, the run kept whole."""
    line = f"loadprof could not diagnose this run ({reason})"
    if line not in run.limitations:
        run.limitations.append(line)
    return RunReport(run, Diagnosis(verdict="inconclusive", cause=None, summary=line, confidence="low"))


def render_console(report: Report, file: IO[str] | None = None, width: int | None = None) -> None:
    report.render_console(file=file, width=width)


def write_json(report: Report, path: str | os.PathLike[str]) -> None:
    """Write atomically (jsonio): a reader never sees half a report. Raises JsonWriteError."""
    write_text_atomic(path, report.to_json())


#: Larger than any run loadprof writes (its buffers are bounded: ~35 MiB for 20,000 readings
#: of 160 cores), so a bigger file is refused before it is read: parsing JSON costs ~10-20x
#: its size in memory (docs/bad-input.md gives the peak measured at this size).
MAX_SAVED_BYTES = 64 * 2**20


def load_report(path: str | os.PathLike[str], gpu_hour_price: float | None = None) -> Report:
    """Read a saved report (or bare run) and diagnose it again with this loadprof.

    Every way the file can be wrong is one ReportError naming it (NOTE [ Reading a
    saved run ] in runjson.py); a price that is not one is a ValueError, as in ``Profile``."""
    try:
        gpu_hour_price = check_price(gpu_hour_price)
    except ValueError as exc:
        raise ValueError(f"gpu_hour_price: {exc}") from None
    p = Path(path)
    data = read_json(p, MAX_SAVED_BYTES, ReportError, "a loadprof report")
    if not isinstance(data, dict):
        raise ReportError(f"{p}: expected a loadprof report object, got {type(data).__name__}")
    if "job" in data:  # a multi-process job's merged report (report/job.py)
        from .job import load_job

        try:
            return load_job(data["job"], gpu_hour_price)
        except RecordError as exc:
            raise ReportError(f"{p}: {exc}") from None
    raw = data.get("run", data)
    if not isinstance(raw, dict) or "steps" not in raw or "environment" not in raw:
        raise ReportError(f"{p}: not a loadprof report (no 'run' with 'steps' and 'environment')")
    try:
        run = read_run(raw)
    except RecordError as exc:
        raise ReportError(f"{p}: {exc}") from None
    return build_report(run, gpu_hour_price)
