"""Reports: a ``Run`` diagnosed and advised, and its renderers.

``build_report(run)`` is the one place where diagnosis and advice meet a run;
each output format is one renderer with ``render(report)``.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from ..advice import Recommendation, recommend
from ..diagnosis import Diagnosis, diagnose
from ..jsonio import JsonWriteError, write_text_atomic
from ..records import SCHEMA_VERSION, RecordError, Run
from .console import ConsoleRenderer
from .jsonfile import JsonRenderer

__all__ = ["Report", "build_report", "failed_report", "load_report", "render_console", "write_json",
           "ConsoleRenderer", "JsonRenderer", "JsonWriteError", "ReportError"]


class ReportError(Exception):
    """A saved report/run that cannot be read; the message names the file."""


@dataclass
class Report:
    run: Run
    diagnosis: Diagnosis
    recommendations: list[Recommendation] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return self.diagnosis.verdict

    @property
    def cause(self) -> str | None:
        return self.diagnosis.cause

    @property
    def data_wait_fraction(self) -> float:
        return self.diagnosis.metrics.data_wait_fraction

    def recommendation_ids(self) -> list[str]:
        return [r.id for r in self.recommendations]

    def to_dict(self) -> dict[str, Any]:
        m = self.diagnosis.metrics
        run = self.run
        env = asdict(run.environment)
        return {
            "schema": SCHEMA_VERSION,
            "verdict": self.verdict,
            "cause": self.cause,
            "confidence": self.diagnosis.confidence,
            "summary": self.diagnosis.summary,
            "warnings": [{"id": wid, "detail": detail} for wid, detail in self.diagnosis.warnings],
            "evidence": [asdict(e) for e in self.diagnosis.evidence],
            "recommendations": [r.to_dict() for r in self.recommendations],
            "steps": {
                "count": m.steps_total,
                "judged": m.steps_judged,
                "warmup": m.warmup_steps,
                "median_s": m.step_time_median,
                "mean_s": m.step_time_mean,
                "compute_per_step_s": m.compute_per_step,
            },
            "data_wait_fraction": m.data_wait_fraction,
            "data_wait_method": run.data_wait_method,
            "samples": {
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
                },
            },
            "loaders": [asdict(li) for li in run.loaders],
            "environment": env,
            "limitations": list(run.limitations),
            "exit_status": run.exit_status,
            "duration_s": run.duration,
            "run": run.to_dict(),
        }


def build_report(run: Run) -> Report:
    diagnosis = diagnose(run)
    return Report(run, diagnosis, recommend(run, diagnosis))


def failed_report(run: Run, reason: str) -> Report:
    """The report of a run whose diagnosis failed: inconclusive, saying why, the run kept whole."""
    line = f"loadprof could not diagnose this run ({reason})"
    if line not in run.limitations:
        run.limitations.append(line)
    return Report(run, Diagnosis(verdict="inconclusive", cause=None, summary=line, confidence="low"))


def render_console(report: Report, file: IO[str] | None = None, width: int | None = None) -> None:
    ConsoleRenderer(file=file, width=width).render(report)


def write_json(report: Report, path: str | os.PathLike[str]) -> None:
    """Write atomically (jsonio): a reader never sees half a report. Raises JsonWriteError."""
    write_text_atomic(path, JsonRenderer().render(report))


#: Larger than any run loadprof writes (its buffers are bounded: a few tens of MiB at
#: most), so a bigger file is refused before it is read (bounded memory).
MAX_SAVED_BYTES = 256 * 2**20


def load_report(path: str | os.PathLike[str]) -> Report:
    """Read a saved report (or bare run) and diagnose it again with this loadprof.

    Every way the file can be wrong is one ReportError naming it (NOTE [ Reading a
    saved run ] in records.py)."""
    p = Path(path)
    try:
        if not stat.S_ISREG(p.stat().st_mode):  # a FIFO would block, /dev/zero never end
            raise ReportError(f"{p}: not a regular file")
        with p.open("rb") as f:
            raw_bytes = f.read(MAX_SAVED_BYTES + 1)
    except FileNotFoundError:
        raise ReportError(f"{p}: no such file") from None
    except OSError as exc:
        raise ReportError(f"{p}: cannot read ({exc.strerror or exc})") from None
    if len(raw_bytes) > MAX_SAVED_BYTES:
        raise ReportError(f"{p}: larger than {MAX_SAVED_BYTES // 2**20} MiB: not a run loadprof wrote")
    try:
        data = json.loads(raw_bytes.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ReportError(f"{p}: not JSON (not UTF-8 text at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise ReportError(f"{p}: not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise ReportError(f"{p}: not a loadprof report (JSON nested too deeply)") from None
    if not isinstance(data, dict):
        raise ReportError(f"{p}: expected a loadprof report object, got {type(data).__name__}")
    raw = data.get("run", data)
    if not isinstance(raw, dict) or "steps" not in raw or "environment" not in raw:
        raise ReportError(f"{p}: not a loadprof report (no 'run' with 'steps' and 'environment')")
    try:
        run = Run.from_dict(raw)
    except RecordError as exc:
        raise ReportError(f"{p}: {exc}") from None
    return build_report(run)
