"""A custom loop's own time a step (looptime.py): between step calls, less its waits."""

from __future__ import annotations

import pytest

from loadprof.frameworks.tensorflow.looptime import SKIP_STEPS, LoopTime


def _loop(steps: list[tuple[float, float, float]]) -> LoopTime:
    """Steps of (wait, own, call) seconds, one after another from t = 0."""
    lt, t = LoopTime(), 0.0
    for wait, own, call in steps:
        lt.waited(wait)
        t += wait + own
        lt.call_starts(t)
        t += call
        lt.call_ends(t)
    return lt


def test_the_waits_and_the_calls_are_not_the_loops_own_time() -> None:
    lt = _loop([(0.5, 0.01, 0.2)] * (SKIP_STEPS + 5))
    assert lt.per_step() == pytest.approx(0.01)
    assert len(lt.outside) == SKIP_STEPS + 4  # the first call has no step before it


def test_an_epochs_start_is_waiting_and_the_median_holds_against_a_rare_long_step() -> None:
    lt = LoopTime()
    lt.call_ends(1.0)
    lt.waited(0.3)  # the next pass's iterator starting
    lt.waited(0.1)  # its first batch
    lt.call_starts(1.42)
    assert lt.outside == [pytest.approx(0.02)]
    steps = [(0.0, 0.002, 0.01)] * (SKIP_STEPS + 6) + [(0.0, 0.5, 0.01)]  # one garbage collection
    assert _loop(steps).per_step() == pytest.approx(0.002)


def test_no_figure_before_enough_steps() -> None:
    assert LoopTime().per_step() is None
    assert _loop([(0.1, 0.01, 0.1)] * SKIP_STEPS).per_step() is None


def test_a_call_of_several_batches_counts_its_own_time_per_batch() -> None:
    # Keras fit with steps_per_execution=4: one callback round a call of 4 batches
    lt, t = LoopTime(), 0.0
    for _ in range(SKIP_STEPS + 3):
        t += 0.02
        lt.call_starts(t, batches=4)
        t += 0.1
        lt.call_ends(t)
    assert lt.per_step() == pytest.approx(0.005)
