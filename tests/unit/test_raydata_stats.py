"""Ray Data's stats text, as ``Dataset.stats()`` of Ray 2.60 gave it for two real runs
(raydata_stats/: a slow map on a one-CPU cluster; a shuffle, whose parts Ray lists as
sub-operators), read into operators; text Ray never wrote gives none and a reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadprof.frameworks.raydata.stats import OperatorStats, parse

HERE = Path(__file__).parent / "raydata_stats"


def test_each_operator_of_a_real_run_is_read_with_its_tasks_times() -> None:
    ops, why = parse((HERE / "starved_map.txt").read_text())
    assert why == ""
    assert [op.name for op in ops] == ["ReadRange", "MapBatches(featurize)"]
    read, mapped = ops
    assert mapped == OperatorStats("MapBatches(featurize)", tasks=8, blocks=8, span=0.46,
                                   wall=pytest.approx(0.22381), cpu=pytest.approx(0.17766), rows=2048)
    assert read.wall == pytest.approx(0.01046) and read.cpu == pytest.approx(0.00969) and read.tasks == 8


def test_sub_operators_are_rows_of_their_own() -> None:
    ops, why = parse((HERE / "shuffle_suboperators.txt").read_text())
    assert why == ""
    assert [op.name for op in ops] == ["ReadRange->Map(<lambda>)->RandomShuffleMap", "RandomShuffleReduce"]
    assert ops[0].span is None and ops[0].wall == pytest.approx(0.00886) and ops[1].cpu == pytest.approx(0.00122)


def test_microseconds_milliseconds_and_seconds() -> None:
    text = ("Operator 1 MapBatches(f): 3 tasks executed, 3 blocks produced in 12.5s\n"
            "* Remote wall time: 1.5s min, 5.0s max, 4.0s mean, 12.02s total\n"
            "* Remote cpu time: 10us min, 20us max, 15us mean, 450.5us total\n")
    [op], why = parse(text)
    assert why == "" and op.wall == pytest.approx(12.02) and op.cpu == pytest.approx(450.5e-6) and op.span == 12.5
    assert op.rows is None


@pytest.mark.parametrize("text", [
    None, 42, "", "   \n", "garbage\nmore garbage",
    "Operator 1 ReadRange: [execution cached]\n",
    "Operator 1 ReadRange: 2 tasks executed, 2 blocks produced in 0.1s\n* Remote wall time: lots total\n",
    "Operator x ReadRange: many tasks executed\n* Remote wall time: 1ms min, 2ms max, 1ms mean, 3ms total\n",
])
def test_text_it_cannot_read_gives_no_operators_and_says_why(text: object) -> None:
    ops, why = parse(text)
    assert ops == [] and why.startswith("Ray's stats")


def test_a_truncated_text_keeps_the_operators_it_read_whole() -> None:
    full = (HERE / "starved_map.txt").read_text()
    cut = full[:full.index("Operator 2")] + "Operator 2 MapBatches(featurize): 8 tasks exec"
    ops, why = parse(cut)
    assert why == "" and [op.name for op in ops] == ["ReadRange"]
