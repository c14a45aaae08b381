"""`loadprof check RUN.json`: exit 0 when every limit holds, 1 with one line per broken
limit, 2 on a usage error or a run it cannot read; runs saved by real small loops. A job's
report is checked where the real jobs run (test_distributed.py, ``check_a_job``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DataLoader  # noqa: E402

from loadprof import Profile  # noqa: E402
from tests.conftest import run_check  # noqa: E402
from tests.torch_loops import Sleepy, heavy_model, in_memory_loader, small_model, train  # noqa: E402


def _profiled(path: Path, loader: DataLoader, model: torch.nn.Module) -> Path:
    with Profile(json=path, print_report=False, gpu=False):
        train(loader, model)
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three saved runs of this same script: compute-heavy (little input wait), starved
    (a slow-storage dataset read in the loop, batch 8) and the fast one with batch 16."""
    d = tmp_path_factory.mktemp("check")
    torch.manual_seed(0)
    fast = _profiled(d / "fast.json", in_memory_loader(n=8 * 30, batch_size=8), heavy_model(width=384))
    starved = _profiled(d / "starved.json", DataLoader(Sleepy(n=8 * 30, delay=0.01), batch_size=8),
                        small_model())
    other_batch = _profiled(d / "batch16.json", in_memory_loader(n=16 * 20, batch_size=16), heavy_model(width=384))
    return {"fast": fast, "starved": starved, "batch16": other_batch}


def _report(path: Path) -> dict:
    return json.loads(path.read_text())


def test_limits_that_hold_exit_0_with_one_ok_line(runs, capsys):
    fast = _report(runs["fast"])
    assert fast["data_wait_fraction"] < 0.5, fast["data_wait_fraction"]
    code, out, err = run_check(capsys, str(runs["fast"]), "--max-data-wait", "0.5", "--fail-on", "data-starved")
    assert code == 0, (out, err)
    assert len(out) == 1 and ": ok (2 limits held" in out[0]
    assert err == []


def test_each_broken_limit_is_one_line_with_the_measured_and_the_baseline_value(runs, capsys):
    starved, fast = _report(runs["starved"]), _report(runs["fast"])
    assert starved["verdict"] == "data-starved"
    code, out, _ = run_check(capsys, str(runs["starved"]), "--baseline", str(runs["fast"]),
                             "--max-data-wait", "20%", "--max-slowdown", "10", "--fail-on", "data-starved", "host-bound")
    assert code == 1
    # the starved steps wait ~80 ms for storage, the heavy model's take ~10 ms on a quiet
    # machine; a busy one can stretch those past the starved run's, and the check says so
    ratio = starved["steps"]["median_s"] / fast["steps"]["median_s"]
    assert len(out) == (3 if ratio > 1.10 else 2), (ratio, out)
    wait, verdict = out[0], out[-1]
    assert f"data wait {starved['data_wait_fraction']:.1%} of step time > limit 20.0%" in wait
    assert f"(baseline {fast['data_wait_fraction']:.1%})" in wait
    if ratio > 1.10:
        assert f"is {100 * (ratio - 1):.1f}% slower than the baseline's" in out[1] and "> limit 10%" in out[1]
    assert verdict.endswith(f"verdict data-starved ({starved['cause']}) is in --fail-on (baseline {fast['verdict']})")


def _quicker_twin(path: Path, tmp_path: Path, factor: float) -> Path:
    """The run at ``path`` saved again with each step and its waits ``factor`` as long."""
    data = _report(path)
    for step in data["run"]["steps"]:
        step["end"] = step["start"] + factor * (step["end"] - step["start"])
        for key in ("data_wait", "data_wait_cpu", "h2d"):
            step[key] *= factor
    twin = tmp_path / f"twin-{path.name}"
    twin.write_text(json.dumps(data))
    return twin


def test_the_slowdown_limit_holds_for_a_faster_run_and_breaks_for_a_slower_one(runs, capsys, tmp_path):
    quick = _quicker_twin(runs["fast"], tmp_path, 0.8)
    code, out, _ = run_check(capsys, str(quick), "--baseline", str(runs["fast"]), "--max-slowdown", "0")
    assert code == 0, out
    assert "ok (1 limit held" in out[0]
    code, out, _ = run_check(capsys, str(runs["fast"]), "--baseline", str(quick), "--max-slowdown", "20")
    assert code == 1 and len(out) == 1, out
    assert "is 25.0% slower than the baseline's" in out[0] and "> limit 20%" in out[0]


