"""A job's what-if figures from its ranks' replays (jobs/estimates.py) and the ranks' agreement
on what to replay (jobs/replays.py), on hand-built plans and runs: no process, no framework."""

from __future__ import annotations

import pytest

from loadprof.advice.base import Recommendation
from loadprof.fixes.spec import Changes
from loadprof.jobs.estimates import JobWhatIf, job_estimate, job_whatifs
from loadprof.jobs.records import RankRun
from loadprof.jobs.replays import Plan, decide
from loadprof.records import Run, WhatIf


def _whatif(change: str, seconds: float, baseline: float, steps: int = 10) -> WhatIf:
    return WhatIf(change, seconds, baseline, steps)


def _rank(r: int, whatifs: list[WhatIf], skipped: str = "") -> RankRun:
    return RankRun(rank=r, world_size=2, run=Run(whatif=whatifs, whatif_skipped=skipped))


def test_the_job_figure_is_the_slowest_rank_as_run_over_the_slowest_rank_with_the_change():
    figures, why = job_whatifs([
        _rank(0, [_whatif("cache", 0.004, 0.020), _whatif("num_workers=2", 0.012, 0.020, 8)]),
        _rank(1, [_whatif("cache", 0.003, 0.070), _whatif("num_workers=2", 0.036, 0.070)]),
    ])
    assert why == ""
    assert figures == [JobWhatIf("cache", 0.004, 0.070, bound_by=0, baseline_rank=1, steps=10),
                       JobWhatIf("num_workers=2", 0.036, 0.070, bound_by=1, baseline_rank=1, steps=8)]
    assert figures[0].speedup == pytest.approx(17.5)


def test_each_rank_s_replays_are_read_at_its_own_page_faults_a_step():
    slow = Run(whatif=[WhatIf("cache", 0.004, 0.070, 10, faults_per_step=100.0, baseline_faults_per_step=10_100.0)],
               whatif_run_faults=100.0)
    slow.environment.fault_seconds = 1e-6  # rank 1's settings' replay took 10 ms of faults the run did not
    figures, _ = job_whatifs([_rank(0, [_whatif("cache", 0.004, 0.020)]), RankRun(rank=1, world_size=2, run=slow)])
    assert figures[0].baseline_seconds_per_step == pytest.approx(0.060) and figures[0].speedup == pytest.approx(15.0)
    slow.whatif_run_faults = None  # not kept: as measured
    assert job_whatifs([_rank(0, [_whatif("cache", 0.004, 0.020)]),
                        RankRun(rank=1, world_size=2, run=slow)])[0][0].speedup == pytest.approx(17.5)


def test_no_job_figure_for_a_change_one_rank_did_not_measure_or_a_rank_missing():
    figures, why = job_whatifs([_rank(0, [_whatif("cache", 0.004, 0.020)]),
                                _rank(1, [], "the ranks replay together or not at all; rank 0: x")])
    assert figures == [] and why.startswith("rank 1: the ranks replay together")
    figures, why = job_whatifs([_rank(0, [_whatif("cache", 0.004, 0.020)]),
                                RankRun(rank=1, world_size=2, missing="killed")])
    assert figures == [] and "rank 1 sent no report" in why


def test_a_job_figure_replaces_the_rank_s_own_and_one_that_gains_nothing_drops_the_advice():
    rec = Recommendation("cache", "Cache", "", "", values={"whole_job_speedup": 30.0}, estimated_speedup=30.0)
    got = job_estimate(rec, [JobWhatIf("cache", 0.010, 0.070, bound_by=0, baseline_rank=1, steps=9)])
    assert got is not None and got.estimated_speedup == 7.0 and "whole_job_speedup" not in got.values
    assert "rank 0, the slowest" in got.basis and rec.estimated_speedup == 30.0  # the rank's own left as it was
    assert job_estimate(rec, [JobWhatIf("cache", 0.070, 0.070, 0, 1, 9)]) is None
    assert job_estimate(rec, []) is rec


def test_the_ranks_replay_the_union_of_their_plans_or_none_where_one_refuses():
    a = Plan([Changes(cache=True), Changes(num_workers=2)], "", 0.050, 0.070)
    b = Plan([Changes(num_workers=2), Changes(stored=True)], "", 0.002, 0.070)
    agreed = decide({0: a, 1: b})
    assert [c.describe() for c in agreed.changes] == ["cache", "num_workers=2", "stored"]
    assert agreed.collective == 0.002 and agreed.why == ""  # the slowest rank waits for no one
    refused = decide({0: a, 1: Plan([], "the model is wrapped in FullyShardedDataParallel: x", 0.002, 0.07)})
    assert refused.changes == [] and "rank 1: the model is wrapped in FullyShardedDataParallel" in refused.why
    unmeasured = decide({0: a, 1: Plan([], "", None, 0.07)})
    assert unmeasured.changes == [] and "not measured on rank 1" in unmeasured.why
    assert Plan.from_json(a.to_json().encode()) == a
    assert Plan.from_json(b'{"changes": 3}').refused.startswith("its plan could not be read")


def test_a_job_figure_faster_than_the_job_with_no_loading_is_held_to_it():
    rec = Recommendation("cache", "Cache", "d", "c", {}, 2.0, "a rank's")
    got = job_estimate(rec, [JobWhatIf("cache", 0.002, 0.070, 0, 1, 9), JobWhatIf("repeat_batch", 0.0025, 0.070, 0, 1, 9)])
    assert got is not None and got.estimated_speedup == 28.0
    assert "held to the model alone's 28.00x (it read 35.00x" in got.basis
