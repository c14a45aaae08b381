"""The heap rule (advice/heap.py): page faults of the training process on memory glibc's
malloc gave back, priced at the fault's measured cost, advised with the thresholds to set
and that time as the gain; the allocator and the fault's cost as heap.py reads them."""

from __future__ import annotations

import sys

import pytest

from loadprof import heap
from loadprof.advice import recommend
from loadprof.advice.base import change_of
from loadprof.diagnosis import diagnose
from loadprof.metrics import compute_metrics
from loadprof.records import HostSample, LoaderInfo, Step, WhatIf
from loadprof.whatifrun import heap_moved
from tests.conftest import make_run

MiB = 2**20


def _faulting_run(faults_per_step: float, cost: float = 2e-6, malloc: str = "glibc", workers: int = 0,
                  growth: int = 0):
    """A 100 ms step whose training process takes ``faults_per_step`` minor faults."""
    run = make_run(wait=0.001, workers=workers)
    run.environment.malloc = malloc
    run.environment.fault_seconds = cost
    for i, h in enumerate(run.host_samples):
        h.window = 0.1  # a reading every 0.1 s, as the steps: one step's faults each
        h.process_faults = int(faults_per_step)
        h.process_rss = 500 * MiB + i * growth
    return run


def _advice(run):
    return {r.id: r for r in recommend(run, diagnose(run))}


def test_faults_a_step_are_read_over_the_judged_window() -> None:
    m = compute_metrics(_faulting_run(8000, growth=4096 * 100))
    assert m.faults_per_step == pytest.approx(8000)
    assert m.rss_growth_per_step == pytest.approx(4096 * 100, rel=0.1)


def test_faults_taking_a_share_of_the_step_get_the_thresholds_with_their_time_as_the_gain() -> None:
    rec = _advice(_faulting_run(8000))["heap"]  # 16 ms of a 100 ms step
    assert not rec.bound and rec.estimated_speedup == pytest.approx(0.1 / (0.1 - 0.016), abs=0.01)
    assert rec.values["faults_per_step"] == 8000 and rec.values["mmap_threshold"] == heap.MMAP_THRESHOLD
    assert rec.values["trim_threshold"] >= heap.MIN_TRIM
    assert "MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=" in rec.code
    assert "8,000 page faults a step" in rec.detail and "16.0 ms of the 100.0 ms step" in rec.detail
    assert change_of(rec).heap == rec.values["trim_threshold"]


def test_no_heap_advice_under_the_share_another_allocator_or_no_measured_cost() -> None:
    assert "heap" not in _advice(_faulting_run(2000))  # 4 ms of 100: under 5%
    for malloc in ("jemalloc", "glibc, tuned", ""):
        assert "heap" not in _advice(_faulting_run(8000, malloc=malloc))
    assert "heap" not in _advice(_faulting_run(8000, cost=0.0))
    run = _faulting_run(8000)
    for h in run.host_samples:
        h.process_faults = None  # not read (a run saved before faults were)
    assert "heap" not in _advice(run)


def test_first_touches_and_batches_from_workers_are_not_the_allocator_s() -> None:
    # the process's memory grew by the pages it faulted: memory it keeps, not memory freed
    assert "heap" not in _advice(_faulting_run(8000, growth=8000 * 4096))
    # every batch a worker hands over is a new shared mapping: 32 samples of 1 MiB a step
    run = _faulting_run(8000, workers=2)
    run.loaders = [LoaderInfo("torch", "DataLoader", batch_size=32, num_workers=2, sample_nbytes=MiB,
                              iterations=1)]
    assert "heap" not in _advice(run)


def test_trim_threshold_is_four_steps_of_churn_at_least_the_floor_a_power_of_two() -> None:
    assert heap.trim_threshold(1 * MiB) == heap.MIN_TRIM
    assert heap.trim_threshold(100 * MiB) == 512 * MiB


