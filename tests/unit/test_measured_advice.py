"""The what-if measurements set the advice's figures (advice.measured): a change a full replay
measured to gain nothing is dropped; one the model alone on a held batch measured to gain
nothing stays, unestimated, since the loader working beside it was not replayed."""

from __future__ import annotations

from loadprof.advice import recommend
from loadprof.diagnosis import diagnose
from loadprof.records import WhatIf
from tests.conftest import make_run


def _compute_bound_with_bf16():
    run = make_run(wait=0.001)
    run.environment.cpu_features = ["avx512f", "amx_bf16"]
    return run


def _advice(run):
    return {r.id: r for r in recommend(run, diagnose(run))}


def test_a_full_replay_that_gains_nothing_drops_the_advice() -> None:
    run = _compute_bound_with_bf16()
    run.whatif = [WhatIf("amp=auto", 0.100, 0.099, 24)]
    assert "mixed_precision" not in _advice(run)


def test_the_model_alone_gaining_nothing_keeps_the_advice_without_a_figure() -> None:
    run = _compute_bound_with_bf16()
    run.whatif = [WhatIf("amp=auto", 0.100, 0.099, 24, held_wait_seconds=0.004, alone=True)]
    rec = _advice(run)["mixed_precision"]
    assert rec.estimated_speedup is None and not rec.bound
    assert "the model alone on a held batch ran 0.99x" in rec.basis and "loadprof tune" in rec.basis


def test_a_gain_that_one_round_of_the_replays_reverses_drops_the_advice_and_the_summary_says_so() -> None:
    from loadprof.whatif import summary

    run = _compute_bound_with_bf16()
    # 1.10x over the rounds, but 0.91x in one: within the replays' noise
    run.whatif = [WhatIf("amp=auto", 0.0909, 0.100, 48, round_gains=[1.32, 0.91])]
    run.whatif_seconds = 10.0
    assert "mixed_precision" not in _advice(run)
    assert "0.91x in a round: not advised" in summary(run)
    run.whatif = [WhatIf("amp=auto", 0.0909, 0.100, 48, round_gains=[1.12, 1.08])]  # every round gained
    assert _advice(run)["mixed_precision"].estimated_speedup == 1.1
    assert "not advised" not in summary(run)
    run.whatif = [WhatIf("amp=auto", 0.0909, 0.100, 24, round_gains=[0.95])]  # one round: nothing to compare
    assert _advice(run)["mixed_precision"].estimated_speedup == 1.1
    # the model alone, a round reversed: kept, unestimated, the round named
    run.whatif = [WhatIf("amp=auto", 0.0909, 0.100, 48, held_wait_seconds=0.004, alone=True,
                         round_gains=[1.32, 0.91])]
    rec = _advice(run)["mixed_precision"]
    assert rec.estimated_speedup is None and "(0.91x in one round of the replays)" in rec.basis
    assert "0.91x in a round alone: advised unestimated" in summary(run)


def test_the_model_alone_gaining_carries_the_measured_figure() -> None:
    run = _compute_bound_with_bf16()
    run.whatif = [WhatIf("amp=auto", 0.080, 0.100, 24, held_wait_seconds=0.004, alone=True)]
    rec = _advice(run)["mixed_precision"]
    assert rec.estimated_speedup == 1.25 and "the model alone on a held batch" in rec.basis


def test_a_cache_replayed_faster_than_the_model_alone_is_held_to_the_model_alone() -> None:
    # no loader makes a step faster than no loading at all: the gap is two replays' noise
    from tests.unit.test_report_snapshots import measured_changes_on_a_cpu_host

    run = measured_changes_on_a_cpu_host()
    run.whatif = [WhatIf("cache", 0.050, 0.25, 24), WhatIf("repeat_batch", 0.0625, 0.25, 24)]
    rec = _advice(run)["cache"]
    assert rec.estimated_speedup == 4.0
    assert "held to the model alone's 4.00x (it read 5.00x" in rec.basis
    run.whatif = [WhatIf("cache", 0.0700, 0.25, 24), WhatIf("repeat_batch", 0.0625, 0.25, 24)]
    rec = _advice(run)["cache"]
    assert rec.estimated_speedup == round(0.25 / 0.07, 2) and "held" not in rec.basis
    # no loading at all gained nothing: no loading change is advised
    run.whatif = [WhatIf("cache", 0.050, 0.25, 24), WhatIf("repeat_batch", 0.249, 0.25, 24)]
    assert "cache" not in _advice(run)


def test_a_model_change_is_not_held_to_the_model_alone() -> None:
    from loadprof.advice.base import held_to_ceiling
    from loadprof.fixes.spec import Changes

    assert held_to_ceiling(1.6, Changes(amp="auto"), 1.2) == (1.6, "")
    assert held_to_ceiling(1.6, Changes(threads=1), 1.2) == (1.6, "")
    assert held_to_ceiling(1.6, Changes(num_workers=2), None) == (1.6, "")
    assert held_to_ceiling(1.6, Changes(num_workers=2), 1.2)[0] == 1.2


