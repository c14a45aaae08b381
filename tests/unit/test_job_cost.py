"""A multi-process job's cost (cost.py's ``job_cost``): its ranks' GPUs summed, read back
from the job's file and shown by every renderer (terminal, JSON, notebook, HTML page),
and the tracker fields of a job's report."""

from __future__ import annotations

import io
import json

import pytest

from loadprof.cli import main
from loadprof.cost import cost_line
from loadprof.jobs.records import JobRun, RankRun, rank_to_dict
from loadprof.report import load_report, render_console
from loadprof.report.html import HtmlPageRenderer
from loadprof.report.job import JobReport, build_job_report
from loadprof.trackers.fields import logged_step, summary_fields
from tests.conftest import STEP, WAIT, starved_run
from tests.job_files import small_job


def rank(r: int, host: str = "node0", gpu: int | None = None, memory: bool = True, n: int = 20) -> RankRun:
    """A rank whose GPU idles while its loop waits 60% of each step (conftest's starved run)."""
    run = starved_run(n=n)
    for s in run.gpu_samples:
        s.index = r if gpu is None else gpu
        s.process_memory_used = s.process_memory_used if memory else None
    run.environment.hostname = host
    return RankRun(rank=r, world_size=0, local_rank=r, node_rank=0, host=host, pid=100 + r, run=run)


def job_report(tmp_path, ranks: list[RankRun], price: float | None = None) -> JobReport:
    """The job written as loadprof writes it and read back as ``loadprof report`` does."""
    for r in ranks:
        r.world_size = len(ranks)
    path = tmp_path / "job.json"
    path.write_text(build_job_report(JobRun(world_size=len(ranks), run_id="t", merged="at exit", ranks=ranks),
                                     gpu_hour_price=price).to_json())
    report = load_report(path, gpu_hour_price=price)
    assert isinstance(report, JobReport)
    return report


def test_a_jobs_cost_is_its_ranks_gpu_hours_and_energy_summed(tmp_path):
    report = job_report(tmp_path, [rank(0), rank(1)], price=2.0)
    one = report.rank_costs()[0]
    cost = report.cost
    assert cost.measured and cost.ranks == [0, 1] and cost.gpus == [0, 1]
    assert cost.input_wait_fraction == pytest.approx(WAIT)
    assert cost.gpu_hours_input_per_day == pytest.approx(2 * WAIT * 24)  # 28.8: two GPUs idle 60% a day
    assert cost.money_input_per_day == pytest.approx(2 * WAIT * 24 * 2.0)
    assert cost.energy_j == pytest.approx(2 * one.energy_j)
    assert cost.joules_per_step == pytest.approx(2 * one.joules_per_step)  # a job's step runs on both
    assert cost.mean_power_w == pytest.approx(one.mean_power_w)  # per GPU
    assert cost.joules_per_sample == pytest.approx(one.joules_per_sample)
    assert cost.gpu_hours_input_per_epoch == pytest.approx(2 * WAIT * 100 * STEP / 3600)
    assert cost.input_wait_energy_fraction == pytest.approx(one.input_wait_energy_fraction)


def test_every_renderer_of_a_job_shows_its_cost(tmp_path):
    report = job_report(tmp_path, [rank(0), rank(1)], price=2.0)
    out = io.StringIO()
    render_console(report, file=out, width=300)
    (line,) = [x for x in out.getvalue().splitlines() if x.startswith("Cost:")]
    assert line.startswith("Cost: input wait 28.80 GPU-h/day on 2 GPUs of 2 ranks (0.0333 an epoch); ")
    assert line.endswith("at 2/GPU-h: 57.60/day lost to input")
    doc = json.loads(report.to_json())
    assert doc["cost"]["gpu_hours_input_per_day"] == pytest.approx(28.8)
    assert doc["cost"]["ranks"] == [0, 1]
    assert [r["gpu_hours_input_per_day"] for r in doc["ranks"]] == pytest.approx([14.4, 14.4])
    assert line in str(report)  # print(prof.report)
    assert line in report._repr_html_()  # a notebook
    page = HtmlPageRenderer().render(report)
    assert "<h2>Cost of the wait</h2><p class='muted'>on 2 GPUs of 2 ranks, summed</p>" in page
    assert "28.80/day" in page and "57.60/day" in page


