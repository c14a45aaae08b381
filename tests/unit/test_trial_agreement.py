"""benchmarks/trial_agreement.py: the share of changes whose own rounds disagree by more
than any figure can come within the target of, read from saved passes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from trial_agreement import main  # noqa: E402


def _row(example: str, runs: list[float]) -> dict[str, object]:
    return {"example": example, "id": "cache", "status": "measured", "measured_runs": runs}


def test_rounds_farther_apart_than_the_target_allows_are_counted_by_family(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    quiet = tmp_path / "quiet.json"
    quiet.write_text(json.dumps({"options": {"busy": False}, "rows": [
        _row("slow_transform", [1.0, 1.40]),  # 40% apart: no figure within 15% of both
        _row("torch_starved", [2.0, 2.6]),  # 30%: 2.3x is within 15% of both
        _row("npy_patches", [5.0]),  # one round: not counted
        _row("tfdata_map", [1.2, 1.9, 1.5]),
        {"example": "keras_mnist", "id": "contention", "status": "loadprof cannot apply it from outside"},
    ]}))
    busy = tmp_path / "busy.json"
    busy.write_text(json.dumps({"options": {"busy": True}, "rows": [_row("text_tokens", [3.0, 3.1])]}))
    assert main([str(quiet), str(busy)]) == 0
    lines = {" ".join(line.split()[:2]): line.split()[2:] for line in capsys.readouterr().out.splitlines()[1:]}
    assert lines["quiet torch"][:3] == ["1", "of", "2"]
    assert lines["quiet TensorFlow"][:3] == ["1", "of", "1"]
    assert lines["busy torch"][:3] == ["0", "of", "1"]


def test_a_file_that_is_not_a_saved_pass_is_one_line_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "run.json"
    bad.write_text(json.dumps({"steps": []}))
    with pytest.raises(SystemExit) as exited:
        main([str(bad)])
    assert exited.value.code == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.count("\n") == 1 and str(bad) in out.err