def test_the_whole_jobs_figure_keeps_the_first_steps_own_start_up_as_it_was() -> None:
    # a graph traced or kernels chosen in the first step: a loading change does not shorten it
    import dataclasses
    import math

    from tests.unit.test_report_snapshots import measured_changes_on_a_cpu_host

    def whole(first_extra: float) -> tuple[float, str]:
        run = measured_changes_on_a_cpu_host()
        run.steps = [dataclasses.replace(s, start=s.start + (first_extra if s.index else 0.0),
                                         end=s.end + first_extra) for s in run.steps]
        run.whatif = [WhatIf("num_workers=1", 0.125, 0.25, 24, start_seconds=0.3, baseline_start_seconds=0.1875)]
        rec = _advice(run)["num_workers"]
        return rec.values["whole_job_speedup"], rec.basis

    plain, basis = whole(0.0)
    assert "first step" not in basis and plain > 1.0
    slow, basis = whole(2.0)
    durations = [0.25 + 2.0] + [0.25] * 39
    total, first = sum(durations), 2.0 - 0.1875
    starts = math.ceil(40 / 32)  # epochs of 32 batches, workers started at each
    assert slow == round(total / ((total - first) / 2 + first + starts * (0.3 - 0.1875)), 2)
    assert slow < plain and slow < round(total / (total / 2 + starts * (0.3 - 0.1875)), 2)  # not scaled by the gain
    assert "the first step's other 1.81 s (start-up work) as it was" in basis


def test_the_whole_jobs_figure_counts_the_workers_stop_between_epochs_and_keeps_the_time_between_steps() -> None:
    import dataclasses

    from tests.unit.test_report_snapshots import measured_changes_on_a_cpu_host

    run = measured_changes_on_a_cpu_host()  # 40 steps of 0.25 s, epochs of 32: 2 starts, 1 stop between
    run.steps = [dataclasses.replace(s, start=s.start + (1.0 if s.index >= 32 else 0.0),
                                     end=s.end + (1.0 if s.index >= 32 else 0.0)) for s in run.steps]  # an evaluation
    run.whatif = [WhatIf("num_workers=1", 0.125, 0.25, 24, start_seconds=0.3, baseline_start_seconds=0.1875,
                         stop_seconds=0.2, baseline_stop_seconds=0.0)]
    rec = _advice(run)["num_workers"]
    busy, between = 40 * 0.25, 1.0
    assert rec.values["whole_job_speedup"] == round((busy + between) / (busy / 2 + between + 2 * 0.1125 + 0.2), 2)
    assert "and 0.20 s to stop (as it was: 0.00 s) at an epoch's end" in rec.basis


def test_the_whole_jobs_figure_counts_kept_workers_waiting_for_each_later_epochs_first_batch() -> None:
    # persistent workers read nothing of an epoch before it begins: its first step waits for a
    # worker's whole batch, where a steady step finds the batches the others made ahead
    from tests.unit.test_report_snapshots import measured_changes_on_a_cpu_host

    def whole(first_batch: float) -> tuple[float | None, str]:
        run = measured_changes_on_a_cpu_host()  # 40 steps of 0.25 s, epochs of 32
        run.loaders[0].iterations = 2  # a loop of epochs: the workers kept
        run.whatif = [WhatIf("num_workers=1", 0.125, 0.25, 24, start_seconds=0.6, baseline_start_seconds=0.1875,
                             first_batch_seconds=first_batch)]
        rec = _advice(run)["num_workers"]
        assert "persistent_workers=True" in rec.code
        return rec.values.get("whole_job_speedup"), rec.basis

    steady, basis = whole(0.125)  # a first batch no longer than a step: nothing to wait for
    assert steady == round(10.0 / (10.0 / 2 + (0.6 - 0.1875)), 2) and "later epoch" not in basis
    refilled, basis = whole(0.5)
    assert refilled == round(10.0 / (10.0 / 2 + (0.6 - 0.1875) + (0.5 - 0.125)), 2) and refilled < steady
    assert "1 time, then 1 later epoch each 375 ms longer waiting for its first batch" in basis


def test_the_whole_jobs_figure_keeps_the_epoch_ends_freeing_their_iterators_as_they_were() -> None:
    # a loop that freed its first epoch's iterator in 1.5 s, inside epoch 2's first step's wait
    import dataclasses

    from tests.unit.test_report_snapshots import measured_changes_on_a_cpu_host

    def whole(freed: float) -> tuple[float, str]:
        run = measured_changes_on_a_cpu_host()  # 40 steps of 0.25 s, epochs of 32: 2 starts
        run.steps = [dataclasses.replace(s, start=s.start + (freed if s.index > 32 else 0.0),
                                         end=s.end + (freed if s.index >= 32 else 0.0)) for s in run.steps]
        run.loaders[0].iterations, run.loaders[0].stop_s = 2, [freed, 0.01]  # the last after training
        run.whatif = [WhatIf("num_workers=1", 0.125, 0.25, 24, start_seconds=0.3, baseline_start_seconds=0.1875)]
        rec = _advice(run)["num_workers"]
        return rec.values["whole_job_speedup"], rec.basis

    plain, basis = whole(0.0)
    assert "freeing" not in basis
    held, basis = whole(1.5)
    busy = 40 * 0.25 + 1.5
    starts = 1 if "1 time;" in basis else 2  # persistent workers advised for a loop of epochs: one start
    assert held == round(busy / ((busy - 1.5) / 2 + 1.5 + starts * 0.1125), 2) and held < plain
    assert "the epoch ends' 1.50 s freeing their iterators as they were" in basis


def test_a_replays_change_reads_back_as_the_change_it_was() -> None:
    from loadprof.fixes.spec import Changes

    for change in (Changes(num_workers=2, cache=True), Changes(map_fn="augment (job.py:12)", map_calls=2),
                   Changes(amp="auto"), Changes()):
        assert Changes.parse(change.describe()) == change