def test_ranks_on_one_gpu_count_it_once_and_on_two_hosts_twice(tmp_path):
    shared = job_report(tmp_path, [rank(0, gpu=0), rank(1, gpu=0)]).cost
    assert shared.gpus == [0] and shared.ranks == [0, 1]
    assert shared.gpu_hours_input_per_day == pytest.approx(WAIT * 24)
    assert "rank 1 shares a GPU with rank 0 on node0" in shared.notes
    assert cost_line(shared).startswith("Cost: input wait 14.40 GPU-h/day on 1 GPU of 2 ranks")
    apart = job_report(tmp_path, [rank(0, "a", gpu=0), rank(1, "b", gpu=0)]).cost
    assert apart.gpus == [0, 0] and apart.gpu_hours_input_per_day == pytest.approx(2 * WAIT * 24)


def test_a_rank_that_sees_every_gpu_is_costed_on_its_local_ranks(tmp_path):
    # No process memory read (a container without NVML's process list): each rank's NVML
    # sees both GPUs, equally busy; each rank's own is the one of its local rank.
    ranks = []
    for r in (0, 1):
        one = rank(r, memory=False)
        other = rank(1 - r, memory=False)
        one.run.gpu_samples = sorted(one.run.gpu_samples + other.run.gpu_samples, key=lambda g: (g.t, g.index))
        ranks.append(one)
    cost = job_report(tmp_path, ranks).cost
    assert cost.gpus == [0, 1] and cost.gpus_basis == "local rank"
    assert cost.gpu_hours_input_per_day == pytest.approx(2 * WAIT * 24)


def test_a_job_without_gpu_work_says_so_once_and_a_missing_rank_is_not_counted(tmp_path):
    path = tmp_path / "small.json"
    path.write_text(json.dumps(small_job(2)))
    report = load_report(path)
    assert report.cost.to_dict()["measured"] is False
    assert report.cost.why_not == "the run put no work on a GPU, on every rank"
    out = io.StringIO()
    render_console(report, file=out, width=300)
    assert "Cost: not measured (the run put no work on a GPU, on every rank)" in out.getvalue()
    ranks = [rank(0), rank(1)]
    ranks[1].run, ranks[1].missing = None, "no report for this rank"
    cost = job_report(tmp_path, ranks).cost
    assert cost.ranks == [0] and cost.gpu_hours_input_per_day == pytest.approx(WAIT * 24)
    assert "not counted: rank(s) 1: no report from the rank" in cost.notes


def test_a_jobs_tracker_fields_are_the_jobs(tmp_path):
    report = job_report(tmp_path, [rank(0), rank(1, n=24)], price=1.0)
    numbers, texts = summary_fields(report)
    assert numbers["loadprof/world_size"] == 2.0
    assert numbers["loadprof/cost/gpu_hours_input_per_day"] == pytest.approx(28.8)
    assert numbers["loadprof/step_ms_median"] == pytest.approx(STEP * 1000)
    assert texts["loadprof/cost"].startswith("Cost: input wait 28.80 GPU-h/day on 2 GPUs of 2 ranks")
    assert texts["loadprof/verdict"] == report.verdict == "data-starved"
    assert logged_step(report) == numbers["loadprof/steps"] == 24


def test_merge_prices_the_jobs_cost(tmp_path, capsys):
    files = []
    for r in (rank(0), rank(1)):
        r.world_size, r.run_id = 2, "t"
        files.append(tmp_path / f"report.rank{r.rank}.json")
        files[-1].write_text(json.dumps(rank_to_dict(r)))
    out = tmp_path / "job.json"
    assert main(["merge", "-q", "--gpu-hour-price", "2", "--json", str(out), *map(str, files)]) == 0
    cost = json.loads(out.read_text())["cost"]
    assert cost["gpu_hours_input_per_day"] == pytest.approx(28.8)
    assert cost["money_input_per_day"] == pytest.approx(57.6)
