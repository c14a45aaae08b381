"""Pure diagnosis across the ranks of a job: a ``JobRun`` in, a ``JobDiagnosis`` out.

No I/O, no threads: tests build per-rank runs by hand.

Each rank is diagnosed on its own (``diagnosis.diagnose``); then, per step after
warm-up, its time splits into its own work (input wait, host-to-device copy,
compute) and time blocked in collectives (NOTE [ Collective wait ] in
jobs/collectives.py). Under DDP the step times agree and only the own work tells
who is late: a rank is a straggler when its own work exceeds the median of the
other ranks' by ``straggler_share`` of the job's step time, while the others wait
for it. The component that explains ``cause_share`` of that excess is its cause
(TraceML blames input, copy or compute only past 80%); otherwise the cause is
"unclear". Where the rank's training thread waited for a CPU (schedstat) longer than the
others' by that share of the excess, the cause is "cpu-wait": its compute ran late because
other work held its cores, not because it has more of it. The job's verdict comes from the
ranks that set the pace: the stragglers, or without any, the verdict most ranks share.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter
from dataclasses import dataclass, field
from operator import add
from typing import Any

from ..advice import Recommendation, recommend
from ..diagnosis import Diagnosis, diagnose
from ..metrics import main_loader
from ..records import GpuSample, Run
from ..thresholds import DEFAULT_THRESHOLDS, Thresholds
from ..typedjson import RecordError
from .estimates import JobWhatIf, job_whatifs
from .records import JobRun, RankRun, check_record

#: Straggler causes, as the JSON names them.
STRAGGLER_CAUSES = {
    "input": "its input wait (the loader is slower on this rank)",
    "copy": "its host-to-device copies",
    "compute": "its compute (forward, backward, optimizer and the loop's own code)",
    "cpu-wait": "its training thread's wait for a CPU (other work on its cores; Linux schedstat)",
    "unclear": "no single part explains the excess (cause unclear)",
}


@dataclass(frozen=True)
class JobThresholds:
    """The cut-offs across ranks, with where they come from."""

    #: TraceML: a rank's excess over the median is ignored under 5%, a warning at 10%,
    #: critical at 20%; we name a straggler from 10% of the job's step time ...
    straggler_share: float = 0.10
    #: ... and from a millisecond, so microsecond steps do not name noise.
    straggler_min_seconds: float = 0.001
    #: TraceML: input, copy or compute is blamed only when it explains >= 80% of the excess.
    cause_share: float = 0.80
    #: Ours: where collectives are measured, the others must wait at least a quarter of
    #: the excess for it; ranks that do not wait for each other have no straggler.
    others_wait_share: float = 0.25


DEFAULT_JOB_THRESHOLDS = JobThresholds()


@dataclass
class RankFigures:
    """One row of the per-rank table: seconds are per step, over the judged steps."""

    rank: int
    local_rank: int | None = None
    node_rank: int | None = None
    host: str = ""
    missing: str = ""
    verdict: str = "inconclusive"
    cause: str | None = None
    steps: int = 0
    step_time: float | None = None
    input_wait: float | None = None
    h2d: float | None = None
    compute: float | None = None  # own compute: step time less input, copy and collectives
    collective: float | None = None  # None: not measured
    own_work: float | None = None
    cpu_wait: float | None = None  # the training thread queued for a CPU (schedstat); within compute
    data_wait_fraction: float | None = None
    gpu_util: float | None = None  # %, this rank's own GPU where it can be told
    gpu_memory_peak: float | None = None  # fraction of the device
    cpu_cores: float | None = None  # the rank's process, in cores
    workers_cpu_cores: float | None = None  # its loader workers together
    clock_offset: float | None = None


@dataclass
class Straggler:
    rank: int
    host: str
    cause: str  # a key of STRAGGLER_CAUSES
    excess: float  # seconds per step its own work exceeds the others' median
    excess_share: float  # of the job's step time
    others_wait: float | None  # seconds per step the others spend in collectives (median)
    detail: str = ""


@dataclass
class JobDiagnosis:
    verdict: str
    cause: str | None
    summary: str
    confidence: str
    world_size: int
    ranks: list[RankFigures] = field(default_factory=list)
    stragglers: list[Straggler] = field(default_factory=list)
    pace_ranks: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    step_time: float | None = None  # the job's: median over ranks
    warnings: list[tuple[str, str]] = field(default_factory=list)
    #: median over steps of how far apart the ranks' ends of the same step lie on rank 0's
    #: clock (seconds): small when the clocks line up and a collective syncs each step
    step_end_spread: float | None = None
    #: each present rank's own diagnosis, by rank, and the thresholds it was judged with
    per_rank: dict[int, Diagnosis] = field(default_factory=dict)
    thresholds: dict[int, Thresholds] = field(default_factory=dict)
    #: the ranks whose own verdict (made on the rank) stands for their diagnosis
    own: dict[int, OwnVerdict] = field(default_factory=dict)
    #: the advised changes measured on every rank, as the job's figures (jobs/estimates.py),
    #: or why there are none
    whatif: list[JobWhatIf] = field(default_factory=list)
    whatif_skipped: str = ""


def rank_cores(rank: RankRun) -> float | None:
    """The rank's process and workers' CPU over the whole run, in cores (None: no host readings)."""
    process, children = rank.column("host_samples", "process_cpu"), rank.column("host_samples", "children_cpu")
    return sum(map(add, process, children)) / len(process) / 100.0 if process else None


def sibling_thresholds(rank: int, host: str, usable_cores: int, cores: dict[int, tuple[str, float]]) -> Thresholds:
    """A rank's thresholds given the CPU (host, cores) of ranks that share hosts: its sibling
    ranks' CPU is not counted as contention (``rank_thresholds``). The sum runs in rank order,
    so a rank and rank 0 that know the same figures get the very same thresholds."""
    siblings = sum(c for k, (h, c) in sorted(cores.items()) if k != rank and h == host)
    return dataclasses.replace(DEFAULT_THRESHOLDS, contended_others=DEFAULT_THRESHOLDS.contended_others
                               + siblings / max(1, usable_cores))


def rank_thresholds(job: JobRun) -> dict[int, Thresholds]:
    """Each rank's single-run thresholds, with its sibling ranks' CPU not counted as contention.

    A rank's host sampler sees the other ranks on its host as "other processes";
    they are the job's own work, so the share they use is added to the contention
    cut-off (``Thresholds.contended_others``) of that rank."""
    present = [r for r in job.ranks if r.present]
    hosts = Counter(r.host for r in present if r.host)
    out: dict[int, Thresholds] = {r.rank: DEFAULT_THRESHOLDS for r in present}
    if not any(n > 1 for n in hosts.values()):
        return out
    cores: dict[int, tuple[str, float]] = {}
    for r in present:
        if hosts.get(r.host, 0) > 1:
            mean = rank_cores(r)  # the whole run's mean: a share of the host, not a verdict
            if mean is not None:
                cores[r.rank] = (r.host, mean)
    for r in present:
        head = r.head
        if r.rank in cores and head is not None:
            out[r.rank] = sibling_thresholds(r.rank, r.host, head.environment.usable_cores, cores)
    return out


@dataclass
class OwnVerdict:
    """A rank's own diagnosis, made on the rank before it sends its run, so that rank 0 need
    not diagnose every rank in turn: with the thresholds it was made with (its sibling ranks'
    CPU as the rank knew it); rank 0 uses it only where its own thresholds for the rank agree."""

    contended_others: float
    diagnosis: Diagnosis
    figures: RankFigures
    recommendations: list[Recommendation] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"contended_others": self.contended_others, "diagnosis": self.diagnosis.to_dict(),
                "figures": dataclasses.asdict(self.figures),
                "recommendations": [r.to_dict() for r in self.recommendations]}

    @classmethod
    def from_dict(cls, data: Any, rank: RankRun, where: str) -> OwnVerdict:
        """Read back and checked as a saved run's fields are (RecordError)."""
        if not isinstance(data, dict):
            raise RecordError(f"{where}: expected an object")
        recs = data.get("recommendations")
        if not isinstance(recs, list) or not all(isinstance(r, dict) and _plain_values(r.get("values")) for r in recs):
            raise RecordError(f"{where}.recommendations: expected a list of recommendations")
        d = check_record(Diagnosis, data.get("diagnosis"), f"{where}.diagnosis")
        head = rank.head
        d.metrics.loader = main_loader(head) if head is not None else None
        figures = check_record(RankFigures, data.get("figures"), f"{where}.figures")
        # where it sits in the job and its clock are rank 0's to say
        figures = dataclasses.replace(figures, rank=rank.rank, local_rank=rank.local_rank, node_rank=rank.node_rank,
                                      host=rank.host, missing="")
        out = [dataclasses.replace(check_record(Recommendation, {**r, "values": {}}, f"{where}.recommendations[{i}]"),
                                   values=dict(r.get("values") or {})) for i, r in enumerate(recs)]
        threshold = check_record(_Cut, {"value": data.get("contended_others")}, f"{where}.contended_others").value
        return cls(threshold, d, figures, out)


