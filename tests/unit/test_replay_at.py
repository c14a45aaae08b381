"""When the what-if replays run: at their usual step, or at the end of a short loader's
first epoch, so that a short job's files still exist (whatif.replay_at)."""

from __future__ import annotations

from loadprof.whatif import MIN_REPLAY_STEP, REPLAY_STEP, replay_at, replay_step


class Sized:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


class Unsized:
    def __len__(self) -> int:
        raise TypeError("an IterableDataset's loader has no length")


def test_a_long_loader_replays_at_the_usual_step() -> None:
    assert replay_at(REPLAY_STEP, Sized(500)) == REPLAY_STEP
    assert replay_at(REPLAY_STEP, Sized(REPLAY_STEP)) == REPLAY_STEP


def test_a_short_loader_replays_at_its_first_epochs_end() -> None:
    assert replay_at(REPLAY_STEP, Sized(12)) == 12


def test_never_before_the_step_is_held() -> None:
    assert replay_at(REPLAY_STEP, Sized(3)) == MIN_REPLAY_STEP


def test_an_unknown_length_or_no_loader_keeps_the_usual_step() -> None:
    assert replay_at(REPLAY_STEP, Unsized()) == REPLAY_STEP
    assert replay_at(REPLAY_STEP, None) == REPLAY_STEP
    assert replay_at(REPLAY_STEP, Sized(0)) == REPLAY_STEP


def test_a_max_steps_end_comes_first() -> None:
    step = replay_step(10)
    assert step == 8 and replay_at(step, Sized(500)) == 8
