"""The report of a multi-process job: every rank's run diagnosed, and the job across them.

``build_job_report(job)`` is where per-rank diagnosis, the diagnosis across ranks and
advice meet a ``JobRun``; ``JobConsoleRenderer`` prints it, and ``to_dict`` is its
JSON (the usual keys of a report, ``cost`` summed over the ranks' GPUs, plus
``world_size``, ``ranks``, ``stragglers`` and the raw ``job`` that ``loadprof report``
diagnoses again).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import IO, Any

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..advice import Recommendation, by_gain, recommend
from ..cost import Cost, RankCost, cost_line, cost_of, job_cost, rank_gpus
from ..jobs.diagnosis import JobDiagnosis, OwnVerdict, RankFigures, diagnose_job, passing_run, where
from ..jobs.estimates import job_estimate
from ..jobs.records import JobRun
from ..jsonio import dumps
from ..records import SCHEMA_VERSION
from ..thresholds import DEFAULT_THRESHOLDS, Evidence
from .base import RankRunOffset, Report
from .console import print_recommendation

#: From this many ranks the terminal table shows the slowest and fastest few and the spread.
COMPACT_FROM = 64
COMPACT_EACH = 5


@dataclass
class JobRecommendation:
    """One recommendation and the ranks (and hosts) it applies to."""

    recommendation: Recommendation
    ranks: list[int] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {**self.recommendation.to_dict(), "ranks": self.ranks, "hosts": self.hosts}

    # read as a run's recommendation is (the notebook and text renderers)
    @property
    def title(self) -> str:
        return self.recommendation.title

    @property
    def id(self) -> str:
        return self.recommendation.id

    @property
    def detail(self) -> str:
        return self.recommendation.detail

    @property
    def code(self) -> str:
        return self.recommendation.code

    @property
    def estimated_speedup(self) -> float | None:
        return self.recommendation.estimated_speedup

    @property
    def bound(self) -> bool:
        return self.recommendation.bound

    @property
    def floor(self) -> bool:
        return self.recommendation.floor

    @property
    def basis(self) -> str:
        return self.recommendation.basis


@dataclass(repr=False)
class JobReport(Report):
    """A multi-process job's report, on rank 0 (``Profile.report`` there; ``loadprof merge``)."""

    job: JobRun
    diagnosis: JobDiagnosis
    recommendations: list[JobRecommendation] = field(default_factory=list)
    gpu_hour_price: float | None = None  # the user's, for ``cost``'s money figures (no default)
    _rank_costs: dict[int, Cost] | None = field(default=None, init=False, compare=False)

    @property
    def cost(self) -> Cost:
        """The input wait's cost across the job's GPUs (NOTE [ Energy of a run ] in cost.py)."""
        costs = self.rank_costs()
        parts = [RankCost(r.rank, r.host, costs[r.rank]) for r in self.job.ranks if r.rank in costs]
        missing = [RankCost(r, "", Cost(measured=False, why_not="no report from the rank"))
                   for r in self.diagnosis.missing if r not in costs]
        return job_cost(parts + missing, self.gpu_hour_price)

    def rank_costs(self) -> dict[int, Cost]:
        """Each present rank's own cost, by rank (worked out once: a rank's run may have
        to be built from its columns)."""
        if self._rank_costs is None:
            d = self.diagnosis
            self._rank_costs = {}
            for rank in self.job.ranks:
                run = passing_run(rank) if rank.rank in d.per_rank else None
                if run is not None:
                    self._rank_costs[rank.rank] = cost_of(run, d.per_rank[rank.rank].metrics,
                                                          gpus=rank_gpus(run, rank.local_rank))
        return self._rank_costs

    @property
    def limitations(self) -> list[str]:
        return self.job.limitations

    @property
    def evidence(self) -> list[Evidence]:
        """The pace-setting rank's evidence (the job goes at its pace)."""
        d = self.diagnosis
        pace = d.per_rank.get(d.pace_ranks[0]) if d.pace_ranks else None
        return list(pace.evidence) if pace else []

    def render_console(self, file: IO[str] | None = None, width: int | None = None) -> None:
        JobConsoleRenderer(file=file, width=width).render(self)

    def ranked_runs(self) -> list[RankRunOffset]:
        return [(r.rank, r.run, r.clock_offset) for r in self.job.ranks if r.run is not None]

    def __repr__(self) -> str:
        return (f"<loadprof JobReport {self.verdict}" + (f" ({self.cause})" if self.cause else "")
                + f", confidence {self.confidence}, {self.job.world_size} ranks, "
                + f"recommendations: {', '.join(self.recommendation_ids()) or 'none'}>")

    @property
    def data_wait_fraction(self) -> float:
        """The pace-setting ranks' input share (the mean over them)."""
        rows = [r for r in self.diagnosis.ranks if r.rank in self.diagnosis.pace_ranks
                and r.data_wait_fraction is not None]
        return sum(r.data_wait_fraction or 0.0 for r in rows) / len(rows) if rows else 0.0

    def recommendation_ids(self) -> list[str]:
        return [r.recommendation.id for r in self.recommendations]

    def to_dict(self, columns: bool | None = False) -> dict[str, Any]:
        """The report's JSON form; ``job`` holds every rank's run as a saved run, or with
        ``columns`` as the job's file keeps it (NOTE [ Columns of a rank ] in jobs/columns.py);
        None: no ``job``."""
        d = self.diagnosis
        pace = d.per_rank.get(d.pace_ranks[0]) if d.pace_ranks else None
        costs = self.rank_costs()
        rank0 = next((r.head for r in self.job.ranks if r.rank == 0 and r.head is not None), None)
        return {
            "schema": SCHEMA_VERSION,
            "verdict": d.verdict,
            "cause": d.cause,
            "confidence": d.confidence,
            "summary": d.summary,
            "warnings": [{"id": wid, "detail": detail} for wid, detail in d.warnings],
            "evidence": [{**asdict(e), "rank": d.pace_ranks[0]} for e in pace.evidence] if pace else [],
            "recommendations": [r.to_dict() for r in self.recommendations],
            "world_size": self.job.world_size,
            "ranks": [_row_dict(row, costs.get(row.rank)) for row in d.ranks],
            "stragglers": [asdict(s) for s in d.stragglers],
            "pace_ranks": list(d.pace_ranks),
            "missing_ranks": list(d.missing),
            "steps": {"median_s": d.step_time, "end_spread_s": d.step_end_spread},
            "whatif": {"changes": [{**asdict(w), "speedup": w.speedup} for w in d.whatif],
                       "skipped": d.whatif_skipped},
            "data_wait_fraction": self.data_wait_fraction,
            "cost": self.cost.to_dict(),
            "limitations": list(self.job.limitations),
            "exit_status": rank0.exit_status if rank0 else "",
            "duration_s": rank0.duration if rank0 else None,
            **({} if columns is None else {"job": self.job.to_dict(columns=columns)}),
        }

    def to_json(self) -> str:
        """Strict JSON: the summary indented, the ranks' raw runs (``job``) compact and in
        columns, so that a job of many ranks writes and reads in a fraction of a second
        (NOTE [ Columns of a rank ] in jobs/columns.py)."""
        data = self.to_dict(columns=None)
        raw = self.job.to_json()
        head = dumps(data, indent=2).rstrip().rstrip("}").rstrip()
        return f'{head},\n  "job": {raw}\n}}\n'


