"""``loadprof compare``'s cost per variant: the GPU-hours a day each variant loses to
input wait, and what the fix saves against the baseline (cost.py's figures of each run)."""

from __future__ import annotations

import io

from loadprof.experiments.compare import Comparison, Variant, VariantResult
from loadprof.experiments.trial import TrialResult
from loadprof.report.compare_text import CompareConsoleRenderer


def _variant(name: str, lost: list[float] | None, seconds: float) -> VariantResult:
    cost = ([{"measured": True, "gpu_hours_input_per_day": h} for h in lost] if lost is not None
            else [{"measured": False, "why_not": "no GPU"}])
    return VariantResult(Variant(name, name), [TrialResult(name, script_s=seconds, cost=c) for c in cost])


def test_each_variant_costs_its_input_wait_and_says_what_it_saves() -> None:
    cmp = Comparison(["train.py"], [_variant("baseline", [9.0, 10.0, 11.0], 30.0), _variant("workers", [2.0], 12.0)],
                     repeat=3)
    base, fixed = cmp.results
    assert base.input_gpu_hours_per_day == 10.0 and fixed.input_gpu_hours_per_day == 2.0
    assert cmp.saves(fixed) == 8.0 and cmp.saves(base) is None
    data = cmp.to_dict()["variants"]
    assert data[0]["cost"] == {"measured": True, "gpu_hours_input_per_day": 10.0}  # the median run's
    assert data[1]["saves_gpu_hours_per_day"] == 8.0
    out = io.StringIO()
    CompareConsoleRenderer(file=out, width=160).render(cmp)
    assert "input GPU-h/day" in out.getvalue() and "2.00 (saves 8.00)" in out.getvalue()


def test_without_a_gpu_the_table_says_the_cost_is_not_measured() -> None:
    cmp = Comparison(["train.py"], [_variant("baseline", None, 30.0), _variant("workers", None, 12.0)], repeat=1)
    assert cmp.saves(cmp.results[1]) is None and cmp.to_dict()["variants"][1]["cost"]["measured"] is False
    out = io.StringIO()
    CompareConsoleRenderer(file=out, width=160).render(cmp)
    assert "input GPU-h/day" not in out.getvalue()
    assert "cost of the input wait: not measured (no GPU)" in out.getvalue()
