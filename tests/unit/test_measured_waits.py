"""Waits measured after the run (the Keras fit probe) reach every step's record, merged or not.

NOTE [ Waits measured after the run ] in timeline.py; the end-to-end case is a long
``fit`` in test_tensorflow.py.
"""

from __future__ import annotations

import pytest

from loadprof.timeline import Timeline


def run_steps(n: int, max_records: int, step_s: float = 0.01) -> Timeline:
    tl = Timeline(0.0)
    tl.max_records = max_records
    for i in range(n):
        tl.step_begins(i * step_s, 32)
        tl.optimizer_step((i + 1) * step_s)
    return tl


def test_each_wait_joins_the_record_holding_its_step_after_older_records_were_merged() -> None:
    tl = run_steps(1000, max_records=64)
    steps = tl.steps
    assert len(steps) <= 64 and steps[-1].merged == 1 and max(s.merged for s in steps) > 8
    tl.measured_waits(((i, 0.004, 0.002) for i in range(1000)), "differential")
    for s in tl.steps:
        assert s.data_wait == pytest.approx(0.004 * s.merged)
        assert s.data_wait_cpu == pytest.approx(0.002 * s.merged)
        assert s.batch_size == 32 * s.merged
    assert tl.method() == "differential"


def test_a_wait_never_exceeds_its_record_and_unknown_steps_are_skipped() -> None:
    tl = run_steps(10, max_records=64)
    tl.measured_waits([(3, 0.5, 1.0), (4, 0.002, 0.001), (99, 1.0, 1.0)], "differential")
    steps = tl.steps
    assert steps[3].data_wait == pytest.approx(0.01) and steps[3].data_wait_cpu == pytest.approx(0.02)
    assert steps[4].data_wait == pytest.approx(0.002)
    assert sum(s.data_wait for s in steps) == pytest.approx(0.012)


def test_a_step_begins_later_than_the_last_ended_when_told_so() -> None:
    tl = Timeline(0.0)
    tl.step_begins(None, 8)
    tl.optimizer_step(1.0)
    tl.step_begins(3.0, 8)  # an epoch's first step, after a validation pass
    tl.optimizer_step(4.0)
    first, second = tl.steps
    assert (second.start, second.end, second.batch_size) == (3.0, 4.0, 8)
    assert first.batch_size == 8


def test_marks_by_hand_take_over_from_step_begins() -> None:
    tl = Timeline(0.0)
    tl.mark(1.0)
    tl.step_begins(5.0, 8)
    tl.mark(6.0)
    assert [(s.start, s.end, s.batch_size) for s in tl.steps] == [(0.0, 1.0, None), (1.0, 6.0, None)]