@dataclass
class _Cut:
    value: float


def _plain_values(values: Any) -> bool:
    """A recommendation's ``values``: an object of numbers, strings, booleans and nulls."""
    return values is None or isinstance(values, dict) and all(
        isinstance(v, str | int | float | bool) or v is None for v in values.values())


def own_verdict(rank: RankRun, cores: dict[int, tuple[str, float]]) -> OwnVerdict:
    """The verdict a rank sends with its run, judged with the thresholds ``cores`` give (its
    own and the sibling ranks' CPU it knows of)."""
    assert rank.run is not None
    th = DEFAULT_THRESHOLDS
    if rank.rank in cores and any(k != rank.rank and h == rank.host for k, (h, _) in cores.items()):
        th = sibling_thresholds(rank.rank, rank.host, rank.run.environment.usable_cores, cores)
    d = diagnose(rank.run, th)
    return OwnVerdict(th.contended_others, d, rank_figures(rank, d), recommend(rank.run, d, th))


def passing_run(rank: RankRun) -> Run | None:
    """The rank's run, built from its columns for this use only when it is not built yet:
    a job's ranks are read one at a time, never all held as objects (a job file's memory)."""
    if rank.columns is not None and rank.__dict__.get("_run") is None:
        return rank.columns.run()
    return rank.run


