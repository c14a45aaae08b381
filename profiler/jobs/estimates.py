"""Pure: what an advised change buys a job, from what each of its ranks' replays measured
(NOTE [ What-if replays ] in whatif.py: the ranks replay the same changes side by side).

The job moves at its slowest rank: its step as run is the slowest rank's replay as
run, and with the change, the slowest rank's replay with it. So the job's estimate is
(max over ranks of the replay as run) / (max over ranks of the replay with the change),
and the rank that bounds it is the one slowest with the change: a cache on every rank
leaves the job at whichever rank's step is then the longest.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..advice.base import (
    CEILING,
    Recommendation,
    held_to_ceiling,
    replay_name,
    replayed_change,
    steps_at_run_faults,
)
from ..records import Run, WhatIf
from ..replaygain import NO_GAIN
from .records import RankRun


@dataclass
class JobWhatIf:
    """One change measured on every rank, as the job's figure."""

    change: str  # ``Changes.describe()``
    seconds_per_step: float  # the slowest rank's replay with the change
    baseline_seconds_per_step: float  # the slowest rank's replay as the run had it
    bound_by: int  # the rank slowest with the change: the job's step with it
    baseline_rank: int  # the rank slowest as the run had it
    steps: int  # the fewest measured steps of a replay on any rank

    @property
    def speedup(self) -> float:
        return self.baseline_seconds_per_step / self.seconds_per_step if self.seconds_per_step > 0 else 0.0


def job_whatifs(ranks: list[RankRun]) -> tuple[list[JobWhatIf], str]:
    """The job's figure for each change every rank measured, in the order rank 0 (the
    first present) measured them; or why there is none."""
    heads = {r.rank: r.head for r in ranks}
    missing = [r for r, head in sorted(heads.items()) if head is None]
    measured = {r: {w.change: _read(w, head) for w in head.whatif} for r, head in heads.items() if head is not None}
    if not measured or len(heads) < 2:
        return [], ""
    if missing:
        return [], "rank " + ", ".join(map(str, missing[:8])) + " sent no report: no figure for the job"
    first = min(measured)
    out = []
    for change in measured[first]:
        per = {r: got[change] for r, got in measured.items() if change in got}
        if len(per) == len(measured):
            out.append(_joined(change, per))
    if out:
        return out, ""
    skipped = [(r, head.whatif_skipped) for r, head in sorted(heads.items())
               if head is not None and head.whatif_skipped]
    if skipped:
        return [], f"rank {skipped[0][0]}: {skipped[0][1]}"
    if any(measured.values()):
        return [], "no change was measured on every rank"
    return [], ""


def _read(w: WhatIf, head: Run) -> WhatIf:
    """A rank's replay with both steps read at that rank's own page faults a step, as one
    run's are (``advice.base.at_run_faults``)."""
    step, base = steps_at_run_faults(w, head.whatif_run_faults, head.environment.fault_seconds)
    return dataclasses.replace(w, seconds_per_step=step, baseline_seconds_per_step=base)


def _joined(change: str, per: dict[int, WhatIf]) -> JobWhatIf:
    bound_by = max(per, key=lambda r: per[r].seconds_per_step)
    baseline_rank = max(per, key=lambda r: per[r].baseline_seconds_per_step)
    return JobWhatIf(change, per[bound_by].seconds_per_step, per[baseline_rank].baseline_seconds_per_step,
                     bound_by, baseline_rank, min(w.steps for w in per.values()))


def job_estimate(rec: Recommendation, figures: list[JobWhatIf]) -> Recommendation | None:
    """A pace rank's recommendation with the job's measured figure in place of the rank's own
    (as ``advice.measured`` does for one run); None: measured to gain the job nothing, so not
    advised; unchanged where the job has no figure for it."""
    change = replayed_change(rec)
    figure = next((f for f in figures if change is not None and f.change == change.describe()), None)
    if figure is None or change is None:
        return rec
    alone = next((f for f in figures if f.change == CEILING), None)
    gain, held = held_to_ceiling(figure.speedup, change, alone.speedup if alone is not None else None)
    if gain < NO_GAIN:  # measured (or no loading at all measured) to gain the job nothing
        return None
    values = {k: v for k, v in rec.values.items() if k != "whole_job_speedup"}  # a rank's, not the job's
    basis = (f"measured: every rank's own step replayed side by side with {replay_name(figure.change)}; "
             f"the job's step {figure.seconds_per_step * 1e3:.1f} ms with it (rank {figure.bound_by}, the slowest) "
             f"against {figure.baseline_seconds_per_step * 1e3:.1f} ms as it ran (rank {figure.baseline_rank}), "
             f"{figure.steps} steps each at least{held}")
    return dataclasses.replace(rec, values=values, estimated_speedup=round(gain, 2), basis=basis, bound=False,
                               floor=False)
