"""A tf.data iterator's free read at epochs of another length: autotune's thread wakes at
10 ms x (2^(k+1) - 1) into the iterator's life, and a free that misses the cancel waits
for the next wake (NOTE [ An iterator's free and autotune's wakes ])."""

from __future__ import annotations

import pytest

from loadprof.epochfree import changed_free, expected_wait, lives, scaled_free, until_wake
from loadprof.records import FIT_NOTE, LoaderInfo


def _pipeline(lives_s: list[float], stops: list[float], notes: list[str] | None = None) -> LoaderInfo:
    starts = [0.0]
    for life, stop in zip(lives_s, stops, strict=False):
        starts.append(starts[-1] + life + stop)
    return LoaderInfo(framework="tf.data", kind="tf.data pipeline", iterations=len(stops),
                      stop_s=stops, iteration_starts_s=starts if notes is None else [], notes=notes or [])


def test_the_wait_runs_to_autotunes_next_wake() -> None:
    # wakes at 10, 30, 70, ..., 1270, 2550 ms
    assert until_wake(0.005) == pytest.approx(0.005)
    assert until_wake(1.83) == pytest.approx(0.72)  # a sequential map's epoch
    assert until_wake(1.29) == pytest.approx(1.26)  # the parallel map's: just past 1.27 s
    assert until_wake(1.25) == pytest.approx(0.02)
    # read over the lives either side, the jump at a wake is a mean of both sides
    assert until_wake(1.25) < expected_wait(1.27) < until_wake(1.29)


def test_a_changed_epoch_waits_as_often_as_the_runs_frees_missed_the_cancel() -> None:
    info = _pipeline([1.83, 1.83, 1.83], [0.72, 0.001, 0.72, 0.01])  # the last: after training
    assert [round(life, 2) for life, _ in lives(info)] == [1.83, 1.83, 1.83]
    missed = (0.72 + 0.001 + 0.72) / (3 * 0.72)
    assert changed_free(info, 1.0) == pytest.approx(missed * expected_wait(1.83))
    shorter = changed_free(info, 1.31 / 1.83)
    assert shorter == pytest.approx(missed * expected_wait(1.31))
    assert shorter is not None and shorter > 0.481 * 1.31 / 1.83  # more than in proportion


def test_frees_with_no_epoch_starts_noted_are_read_in_proportion() -> None:
    fit = _pipeline([1.0, 1.0], [0.4, 0.2], notes=[FIT_NOTE])  # Keras fit notes no epoch starts
    assert changed_free(fit, 0.5) is None
    assert scaled_free(fit, 0.5) == pytest.approx(0.15)
    none = _pipeline([1.0], [0.4])
    none.stop_s = []
    assert scaled_free(none, 0.5) == 0.0