def test_the_allocator_named_by_preload_and_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in heap.SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
    assert heap.allocator() == "jemalloc"
    monkeypatch.delenv("LD_PRELOAD")
    if not heap.allocator().startswith("glibc"):
        pytest.skip("not a glibc system")
    assert heap.allocator() == "glibc"
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1000000000")
    assert heap.allocator() == "glibc, tuned"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="page faults counted by Linux")
def test_a_fault_costs_something_under_a_millisecond() -> None:
    cost = heap.fault_seconds()
    assert cost is not None and 0 < cost < 1e-3


def test_no_heap_advice_for_a_run_that_ran_out_of_memory() -> None:
    run = _faulting_run(8000)
    run.oom_errors.append("RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes")
    assert diagnose(run).verdict == "memory-bound"
    assert "heap" not in _advice(run)


def test_tune_tries_the_thresholds_where_the_report_advises_them_and_not_on_a_memory_bound_run() -> None:
    from loadprof.experiments.trial import TrialResult, TrialSpec, _measure
    from loadprof.experiments.tuneplan import TuneOptions, plan_compute
    from loadprof.report import build_report

    def planned(run):
        base = TrialResult("baseline")
        _measure(base, build_report(run), 5, TrialSpec(script="train.py", max_steps=len(run.steps)))
        [(cand, (_, why))] = plan_compute(base, None, TuneOptions(fixes=("heap",)))
        return cand, why

    cand, _ = planned(_faulting_run(8000))
    assert cand is not None and cand.changes.heap == _advice(_faulting_run(8000))["heap"].values["trim_threshold"]
    run = _faulting_run(8000)
    run.oom_errors.append("RuntimeError: DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes")
    cand, why = planned(run)
    assert cand is None and "memory-bound" in why


def test_a_short_step_s_few_faults_are_no_pattern() -> None:
    run = _faulting_run(200, cost=5e-5)  # 10 ms of a 100 ms step, but 200 faults: under 1 MiB
    assert "heap" not in _advice(run)


def test_the_replays_are_read_at_the_run_s_page_faults_the_model_alone_too() -> None:
    """Replays that ran after the run in another state of glibc's heap are read at the run's
    faults a step: the model alone that faulted more is no lower ceiling for it; without the
    run's count (a run saved before it was kept) the replays stand as measured."""
    from loadprof.records import WhatIf
    from tests.unit.test_report_snapshots import measured_changes_on_a_cpu_host

    run = measured_changes_on_a_cpu_host()
    run.environment.fault_seconds, run.whatif_run_faults = 1e-6, 300.0
    # the cache 50 ms with the run's 300 faults, its settings 250 ms with 5,300 (5 ms of them
    # beyond the run's); the model alone 62.5 ms with 20,300: 42.5 ms at the run's
    alone = WhatIf("repeat_batch", 0.0625, 0.25, 24, faults_per_step=20_300.0, baseline_faults_per_step=5300.0)
    run.whatif = [WhatIf("cache", 0.050, 0.25, 24, faults_per_step=300.0, baseline_faults_per_step=5300.0), alone]
    rec = _advice(run)["cache"]
    assert rec.estimated_speedup == 4.9 and "held to" not in rec.basis
    assert "read at the run's 300 page faults a step" in rec.basis
    assert "50.0 ms with 300 and 250.0 ms with 5,300" in rec.basis
    run.whatif_run_faults = None  # not kept: the model alone's 4.00x holds the cache's 5.00x
    rec = _advice(run)["cache"]
    assert rec.estimated_speedup == 4.0 and "held to the model alone's 4.00x (it read 5.00x" in rec.basis
    assert "read at the run's" not in rec.basis


def test_at_run_faults_moves_a_step_by_its_faults_beyond_the_run_s_at_most_half_of_it() -> None:
    from loadprof.advice.base import at_run_faults

    assert at_run_faults(0.1, 20_000.0, 10_000.0, 2e-6) == pytest.approx(0.08)
    assert at_run_faults(0.1, 0.0, 10_000.0, 2e-6) == pytest.approx(0.12)  # short of them: slower
    assert at_run_faults(0.1, 1e12, 0.0, 2e-6) == 0.05 and at_run_faults(0.1, 0.0, 1e12, 2e-6) == pytest.approx(0.15)
    assert at_run_faults(0.1, None, 10.0, 2e-6) == at_run_faults(0.1, 10.0, None, 2e-6) == \
        at_run_faults(0.1, 10.0, 20.0, None) == 0.1


