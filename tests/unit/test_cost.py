"""The cost of a stall (cost.py): energy from NVML's counter or its power readings,
GPU-hours and money lost to input wait, on hand-built runs and through a fake NVML."""

from __future__ import annotations

import io
import json

import pytest

from loadprof.metrics import compute_metrics
from loadprof.report import build_report, load_report, render_console, write_json
from loadprof.samplers import NvmlSource
from tests.conftest import BUSY_W, IDLE_W, STEP, WAIT, energy_j, starved_run
from tests.fake_pynvml import FakeGpu, FakeNvml

GiB = 2**30
def test_energy_from_the_counter_and_the_energy_spent_waiting():
    run = starved_run()
    m = compute_metrics(run)
    report = build_report(run)
    cost = report.cost
    judged = run.steps[m.warmup_steps:]
    expected = energy_j(judged[-1].end) - energy_j(judged[0].start)
    assert cost.measured and cost.gpus == [0] and cost.energy_source == "counter"
    assert cost.energy_j == pytest.approx(expected, rel=0.01)
    assert cost.joules_per_step == pytest.approx(WAIT * IDLE_W + (STEP - WAIT) * BUSY_W, rel=0.01)  # 310.2 J
    assert cost.joules_per_sample == pytest.approx(cost.joules_per_step / 32)
    # The waits drew idle power: 45 J a step of 310, not 60% of it.
    assert cost.input_wait_energy_j == pytest.approx(WAIT * IDLE_W * len(judged), rel=0.02)
    assert cost.input_wait_energy_fraction == pytest.approx(45 / 310.2, rel=0.02)


def test_a_counter_that_moves_every_100ms_read_off_its_beat_still_sums_exactly():
    run = starved_run(offset=0.05)  # read half way between the counter's updates
    cost = build_report(run).cost
    judged = run.steps[compute_metrics(run).warmup_steps:]
    expected = energy_j(judged[-1].end) - energy_j(judged[0].start)
    assert cost.energy_j == pytest.approx(expected, rel=0.02)


def test_power_is_integrated_where_the_counter_is_missing():
    run = starved_run(counter=False)  # a pre-Volta board: NotSupported
    cost = build_report(run).cost
    assert cost.energy_source == "power"
    assert cost.joules_per_step == pytest.approx(310.2, rel=0.1)
    # A reading the counter missed now and then: the counter spans the gap, exactly.
    gaps = starved_run()
    for s in gaps.gpu_samples[1::2]:
        s.energy_mj = None
    assert build_report(gaps).cost.energy_source == "counter"
    assert build_report(gaps).cost.energy_j == pytest.approx(build_report(starved_run()).cost.energy_j, rel=0.01)
    # The counter failing half way: power before, the counter after.
    mixed = starved_run()
    for s in mixed.gpu_samples[:100]:
        s.energy_mj = None
    assert build_report(mixed).cost.energy_source == "counter+power"
    assert build_report(mixed).cost.joules_per_step == pytest.approx(310.2, rel=0.1)


def test_gpu_hours_per_day_and_epoch_and_money_at_the_users_price():
    run = starved_run(busy_util=80.0)  # busy stretches with 20% gaps: other idle time
    cost = build_report(run, gpu_hour_price=3.0).cost
    assert cost.input_wait_fraction == pytest.approx(0.6)
    assert cost.other_idle_fraction == pytest.approx(1 - 0.4 * 0.8 - 0.6, abs=0.02)
    assert cost.gpu_hours_input_per_day == pytest.approx(0.6 * 24)
    assert cost.steps_per_epoch == 100  # 3200 samples / batch 32
    assert cost.gpu_hours_input_per_epoch == pytest.approx(0.6 * 100 * STEP / 3600)
    assert cost.money_input_per_day == pytest.approx(0.6 * 24 * 3.0)
    assert cost.money_input_per_epoch == pytest.approx(0.6 * 100 / 3600 * 3.0)
    assert build_report(run).cost.money_input_per_day is None  # no default price


