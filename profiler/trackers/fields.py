"""Pure: a report as the flat, namespaced fields a tracker run takes.

Numbers (``loadprof/data_wait_fraction``, ``loadprof/cost/energy_j``, ...) and texts
(``loadprof/verdict``, ``loadprof/top_recommendation``, ...), both keyed
``loadprof/...`` so that they sort together in a run's summary and never clash with
the script's own metrics. The list is documented in docs/trackers.md.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from typing import Any

from ..advice.base import speedup_text
from ..cost import cost_line

PREFIX = "loadprof/"

#: The cost figures a tracker gets, when measured (cost.py's names).
COST_NUMBERS = ("energy_j", "mean_power_w", "joules_per_step", "joules_per_sample", "input_wait_energy_j",
                "input_wait_fraction", "other_idle_fraction", "gpu_hours_input_per_day",
                "gpu_hours_input_per_epoch", "gpu_hours_idle_per_day", "gpu_hours_idle_per_epoch",
                "money_input_per_day", "money_input_per_epoch", "money_idle_per_day", "gpu_hour_price")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _run_numbers(report: Any) -> dict[str, Any]:
    """A run's figures: its steps and its GPU."""
    from ..report.job import JobReport

    if isinstance(report, JobReport):  # the job's: its step, its ranks' GPUs, the stragglers
        d = report.diagnosis
        utils = [r.gpu_util for r in d.ranks if r.gpu_util is not None]
        return {"step_ms_median": None if d.step_time is None else d.step_time * 1000.0,
                "steps": logged_step(report), "gpu_util_median": statistics.median(utils) if utils else None,
                "world_size": d.world_size, "stragglers": len(d.stragglers)}
    return {"step_ms_median": report.steps["median_s"] * 1000.0, "steps": report.steps["count"],
            "gpu_util_median": report.samples["gpu"]["util_median"]}


def logged_step(report: Any) -> int:
    """The step the summary is logged at: the run's last (a job's: its ranks' most)."""
    from ..report.job import JobReport

    if isinstance(report, JobReport):
        return max((r.steps for r in report.diagnosis.ranks if r.steps is not None), default=0)
    return int(report.steps["count"])


def summary_fields(report: Any) -> tuple[dict[str, float], dict[str, str]]:
    """(numbers, texts) of ``report`` (a ``loadprof.Report``: a run's, or a job's across
    its ranks), keys ``loadprof/...``."""
    numbers: dict[str, Any] = {"data_wait_fraction": report.data_wait_fraction, **_run_numbers(report)}
    texts: dict[str, Any] = {
        "verdict": report.verdict,
        "cause": report.cause,
        "confidence": report.confidence,
        "summary": report.summary,
    }
    if report.recommendations:
        top = report.recommendations[0]
        texts["top_recommendation"] = top.id
        texts["top_recommendation_title"] = top.title
        numbers["top_recommendation_speedup"] = top.estimated_speedup
    cost = report.cost
    texts["cost"] = cost_line(cost)
    numbers["cost/measured"] = 1.0 if cost.measured else 0.0
    for name in COST_NUMBERS:
        numbers[f"cost/{name}"] = getattr(cost, name)
    kept = {PREFIX + k: v for k, v in ((k, _number(v)) for k, v in numbers.items()) if v is not None}
    said = {PREFIX + k: str(v) for k, v in texts.items() if v}
    return kept, said


def markdown(report: Any) -> str:
    """The summary as a few lines of Markdown (TensorBoard's text tab)."""
    _, texts = summary_fields(report)
    lines = [f"**loadprof verdict: {report.headline()}**", "", report.summary, ""]
    for i, r in enumerate(report.recommendations, 1):
        est = f" {speedup_text(r.estimated_speedup, r.bound, r.floor)}" if r.estimated_speedup else ""
        lines.append(f"{i}. {r.title} `[{r.id}]`{est}")
    lines += ["", texts.get(PREFIX + "cost", "")]
    return "\n".join(lines).strip()


#: The trackers ``log_to`` names (trackers/__init__.py maps each to its module).
NAMES = ("wandb", "mlflow", "tensorboard")
#: ... and the live exports: while the job runs, not into a run (trackers/otlp.py)
LIVE = ("otlp",)


def parse_log_to(spec: str | Iterable[str] | None) -> dict[str, str | None]:
    """``"wandb,mlflow,tensorboard=DIR"`` (or a list of those) -> {name: argument or None}.

    The argument is W&B's project, MLflow's experiment, TensorBoard's log folder (OTLP
    takes none: OpenTelemetry's own variables configure it). ValueError names what is
    not a tracker."""
    if not spec:
        return {}
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out: dict[str, str | None] = {}
    for item in items:
        name, eq, arg = item.strip().partition("=")
        if not name:
            continue
        if name not in NAMES + LIVE:
            raise ValueError(f"log_to: expected trackers among {', '.join(NAMES + LIVE)} (tensorboard=DIR), "
                             f"got {name!r}")
        out[name] = arg if eq and arg else None
    return out
