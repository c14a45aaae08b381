"""The CI gate behind ``loadprof check RUN.json`` (commands/check.py). Exit 0 when
every limit holds, 1 with one line per broken limit, 2 on a usage error or a run
that cannot be read.

The limits:
- ``--max-data-wait FRACTION``: the judged steps' input share (wait + host-to-device
  copy, as the report's ``data_wait_fraction``) at most this;
- ``--max-slowdown PERCENT``: the median step time at most this much above the
  ``--baseline`` run's;
- ``--fail-on VERDICT ...``: the verdict is none of these.

A slowdown is only meaningful between runs of the same script and batch size, so
other pairs are refused (exit 2) unless ``--force``. The script is compared by file
name (argv[0]'s last part, or the ``-m`` module name): a CI checkout and a laptop
hold the same script at different paths.

A multi-process job's report (torchrun, ``loadprof merge``) is gated on its ranks:
its data wait is the worst rank's input share and its median step the slowest
rank's (the job goes at that rank's pace), over the ranks that reported; the lines
name the rank. A job and a single process, or jobs of different sizes, are not
comparable without ``--force``.
"""

from __future__ import annotations

import functools
import os
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..metrics import main_loader
from ..report import Report, RunReport
from ..report.job import JobReport

if TYPE_CHECKING:
    from ..records import Run


@dataclass
class Limits:
    max_data_wait: float | None = None  # fraction of step time, 0..1
    max_slowdown: float | None = None  # percent over the baseline's median step time
    fail_on: tuple[str, ...] = ()


@dataclass
class Broken:
    """One broken limit, as its line says it."""

    limit: str
    line: str


class CheckError(Exception):
    """The check cannot be made (a mismatched baseline, nothing measured): exit 2."""


@dataclass
class Figures:
    """What the limits read from a report: one run's figures, or a job's from its ranks."""

    verdict: str
    cause: str | None
    steps_judged: int
    data_wait_fraction: float
    step_time_median: float
    script: str = ""
    batch_size: int | None = None
    world_size: int = 1
    wait_rank: int | None = None  # a job: the rank whose input share is the job's (the worst)
    step_rank: int | None = None  # a job: the rank whose median step is the job's (the slowest)

    @property
    def kind(self) -> str:
        return "a single process" if self.world_size == 1 else f"a job of {self.world_size} ranks"

    def data_wait(self, which: bool = True) -> str:
        """'40.2%', in a job with its rank: 'on rank 1 (the job's worst)'."""
        if not self.steps_judged:
            return "not measured (no judged steps)"
        return f"{self.data_wait_fraction:.1%}{_on(self.wait_rank, 'worst' if which else '')}"

    def median_step(self, which: bool = True) -> str:
        if not self.steps_judged:
            return "not measured (no judged steps)"
        return f"{_ms(self.step_time_median)}{_on(self.step_rank, 'slowest' if which else '')}"


def _on(rank: int | None, which: str) -> str:
    if rank is None:
        return ""
    return f" on rank {rank}" + (f" (the job's {which})" if which else "")


@functools.singledispatch
def figures(report: Report) -> Figures:
    """A single run's figures, or a job's: the worst input share and the slowest median step
    of the ranks with judged steps (the module doc says why)."""
    raise TypeError(f"no figures for {type(report).__name__}")


@figures.register
def _run_figures(report: RunReport) -> Figures:
    m = report.diagnosis.metrics
    return Figures(report.verdict, report.cause, m.steps_judged, m.data_wait_fraction, m.step_time_median,
                   script_name(report.run), batch_size(report.run))