def test_a_baseline_of_another_batch_size_is_refused_unless_forced(runs, capsys, tmp_path):
    code, out, err = run_check(capsys, str(runs["batch16"]), "--baseline", str(runs["fast"]), "--max-slowdown", "1000")
    assert code == 2 and out == []
    assert err == ["loadprof: error: the run's batch size is 16, the baseline's 8: not comparable "
                   "(--force compares anyway)"]
    # The baseline's own measurements saved as batch 16: refused as well, and compared
    # with --force (the same step times, so no slowdown whatever the machine's load).
    data = _report(runs["fast"])
    for step in data["run"]["steps"]:
        if step["batch_size"]:
            step["batch_size"] = 16 * step["merged"]
    for loader in data["run"]["loaders"]:
        loader["batch_size"] = 16
    twin = tmp_path / "fast16.json"
    twin.write_text(json.dumps(data))
    code, _, err = run_check(capsys, str(twin), "--baseline", str(runs["fast"]), "--max-slowdown", "5")
    assert code == 2 and err[0].startswith("loadprof: error: the run's batch size is 16, the baseline's 8")
    code, out, _ = run_check(capsys, str(twin), "--baseline", str(runs["fast"]), "--max-slowdown", "5", "--force")
    assert code == 0 and "ok (1 limit held" in out[0], out


def test_a_baseline_of_another_script_is_refused_unless_forced(runs, capsys, tmp_path):
    data = _report(runs["fast"])
    data["run"]["command"] = ["/ci/checkout/other_train.py", "--epochs", "1"]
    other = tmp_path / "other.json"
    other.write_text(json.dumps(data))
    code, _, err = run_check(capsys, str(runs["fast"]), "--baseline", str(other), "--max-slowdown", "5")
    assert code == 2
    assert len(err) == 1 and "the baseline of other_train.py: not comparable" in err[0]
    code, _, _ = run_check(capsys, str(runs["fast"]), "--baseline", str(other), "--max-slowdown", "5", "--force")
    assert code == 0  # the same measurements: no slowdown


def test_the_same_script_from_another_folder_is_comparable(runs, capsys, tmp_path):
    data = _report(runs["fast"])
    script = Path(data["run"]["command"][0]).name
    data["run"]["command"] = [f"/elsewhere/{script}"]
    moved = tmp_path / "moved.json"
    moved.write_text(json.dumps(data))
    code, out, _ = run_check(capsys, str(runs["fast"]), "--baseline", str(moved), "--max-slowdown", "0")
    assert code == 0, out


@pytest.mark.parametrize("argv, message", [
    ([], "no limit given (--max-data-wait, --max-slowdown with --baseline, --fail-on)"),
    (["--max-slowdown", "10"], "--max-slowdown needs --baseline BASE.json"),
])
def test_usage_errors_exit_2_with_one_line(runs, capsys, argv, message):
    code, out, err = run_check(capsys, str(runs["fast"]), *argv)
    assert code == 2 and out == []
    assert err == [f"loadprof: error: {message}"]


@pytest.mark.parametrize("argv", [["--max-data-wait", "1.5"], ["--max-data-wait", "lots"],
                                  ["--max-slowdown", "-3"], ["--fail-on", "slow"]])
def test_bad_limit_values_exit_2(runs, capsys, argv):
    code, out, err = run_check(capsys, str(runs["fast"]), *argv)
    assert code == 2 and out == []
    assert "error: argument" in err[-1]


def test_an_unreadable_run_exits_2_with_the_loaders_one_line(runs, capsys, tmp_path):
    bad = tmp_path / "bad.json"
    data = _report(runs["fast"])
    data["run"]["steps"][3]["end"] = "soon"
    bad.write_text(json.dumps(data))
    code, out, err = run_check(capsys, str(bad), "--max-data-wait", "0.2")
    assert code == 2 and out == []
    assert err == [f"loadprof: error: {bad}: run.steps[3].end: expected a number, got a string \"soon\""]
    code, _, err = run_check(capsys, str(runs["fast"]), "--baseline", str(tmp_path / "missing.json"),
                             "--max-slowdown", "5")
    assert code == 2 and err == [f"loadprof: error: {tmp_path / 'missing.json'}: no such file"]


def test_a_run_whose_steps_have_no_data_wait_is_an_error_not_a_zero_wait(runs, capsys, tmp_path):
    # --json writes a wait that was not finite as null; reading it as 0 passed --max-data-wait.
    data = _report(runs["starved"])
    for step in data["run"]["steps"]:
        step["data_wait"] = None
    nulls = tmp_path / "nulls.json"
    nulls.write_text(json.dumps(data))
    code, out, err = run_check(capsys, str(nulls), "--max-data-wait", "0.2")
    assert code == 2 and out == []
    assert err == [f"loadprof: error: {nulls}: run.steps[0].data_wait: null: the step has no data-wait measurement"]
    code, out, err = run_check(capsys, str(runs["starved"]), "--baseline", str(nulls), "--max-slowdown", "5")
    assert code == 2 and out == [] and "has no data-wait measurement" in err[0]