def _paused_run(before: int, after: int):
    """60 steps of 100 ms, the what-if replays' pause (3.0 s to 8.0 s) after the 30th, a
    reading every 0.1 s counting ``before`` faults before the pause, ``after`` past it, and
    the replays' own many inside it."""
    run = make_run(n=60)
    run.environment.malloc = "glibc"
    run.steps = [Step(i, i * 0.1 + (5.0 if i >= 30 else 0.0), (i + 1) * 0.1 + (5.0 if i >= 30 else 0.0),
                      batch_size=32) for i in range(60)]
    run.host_samples = [HostSample(t=round(i * 0.1, 1), window=0.1,
                                   process_faults=before if i <= 30 else 50_000 if i <= 80 else after)
                        for i in range(1, 111)]
    return run


def test_steps_that_faulted_otherwise_after_the_replays_say_the_heap_moved() -> None:
    line = heap_moved(_paused_run(8000, 0), 3.0, 8.0, 8.2)
    assert line is not None and "0 page faults a step, 8,000 before them" in line
    assert "replays (from step 30) took" in line  # the first step after the pause
    assert "judged steps hold both states" in line
    back = heap_moved(_paused_run(0, 8000), 3.0, 8.0, 8.2)
    assert back is not None and "8,000 page faults a step, 0 before them" in back
    # alike on both sides, or within the replays' noise of each other: nothing said
    assert heap_moved(_paused_run(8000, 7000), 3.0, 8.0, 8.2) is None
    assert heap_moved(_paused_run(200, 0), 3.0, 8.0, 8.2) is None
    # another allocator, or glibc's thresholds set already: no such states
    tuned = _paused_run(8000, 0)
    tuned.environment.malloc = "glibc, tuned"
    assert heap_moved(tuned, 3.0, 8.0, 8.2) is None
    # no reading wholly after the pause: nothing to compare
    assert heap_moved(_paused_run(8000, 0), 3.0, 8.0, 20.0) is None


def test_the_runs_faults_beyond_a_replays_are_priced_and_no_others() -> None:
    """The time a step's extra page faults took, at this host's measured price of one: what
    the replays take off the run's own time outside the model call, so that a heap left in
    another state by their allocations is not spun as code of the loop."""
    from loadprof.heap import fault_seconds, state_seconds

    assert state_seconds(None, 100.0) == 0.0 and state_seconds(5000.0, None) == 0.0
    assert state_seconds(1000.0, 5000.0) == 0.0 and state_seconds(3000.0, 3000.0) == 0.0
    assert state_seconds(9000.0, 1000.0, 2e-6) == pytest.approx(0.016)
    cost = fault_seconds()  # None where each probe was preempted (a loaded host) or faults are not counted
    if cost is None:
        pytest.skip("the price of a page fault could not be measured here")
    # a few hundred ns to a few tens of µs each
    assert 1e-8 < cost < 1e-4, cost
    assert state_seconds(9000.0, 1000.0, cost) == pytest.approx(8000 * cost)