def _row_dict(row: RankFigures, cost: Cost | None) -> dict[str, Any]:
    measured = cost is not None and cost.measured
    return {
        "rank": row.rank, "local_rank": row.local_rank, "node_rank": row.node_rank, "host": row.host,
        "verdict": row.verdict, "cause": row.cause, "missing": row.missing or None, "steps": row.steps,
        "step_time_s": row.step_time, "input_wait_s": row.input_wait, "h2d_s": row.h2d,
        "compute_s": row.compute, "collective_s": row.collective, "own_work_s": row.own_work,
        "cpu_wait_s": row.cpu_wait, "data_wait_fraction": row.data_wait_fraction, "gpu_util": row.gpu_util,
        "gpu_memory_peak_fraction": row.gpu_memory_peak, "cpu_cores": row.cpu_cores,
        "workers_cpu_cores": row.workers_cpu_cores, "clock_offset_s": row.clock_offset,
        # its own share of the job's cost (null: not measured on this rank)
        "gpu_hours_input_per_day": cost.gpu_hours_input_per_day if cost is not None and measured else None,
    }


def build_job_report(job: JobRun, own: dict[int, OwnVerdict] | None = None,
                     gpu_hour_price: float | None = None) -> JobReport:
    """The job's report; ``own``: verdicts the ranks made of themselves (``diagnose_job``);
    ``gpu_hour_price`` for the cost's money figures."""
    d = diagnose_job(job, own_verdicts=own)
    by_rank = {r.rank: r for r in job.ranks}
    hosts = {row.rank: row.host for row in d.ranks}
    grouped: dict[str, JobRecommendation] = {}
    for rank in d.pace_ranks:
        diagnosis = d.per_rank.get(rank)
        if rank in d.own:
            recs = d.own[rank].recommendations
        else:
            run = passing_run(by_rank[rank]) if rank in by_rank else None
            if run is None or diagnosis is None:
                continue
            recs = recommend(run, diagnosis, d.thresholds.get(rank, DEFAULT_THRESHOLDS))
        for own_rec in recs:
            rec = job_estimate(own_rec, d.whatif)
            if rec is None:  # measured on every rank to gain the job nothing
                continue
            entry = grouped.setdefault(rec.id, JobRecommendation(rec))
            entry.ranks.append(rank)
            if hosts.get(rank) and hosts[rank] not in entry.hosts:
                entry.hosts.append(hosts[rank])
    # ordered by what each buys, the job's measured figures in place of the ranks' own
    order = {id(rec): i for i, rec in enumerate(by_gain([e.recommendation for e in grouped.values()]))}
    entries = sorted(grouped.values(), key=lambda e: order[id(e.recommendation)])
    return JobReport(job, d, entries, gpu_hour_price)