@figures.register
def _job_figures(report: JobReport) -> Figures:
    d = report.diagnosis
    judged = {r: diag.metrics for r, diag in sorted(d.per_rank.items()) if diag.metrics.steps_judged}
    first = next((r for r in sorted(report.job.ranks, key=lambda r: r.rank) if r.run is not None), None)
    out = Figures(report.verdict, report.cause, min((m.steps_judged for m in judged.values()), default=0),
                  0.0, 0.0, script_name(first.run) if first and first.run else "",
                  batch_size(first.run) if first and first.run else None, report.job.world_size)
    if judged:
        out.wait_rank = max(judged, key=lambda r: judged[r].data_wait_fraction)
        out.step_rank = max(judged, key=lambda r: judged[r].step_time_median)
        out.data_wait_fraction = judged[out.wait_rank].data_wait_fraction
        out.step_time_median = judged[out.step_rank].step_time_median
    return out


def check(report: Report, limits: Limits, baseline: Report | None = None,
          force: bool = False) -> list[Broken]:
    """The broken limits of ``report`` (empty: every limit holds). Pure: no I/O."""
    if limits.max_slowdown is not None and baseline is None:
        raise CheckError("--max-slowdown needs --baseline BASE.json")
    m = figures(report)
    base = figures(baseline) if baseline is not None else None
    if base is not None and not force:
        _same_kind(m, base)
    broken: list[Broken] = []
    if limits.max_data_wait is not None:
        if not m.steps_judged:
            raise CheckError("--max-data-wait: the run has no judged steps to measure its input share on")
        if m.data_wait_fraction > limits.max_data_wait:
            was = f" (baseline {base.data_wait(False)})" if base is not None and base.steps_judged else ""
            on = _on(m.wait_rank, "worst")
            broken.append(Broken("max-data-wait", f"data wait {m.data_wait_fraction:.1%} of step time{on} > "
                                                  f"limit {limits.max_data_wait:.1%}{was}"))
    if limits.max_slowdown is not None:
        assert base is not None
        if not m.steps_judged or not base.steps_judged or base.step_time_median <= 0:
            which = "the run" if not m.steps_judged else "the baseline"
            raise CheckError(f"--max-slowdown: {which} has no judged steps to take a median step time from")
        slowdown = 100.0 * (m.step_time_median / base.step_time_median - 1.0)
        if slowdown > limits.max_slowdown:
            broken.append(Broken("max-slowdown", f"median step {m.median_step()} is {slowdown:.1f}% "
                                                 f"slower than the baseline's {base.median_step(False)} > "
                                                 f"limit {limits.max_slowdown:g}%"))
    if m.verdict in limits.fail_on:
        was = f" (baseline {base.verdict})" if base is not None else ""
        reason = f" ({m.cause})" if m.cause else ""
        broken.append(Broken("fail-on", f"verdict {m.verdict}{reason} is in --fail-on{was}"))
    return broken


def script_name(run: Run) -> str:
    """The script a run ran, by file name (the module doc says why)."""
    if not run.command:
        return ""
    return os.path.basename(run.command[0].rstrip("/\\")) or run.command[0]


def batch_size(run: Run) -> int | None:
    """Samples per step: the most common among the steps that counted them, else the loader's."""
    sizes = [round(s.batch_size / s.merged) for s in run.steps if s.batch_size]
    if sizes:
        return int(statistics.mode(sizes))
    loader = main_loader(run)
    return loader.batch_size if loader is not None else None


def _same_kind(ours: Figures, theirs: Figures) -> None:
    if ours.world_size != theirs.world_size:
        raise CheckError(f"the run is {ours.kind}, the baseline {theirs.kind}: not comparable "
                         "(--force compares anyway)")
    if ours.script and theirs.script and ours.script != theirs.script:
        raise CheckError(f"the run is of {ours.script}, the baseline of {theirs.script}: not comparable "
                         "(--force compares anyway)")
    if ours.batch_size is not None and theirs.batch_size is not None and ours.batch_size != theirs.batch_size:
        raise CheckError(f"the run's batch size is {ours.batch_size}, the baseline's {theirs.batch_size}: "
                         "not comparable (--force compares anyway)")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"
