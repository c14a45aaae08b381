"""A loader whose batches come in bursts (Ray Data's executions): each what-if replay
reads one execution to its end, so that the next one's start and ramp fall in no
replay's steps (the run's epoch starts are counted apart)."""

from __future__ import annotations

import time
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from loadprof.fixes.spec import Changes  # noqa: E402
from loadprof.frameworks.torch.replay import measure  # noqa: E402
from loadprof.frameworks.torch.stepcapture import StepCapture  # noqa: E402

BATCHES, WARM, START_S = 40, 4, 0.3


class Executions:
    """Each ``iter()`` an execution: a start, then BATCHES batches."""

    warmup_steps = WARM
    bursts = True

    def __init__(self, started: list[int]) -> None:
        self.started = started

    def __iter__(self) -> Any:
        self.started.append(1)
        time.sleep(START_S)
        for _ in range(BATCHES):
            yield (torch.randn(8, 16),)


class BurstSource:
    """Another framework's loader as the replays see it (torch/replay.py's ReplaySource)."""

    bursts = True

    def __init__(self) -> None:
        self.started: list[int] = []

    def unsafe(self) -> str:
        return ""

    def later(self, replay: Any) -> bool:
        return False

    def like(self, change: Changes) -> Any:
        return Executions(self.started)


def test_a_replay_of_bursts_ends_with_its_execution_and_counts_no_restart() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    capture = StepCapture()
    capture.model, capture.optimizer = model, torch.optim.SGD(model.parameters(), lr=0.01)
    capture.args, capture.kwargs = (torch.randn(8, 16),), {}
    capture.loader = source = BurstSource()
    out, why = measure(capture, [Changes(threads=1)], run_compute=0.0, budget=8.0, interrupted=lambda: False)
    assert out, why
    [threads] = [w for w in out if w.change == Changes(threads=1).describe()]
    rounds = len(threads.round_gains)
    assert rounds >= 1
    # each replay's measured steps lie within one execution, after its warm-up
    assert threads.steps <= rounds * (BATCHES - WARM), (threads.steps, rounds)
    # and no replay read past it into another: one execution a replay (the run's settings,
    # the model alone's held batch and the change each round; the first read again at most)
    assert len(source.started) <= 3 * rounds + 1, (len(source.started), rounds)