def load_job(data: Any, gpu_hour_price: float | None = None) -> JobReport:
    """A saved job report's ``job``, validated (RecordError) and diagnosed again."""
    return build_job_report(JobRun.from_dict(data), gpu_hour_price=gpu_hour_price)


def _secs(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1000:.1f}ms" if x < 1 else f"{x:.2f}s"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _ranks(ranks: list[int], hosts: list[str], world: int) -> str:
    if len(ranks) == world:
        return "all ranks"
    shown = ", ".join(str(r) for r in ranks[:12]) + (" ..." if len(ranks) > 12 else "")
    return f"rank{'s' if len(ranks) > 1 else ''} {shown}" + (f" on {', '.join(hosts[:4])}" if hosts else "")


class JobConsoleRenderer:
    def __init__(self, file: IO[str] | None = None, width: int | None = None) -> None:
        self.console = Console(file=file, width=width, highlight=False, soft_wrap=False)

    def render(self, report: JobReport) -> None:
        c = self.console
        d = report.diagnosis
        head = Text()
        head.append("loadprof job verdict: ", style="bold")
        head.append(d.verdict.upper(), style="bold")
        if d.cause:
            head.append(f" ({d.cause})")
        head.append(f"   confidence: {d.confidence}\n{d.summary}")
        present = len(d.ranks) - len(d.missing)
        head.append(f"\n{d.world_size} ranks ({present} reported); job step {_secs(d.step_time)}", style="dim")
        if d.step_end_spread is not None:
            head.append(f"; step ends on one clock within {_secs(d.step_end_spread)} (median)", style="dim")
        for wid, detail in d.warnings:
            head.append(f"\nwarning [{wid}]: ", style="bold yellow")
            head.append(detail, style="yellow")
        c.print(Panel(head, expand=False))
        c.print(self._table(d))
        cost = report.cost
        c.print(Text(cost_line(cost), style="dim" if not cost.measured else ""))
        for s in d.stragglers:
            line = Text(f"straggler: {where(_find(d, s.rank))}, cause {s.cause}: ", style="bold red")
            line.append(s.detail)
            c.print(line)
        if report.recommendations:
            c.print(Text("Recommendations", style="bold"))
            for i, r in enumerate(report.recommendations, 1):
                print_recommendation(c, i, r, f"for {_ranks(r.ranks, r.hosts, d.world_size)}")
        for row in d.ranks:
            if row.missing:
                c.print(Text(f"missing: {where(row)}: {row.missing}", style="yellow"))
        if report.job.limitations:
            c.print(Text("Not measured:", style="bold yellow"))
            for limit in report.job.limitations:
                c.print(Text(f"  - {limit}", style="yellow"))
        c.print(Text("Each rank's full report: loadprof report FILE.json (the raw runs are under 'job')",
                     style="dim"))

    def _table(self, d: JobDiagnosis) -> Table:
        rows = [r for r in d.ranks if not r.missing]
        compact = len(d.ranks) >= COMPACT_FROM
        title = ("Per rank, ms per step after warm-up (* straggler; comp = own compute, coll = blocked in "
                 "collectives; GPU busy/memory; CPU cores rank+workers)")
        if compact:
            title = f"Per rank: the {COMPACT_EACH} slowest and fastest of {len(d.ranks)} by own work, ms per step"
        table = Table(title=title, title_justify="left", expand=False, padding=(0, 1))
        # GPU: busy %/peak memory of its device; CPU: cores of the rank + of its loader workers
        for name in ("rank", "host:lr", "verdict", "step", "input", "h2d", "comp", "coll", "GPU", "CPU"):
            table.add_column(name, justify="left" if name in ("host:lr", "verdict") else "right")
        stragglers = {s.rank for s in d.stragglers}
        shown = rows
        if compact and len(rows) > 2 * COMPACT_EACH:
            ordered = sorted(rows, key=lambda r: -(r.own_work or 0.0))
            shown = ordered[:COMPACT_EACH] + ordered[-COMPACT_EACH:]
        for i, r in enumerate(shown):
            if shown is not rows and i == COMPACT_EACH:
                table.add_row("...", f"{len(rows) - 2 * COMPACT_EACH} more", *[""] * 8)
            gpu = "-" if r.gpu_util is None else f"{r.gpu_util:.0f}%"
            if r.gpu_memory_peak is not None:
                gpu += f"/{_pct(r.gpu_memory_peak)}"
            cpu = "-" if r.cpu_cores is None else f"{r.cpu_cores:.1f}+{r.workers_cpu_cores or 0.0:.1f}"
            mark = "*" if r.rank in stragglers else ""
            table.add_row(f"{mark}{r.rank}", f"{r.host}:{'-' if r.local_rank is None else r.local_rank}",
                          _SHORT.get(r.verdict, r.verdict), _ms(r.step_time), _ms(r.input_wait), _ms(r.h2d),
                          _ms(r.compute), _ms(r.collective), gpu, cpu,
                          style="bold red" if mark else None)
        if compact:
            works = sorted(r.own_work for r in rows if r.own_work is not None)
            if works:
                table.caption = (f"own work per step: fastest {_secs(works[0])}, median "
                                 f"{_secs(works[len(works) // 2])}, slowest {_secs(works[-1])}")
        return table


_SHORT = {"data-starved": "data", "compute-bound": "compute", "memory-bound": "memory",
          "host-bound": "host", "inconclusive": "?"}


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.1f}"


def _find(d: JobDiagnosis, rank: int) -> RankFigures:
    return next(r for r in d.ranks if r.rank == rank)
