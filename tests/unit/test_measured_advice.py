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


def test_the_model_alone_gaining_carries_the_measured_figure() -> None:
    run = _compute_bound_with_bf16()
    run.whatif = [WhatIf("amp=auto", 0.080, 0.100, 24, held_wait_seconds=0.004, alone=True)]
    rec = _advice(run)["mixed_precision"]
    assert rec.estimated_speedup == 1.25 and "the model alone on a held batch" in rec.basis