def test_a_replay_in_the_other_heap_state_than_the_run_s_gives_its_own_figure_beside() -> None:
    """The estimate is read at the run's faults a step; where the change's replay ran in
    the other state than the run's, its figure as it ran there is given beside it (a fresh
    process of the change may fall in either), and not within one state or under another
    allocator."""
    from loadprof.advice.base import other_state_gain
    from loadprof.records import WhatIf
    from tests.unit.test_report_snapshots import measured_changes_on_a_cpu_host

    run = measured_changes_on_a_cpu_host()
    run.environment.malloc, run.environment.fault_seconds = "glibc", 2e-6
    run.whatif_run_faults = 10_020.0
    # 50 ms with 20 faults a step beside the run's settings' 250 ms with the run's 10,020:
    # 20 ms of faults fewer, 70 ms at the run's
    cache = WhatIf("cache", 0.050, 0.25, 24, faults_per_step=20.0, baseline_faults_per_step=10_020.0)
    run.whatif = [cache]
    rec = _advice(run)["cache"]
    assert rec.estimated_speedup == round(0.25 / 0.070, 2) and rec.values["other_heap_state_speedup"] == 5.0
    assert ("its replay's heap ran in the other of glibc's two states from the run's (20 page "
            "faults a step to 10,020): about 5.00x a step in that state, where a fresh process of the changed job "
            "may fall too") in rec.basis
    assert other_state_gain(cache, 0.25, "glibc", 10_020.0, 2e-6) == 5.0
    assert other_state_gain(cache, 0.25, "glibc", 100.0, 2e-6) is None  # one state
    assert other_state_gain(cache, 0.25, "glibc, tuned", 10_020.0, 2e-6) is None
    assert other_state_gain(cache, 0.25, "glibc", 10_020.0, None) is None
    assert other_state_gain(cache, 0.25, "glibc", None, 2e-6) is None
    run.environment.malloc = "jemalloc"
    rec = _advice(run)["cache"]
    assert rec.estimated_speedup == round(0.25 / 0.070, 2) and "other_heap_state_speedup" not in rec.values


def test_a_model_change_keeps_its_own_page_faults_where_both_replays_faulted() -> None:
    """bf16 autocast casts the weights anew at each forward: its replay faults more than the
    run's settings' in the same heap state, and a fresh process of it does too. That
    difference stays in its step read at the run's faults; a loading change's, or one with
    either replay in the heap's other state, is read at the run's count alone."""
    from loadprof.advice.base import own_faults, steps_at_run_faults
    from tests.unit.test_measured_advice import _compute_bound_with_bf16

    run = _compute_bound_with_bf16()
    run.environment.malloc, run.environment.fault_seconds = "glibc", 2e-6
    run.whatif_run_faults = 1000.0
    # bf16 60 ms with 6,000 faults a step, the run's settings 100 ms with 3,000: 3,000 its own;
    # at the run's 1,000: the settings 96 ms, bf16 at 4,000 (its own kept) 56 ms
    bf16 = WhatIf("amp=auto", 0.060, 0.100, 24, faults_per_step=6000.0, baseline_faults_per_step=3000.0)
    assert own_faults(bf16) == 3000.0
    assert steps_at_run_faults(bf16, 1000.0, 2e-6) == pytest.approx((0.056, 0.096))
    run.whatif = [bf16]
    rec = _advice(run)["mixed_precision"]
    assert rec.estimated_speedup == round(0.096 / 0.056, 2)  # not 0.096 / 0.050: 1.92x
    assert "the change's own 3,000 more kept beside them" in rec.basis
    assert "the heap advice's thresholds keep that memory too" in rec.basis
    # fewer: the change's allocations smaller, kept too (no thresholds to name)
    fewer = WhatIf("amp=auto", 0.060, 0.100, 24, faults_per_step=2000.0, baseline_faults_per_step=3000.0)
    assert own_faults(fewer) == -1000.0
    run.whatif = [fewer]
    rec = _advice(run)["mixed_precision"]
    assert "own 1,000 fewer kept" in rec.basis and "keep that memory too" not in rec.basis
    # one replay in the heap's other state: the difference may be the state; the run's count stands
    assert own_faults(WhatIf("amp=auto", 0.06, 0.1, 24, faults_per_step=6000.0, baseline_faults_per_step=40.0)) == 0
    assert own_faults(WhatIf("amp=auto", 0.06, 0.1, 24, faults_per_step=40.0, baseline_faults_per_step=6000.0)) == 0
    # a loading change's faults are the loader's and the heap's, not the model's
    assert own_faults(WhatIf("num_workers=2", 0.06, 0.1, 24, faults_per_step=6000.0,
                             baseline_faults_per_step=3000.0)) == 0
    assert own_faults(WhatIf("amp=auto", 0.06, 0.1, 24)) == 0  # not counted
    assert steps_at_run_faults(bf16, None, 2e-6) == (0.060, 0.100)
