"""A replay's rounds joined into its figure: those whose heap ran in the other of glibc's two
states from the run's are left out where another ran in the run's (a replay's allocations can
move the process's heap between rounds; the changed job is read at the run's state), and each
round's gain pairs the change's replay with the run's settings' of the same round."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from loadprof.frameworks.torch.replay import _Result, _round_gains, kept_rounds  # noqa: E402


def _round(no: int, seconds: float, faults: float | None, steps: int = 10) -> _Result:
    r = _Result(seconds, seconds, steps, 1.0, 0.0)
    r.round_nos, r.faults = [no], faults
    return r


def test_a_round_in_the_other_heap_state_is_left_out_where_another_ran_in_the_runs() -> None:
    # bf16 beside Ray: its first round faulted 5,415 times a step at 20 ms, the next 3 at 9 ms
    rounds = [_round(0, 0.020, 5415.0), _round(1, 0.009, 3.0), _round(2, 0.011, 5.0)]
    kept = kept_rounds(rounds, run_faults=6.0)
    assert kept.left_out == 1
    assert kept.seconds == pytest.approx(0.010) and kept.round_nos == [1, 2] and kept.faults == pytest.approx(4.0)


def test_every_round_is_kept_where_none_or_all_ran_in_the_other_state_or_the_heap_is_not_glibcs() -> None:
    same = [_round(0, 0.020, 10.0), _round(1, 0.010, 3.0)]
    kept = kept_rounds(same, run_faults=6.0)  # none left out
    assert kept.left_out == 0 and kept.round_nos == [0, 1] and kept.seconds == pytest.approx(0.015)
    other = [_round(0, 0.020, 5415.0), _round(1, 0.019, 4000.0)]
    kept = kept_rounds(other, run_faults=6.0)  # the reading at the run's faults applies
    assert kept.left_out == 0 and kept.round_nos == [0, 1]
    mixed = [_round(0, 0.020, 5415.0), _round(1, 0.010, 3.0)]
    assert kept_rounds(mixed, run_faults=None).round_nos == [0, 1]  # another allocator: no two states
    unknown = [_round(0, 0.020, None), _round(1, 0.009, 5415.0)]
    kept = kept_rounds(unknown, run_faults=6.0)
    assert kept.round_nos == [0]  # not counted: not known to be in the other


def test_each_rounds_gain_pairs_the_replays_of_one_round() -> None:
    base = _round(0, 0.020, 5.0).joined(_round(2, 0.018, 5.0))  # its round 1 left out
    change = _round(1, 0.010, 5.0).joined(_round(2, 0.009, 5.0))
    assert _round_gains(base, change, 0.0) == [pytest.approx(2.0)]  # round 2 only
    assert _round_gains(base, change, 0.002) == [pytest.approx(0.020 / 0.011)]