def _own_gpu(rank: RankRun, run: Run) -> list[GpuSample]:
    """This rank's device: the one its process holds memory on, else index = local rank."""
    samples = run.gpu_samples
    used = {g.index for g in samples if (g.process_memory_used or 0) > 0}
    if len(used) == 1:
        index = used.pop()
    elif rank.local_rank is not None and any(g.index == rank.local_rank for g in samples):
        index = rank.local_rank
    else:
        return []
    return [g for g in samples if g.index == index]


def rank_figures(rank: RankRun, d: Diagnosis, run: Run | None = None) -> RankFigures:
    """The per-rank row from one rank's run (``run``, else its own) and its own diagnosis."""
    f = RankFigures(rank.rank, rank.local_rank, rank.node_rank, rank.host, rank.missing,
                    clock_offset=rank.clock_offset)
    run = run if run is not None else rank.run
    if run is None:
        return f
    m = d.metrics
    f.verdict, f.cause, f.steps = d.verdict, d.cause, m.steps_total
    f.cpu_cores = None if m.tree_cpu_cores is None else max(0.0, m.tree_cpu_cores - (m.children_cpu_cores or 0.0))
    f.workers_cpu_cores = m.children_cpu_cores
    own = _own_gpu(rank, run)
    utils = [g.util_gpu for g in own if g.util_gpu is not None]
    f.gpu_util = statistics.median(utils) if utils else m.gpu_util_median
    mems = [g.memory_used / g.memory_total for g in own if g.memory_used is not None and g.memory_total]
    f.gpu_memory_peak = max(mems) if mems else m.gpu_memory_peak_fraction
    if not m.steps_judged:
        return f
    judged = run.steps[m.warmup_steps:]
    n = m.steps_judged
    f.step_time = m.step_time_mean
    f.input_wait = sum(s.data_wait for s in judged) / n
    f.h2d = sum(s.h2d for s in judged) / n
    f.data_wait_fraction = m.data_wait_fraction
    if rank.collective_wait is not None:
        f.collective = sum(rank.collective_wait[m.warmup_steps:]) / n
    f.compute = max(0.0, f.step_time - f.input_wait - f.h2d - (f.collective or 0.0))
    f.own_work = f.input_wait + f.h2d + f.compute
    f.cpu_wait = None if m.run_delay is None else m.run_delay * f.step_time
    return f


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def find_stragglers(rows: list[RankFigures], th: JobThresholds = DEFAULT_JOB_THRESHOLDS) -> list[Straggler]:
    """Ranks whose own work arrives late while the others wait; worst first."""
    judged = [r for r in rows if r.own_work is not None and r.step_time is not None]
    if len(judged) < 2:
        return []
    job_step = _median([r.step_time for r in judged if r.step_time is not None])
    out: list[Straggler] = []
    for r in judged:
        others = [o for o in judged if o is not r]
        assert r.own_work is not None
        excess = r.own_work - _median([o.own_work for o in others if o.own_work is not None])
        if excess < max(th.straggler_min_seconds, th.straggler_share * job_step):
            continue
        waits = [o.collective for o in others if o.collective is not None]
        others_wait = _median(waits) if waits else None
        if others_wait is not None and others_wait < th.others_wait_share * excess:
            continue  # nobody waits for it: not holding the job back
        deltas = {
            "input": (r.input_wait or 0.0) - _median([o.input_wait or 0.0 for o in others]),
            "copy": (r.h2d or 0.0) - _median([o.h2d or 0.0 for o in others]),
            "compute": (r.compute or 0.0) - _median([o.compute or 0.0 for o in others]),
        }
        part, delta = max(deltas.items(), key=lambda kv: kv[1])
        queued = [o.cpu_wait for o in others if o.cpu_wait is not None]
        late = r.cpu_wait - _median(queued) if r.cpu_wait is not None and queued else None
        if late is not None and late >= th.cause_share * excess:
            # the excess was time queued for a core: other work's, not more of its own
            part, delta = "cpu-wait", late
        cause = part if delta >= th.cause_share * excess else "unclear"
        share = excess / job_step if job_step > 0 else 0.0
        detail = (f"its own work is {_ms(excess)} per step ({100 * share:.0f}% of the job's step) longer "
                  f"than the other ranks' median; {STRAGGLER_CAUSES[cause]}")
        if cause != "unclear":
            detail += f" explains {_ms(delta)} of it"
        if others_wait is not None:
            detail += f"; the others wait {_ms(others_wait)} per step in collectives"
        out.append(Straggler(r.rank, r.host, cause, excess, share, others_wait, detail))
    return sorted(out, key=lambda s: -s.excess)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if abs(seconds) < 1 else f"{seconds:.2f} s"