def test_input_wait_the_gpu_spent_on_queued_work_costs_no_gpu_time():
    run = starved_run()
    for s in run.gpu_samples:
        s.util_gpu = 90.0  # the GPU ran queued kernels through the waits
    cost = build_report(run).cost
    assert cost.input_wait_fraction == pytest.approx(0.1)
    assert cost.other_idle_fraction == pytest.approx(0.0)


def test_no_gpu_says_the_cost_is_not_measured_and_why(tmp_path):
    run = starved_run()
    run.gpu_samples = []
    run.environment.gpu_status = "unavailable (pynvml not installed)"
    report = build_report(run, gpu_hour_price=2.0)
    write_json(report, tmp_path / "r.json")
    cost = json.loads((tmp_path / "r.json").read_text())["cost"]
    assert cost["measured"] is False
    assert cost["why_not"] == "no GPU readings: GPU unavailable (pynvml not installed)"
    assert cost["money_input_per_day"] is None
    out = io.StringIO()
    render_console(report, file=out, width=200)
    assert "Cost: not measured (no GPU readings: GPU unavailable (pynvml not installed))" in out.getvalue()


def test_the_terminal_summary_has_one_cost_line_and_a_saved_report_keeps_the_figures(tmp_path):
    report = build_report(starved_run(), gpu_hour_price=2.5)
    out = io.StringIO()
    render_console(report, file=out, width=300)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("Cost:")]
    assert lines == ["Cost: input wait 14.40 GPU-h/day on 1 GPU (0.0167 an epoch); other idle 0.05 GPU-h/day; "
                     "310 J/step, 810 J of 5.58 kJ while waiting; at 2.5/GPU-h: 36.00/day lost to input"]
    write_json(report, tmp_path / "r.json")
    again = load_report(tmp_path / "r.json", gpu_hour_price=2.5)
    assert again.cost == report.cost


def test_nvml_reads_the_energy_counter_and_says_when_a_board_has_none(monkeypatch):
    fake = FakeNvml(gpus=[FakeGpu(power_mw=200_000, energy_period=0.0),
                          FakeGpu(name="Tesla P100", cc=(6, 0), not_supported={"energy"})]).install(monkeypatch)
    src = NvmlSource()
    src.start()
    first = src.sample(0.0)
    fake.advance(2.0)
    second = src.sample(2.0)
    src.close()
    assert second[0].energy_mj - first[0].energy_mj == 400_000  # 200 W for 2 s = 400 J
    assert first[1].energy_mj is None and second[1].energy_mj is None
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption", 1] == 1  # NotSupported: not asked again
    assert src.problems() == ["energy: Not Supported on GPU 1"]




@pytest.mark.parametrize("bad", [1e308, float("inf"), float("nan"), -1, 10**400, True, "2.5"])
def test_one_price_check_for_the_command_line_profile_and_saved_reports(tmp_path, capsys, bad):
    from loadprof import Profile
    from loadprof.cli import main

    path = tmp_path / "r.json"
    write_json(build_report(starved_run()), path)
    with pytest.raises(ValueError, match="gpu_hour_price: "):
        Profile(gpu_hour_price=bad)
    with pytest.raises(ValueError, match="gpu_hour_price: "):
        load_report(path, gpu_hour_price=bad)
    if isinstance(bad, (float, int)) and not isinstance(bad, bool):
        assert main(["report", "--gpu-hour-price", repr(bad), str(path)]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert "argument --gpu-hour-price: " in err.strip().splitlines()[-1]


def test_the_highest_price_taken_keeps_every_money_figure_finite():
    from loadprof.settings import MAX_GPU_HOUR_PRICE

    report = build_report(starved_run(), gpu_hour_price=MAX_GPU_HOUR_PRICE)
    doc = json.loads(report.to_json())
    assert doc["cost"]["money_input_per_day"] > 0
    out = io.StringIO()
    render_console(report, file=out, width=200)
    cost = next(line for line in out.getvalue().splitlines() if line.startswith("Cost:"))
    assert "/GPU-h" in cost and "inf" not in cost