def where(row: RankFigures) -> str:
    parts = [f"rank {row.rank}"]
    facts = [p for p in (row.host and f"host {row.host}",
                         row.local_rank is not None and f"local rank {row.local_rank}") if p]
    return parts[0] + (f" ({', '.join(facts)})" if facts else "")


def diagnose_job(job: JobRun, th: JobThresholds = DEFAULT_JOB_THRESHOLDS,
                 own_verdicts: dict[int, OwnVerdict] | None = None) -> JobDiagnosis:
    """The job's verdict from the ranks that set the pace, with the per-rank table. A rank's
    own verdict stands for its diagnosis where it was made with the thresholds used here."""
    per_rank: dict[int, Diagnosis] = {}
    rows: list[RankFigures] = []
    by_rank = {r.rank: r for r in job.ranks}
    thresholds = rank_thresholds(job)
    accepted: dict[int, OwnVerdict] = {}
    for r in range(job.world_size):
        rank = by_rank.get(r)
        if rank is None:
            rank = RankRun(rank=r, world_size=job.world_size, missing="no report for this rank")
        sent = (own_verdicts or {}).get(r)
        if rank.present and sent is not None and thresholds[r] == dataclasses.replace(
                DEFAULT_THRESHOLDS, contended_others=sent.contended_others):
            accepted[r] = sent
            per_rank[r] = sent.diagnosis
            rows.append(dataclasses.replace(sent.figures, clock_offset=rank.clock_offset))
        elif (run := passing_run(rank)) is not None:
            per_rank[r] = diagnose(run, thresholds[r])
            rows.append(rank_figures(rank, per_rank[r], run))
        else:
            rows.append(RankFigures(r, rank.local_rank, rank.node_rank, rank.host, rank.missing or "no report"))
    missing = [row.rank for row in rows if row.missing]
    judged = [row for row in rows if row.step_time is not None and row.verdict != "inconclusive"]
    step_times = [row.step_time for row in judged if row.step_time is not None]
    out = JobDiagnosis("inconclusive", None, "", "low", job.world_size, rows, missing=missing,
                       step_time=_median(step_times) if step_times else None, per_rank=per_rank,
                       thresholds=thresholds, own=accepted)
    out.whatif, out.whatif_skipped = job_whatifs(job.ranks)
    if missing:
        out.warnings.append(("missing-ranks", f"{len(missing)} of {job.world_size} ranks sent no report: "
                             + ", ".join(str(r) for r in missing[:16]) + (" ..." if len(missing) > 16 else "")))
    if not judged:
        out.summary = "no rank measured enough steps to judge" if per_rank else "no rank's report arrived"
        return out
    out.step_end_spread = step_end_spread(job)
    out.stragglers = find_stragglers(judged, th)
    if out.stragglers:
        worst = out.stragglers[0]
        out.pace_ranks = [s.rank for s in out.stragglers]
        own = per_rank[worst.rank]
        if worst.cause in ("input", "copy"):
            out.verdict = "data-starved"
            out.cause = own.cause if own.verdict == "data-starved" else (
                "host-to-device" if worst.cause == "copy" else "straggler-input")
        elif worst.cause == "compute":
            out.verdict = own.verdict if own.verdict in ("compute-bound", "host-bound", "memory-bound") \
                else "compute-bound"
            out.cause = own.cause if own.verdict == out.verdict else "straggler-compute"
        else:
            out.verdict, out.cause = own.verdict, own.cause
        names = ", ".join(where(_row(rows, s.rank)) for s in out.stragglers[:4])
        more = f" and {len(out.stragglers) - 4} more" if len(out.stragglers) > 4 else ""
        lose = f"; the others wait {_ms(worst.others_wait)} per step for it" if worst.others_wait is not None else ""
        out.summary = (f"straggler{'s' if len(out.stragglers) > 1 else ''} set the pace: {names}{more}; "
                       f"rank {worst.rank}: cause {worst.cause} ({_ms(worst.excess)} per step over the "
                       f"others' own work{lose})")
        out.confidence = own.confidence
    else:
        counts = Counter(row.verdict for row in judged)
        top = max(counts.values())
        slowest = max(judged, key=lambda row: row.step_time or 0.0)
        verdict = slowest.verdict if counts[slowest.verdict] == top else \
            next(v for v, c in counts.most_common() if c == top)
        pace = [row for row in judged if row.verdict == verdict]
        causes = Counter(per_rank[row.rank].cause for row in pace)
        out.verdict, out.cause = verdict, causes.most_common(1)[0][0]
        out.pace_ranks = [row.rank for row in pace]
        ranks = "all ranks" if len(pace) == len(rows) else f"{len(pace)} of {len(rows)} ranks"
        out.summary = f"balanced: no straggler; {ranks} {verdict}"
        if out.cause:
            out.summary += f" ({out.cause})"
        confidences = [per_rank[row.rank].confidence for row in pace]
        out.confidence = min(confidences, key=("low", "medium", "high").index)
    if missing and out.confidence == "high":
        out.confidence = "medium"
    return out


def aligned_ends(rank: RankRun, origin: float) -> list[float]:
    """Ends of this rank's unmerged step records, in seconds since ``origin`` on rank 0's clock."""
    head = rank.head
    if head is None or rank.clock_offset is None:
        return []
    shift = head.started_at + rank.clock_offset - origin
    return [shift + end for end, merged in zip(rank.column("steps", "end"), rank.column("steps", "merged"),
                                               strict=True) if merged == 1]


def step_end_spread(job: JobRun) -> float | None:
    """Median over step indices of (latest - earliest) end across ranks, on one clock."""
    ranks = [r for r in job.ranks if r.head is not None and r.clock_offset is not None]
    if len(ranks) < 2:
        return None
    origin = min(r.head.started_at + (r.clock_offset or 0.0) for r in ranks if r.head is not None)
    series = [aligned_ends(r, origin) for r in ranks]
    n = min(len(s) for s in series)
    if n == 0:
        return None
    return statistics.median(max(s[k] for s in series) - min(s[k] for s in series) for k in range(n))


def _row(rows: list[RankFigures], rank: int) -> RankFigures:
    return next(row for row in rows if row.rank == rank)
